"""`topokeeper simulate` ended by a signal stops what it started: its slurmctld, the namespace that holds its
mounts, and its use of the chroot's /proc (before, SIGTERM left slurmctld running and /proc mounted for good)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.installed_command import TOPOKEEPER, block_buffered_environment
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE
from topokeeper.sim.slurm_chroot import SUITE_FOR_FORMAT, ensure_chroot

pytestmark = pytest.mark.slurm

# A day of simulated time: the run is still playing (about 80 s of it) when the signal comes.
SCENARIO = """
cluster:
  name: sigterm
  slurm_version: "26.05"
  instance_groups:
    - {name: controller, type: ml.m5.xlarge, count: 1, role: controller}
    - {name: cpu, type: ml.c6i.4xlarge, count: 4, partition: cpu}
steps:
  - wait: {seconds: 86400}
"""


def _processes(match: Callable[[int], bool]) -> set[int]:
    """Live (not zombie) processes ``match`` accepts."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z" and match(int(entry)):
                    found.add(int(entry))
    return found


def _in_root(root: Path, needle: str) -> Callable[[int], bool]:
    """A process chrooted into ``root`` whose command line holds ``needle``."""

    def match(pid: int) -> bool:
        return os.readlink(f"/proc/{pid}/root") == str(root) and needle in Path(f"/proc/{pid}/cmdline").read_text()

    return match


def _in_namespace(namespace: str) -> Callable[[int], bool]:
    return lambda pid: os.readlink(f"/proc/{pid}/ns/mnt") == namespace


def _mounts_under(root: Path) -> list[str]:
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return sorted(p for p in points if p == str(root) or p.startswith(f"{root}/"))


def _proc_users(root: Path) -> int:
    counter = root.parent / f"{root.name}.proc-users"
    return int(counter.read_text() or 0) if counter.exists() else 0


def _wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_simulation_ended_by_a_signal_stops_its_slurmctld_and_releases_the_chroot(
    tmp_path: Path, number: signal.Signals
) -> None:
    root = ensure_chroot(SUITE_FOR_FORMAT["topology.yaml"]).resolve()
    mounts_before, users_before = _mounts_under(root), _proc_users(root)
    scenario = tmp_path / "sigterm.yaml"
    scenario.write_text(SCENARIO)
    story = tmp_path / "story.txt"
    with story.open("w") as stderr:
        simulation = subprocess.Popen(
            [TOPOKEEPER, "simulate", "--scenario", str(scenario), "--out", str(tmp_path / "out")],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=block_buffered_environment(**{HEAD_NODE_VARIABLE: "chroot"}),
            start_new_session=True,
        )
    # The controller's directory ends in the simulation's pid: what this run started, and nothing else.
    ours = _in_root(root, f"-{simulation.pid}/etc/slurm.conf")
    namespace = ""
    try:
        _wait_for(lambda: _processes(ours), 120, "slurmctld of this run")
        namespace = os.readlink(f"/proc/{min(_processes(ours))}/ns/mnt")
        _wait_for(lambda: "drift" in story.read_text(), 120, "drift check (the story playing)")
        simulation.send_signal(number)
        code = simulation.wait(timeout=90)
        assert code == 128 + number, f"ended by the signal itself ({code}), not by its own stop: {story.read_text()}"
        assert _processes(ours) == set()
        assert _processes(_in_namespace(namespace)) == set(), "the controller's namespace (and its mounts) lives on"
        assert _mounts_under(root) == mounts_before and _proc_users(root) == users_before
        assert not list((root / "topokeeper").glob(f"*-{simulation.pid}"))
        assert "Traceback" not in story.read_text(), story.read_text()
    finally:
        # A failure leaves nothing running: what this run started, by pid.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(simulation.pid, signal.SIGKILL)
        simulation.wait()
        leftovers = _processes(ours) | (_processes(_in_namespace(namespace)) if namespace else set())
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
