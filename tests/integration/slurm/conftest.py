"""Real slurmctld in Debian chroots: sid (26.05, topology.yaml) and trixie (24.11, topology.conf).

The chroots are built on first use into a cache outside the clone (see topokeeper.sim.slurm_chroot).
These tests never skip: a machine that cannot run them fails them, with the reason.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from topokeeper.sim.slurm_chroot import SlurmController, ensure_chroot, proc_mounted

_counter = itertools.count()


def _root(suite: str) -> Iterator[Path]:
    root = ensure_chroot(suite)
    with proc_mounted(root):
        yield root


@pytest.fixture(scope="session")
def sid_root() -> Iterator[Path]:
    yield from _root("sid")


@pytest.fixture(scope="session")
def trixie_root() -> Iterator[Path]:
    yield from _root("trixie")


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
