"""The core layer carries only what runs in Lambda: no simulator, CLI or operator commands.

infra/layers.py computes the layer from the handlers' imports (infra.import_closure reads the sources); here
the standard library's modulefinder, which reads the compiled bytecode, must find the same modules, and the
modules the functions load by a computed name must be among them. Whether the layer ships bytecode depends on
the Python 3.14 this machine has: tests/infra/test_layer_bytecode.py builds the sid chroot first and checks the
bytecode; here, a build that finds none ships none.
"""

from __future__ import annotations

import ast
import importlib.util
import modulefinder
import warnings
from pathlib import Path

import pytest

from infra.constants import CORE_LAYER_SOURCE, FUNCTIONS_DIR, PYTHON_VERSION
from infra.import_closure import module_file
from infra.layers import (
    CHROOT_CACHE_ENV,
    LAMBDA_SERVICES,
    LAYER_PYTHON_ENV,
    PACKAGE,
    LayerWithoutBytecode,
    build_core_layer,
    find_layer_python,
    layer_data_files,
    layer_package_files,
)
from topokeeper.contract.head_node_program import source_paths
from topokeeper.wiring.login_sync import LOGIN_MODULES
from topokeeper.wiring.runtime import FUNCTION_ADAPTERS

pytestmark = pytest.mark.infra

# What only an operator's machine runs: if a handler's imports ever reach one of these, the layer grows by it.
OPERATOR_ONLY = ("sim/", "cli", "operator_commands.py", "narrate.py", "agent_install.py", "py.typed")
# The pinned wheels of layers/core/requirements.txt, each with its metadata.
THIRD_PARTY = {
    "boto3", "boto3-1.44.8.dist-info", "botocore", "botocore-1.44.8.dist-info", "dateutil",
    "python_dateutil-2.9.0.post0.dist-info", "jmespath", "jmespath-1.1.0.dist-info", "s3transfer",
    "s3transfer-0.19.3.dist-info", "six.py", "six-1.17.0.dist-info", "urllib3", "urllib3-2.8.0.dist-info",
}  # fmt: skip


def files_under(root: Path) -> list[str]:
    """The files under ``root``, bytecode aside."""
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )


def bytecode_of(source: Path) -> Path:
    """Where the runtime's Python looks for a module's bytecode (``__pycache__/x.cpython-314.pyc``)."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    return cached.with_name(f"{source.stem}.cpython-{PYTHON_VERSION.replace('.', '')}.pyc")


def bytecode_problems(python: Path) -> list[str]:
    """What keeps a layer's bytecode from serving the runtime: a module without it, or bytecode that is not
    hash-based and unchecked (flags 0b01, PEP 552) or that no module has."""
    sources = sorted(python.rglob("*.py"))
    expected = {bytecode_of(source) for source in sources}
    problems = [f"{source}: no bytecode" for source in sources if not bytecode_of(source).is_file()]
    for pyc in sorted(python.rglob("*.pyc")):
        if pyc not in expected:
            problems.append(f"{pyc}: of no module")
        elif int.from_bytes(pyc.read_bytes()[4:8], "little") != 0b01:
            problems.append(f"{pyc}: not unchecked-hash")
    return problems


def lambda_modules() -> list[str]:
    """The package files the layer ships, as paths under topokeeper/."""
    return [path.as_posix() for path in layer_package_files()]


def modulefinder_modules() -> set[str]:
    """The package's modules the handlers import, as the standard library's modulefinder finds them (from the
    bytecode, imports inside functions included)."""
    python = (CORE_LAYER_SOURCE / "python").resolve()
    found = set()
    for handler in sorted(FUNCTIONS_DIR.glob("*/handler.py")):
        finder = modulefinder.ModuleFinder(path=[str(python)])
        finder.run_script(str(handler))
        found |= {
            Path(module.__file__).relative_to(python / PACKAGE).as_posix()
            for name, module in finder.modules.items()
            if name.split(".")[0] == PACKAGE and module.__file__
        }
    return found


def test_the_layer_is_what_the_handlers_import_and_the_files_they_read() -> None:
    shipped = lambda_modules()
    data = {path.as_posix() for path in layer_data_files()}
    assert shipped == sorted(set(shipped))  # one order: the build and its content stamp read it
    assert set(shipped) == modulefinder_modules() | data
    assert [path for path in shipped if path.startswith(OPERATOR_ONLY)] == []
    # Loaded by importlib.import_module at init: each must also be imported by name where it is used.
    computed = {f"topokeeper.adapters.{name}" for names in FUNCTION_ADAPTERS.values() for name in names}
    for module in sorted(computed | set(LOGIN_MODULES)):
        assert module_file(CORE_LAYER_SOURCE / "python", module, PACKAGE) is not None, module
        assert module.removeprefix("topokeeper.").replace(".", "/") + ".py" in shipped, module


def test_the_built_layer_holds_those_modules_and_the_pinned_wheels_only() -> None:
    python = build_core_layer() / "python"

    assert files_under(python / PACKAGE) == lambda_modules()
    assert {entry.name for entry in python.iterdir()} - {"__pycache__"} == {PACKAGE, *THIRD_PARTY}
    data = python / "botocore" / "data"
    assert {service.name for service in data.iterdir() if service.is_dir()} == LAMBDA_SERVICES
    # of each service the API version botocore loads (the newest), without documentation examples
    assert [version.name for version in (data / "ec2").iterdir() if version.is_dir()] == ["2016-11-15"]
    assert all(len([v for v in service.iterdir() if v.is_dir()]) == 1 for service in data.iterdir() if service.is_dir())
    assert not list(data.rglob("examples-1.json"))


def test_without_python_3_14_the_layer_ships_no_bytecode_and_the_build_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LAYER_PYTHON_ENV, raising=False)
    monkeypatch.setenv(CHROOT_CACHE_ENV, str(tmp_path / "no-chroots"))
    monkeypatch.setenv("PATH", "/nonexistent")  # no python3.14 on it

    with pytest.warns(LayerWithoutBytecode) as warned:
        python = build_core_layer(out=tmp_path / "core") / "python"

    assert len(warned) == 1
    assert "without bytecode" in str(warned[0].message)
    assert files_under(python / PACKAGE) == lambda_modules()
    assert not list(python.rglob("__pycache__"))
    assert not list(python.rglob("*.pyc"))


def test_a_named_interpreter_that_is_not_python_3_14_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"^{LAYER_PYTHON_ENV}: '/bin/true' does not run as a Python 3.14"):
        find_layer_python({LAYER_PYTHON_ENV: "/bin/true"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_layer_python({LAYER_PYTHON_ENV: "none"}) is None  # asked for: no bytecode, no warning


def _clients_created(source: str) -> set[str]:
    """The services named in ``client("...")`` calls (topokeeper.adapters.aws.client, one per service)."""
    return {
        call.args[0].value
        for call in ast.walk(ast.parse(source))
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "client"
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    }


def test_the_trimmed_botocore_knows_every_service_the_layer_calls() -> None:
    package = CORE_LAYER_SOURCE / "python" / PACKAGE
    called = set().union(
        *(_clients_created((package / path).read_text()) for path in layer_package_files() if path.suffix == ".py")
    )
    assert called == LAMBDA_SERVICES  # none missing, none kept for nothing


def test_the_layer_ships_every_source_of_the_head_node_program() -> None:
    """The SSM channel builds the program in the Lambda from these files: each must be in the layer."""
    shipped = {str(path) for path in layer_package_files()}
    assert set(source_paths()) <= shipped
