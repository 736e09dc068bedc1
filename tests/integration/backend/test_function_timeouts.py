"""The simulator holds each function to its timeout in simulated time: the context counts down as the world's
clock moves, and an invocation that outlives its timeout fails the run (Lambda would have killed it)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.backend.conftest import small_scenario
from topokeeper.contract import stack_spec as spec
from topokeeper.sim.lambda_host import FunctionTimedOut
from topokeeper.sim.world import World, running


def _waits(world: World, seconds: float, remaining: list[int]) -> Any:
    """A drift handler that waits ``seconds`` (as a function waiting on the rate limiter or an SSM poll does)."""

    def handler(event: Any, context: Any) -> list[Any]:
        remaining.append(context.get_remaining_time_in_millis())
        world.sleep(seconds)
        remaining.append(context.get_remaining_time_in_millis())
        return []

    return handler


@pytest.fixture
def world() -> Any:
    with running(small_scenario(), head_node="file") as started:
        yield started


def test_the_context_counts_down_in_simulated_time(world: World) -> None:
    remaining: list[int] = []
    world.functions.handlers[spec.DRIFT] = _waits(world, 100, remaining)

    world.functions.invoke(spec.DRIFT, {})

    assert remaining == [600_000, 500_000]


def test_an_invocation_over_its_timeout_fails_the_run(world: World) -> None:
    remaining: list[int] = []
    world.functions.handlers[spec.DRIFT] = _waits(world, 601, remaining)
    world.settle()  # the cluster is written; the drift schedule is next on the agenda

    with pytest.raises(FunctionTimedOut, match=r"drift function ran 601\.0 s .* over its 600 s timeout"):
        world.settle(until=world.clock.monotonic() + world.scenario.timing.drift_interval_seconds, quiet=False)
    assert remaining == [600_000, 0]
