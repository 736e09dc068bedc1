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

IMPORT_AND_LIST = """
import json, sys
sys.path[:0] = sys.argv[1:]
import handler
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(function: str) -> list[str]:
    paths = [str(ROOT / "functions" / function), str(ROOT / "layers" / "core" / "python")]
    ran = subprocess.run(
        [sys.executable, "-c", IMPORT_AND_LIST, *paths], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded: list[str] = json.loads(ran.stdout.splitlines()[-1])
    return loaded


def _under(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [name for name in modules if any(name == top or name.startswith(f"{top}.") for top in packages)]


@pytest.mark.parametrize("function", FUNCTION_NAMES)
def test_each_handler_loads_its_own_path_at_init_and_no_boto3(function: str) -> None:
    loaded = _loaded_by(function)
    assert _under(loaded, NO_FUNCTION_LOADS) == []
    assert [name for name in LOADED_AT_INIT[function] if name not in loaded] == []
    if function == "ingest":
        assert _under(loaded, INGEST_NEVER_LOADS) == []
