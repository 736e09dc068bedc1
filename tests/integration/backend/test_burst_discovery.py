"""A burst through the whole simulated system: the new instances are swept without ids (pages of 100 of
their instance type) rather than asked 20 a page, and every one of them reaches the live topology."""

from __future__ import annotations

from tests.integration.backend.conftest import small_scenario
from topokeeper.sim.scenario import Scenario
from topokeeper.sim.simulator import simulate

NEW = 150


def test_a_burst_of_new_instances_costs_a_page_per_100_of_the_type() -> None:
    scenario = Scenario.model_validate(
        {
            **small_scenario().model_dump(mode="json"),
            "steps": [{"scale": {"group": "p5", "to": 8 + NEW, "over_seconds": 5}}],
        }
    )
    _create, burst = simulate(scenario, head_node="file").steps

    latency = burst.node_latency_seconds
    assert latency is not None and (latency.nodes, latency.unplaced) == (NEW, 0)
    assert burst.converged and burst.head_node_writes == 1
    # 158 p5 in the account: 2 pages of 100, where 150 new ids would take 8 pages of 20.
    assert burst.aws_calls["DescribeInstanceTopology"] == 2
