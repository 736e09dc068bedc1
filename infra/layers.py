"""The Lambda layers: Powertools from the AWS-managed public layer, and our core layer built locally.

The core layer is built without Docker: ``python/topokeeper/`` copied from layers/core, plus the pinned
pure-Python wheels of layers/core/requirements.txt installed for the Lambda platform. The build is
content-stamped, so a synth with unchanged inputs reuses ``.build/layers/core`` and needs no network.
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
_PLATFORM = "manylinux2014_aarch64"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


def _package_files(source: Path) -> list[Path]:
    return sorted(
        path
        for path in (source / "python" / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


def _inputs_digest(source: Path) -> str:
    digest = hashlib.sha256(f"{_PLATFORM} {PYTHON_VERSION}\n".encode())
    for path in [source / "requirements.txt", *_package_files(source)]:
        digest.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_core_layer(source: Path = CORE_LAYER_SOURCE, out: Path = BUILD_DIR / "layers" / "core") -> Path:
    """Build (or reuse) the core layer directory and return it."""
    stamp = out.with_name(out.name + ".sha256")
    digest = _inputs_digest(source)
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
            "--only-binary=:all:", "--requirement", str(source / "requirements.txt"),
        ],
        check=True,
    )  # fmt: skip
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts are of no use in a layer
    shutil.copytree(source / "python" / PACKAGE, target / PACKAGE, ignore=_SKIP)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    stamp.write_text(digest)
    return out


class Layers(Construct):
    """The two layers every function uses: Powertools, then ours (whose boto3 must win)."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        powertools_arn = ssm.StringParameter.value_for_string_parameter(self, POWERTOOLS_LAYER_PARAMETER)
        self.powertools = lambda_.LayerVersion.from_layer_version_arn(self, "Powertools", powertools_arn)
        # Lambda unpacks layers in order, a later one overwriting an earlier one's files; CDK sorts a
        # function's layers by construct path (recognizeLayerVersion), so this id keeps ours last.
        self.core = lambda_.LayerVersion(
            self,
            "TopokeeperCore",
            code=lambda_.Code.from_asset(str(build_core_layer())),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="topokeeper package with a current boto3",
        )

    @property
    def all(self) -> list[lambda_.ILayerVersion]:
        return [self.powertools, self.core]
