"""The two ways to synthesize: ``python app.py`` from the repo root, and the pinned CLI with cdk.json.

Both are separate processes of several seconds each, so they run side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.constants import EXAMPLES_CONTEXT_KEY, REPO_ROOT, STACK_ID
from infra.layers import build_core_layer

pytestmark = pytest.mark.infra

ENVIRONMENT = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "CDK_DISABLE_CLI_TELEMETRY": "true"}
CDK_CLI = REPO_ROOT / "node_modules" / ".bin" / "cdk"
EXAMPLES_FLAG = f"{EXAMPLES_CONTEXT_KEY}=true"
EXAMPLES_CONTEXT = json.dumps({EXAMPLES_CONTEXT_KEY: "true"})


@pytest.fixture(scope="module")
def synth_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[subprocess.Popen[str], Path]]]:
    build_core_layer()  # up to date before both processes read it
    python_out, cli_out = tmp_path_factory.mktemp("python-app"), tmp_path_factory.mktemp("cdk-cli")
    runs = {
        "python": (
            subprocess.Popen(
                [sys.executable, "app.py"],
                cwd=REPO_ROOT,
                # What the CLI hands the app for -c: the examples in cdk.json may synthesize.
                env={**ENVIRONMENT, "CDK_OUTDIR": str(python_out), "CDK_CONTEXT_JSON": EXAMPLES_CONTEXT},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
            python_out,
        )
    }
    if CDK_CLI.is_file():
        runs["cli"] = (
            subprocess.Popen(
                [str(CDK_CLI), "synth", "--quiet", "--no-notices", "--output", str(cli_out), "-c", EXAMPLES_FLAG],
                cwd=REPO_ROOT,
                env=ENVIRONMENT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
            cli_out,
        )
    yield runs
    for process, _ in runs.values():
        if process.poll() is None:
            process.kill()
        process.communicate()


def assert_synthesized(process: subprocess.Popen[str], outdir: Path) -> None:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert (outdir / f"{STACK_ID}.template.json").is_file()


def test_python_app_py_synthesizes_from_the_repo_root(synth_runs) -> None:
    assert_synthesized(*synth_runs["python"])


def test_the_pinned_cdk_cli_synthesizes_with_cdk_json(synth_runs) -> None:
    assert CDK_CLI.is_file(), "the pinned CDK CLI is missing: run make install (npm ci)"
    assert_synthesized(*synth_runs["cli"])
