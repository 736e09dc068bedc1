"""The layers as Lambda's Python loads them, for the bytecode test and bench/lambda_cold_start.py.

Lambda unzips a layer's ``python/`` to ``/opt/python`` (read-only), every file dated as CDK zipped it
(1980-01-01, yazl's DOS timestamp, read as UTC). Production functions also get the AWS-managed Powertools layer;
its stand-in here is the pinned requirements-powertools.txt, wheels for this machine and the runtime's Python.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.constants import BUILD_DIR, CORE_LAYER_SOURCE, PYTHON_VERSION
from infra.layers import POWERTOOLS_REQUIREMENTS, LayerPython, compile_bytecode, install_wheels

CDK_ZIP_MTIME = 315532800  # 1980-01-01T00:00:00Z
POWERTOOLS_FOR_THIS_MACHINE = BUILD_DIR / f"powertools-standin-{PYTHON_VERSION}-{platform.machine()}"


def powertools_standin(python: LayerPython | None = None) -> Path:
    """Powertools and pydantic as pinned, for the runtime's Python on this machine; compiled by ``python`` if
    given (as if the managed layer shipped bytecode). Installed once per pin set and compiler."""
    requirements = CORE_LAYER_SOURCE / POWERTOOLS_REQUIREMENTS
    out = POWERTOOLS_FOR_THIS_MACHINE.with_name(POWERTOOLS_FOR_THIS_MACHINE.name + ("-pyc" if python else ""))
    stamp = out.with_name(out.name + ".stamp")
    wanted = f"{requirements.read_text()}\nbytecode {python.version if python else 'none'}\n"
    if not (out.is_dir() and stamp.is_file() and stamp.read_text() == wanted):
        shutil.rmtree(out, ignore_errors=True)
        install_wheels([requirements], out, platform_tag=f"manylinux2014_{platform.machine()}")
        if python is not None:
            compile_bytecode(python, out)
        stamp.write_text(wanted)
    return out


def copy_as_unzipped(layer_python: Path, to: Path) -> Path:
    """A copy of a layer's ``python/`` with CDK's zip date on every file, as Lambda unpacks it."""
    shutil.copytree(layer_python, to)
    for path in [to, *to.rglob("*")]:
        os.utime(path, (CDK_ZIP_MTIME, CDK_ZIP_MTIME))
    return to


@contextmanager
def read_only(directory: Path, at: Path) -> Iterator[Path]:
    """``directory`` bind-mounted read-only at ``at`` (needs root: file modes do not stop root from writing)."""
    at.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(directory), str(at)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(at)], check=True)
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=True)
