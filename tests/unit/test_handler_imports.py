"""What each Lambda handler loads at init (bench/lambda_cold_start.py measures it; the goal is under 300 ms).

Lazy imports are the contract here: ingest never plans, renders or signs, so it must not load the engine, the
renderers or the other functions' use cases; no function loads boto3 (botocore makes the clients:
boto3 would add s3transfer and concurrent.futures to every cold start). What a handler's own path runs stays
loaded at init, where Lambda measures it, not in the first invocation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topokeeper.stack_spec import FUNCTION_NAMES

ROOT = Path(__file__).resolve().parents[2]
NO_FUNCTION_LOADS = ("boto3", "s3transfer", "topokeeper.sim", "topokeeper.cli", "topokeeper.operator_commands")
# Ingest's path: parse the event, count the change, queue a reconcile, sync login targets.
INGEST_NEVER_LOADS = (
    "topokeeper.engine",
    "topokeeper.render",
    "topokeeper.service.reconcile",
    "topokeeper.service.result",
    "topokeeper.service.drift",
    "topokeeper.service.signing",
)
# What each function's common path runs, loaded at init (a lazy import must not move it into the invocation).
LOADED_AT_INIT = {
    "ingest": ("botocore.session", "topokeeper.service.ingest", "topokeeper.adapters.dynamodb"),
    "reconcile": (
        "botocore.session",
        "topokeeper.service.reconcile",
        "topokeeper.engine.planner",
        "topokeeper.engine.snapshot",
        "topokeeper.render.bundle",
        "topokeeper.service.signing",
        "topokeeper.adapters.ssm_channel",
        "topokeeper.adapters.agent_channel",
        "topokeeper.adapters.plans",
    ),
    "result": (
        "botocore.session",
        "topokeeper.service.result",
        "topokeeper.render.bundle",
        "topokeeper.adapters.plans",
    ),
    "drift": (
        "botocore.session",
        "topokeeper.service.drift",
        "topokeeper.engine.planner",
        "topokeeper.engine.snapshot",
        "topokeeper.render.bundle",
        "topokeeper.login.lambda_sync",
    ),
}

# Models a function validates only on some paths, built on first use (``defer_build``): nothing at import may
# build them, or importing would pay for them again.
BUILT_ON_FIRST_USE = (
    "topokeeper.events.ClusterStateDetail",
    "topokeeper.events.NodeHealthDetail",
    "topokeeper.events.ClusterEventDetail",
    "topokeeper.events.CloudTrailDetail",
    "topokeeper.events.Ec2StateDetail",
    "topokeeper.events.SsmInvocationDetail",
    "topokeeper.events.AgentResultDetail",
    "topokeeper.ports.KueueAuditRecord",
    "topokeeper.ports.LoginNode",
    "topokeeper.ports.LaunchedInstance",
)

IMPORT_AND_LIST = """
import json, sys
sys.path[:0] = sys.argv[2:]
import handler
built = []
for name in json.loads(sys.argv[1]):
    module, _, model = name.rpartition(".")
    if module in sys.modules and getattr(sys.modules[module], model).__pydantic_complete__:
        built.append(name)
print(json.dumps({"modules": sorted(sys.modules), "built": built}))
"""


def _import_handler(function: str) -> tuple[list[str], list[str]]:
    """The modules ``import handler`` loads, and which of BUILT_ON_FIRST_USE it built."""
    paths = [str(ROOT / "functions" / function), str(ROOT / "layers" / "core" / "python")]
    ran = subprocess.run(
        [sys.executable, "-c", IMPORT_AND_LIST, json.dumps(BUILT_ON_FIRST_USE), *paths],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    found = json.loads(ran.stdout.splitlines()[-1])
    return found["modules"], found["built"]


def _under(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [name for name in modules if any(name == top or name.startswith(f"{top}.") for top in packages)]


@pytest.mark.parametrize("function", FUNCTION_NAMES)
def test_each_handler_loads_its_own_path_at_init_and_no_boto3(function: str) -> None:
    loaded, built = _import_handler(function)
    assert _under(loaded, NO_FUNCTION_LOADS) == []
    assert built == []
    assert [name for name in LOADED_AT_INIT[function] if name not in loaded] == []
    if function == "ingest":
        assert _under(loaded, INGEST_NEVER_LOADS) == []
