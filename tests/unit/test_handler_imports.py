"""What each Lambda handler loads at init (bench/lambda_cold_start.py measures it; the goal is under 300 ms).

Lazy imports are the contract here: ingest never plans, renders or signs, so it must not load the engine, the
renderers or the other functions' use cases; result neither plans nor discovers; no function loads boto3 (botocore
makes the clients: boto3 would add s3transfer and concurrent.futures to every cold start), nor Powertools' batch
utility (asyncio and every event source's data classes: topokeeper.wiring.fifo_batch does the reconcile's batch), nor
the login endpoints' modules when the stack has no login endpoint. What a handler's own path runs stays loaded at init,
where Lambda measures it, not in the first invocation: its use case, the adapters its deps make
(topokeeper.wiring.runtime.FUNCTION_ADAPTERS), and the login modules when the stack has login endpoints.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topokeeper.contract.constants import LOGIN_TARGET_GROUPS_ENV
from topokeeper.contract.stack_spec import FUNCTION_NAMES
from topokeeper.wiring.lambda_init import frozen_init

ROOT = Path(__file__).resolve().parents[2]
NO_FUNCTION_LOADS = (
    "boto3",
    "s3transfer",
    "aws_lambda_powertools.utilities.batch",
    "aws_lambda_powertools.utilities.data_classes",
    "asyncio",
    "topokeeper.sim",
    "topokeeper.cli.main",
    "topokeeper.cli.operator_commands",
    # The EKS provider, loaded by the orchestrator registry (service.orchestrators) for the first EKS cluster only.
    "topokeeper.service.eks",
    "topokeeper.kueue",
)
# Ingest's path: parse the event, count the change, queue a reconcile, sync login targets.
INGEST_NEVER_LOADS = (
    "topokeeper.engine",
    "topokeeper.render",
    "topokeeper.service.reconcile",
    "topokeeper.service.result",
    "topokeeper.service.drift",
    "topokeeper.service.signing",
    "topokeeper.adapters.ssm_channel",
    "topokeeper.contract.head_node_program",
    "topokeeper.headnode",
)
# Result records what a delivery did: it neither plans nor discovers.
RESULT_NEVER_LOADS = (
    "topokeeper.engine.snapshot",
    "topokeeper.service.reconcile",
    "topokeeper.service.drift",
    "topokeeper.service.ingest",
    "topokeeper.adapters.ec2",
    "topokeeper.adapters.hyperpod",
)
# Syncing login targets and installing host identities, loaded only where the stack has a login endpoint.
LOGIN_MODULES = (
    "topokeeper.adapters.elbv2",
    "topokeeper.adapters.login_nodes",
    "topokeeper.adapters.login_run_command",
    "topokeeper.login.install",
    "topokeeper.service.login",
)
# What each function's common path runs, loaded at init (a lazy import must not move it into the invocation).
LOADED_AT_INIT = {
    "ingest": (
        "botocore.session",
        "topokeeper.service.ingest",
        "topokeeper.adapters.dynamodb",
        "topokeeper.adapters.queue",
        "topokeeper.adapters.metrics",
        "topokeeper.adapters.ec2",
        "topokeeper.wiring.login_sync",
    ),
    "reconcile": (
        "botocore.session",
        "topokeeper.service.controller",
        "topokeeper.service.reconcile",
        "topokeeper.engine.planner",
        "topokeeper.engine.snapshot",
        "topokeeper.render.bundle",
        "topokeeper.service.signing",
        "topokeeper.service.drift",
        "topokeeper.wiring.fifo_batch",
        "topokeeper.adapters.ssm_channel",
        "topokeeper.adapters.agent_channel",
        "topokeeper.adapters.plans",
        "topokeeper.adapters.ec2",
        "topokeeper.adapters.hyperpod",
        "topokeeper.adapters.kms",
        "topokeeper.adapters.audit_trail",
    ),
    "result": (
        "botocore.session",
        "topokeeper.service.result",
        "topokeeper.render.bundle",
        "topokeeper.adapters.plans",
        "topokeeper.adapters.ssm_channel",
        "topokeeper.adapters.kms",
        "topokeeper.adapters.audit_trail",
    ),
    "drift": (
        "botocore.session",
        "topokeeper.service.controller",
        "topokeeper.service.drift",
        "topokeeper.engine.planner",
        "topokeeper.engine.snapshot",
        "topokeeper.render.bundle",
        "topokeeper.wiring.login_sync",
        "topokeeper.adapters.ssm_channel",
        "topokeeper.adapters.agent_channel",
        "topokeeper.adapters.ec2",
        "topokeeper.adapters.hyperpod",
        "topokeeper.adapters.kms",
        "topokeeper.adapters.audit_trail",
    ),
}

# Models a function validates only on some paths, built on first use (``defer_build``): nothing at import may
# build them, or importing would pay for them again.
BUILT_ON_FIRST_USE = (
    "topokeeper.contract.event_schemas.ClusterStateDetail",
    "topokeeper.contract.event_schemas.NodeHealthDetail",
    "topokeeper.contract.event_schemas.ClusterEventDetail",
    "topokeeper.contract.event_schemas.CloudTrailDetail",
    "topokeeper.contract.event_schemas.Ec2StateDetail",
    "topokeeper.contract.event_schemas.SsmInvocationDetail",
    "topokeeper.contract.event_schemas.AgentResultDetail",
    "topokeeper.contract.ports.KueueAuditRecord",
    "topokeeper.contract.ports.LoginNode",
    "topokeeper.contract.ports.LoginAuditRecord",
    "topokeeper.contract.ports.LoginInstallRecord",
    "topokeeper.contract.ports.LaunchedInstance",
)

IMPORT_AND_LIST = """
import gc, json, sys
sys.path[:0] = sys.argv[2:]
import handler
collector = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count() > 0}
built = []
for name in json.loads(sys.argv[1]):
    module, _, model = name.rpartition(".")
    if module in sys.modules and getattr(sys.modules[module], model).__pydantic_complete__:
        built.append(name)
