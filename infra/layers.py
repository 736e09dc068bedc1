"""The Lambda layers: Powertools from the AWS-managed public layer, and our core layer built locally.

The core layer is built without Docker: of ``python/topokeeper/`` in layers/core, what the four handlers import
(read from the sources, lazy imports included: ``infra.import_closure``) and the data files they read, plus the
pinned pure-Python wheels of layers/core/requirements.txt installed for the Lambda platform. The build is
content-stamped, so a synth with unchanged inputs reuses ``.build/layers/core`` and needs no network.

botocore's data keeps only the services the functions call (``LAMBDA_SERVICES``), not its 400-odd others, and of
each only the API version botocore loads (the newest) without its documentation examples.

The layer ships bytecode: Lambda's ``/opt`` is read-only, so without it every cold start compiles what it imports.
The ``.pyc`` must come from the runtime's own Python version (``PYTHON_VERSION``) and be ``UNCHECKED_HASH``: CDK zips
files with a fixed mtime, so a timestamp ``.pyc`` would be stale. ``find_layer_python`` picks the interpreter:
``$TOPOKEEPER_LAYER_PYTHON`` (a path, or ``none``), else ``python3.14`` on PATH, else Debian's python3.14 in the
real-Slurm sid chroot the slurm tests build (run through the chroot's own loader: no root, no chroot). Without one
the layer ships no bytecode and the build warns once; a synth never needs root. The build's stamp names the
compiling Python, so the layer is rebuilt when one appears.

Where AWS publishes no Powertools layer (its SSM parameter is missing: GovCloud, China, newer regions), the
context switch ``"topokeeper:bundle-powertools": true`` puts Powertools and pydantic
(layers/core/requirements-powertools.txt) into the core layer instead, and the functions get that one layer.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.constants import (
    ARCHITECTURE,
    BUILD_DIR,
    CORE_LAYER_SOURCE,
    FUNCTIONS_DIR,
    HANDLER,
    POWERTOOLS_LAYER_PARAMETER,
    PYTHON_VERSION,
    RUNTIME,
)
from infra.import_closure import import_closure
from topokeeper.contract.errors import InputError
from topokeeper.contract.head_node_program import source_paths

PACKAGE = "topokeeper"
# Each function's entry point, functions/<name>/handler.py: the layer ships what these import.
HANDLER_FILE = HANDLER.rpartition(".")[0] + ".py"
BUNDLE_POWERTOOLS_CONTEXT = "topokeeper:bundle-powertools"
POWERTOOLS_REQUIREMENTS = "requirements-powertools.txt"
_PLATFORM = "manylinux2014_aarch64"


# The AWS services the functions call (topokeeper.wiring.runtime and the adapters); botocore's and boto3's data for
# every other service is dropped. tests/infra/test_layer_contents.py checks the layer's client() calls
# against it and the handler-asset test builds each function's clients from the trimmed layer.
LAMBDA_SERVICES = frozenset(
    {"cloudtrail-data", "dynamodb", "ec2", "elbv2", "events", "kms", "s3", "sagemaker", "sqs", "ssm", "sts"}
)


def layer_data_files() -> list[Path]:
    """What the functions read as data, relative to the package directory: the sources of the head-node program
    the SSM channel builds and sends, and the script it installs on login nodes."""
    return [*(Path(path) for path in source_paths()), Path("login/install_host_identity.sh")]


def layer_package_files(source: Path = CORE_LAYER_SOURCE, functions: Path = FUNCTIONS_DIR) -> list[Path]:
    """The package files the layer ships, relative to the package directory: what the handlers import (an
    allow-list, so an operator-only module never rides along) and the data files they read."""
    handlers = sorted(functions.glob(f"*/{HANDLER_FILE}"))
    modules = import_closure(handlers, source / "python", PACKAGE)
    data = layer_data_files()
    missing = [path.as_posix() for path in data if not (source / "python" / PACKAGE / path).is_file()]
    if missing:
        raise FileNotFoundError(f"the layer's data files are missing from {source}: {', '.join(missing)}")
    return sorted({*modules, *data})


def _requirements(source: Path, powertools: bool) -> list[Path]:
    return [source / "requirements.txt", *([source / POWERTOOLS_REQUIREMENTS] if powertools else [])]


LAYER_PYTHON_ENV = "TOPOKEEPER_LAYER_PYTHON"
# Where the slurm tests keep their chroots: topokeeper.sim.slurm_chroot.cache_root() (only root builds them;
# tests/infra/test_layer_bytecode.py checks the two agree).
CHROOT_CACHE_ENV = "TOPOKEEPER_CHROOT_CACHE"
ROOT_CHROOT_CACHE = Path("/var/cache/topokeeper/chroots")
# Lambda puts a layer's python/ at /opt/python: the bytecode names its sources there, whatever built it.
LAMBDA_LAYER_PYTHON = "/opt/python"


class LayerWithoutBytecode(UserWarning):
    """No interpreter of the runtime's Python version was found: the layer ships without bytecode."""


