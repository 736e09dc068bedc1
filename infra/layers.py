"""The Lambda layers: Powertools from the AWS-managed public layer, and our core layer built locally.

The core layer is built without Docker: ``python/topokeeper/`` copied from layers/core, plus the pinned
pure-Python wheels of layers/core/requirements.txt installed for the Lambda platform. The build is
content-stamped, so a synth with unchanged inputs reuses ``.build/layers/core`` and needs no network.

botocore's data keeps only the services the functions call (``LAMBDA_SERVICES``), not its 400-odd others.
The layer ships no bytecode: Lambda's ``/opt`` is read-only, so each cold start compiles what it imports. Bytecode
would have to come from the runtime's own Python (3.14, ``UNCHECKED_HASH``: CDK zips files with a fixed mtime);
this machine has no 3.14 outside a root-only chroot, and a synth must not need root.

Where AWS publishes no Powertools layer (its SSM parameter is missing: GovCloud, China, newer regions), the
context switch ``"topokeeper:bundle-powertools": true`` puts Powertools and pydantic
(layers/core/requirements-powertools.txt) into the core layer instead, and the functions get that one layer.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.constants import (
    ARCHITECTURE,
    BUILD_DIR,
    CORE_LAYER_SOURCE,
    POWERTOOLS_LAYER_PARAMETER,
    PYTHON_VERSION,
    RUNTIME,
)

PACKAGE = "topokeeper"
BUNDLE_POWERTOOLS_CONTEXT = "topokeeper:bundle-powertools"
POWERTOOLS_REQUIREMENTS = "requirements-powertools.txt"
_PLATFORM = "manylinux2014_aarch64"
# What only an operator's machine runs (the CLI, its file handling, the install-script generator, the
# simulator, the Kueue commands and label checks (the EKS reconcile runs the rest of topokeeper.kueue), the
# deployment view and stack spec the CLI, the stack and the simulator share),
# relative to the package; the layer ships the rest. The applier and the agent stay: the SSM channel sends the
# applier and the agent is its peer.
OPERATOR_ONLY = frozenset(
    {
        "cli.py", "operator_commands.py", "operator_files.py", "kueue_commands.py", "sim", "narrate.py",
        "kueue/annotations.py", "kueue/drift.py",
        "deployment.py", "stack_spec.py", "agent/install.py", "py.typed", "adapters/secrets.py",
        "login/commands.py", "readonly_commands.py",
    }
)  # fmt: skip


# The AWS services the functions call (topokeeper.runtime and the adapters); botocore's and boto3's data for
# every other service is dropped. tests/infra/test_layer_contents.py checks the layer's client() calls
# against it and the handler-asset test builds each function's clients from the trimmed layer.
LAMBDA_SERVICES = frozenset(
    {"cloudtrail-data", "dynamodb", "ec2", "elbv2", "events", "kms", "s3", "sagemaker", "sqs", "ssm", "sts"}
)


def _ships(relative: Path) -> bool:
    return not {relative.as_posix(), relative.parts[0]} & OPERATOR_ONLY


def layer_package_files(source: Path = CORE_LAYER_SOURCE) -> list[Path]:
    """The package files the layer ships, relative to the package directory."""
    package = source / "python" / PACKAGE
    return sorted(
        path.relative_to(package)
        for path in package.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.suffix != ".pyc"
        and _ships(path.relative_to(package))
    )


def _requirements(source: Path, powertools: bool) -> list[Path]:
    return [source / "requirements.txt", *([source / POWERTOOLS_REQUIREMENTS] if powertools else [])]


def _inputs_digest(source: Path, powertools: bool) -> str:
    digest = hashlib.sha256(f"{_PLATFORM} {PYTHON_VERSION} {sorted(LAMBDA_SERVICES)}\n".encode())
    package = source / "python" / PACKAGE
    requirements = _requirements(source, powertools)
    for path in [*requirements, *(package / relative for relative in layer_package_files(source))]:
        digest.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_core_layer(source: Path = CORE_LAYER_SOURCE, out: Path | None = None, *, powertools: bool = False) -> Path:
    """Build (or reuse) the core layer directory and return it; ``powertools``: with Powertools inside."""
    out = out or BUILD_DIR / "layers" / ("core-powertools" if powertools else "core")
    stamp = out.with_name(out.name + ".sha256")
    digest = _inputs_digest(source, powertools)
    if out.is_dir() and stamp.is_file() and stamp.read_text() == digest:
        return out
    staging = out.with_name(out.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    target = staging / "python"
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--target", str(target), "--no-deps", "--no-compile",
            "--platform", _PLATFORM, "--python-version", PYTHON_VERSION, "--implementation", "cp",
            "--only-binary=:all:",
            *(argument for path in _requirements(source, powertools) for argument in ("--requirement", str(path))),
        ],
        check=True,
    )  # fmt: skip
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts are of no use in a layer
    for data in (target / "botocore" / "data", target / "boto3" / "data"):
        for service in data.iterdir():
            if service.is_dir() and service.name not in LAMBDA_SERVICES:
                shutil.rmtree(service)
    for relative in layer_package_files(source):
        (target / PACKAGE / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / "python" / PACKAGE / relative, target / PACKAGE / relative)
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
