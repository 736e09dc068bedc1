"""The core layer carries only what runs in Lambda: no simulator, CLI or operator commands.

The list is written out in full on purpose: a new module lands in the layer only when someone adds it here,
so an operator-only module (or a new package) cannot slip into every function unnoticed. Whether the layer
ships bytecode depends on the Python 3.14 this machine has: tests/infra/test_layer_bytecode.py builds the sid
chroot first and checks the bytecode; here, a build that finds none ships none.
"""

from __future__ import annotations

import ast
import importlib.util
import warnings
from pathlib import Path

import pytest

from infra.constants import CORE_LAYER_SOURCE, PYTHON_VERSION
from infra.layers import (
    CHROOT_CACHE_ENV,
    LAMBDA_SERVICES,
    LAYER_PYTHON_ENV,
    PACKAGE,
    LayerWithoutBytecode,
    build_core_layer,
    find_layer_python,
    layer_package_files,
)

pytestmark = pytest.mark.infra

LAMBDA_MODULES = [
    "__init__.py",
    "adapters/__init__.py",
    "adapters/agent_channel.py",
    "adapters/audit_trail.py",
    "adapters/aws.py",
    "adapters/dynamodb.py",
    "adapters/ec2.py",
    "adapters/elbv2.py",
    "adapters/hyperpod.py",
    "adapters/kms.py",
    "adapters/login_nodes.py",
    "adapters/login_run_command.py",
    "adapters/metrics.py",
    "adapters/plans.py",
    "adapters/queue.py",
    "adapters/ssm_channel.py",
    "agent/__init__.py",
    "agent/agent.py",
    "applier/__init__.py",
    "applier/applier.py",
    "contract/__init__.py",
    "contract/config.py",
    "contract/constants.py",
    "contract/errors.py",
    "contract/event_schemas.py",
    "contract/ports.py",
    "domain/__init__.py",
    "domain/catalog.py",
    "domain/hostlist.py",
    "domain/models.py",
    "domain/names.py",
    "engine/__init__.py",
    "engine/block.py",
    "engine/planner.py",
    "engine/snapshot.py",
    "engine/tree.py",
    "kueue/__init__.py",
    "kueue/fleet.py",
    "kueue/node_list.py",
    "kueue/objects.py",
    "kueue/publication.py",
    "login/__init__.py",
    "login/host_keys.py",
    "login/install.py",
    "login/install_host_identity.sh",
    "render/__init__.py",
    "render/bundle.py",
    "render/mermaid.py",
    "render/slurm_conf.py",
    "render/slurm_yaml.py",
    "service/__init__.py",
    "service/audit.py",
    "service/controller.py",
    "service/drift.py",
    "service/eks.py",
    "service/ingest.py",
    "service/live.py",
    "service/login.py",
    "service/orchestrators.py",
    "service/reconcile.py",
    "service/result.py",
    "service/signing.py",
    "service/state.py",
    "wiring/__init__.py",
    "wiring/fifo_batch.py",
    "wiring/lambda_init.py",
    "wiring/login_sync.py",
    "wiring/runtime.py",
]
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


def test_the_layer_selects_exactly_the_modules_lambda_runs() -> None:
    assert [path.as_posix() for path in layer_package_files()] == LAMBDA_MODULES


def test_the_built_layer_holds_those_modules_and_the_pinned_wheels_only() -> None:
    python = build_core_layer() / "python"

    assert files_under(python / PACKAGE) == LAMBDA_MODULES
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
    assert files_under(python / PACKAGE) == LAMBDA_MODULES
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