@dataclass(frozen=True)
class LayerPython:
    """An interpreter of the runtime's Python version: the command that starts it and its full version."""

    command: tuple[str, ...]
    version: str  # "3.14.10"

    def run(self, *argv: str, environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        # -S: no site; the environment is given whole, so nothing of this process's PYTHON* leaks in.
        environment = {"PATH": os.environ.get("PATH", os.defpath), **(environment or {})}
        return subprocess.run(
            [*self.command, "-S", *argv], env=environment, capture_output=True, text=True, check=False
        )


def chroot_python(root: Path) -> tuple[str, ...] | None:
    """The command that runs a Debian chroot's python without entering it (its own loader and libraries), or
    None when there is no chroot at ``root``."""
    multiarch = f"{platform.machine()}-linux-gnu"
    loaders = sorted((root / "lib64").glob("ld-linux*.so*")) + sorted((root / "lib").glob("ld-linux*.so*"))
    if not loaders:
        return None
    libraries = f"{root}/lib/{multiarch}:{root}/usr/lib/{multiarch}"
    return (str(loaders[0]), "--library-path", libraries, str(root / "usr" / "bin" / f"python{PYTHON_VERSION}"))


def _probe(command: tuple[str, ...]) -> LayerPython | None:
    try:
        ran = LayerPython(command, "").run("-c", "import sys; print(sys.version.split()[0])")
    except OSError:
        return None
    version = ran.stdout.strip()
    return LayerPython(command, version) if ran.returncode == 0 and version.startswith(f"{PYTHON_VERSION}.") else None


def find_layer_python(environ: dict[str, str] | None = None) -> LayerPython | None:
    """The interpreter that compiles the layer's bytecode: ``$TOPOKEEPER_LAYER_PYTHON`` (``none``: no bytecode),
    else python3.14 on PATH, else the sid chroot's; None (with one warning) when there is none."""
    environ = dict(os.environ) if environ is None else environ
    configured = environ.get(LAYER_PYTHON_ENV, "").strip()
    if configured.lower() == "none":
        return None
    if configured:
        found = _probe((configured,))
        if found is None:
            raise InputError(LAYER_PYTHON_ENV, f"{configured!r} does not run as a Python {PYTHON_VERSION} interpreter")
        return found
    on_path = shutil.which(f"python{PYTHON_VERSION}", path=environ.get("PATH", os.defpath))
    in_chroot = chroot_python(Path(environ.get(CHROOT_CACHE_ENV) or ROOT_CHROOT_CACHE) / "sid")
    for command in (on_path and (on_path,), in_chroot):
        if command and (found := _probe(command)) is not None:
            return found
    warnings.warn(
        LayerWithoutBytecode(
            f"no Python {PYTHON_VERSION} found (set {LAYER_PYTHON_ENV}, put python{PYTHON_VERSION} on PATH, or build "
            "the sid chroot: make slurm): the core layer ships without bytecode, so every cold start compiles it"
        ),
        stacklevel=2,
    )
    return None


def compile_bytecode(python: LayerPython, directory: Path) -> None:
    """Compile every module under ``directory`` (a layer's python/) as the runtime loads it: optimization 0,
    ``UNCHECKED_HASH``, source paths under /opt/python. A fixed hash seed keeps set constants in one order."""
    ran = python.run(
        "-m", "compileall", "-q", "-o", "0", "--invalidation-mode", "unchecked-hash",
        "-s", str(directory), "-p", LAMBDA_LAYER_PYTHON, str(directory),
        environment={"PYTHONHASHSEED": "0"},
    )  # fmt: skip
    if ran.returncode != 0:
        raise RuntimeError(f"compiling {directory} with Python {python.version} failed: {ran.stdout}{ran.stderr}")


def install_wheels(requirements: list[Path], target: Path, platform_tag: str = _PLATFORM) -> None:
    """The pinned wheels of ``requirements`` for the runtime's Python on ``platform_tag``, into ``target``."""
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--target", str(target), "--no-deps", "--no-compile",
            "--platform", platform_tag, "--python-version", PYTHON_VERSION, "--implementation", "cp",
            "--only-binary=:all:",
            *(argument for path in requirements for argument in ("--requirement", str(path))),
        ],
        check=True,
    )  # fmt: skip


