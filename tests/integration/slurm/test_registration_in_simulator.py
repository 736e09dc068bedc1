"""The ParallelCluster scenario with a real slurmd for each booting node (issue 32, scenario
``parallelcluster-registration.yaml``): the backend publishes each instance's registration entry, the node-side
step reads it when the instance has booted and starts slurmd with it (``topokeeper.sim.booting_nodes``).

On 25.11 the head node's apply, which usually arrives before the nodes' slurmd start, leaves each powering-up
node with an entry to its slurmd (the bundle lists them as registering): slurmctld places every one as it
registers, and the audit record says ``registration`` for them. On 26.05 the same nodes register
unplaced and the head node's apply places every one of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from topokeeper.sim.booting_nodes import Boot
from topokeeper.sim.scenario import load_scenario
from topokeeper.sim.simulator import play
from topokeeper.sim.world import running

pytestmark = pytest.mark.slurm

SCENARIO = Path(__file__).parents[3] / "layers/core/python/topokeeper/sim/scenarios/parallelcluster-registration.yaml"
APPLY_ROUTES = ("update", "file")


def _play(version: str) -> tuple[list[Boot], dict[str, set[str]], bool]:
    """The boots, {route: nodes} over every audit record, and whether the last step converged."""
    scenario = load_scenario(SCENARIO)
    cluster = scenario.cluster.model_copy(update={"slurm_version": version})
    scenario = scenario.model_copy(update={"cluster": cluster})
    with running(scenario, head_node="chroot") as world:
        result = play(world, scenario, lambda _: None)
        assert world.booting is not None
        boots = list(world.booting.boots)
    routes: dict[str, set[str]] = {}
    for step in result.steps:
        for record in step.audit_records:
            for route, nodes in record["placed_by"].items():
                routes.setdefault(route, set()).update(nodes)
    return boots, routes, result.steps[-1].converged


def test_on_25_11_nodes_registering_with_their_entry_are_placed_by_registration(slurm2511_root: Path) -> None:
    boots, routes, converged = _play("25.11")
    assert len(boots) == 7
    assert all(boot.entry is not None for boot in boots), [b.entry_error for b in boots]
    # The apply that arrives first leaves each powering-up node with an entry to its slurmd: every one is placed
    # as it registers, none by the head node before.
    assert [boot.node for boot in boots if not boot.placed_at_registration] == []
    assert routes.get("registration", set()) == {boot.node for boot in boots}
    assert all(boot.leaf_after_registration == boot.entry_leaf for boot in boots)
    assert converged


def test_on_26_05_nodes_register_unplaced_and_the_head_node_places_them(sid_slurmd_root: Path) -> None:
    boots, routes, converged = _play("26.05")
    assert len(boots) == 7
    # No entries on 26.05 (its slurmctld ignores a resumed node's slurmd-supplied topology: see
    # test_registration_on_slurmd.py): node-start waits its bound and slurmd starts without one.
    assert all(boot.entry is None for boot in boots)
    assert "registration" not in routes
    assert not any(boot.placed_at_registration for boot in boots)
    applied = set().union(*(routes.get(route, set()) for route in APPLY_ROUTES))
    assert {boot.node for boot in boots} <= applied
    assert converged
