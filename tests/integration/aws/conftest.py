"""An AwsEmulator per test (about 0.3 s to start), on simulated time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from topokeeper.adapters.aws import clear_clients
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def aws(clock: ManualClock) -> Iterator[AwsEmulator]:
    with AwsEmulator(seed=7, clock=clock) as emulator:
        yield emulator


@pytest.fixture
def emulated(aws: AwsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsEmulator]:
    """The emulator as the CLI reaches it: its endpoint and region in the environment, no client made before."""
    for name, value in aws.env().items():
        monkeypatch.setenv(name, value)
    clear_clients()
    yield aws
    clear_clients()
