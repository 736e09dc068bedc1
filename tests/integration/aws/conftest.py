"""An AwsEmulator per test (about 0.3 s to start), on simulated time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def aws(clock: ManualClock) -> Iterator[AwsEmulator]:
    with AwsEmulator(seed=7, clock=clock) as emulator:
        yield emulator