print(json.dumps({"modules": sorted(sys.modules), "built": built, "collector": collector}))
"""


def _import_handler(
    function: str, login_target_groups: str | None = None
) -> tuple[list[str], list[str], dict[str, bool]]:
    """The modules ``import handler`` loads, which of BUILT_ON_FIRST_USE it built, and the collector after it."""
    paths = [str(ROOT / "functions" / function), str(ROOT / "layers" / "core" / "python")]
    environment = {k: v for k, v in os.environ.items() if k != LOGIN_TARGET_GROUPS_ENV}
    if login_target_groups is not None:
        environment[LOGIN_TARGET_GROUPS_ENV] = login_target_groups
    ran = subprocess.run(
        [sys.executable, "-c", IMPORT_AND_LIST, json.dumps(BUILT_ON_FIRST_USE), *paths],
        capture_output=True, text=True, check=True, cwd=ROOT, env=environment,
    )  # fmt: skip
    found = json.loads(ran.stdout.splitlines()[-1])
    return found["modules"], found["built"], found["collector"]


def _under(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [name for name in modules if any(name == top or name.startswith(f"{top}.") for top in packages)]


@pytest.mark.parametrize("function", FUNCTION_NAMES)
def test_each_handler_loads_its_own_path_at_init_and_no_boto3(function: str) -> None:
    loaded, built, collector = _import_handler(function)
    assert _under(loaded, NO_FUNCTION_LOADS) == []
    assert built == []
    assert collector == {"enabled": True, "frozen": True}  # init's objects frozen, the collector on for the rest
    assert [name for name in LOADED_AT_INIT[function] if name not in loaded] == []
    if function == "ingest":
        assert _under(loaded, INGEST_NEVER_LOADS) == []
    if function == "result":
        assert _under(loaded, RESULT_NEVER_LOADS) == []
    assert _under(loaded, LOGIN_MODULES) == []  # the stack has no login endpoint


@pytest.mark.parametrize("function", ["ingest", "drift"])
def test_with_a_login_endpoint_ingest_and_drift_load_its_modules_at_init(function: str) -> None:
    loaded, _, _ = _import_handler(function, json.dumps({"llm-train": "arn:aws:elasticloadbalancing:x"}))
    assert [name for name in LOGIN_MODULES if name not in loaded] == []


def test_an_init_that_fails_freezes_nothing_and_turns_the_collector_back_on() -> None:
    frozen = gc.get_freeze_count()
    with pytest.raises(ImportError), frozen_init():
        assert not gc.isenabled()
        raise ImportError("halfway")
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
