"""The synthesized Lambda assets import their handlers the way Lambda would load them.

Each handler runs in a clean interpreter (``-I -S``: no site-packages) whose path holds only the function's
asset, the core layer's ``python/`` and a stand-in for the AWS-managed Powertools layer, with the
environment the stack gives that function. Then it builds the function's dependencies from that
environment, which checks the env-var contract and that the vendored botocore knows every service used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from infra.constants import BUILD_DIR, FUNCTION_NAMES
from tests.infra.conftest import Synthesized
from tests.infra.test_layer_contents import bytecode_problems, files_under, lambda_modules

pytestmark = pytest.mark.infra

POWERTOOLS_STANDIN = BUILD_DIR / "powertools-standin"
# What CloudFormation would resolve the stack's references to.
RESOLVED = {
    "TABLE_NAME": "Topokeeper-StateTable-1A2B3C",
    "BUCKET_NAME": "topokeeper-plansbucket-1a2b3c",
    "QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/111122223333/Topokeeper-Work.fifo",
    "DEAD_LETTER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/111122223333/Topokeeper-WorkDlq.fifo",
    "SIGNING_KEY_ID": "arn:aws:kms:us-east-1:111122223333:key/11111111-2222-3333-4444-555555555555",
}


@pytest.fixture(scope="session")
def powertools_layer() -> Path:
    """aws-lambda-powertools[parser] and pydantic, the versions this venv tests with, installed once."""
    requirements = [
        f"aws-lambda-powertools[parser]=={version('aws-lambda-powertools')}",
        f"pydantic=={version('pydantic')}",
    ]
    stamp = POWERTOOLS_STANDIN.with_name(POWERTOOLS_STANDIN.name + ".stamp")
    if not (stamp.is_file() and stamp.read_text() == " ".join(requirements)):
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--upgrade"]
        subprocess.run([*pip, "--target", str(POWERTOOLS_STANDIN), *requirements], check=True)
        stamp.write_text(" ".join(requirements))
    return POWERTOOLS_STANDIN


def function_environment(example: Synthesized, name: str) -> dict[str, str]:
    """The environment Lambda gives function ``name``: the stack's variables, resolved, and Lambda's own."""
    function = example.resource(example.stack.functions.by_name[name])["Properties"]
    environment = {
        key: value if isinstance(value, str) else RESOLVED[key]
        for key, value in function["Environment"]["Variables"].items()
    }
    lambda_sets = {"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_LAMBDA_FUNCTION_NAME": name}
    return environment | lambda_sets


def asset_dir(example: Synthesized, code: dict[str, Any]) -> Path:
    return example.outdir / f"asset.{code['S3Key'].removesuffix('.zip')}"


def test_the_core_layer_holds_the_package_and_a_current_boto3_but_no_yaml(example: Synthesized) -> None:
    (layer,) = [r for r in example.resources.values() if r["Type"] == "AWS::Lambda::LayerVersion"]
    python = asset_dir(example, layer["Properties"]["Content"]) / "python"

    assert files_under(python / "topokeeper") == lambda_modules()  # no simulator, CLI or operator commands
    assert (python / "boto3-1.44.8.dist-info").is_dir()
    assert not (python / "yaml").exists()
    assert not list(python.rglob("*.pyc")) or not bytecode_problems(python)  # bytecode for every module, or none


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_the_handler_imports_in_a_clean_interpreter(example: Synthesized, powertools_layer: Path, name: str) -> None:
    function = example.resource(example.stack.functions.by_name[name])["Properties"]
    (layer,) = [r for r in example.resources.values() if r["Type"] == "AWS::Lambda::LayerVersion"]
    path = [
        asset_dir(example, function["Code"]),
        asset_dir(example, layer["Properties"]["Content"]) / "python",
        powertools_layer,
    ]
    environment = function_environment(example, name)
    # Then every module of the layer, as the handler's lazy imports would load it: each finds what it imports.
    modules = [
        f"topokeeper.{file.removesuffix('.py').replace('/', '.')}".removesuffix(".__init__")
        for file in lambda_modules()
        if file.endswith(".py") and not file.endswith("__main__.py")  # an entry point runs when imported
    ]
    program = (
        f"import sys; sys.path[:0] = {json.dumps([str(p) for p in path])}\n"
        "import handler\n"
        "assert callable(handler.lambda_handler)\n"
        "from topokeeper.wiring.runtime import lambda_runtime\n"
        f"lambda_runtime().{name}_deps()\n"
        f"import importlib; [importlib.import_module(module) for module in {modules!r}]\n"
        "import botocore; print(botocore.__file__)\n"
    )

    run = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program], env=environment, capture_output=True, text=True, check=False
    )

    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(str(path[1]))  # our botocore (the clients' maker), not another one
