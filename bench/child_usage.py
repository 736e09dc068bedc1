"""A bench's measured child process: its wall time, CPU time and peak RSS, from wait4."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# A lean parent for the measured process: a child's peak RSS counts what it had before exec, so forking this
# bench (hundreds of MB with a 20,000-node plan in memory) would inflate it.
_RUSAGE_OF_CHILD = (
    "import json, os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "with open(sys.argv[1], 'w') as out:\n"
    "    json.dump([os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, usage.ru_maxrss], out)\n"
)


def wait_measured(argv: list[str], environment: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """Run ``argv``; its wall time, CPU time and peak RSS (its own and its waited-for children's: wait4), and
    its stdout."""
    with tempfile.TemporaryDirectory() as scratch:
        usage_file = Path(scratch) / "usage.json"
        started = time.monotonic()
        ran = subprocess.run(
            [sys.executable, "-S", "-c", _RUSAGE_OF_CHILD, str(usage_file), *argv],
            env=environment, capture_output=True, text=True, check=False,
        )  # fmt: skip
        wall = time.monotonic() - started
        exit_code, cpu, max_rss_kb = json.loads(usage_file.read_text())
    if exit_code != 0:
        raise RuntimeError(f"{argv[:3]} exited {exit_code}: {ran.stderr[-2000:]}")
    return {"seconds": wall, "cpu": cpu, "max_rss_mb": max_rss_kb / 1024}, ran.stdout
