"""Real slurmctld in Debian chroots: sid (26.05, topology.yaml) and trixie (24.11, topology.conf), and
Slurm 25.11 (topology.yaml, ParallelCluster's series) built from ``../shared/slurm/`` in a trixie chroot.

The chroots are built on first use into a cache outside the clone (see topokeeper.sim.slurm_chroot and
topokeeper.sim.slurm_source). These tests never skip, but for one reason: on a machine without the 25.11
source the 25.11 tier is skipped, and the terminal summary says plainly that it did not run.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from topokeeper.sim.slurm_chroot import SlurmController, ensure_chroot, proc_mounted
from topokeeper.sim.slurm_source import ensure_source_chroot, source_tarball
from topokeeper.sim.slurmd_nodes import ensure_slurmd_chroot

_counter = itertools.count()
TIER_2511_NOT_RUN = "Slurm 25.11 tier did not run"
# Only a run that says so may skip the 25.11 tier (a skipped test proves nothing): elsewhere, CI included, a missing
# source fails the tests that need it.
ALLOW_MISSING_2511 = "TOPOKEEPER_ALLOW_MISSING_SLURM_SOURCE"
# Slurm versions that read topology.yaml, and the fixture giving each one's chroot.
YAML_ROOTS = {"26.05": "sid_root", "25.11": "slurm2511_root"}


def _root(suite: str) -> Iterator[Path]:
    yield from _mounted(ensure_chroot(suite))


@pytest.fixture(scope="session")
def sid_root() -> Iterator[Path]:
    yield from _root("sid")


@pytest.fixture(scope="session")
def trixie_root() -> Iterator[Path]:
    yield from _root("trixie")


@pytest.fixture(scope="session")
def slurm2511_root() -> Iterator[Path]:
    """Slurm 25.11 in /opt/slurm, built from ../shared/slurm/ once (cached by the tarball's sha256)."""
    tarball, reason = source_tarball()
    if tarball is None:
        if os.environ.get(ALLOW_MISSING_2511) != "1":
            pytest.fail(f"{reason}; set {ALLOW_MISSING_2511}=1 to skip the 25.11 tier instead")
        pytest.skip(f"{TIER_2511_NOT_RUN}: {reason}")
    yield from _mounted(ensure_source_chroot())


@pytest.fixture(scope="session", params=sorted(YAML_ROOTS))
def yaml_root(request: pytest.FixtureRequest) -> Path:
    """Each Slurm that reads topology.yaml: 25.11 (built) and 26.05 (sid), for what differs by version."""
    root: Path = request.getfixturevalue(YAML_ROOTS[request.param])
    return root


@pytest.fixture(scope="session")
def sid_slurmd_root() -> Iterator[Path]:
    """26.05 with slurmd (a copy of the sid chroot): nodes that register."""
    yield from _mounted(ensure_slurmd_chroot("sid"))


def _mounted(root: Path) -> Iterator[Path]:
    with proc_mounted(root):
        yield root


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A skipped 25.11 test is not a pass: say so in one line, with why."""
    reasons = set()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        if TIER_2511_NOT_RUN in message:
            reasons.add(message[message.index(TIER_2511_NOT_RUN) :])
    for reason in sorted(reasons):
        terminalreporter.write_line(reason, yellow=True, bold=True)


@pytest.fixture
def controllers(request: pytest.FixtureRequest) -> Iterator[Callable[..., SlurmController]]:
    """Make controllers for a test; every one is stopped (by pid) when the test ends."""
    started: list[SlurmController] = []

    def make(root: Path, style: str = "debian") -> SlurmController:
        controller = SlurmController(
            root=root,
            # The chroots are shared by every session on this machine: the pid keeps their controllers apart.
            name=f"t{next(_counter)}-{os.getpid()}-{request.node.name[:40]}".replace("[", "-")
            .replace("]", "")
            .replace("/", "-"),
            style=style,
        )
        started.append(controller)
        return controller

    yield make
    for controller in started:
        controller.stop()
        controller.remove()
