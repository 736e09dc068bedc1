"""cfn-lint on the synthesized template, with the repository's .cfnlintrc.yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.constants import REPO_ROOT, STACK_ID
from tests.infra.conftest import Synthesized

pytestmark = pytest.mark.infra


def test_cfn_lint_is_clean(example: Synthesized) -> None:
    template = example.outdir / f"{STACK_ID}.template.json"
    cfn_lint = Path(sys.executable).parent / "cfn-lint"

    run = subprocess.run([str(cfn_lint), str(template)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)

    assert run.returncode == 0, run.stdout + run.stderr
