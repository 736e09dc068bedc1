"""The core layer's bytecode, compiled by Debian's python3.14 from the sid chroot, is what Lambda's Python loads.

The chroot is built first (ensure_chroot, as the slurm tests do), so the layer build finds its interpreter
whatever ran before: a build that ran without it was stamped "no bytecode" and is rebuilt here. Each handler then
runs in that python3.14 the way Lambda starts it: the layer unzipped with CDK's fixed date on every file, mounted
read-only, PYTHONDONTWRITEBYTECODE unset; ``-v`` names where every module's code object came from.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from infra.constants import FUNCTION_NAMES, FUNCTIONS_DIR
from infra.layers import (
    CHROOT_CACHE_ENV,
    LayerPython,
    build_core_layer,
    chroot_python,
    compile_bytecode,
    find_layer_python,
)
from tests.infra.conftest import Synthesized
from tests.infra.lambda_layout import copy_as_unzipped, powertools_standin, read_only
from tests.infra.test_handler_assets import function_environment
from tests.infra.test_layer_contents import bytecode_problems
from topokeeper.sim.slurm_chroot import cache_root, ensure_chroot

pytestmark = [pytest.mark.slurm, pytest.mark.infra]

CODE_OBJECT = re.compile(r"^# code object from '?(?P<path>[^']+?)'?$", re.MULTILINE)


@pytest.fixture(scope="module")
def runtime_python() -> LayerPython:
    ensure_chroot("sid")
    python = find_layer_python()
    assert python is not None
    return python


@pytest.fixture(scope="module")
def layer(runtime_python: LayerPython) -> Path:
    return build_core_layer() / "python"


def test_the_build_finds_the_chroot_where_the_slurm_harness_keeps_it(runtime_python: LayerPython) -> None:
    environ = {
        "PATH": "/nonexistent",
        **({CHROOT_CACHE_ENV: os.environ[CHROOT_CACHE_ENV]} if CHROOT_CACHE_ENV in os.environ else {}),
    }

    found = find_layer_python(environ)

    assert found is not None
    assert found.command == chroot_python(cache_root() / "sid")
    assert found.version.startswith("3.14.")


def test_every_module_ships_unchecked_hash_bytecode_of_the_runtime_version(
    layer: Path, runtime_python: LayerPython
) -> None:
    magic = runtime_python.run("-c", "import importlib.util as u, sys; sys.stdout.write(u.MAGIC_NUMBER.hex())").stdout
    pycs = sorted(layer.rglob("*.pyc"))

    assert bytecode_problems(layer) == []
    assert len(pycs) > 200
    assert {pyc.read_bytes()[:4].hex() for pyc in pycs} == {magic}


def test_two_builds_compile_the_same_bytes_wherever_they_build(
    layer: Path, runtime_python: LayerPython, tmp_path: Path
) -> None:
    copies = [tmp_path / "a" / "python", tmp_path / "elsewhere" / "b" / "python"]
    for copy in copies:
        shutil.copytree(layer, copy, ignore=shutil.ignore_patterns("__pycache__"))
        compile_bytecode(runtime_python, copy)

    for pyc in layer.rglob("*.pyc"):
        relative = pyc.relative_to(layer)
        assert (copies[0] / relative).read_bytes() == (copies[1] / relative).read_bytes() == pyc.read_bytes(), relative


def _run_handler(
    runtime_python: LayerPython, example: Synthesized, name: str, opt_python: Path, powertools: Path
) -> str:
    path = [str(FUNCTIONS_DIR / name), str(opt_python), str(powertools)]
    program = (
        f"import sys; sys.path[:0] = {path!r}\n"
        "import handler\n"
        "from topokeeper.wiring.runtime import lambda_runtime\n"
        f"lambda_runtime().{name}_deps()\n"  # the clients a first invocation creates
    )
    ran = runtime_python.run("-v", "-c", program, environment=function_environment(example, name))
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stderr


def _from_layer(verbose: str, opt_python: Path) -> list[str]:
    prefix = f"{opt_python}/"
    return [match["path"] for match in CODE_OBJECT.finditer(verbose) if match["path"].startswith(prefix)]


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_handler_loads_the_layer_from_its_bytecode_and_compiles_nothing(
    layer: Path, runtime_python: LayerPython, example: Synthesized, tmp_path: Path, name: str
) -> None:
    unzipped = copy_as_unzipped(layer, tmp_path / "unzipped" / "python")
    with read_only(unzipped, tmp_path / "opt" / "python") as opt_python:
        with pytest.raises(OSError):
            (opt_python / "probe").touch()
        verbose = _run_handler(runtime_python, example, name, opt_python, powertools_standin())

    loaded = _from_layer(verbose, opt_python)
    assert any("/botocore/" in path for path in loaded) and any("/topokeeper/" in path for path in loaded)
    assert [path for path in loaded if not path.endswith(".cpython-314.pyc")] == []  # nothing compiled from source


def test_the_check_sees_modules_compiled_from_source_when_their_bytecode_is_missing(
    layer: Path, runtime_python: LayerPython, example: Synthesized, tmp_path: Path
) -> None:
    unzipped = copy_as_unzipped(layer, tmp_path / "unzipped" / "python")
    shutil.rmtree(unzipped / "topokeeper" / "wiring" / "__pycache__")
    with read_only(unzipped, tmp_path / "opt" / "python") as opt_python:
        verbose = _run_handler(runtime_python, example, "ingest", opt_python, powertools_standin())

    compiled = [path for path in _from_layer(verbose, opt_python) if path.endswith(".py")]
    assert f"{opt_python}/topokeeper/wiring/runtime.py" in compiled
    assert {Path(path).parent for path in compiled} == {opt_python / "topokeeper" / "wiring"}  # where bytecode went
    assert "could not create" in verbose  # read-only: what it compiled is lost with the process
