"""The installed ``topokeeper`` command, run as a script or a shell runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TOPOKEEPER = str(Path(sys.executable).with_name("topokeeper"))


def block_buffered_environment(**extra: str) -> dict[str, str]:
    """This process's environment without ``PYTHONUNBUFFERED`` (this machine sets it, a user's shell need not): a
    child's output into a pipe or a file is block-buffered, as a user's is, so what an exit fails to flush is lost."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"} | extra


def run_installed(
    *argv: str, stdout: Any = subprocess.PIPE, environment: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``topokeeper ARGV`` with block-buffered output, into a pipe unless ``stdout`` says otherwise."""
    return subprocess.run(
        [TOPOKEEPER, *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        env=environment or block_buffered_environment(),
    )
