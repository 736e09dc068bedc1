"""The context switch for regions without AWS's public Powertools layer: Powertools and pydantic go into the
core layer, and the stack references no Powertools parameter."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from infra.app import cdk_json_context, create_app
from infra.config import load_settings
from infra.constants import CONTEXT_KEY, EXAMPLES_CONTEXT_KEY
from infra.layers import BUNDLE_POWERTOOLS_CONTEXT, POWERTOOLS_REQUIREMENTS
from tests.infra.conftest import Synthesized
from tests.infra.test_handler_assets import asset_dir
from tests.infra.test_layer_contents import files_under, lambda_modules

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    context = {
        **cdk_json_context(),
        BUNDLE_POWERTOOLS_CONTEXT: "true",
        EXAMPLES_CONTEXT_KEY: "true",
    }  # as -c passes them
    outdir = tmp_path_factory.mktemp("bundled")
    app, stack = create_app(context, str(outdir), nag=False)
    app.synth()
    return Synthesized(load_settings(context[CONTEXT_KEY]), stack, Template.from_stack(stack), outdir)


def test_no_powertools_parameter_and_every_function_has_only_the_core_layer(bundled: Synthesized) -> None:
    assert "/aws/service/powertools/" not in json.dumps(bundled.template.to_json())
    core = {"Ref": bundled.logical_id(bundled.stack.layers.core)}
    for function in bundled.stack.functions.by_name.values():
        assert bundled.resource(function)["Properties"]["Layers"] == [core]


def test_the_core_layer_carries_powertools_and_pydantic_for_the_lambda_platform(bundled: Synthesized) -> None:
    (layer,) = [r for r in bundled.resources.values() if r["Type"] == "AWS::Lambda::LayerVersion"]
    python = asset_dir(bundled, layer["Properties"]["Content"]) / "python"

    assert files_under(python / "topokeeper") == lambda_modules()
    for distribution in ("aws_lambda_powertools", "pydantic", "pydantic_core", "typing_extensions"):
        # the very versions the tests run with
        assert (python / f"{distribution}-{version(distribution)}.dist-info").is_dir(), distribution
    assert [path.name for path in (python / "pydantic_core").glob("*.so")] == [
        "_pydantic_core.cpython-314-aarch64-linux-gnu.so"
    ]
    assert (python / "boto3-1.44.8.dist-info").is_dir()


def test_the_pins_are_the_tested_versions() -> None:
    pins = [
        line.split("==")
        for line in (ROOT / "layers" / "core" / POWERTOOLS_REQUIREMENTS).read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert pins and all(version(name) == pinned for name, pinned in pins)