def _inputs_digest(source: Path, powertools: bool, python: LayerPython | None) -> str:
    bytecode = python.version if python else "none"
    digest = hashlib.sha256(f"{_PLATFORM} {PYTHON_VERSION} {sorted(LAMBDA_SERVICES)} bytecode {bytecode}\n".encode())
    package = source / "python" / PACKAGE
    requirements = _requirements(source, powertools)
    for path in [*requirements, *(package / relative for relative in layer_package_files(source))]:
        digest.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _trim_sdk_data(target: Path) -> None:
    """Keep the data of ``LAMBDA_SERVICES`` only, of each the newest API version (the one the SDK loads), and
    no documentation examples."""
    for data in (target / "botocore" / "data", target / "boto3" / "data"):
        for service in data.iterdir():
            if not service.is_dir():
                continue
            if service.name not in LAMBDA_SERVICES:
                shutil.rmtree(service)
                continue
            for older in sorted(version for version in service.iterdir() if version.is_dir())[:-1]:
                shutil.rmtree(older)
        for examples in data.glob("*/*/examples-1.json"):
            examples.unlink()


def build_core_layer(source: Path = CORE_LAYER_SOURCE, out: Path | None = None, *, powertools: bool = False) -> Path:
    """Build (or reuse) the core layer directory and return it; ``powertools``: with Powertools inside."""
    out = out or BUILD_DIR / "layers" / ("core-powertools" if powertools else "core")
    stamp = out.with_name(out.name + ".sha256")
    python = find_layer_python()
    digest = _inputs_digest(source, powertools, python)
    if out.is_dir() and stamp.is_file() and stamp.read_text() == digest:
        return out
    staging = out.with_name(out.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    target = staging / "python"
    install_wheels(_requirements(source, powertools), target)
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts are of no use in a layer
    _trim_sdk_data(target)
    for relative in layer_package_files(source):
        (target / PACKAGE / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / "python" / PACKAGE / relative, target / PACKAGE / relative)
    if python is not None:
        compile_bytecode(python, target)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    stamp.write_text(digest)
    return out


class Layers(Construct):
    """The two layers every function uses: Powertools, then ours (whose boto3 must win); or ours alone, with
    Powertools inside, when the context bundles it."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        # -c topokeeper:bundle-powertools=true gives the string; cdk.json gives the boolean.
        self.bundles_powertools = str(self.node.try_get_context(BUNDLE_POWERTOOLS_CONTEXT)).lower() == "true"
        self.powertools: lambda_.ILayerVersion | None = None
        if not self.bundles_powertools:
            powertools_arn = ssm.StringParameter.value_for_string_parameter(self, POWERTOOLS_LAYER_PARAMETER)
            self.powertools = lambda_.LayerVersion.from_layer_version_arn(self, "Powertools", powertools_arn)
        # Lambda unpacks layers in order, a later one overwriting an earlier one's files; CDK sorts a
        # function's layers by construct path (recognizeLayerVersion), so this id keeps ours last.
        self.core = lambda_.LayerVersion(
            self,
            "TopokeeperCore",
            code=lambda_.Code.from_asset(str(build_core_layer(powertools=self.bundles_powertools))),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="topokeeper package with a current boto3"
            + (" and Powertools" if self.bundles_powertools else ""),
        )

    @property
    def all(self) -> list[lambda_.ILayerVersion]:
        return [self.powertools, self.core] if self.powertools is not None else [self.core]
