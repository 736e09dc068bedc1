"""Each import rule of pyproject.toml's ``[tool.importlinter]`` fails ``lint-imports`` on a planted violation.

The package, infra/ and functions/ are copied to a temporary directory with the project's configuration; the copy
passes as it is, then each test plants one violation there (a new module, or one line added to a module of the copy)
and runs lint-imports on that rule alone: it must fail and name the planted import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path("layers/core/python/topokeeper")
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("project")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for tree in (PACKAGE, Path("infra"), Path("functions")):
        shutil.copytree(ROOT / tree, copy / tree, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def lint(project: Path, contract: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": f"{project / PACKAGE.parent}{os.pathsep}{project}"}
    only = ["--contract", contract] if contract else []
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--no-logo", *only],
        cwd=project, env=environment, capture_output=True, text=True, check=False,
    )  # fmt: skip


def plant(project: Path, relative: str, text: str) -> Path:
    path = project / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_copy_keeps_every_rule(project: Path) -> None:
    ran = lint(project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "0 broken" in ran.stdout


# (rule, file planted relative to the copy, its text, what the failure names)
PLANTED = {
    "the pure core imports a use case": (
        "layers",
        f"{PACKAGE}/domain/planted.py",
        "import topokeeper.service.reconcile\n",
        "topokeeper.domain.planted -> topokeeper.service.reconcile",
    ),
    "a use case imports an adapter": (
        "layers",
        f"{PACKAGE}/service/planted.py",
        "import topokeeper.adapters.aws\n",
        "topokeeper.service.planted -> topokeeper.adapters.aws",
    ),
    "the wiring imports the simulator": (
        "layers",
        f"{PACKAGE}/wiring/planted.py",
        "import topokeeper.sim.world\n",
        "topokeeper.wiring.planted -> topokeeper.sim.world",
    ),
    "a contract module in no layer": (
        "contract-modules",
        f"{PACKAGE}/contract/planted.py",
        "",
        "topokeeper.contract.planted",
    ),
    "a use case imports botocore": (
        "no-aws-sdk-below-adapters",
        f"{PACKAGE}/service/planted.py",
        "import botocore\n",
        "topokeeper.service.planted -> botocore",
    ),
    "the planner imports boto3": (
        "no-aws-sdk-below-adapters",
        f"{PACKAGE}/engine/planted.py",
        "import boto3\n",
        "topokeeper.engine.planted -> boto3",
    ),
    "a handler imports infra": (
        "functions-thin",
        "functions/planted/handler.py",
        "import infra.constants\n",
        "functions.planted.handler -> infra.constants",
    ),
    "a handler makes its own AWS client": (
        "functions-thin",
        "functions/planted/handler.py",
        "import topokeeper.adapters.aws\n",
        "functions.planted.handler -> topokeeper.adapters.aws",
    ),
    "infra imports an adapter directly": (
        "infra-reads-contract",
        "infra/planted.py",
        "import topokeeper.adapters.aws\n",
        "infra.planted -> topokeeper.adapters.aws",
    ),
    "infra reaches botocore through a contract module": (
        "infra-reads-contract",
        "infra/planted.py",
        "import topokeeper.contract.planted\n",
        "topokeeper.contract.planted -> botocore",
    ),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_violation_fails_its_rule(project: Path, case: str) -> None:
    contract, relative, text, named = PLANTED[case]
    planted = [plant(project, relative, text)]
    if case == "infra reaches botocore through a contract module":
        planted.append(plant(project, f"{PACKAGE}/contract/planted.py", "import botocore\n"))
    try:
        ran = lint(project, contract)
    finally:
        for path in planted:
            path.unlink()
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "1 broken" in ran.stdout
    assert named in ran.stdout


# (rule, module of the copy a line is added to, the line, what the failure names)
ADDED = {
    "the contract imports the wiring": (
        "layers",
        "contract/config.py",
        "import topokeeper.wiring.runtime",
        "topokeeper.contract.config -> topokeeper.wiring.runtime",
    ),
    "the applier imports the package": (
        "head-node-stdlib",
        "headnode/bundle.py",
        "import topokeeper.domain.names",
        "topokeeper.headnode.bundle -> topokeeper.domain.names",
    ),
    "the agent imports a third-party package": (
        "head-node-stdlib",
        "agent/cycle.py",
        "import yaml",
        "topokeeper.agent.cycle -> yaml",
    ),
    "the wire contract imports the package": (
        "head-node-stdlib",
        "wire.py",
        "import topokeeper.contract.constants",
        "topokeeper.wire -> topokeeper.contract.constants",
    ),
}


@pytest.mark.parametrize("case", sorted(ADDED))
def test_a_line_added_to_a_module_fails_its_rule(project: Path, case: str) -> None:
    contract, module, line, named = ADDED[case]
    path = project / PACKAGE / module
    original = path.read_text()
    path.write_text(f"{original}\n{line}  # planted\n")
    try:
        ran = lint(project, contract)
    finally:
        path.write_text(original)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert named in ran.stdout
