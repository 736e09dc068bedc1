"""The shipped login scenario through the deployed backend on the emulator: login nodes replaced (with a new IP),
scaled up and deleted with their events lost; the real ingest and drift handlers keep moto's ELBv2 IP target group
equal to the running login nodes, audit each change in the history table and on the bus, and the timeline shows it."""

from __future__ import annotations

from collections.abc import Callable

from tests.integration.backend.conftest import AuditCapture
from topokeeper.sim.commands import SCENARIOS
from topokeeper.sim.scenario import load_scenario
from topokeeper.sim.simulator import play
from topokeeper.sim.world import World


def test_the_login_scenario_keeps_the_targets_on_the_login_nodes(world_factory: Callable[..., World]) -> None:
    scenario = load_scenario(SCENARIOS / "login.yaml")
    world = world_factory(scenario, head_node="file")
    capture = AuditCapture()

    result = play(world, scenario, lambda _: None)

    create, replace, scale, delete, wait = result.steps
    logins = [step.login for step in result.steps]
    assert all(login is not None for login in logins)
    first = create.login.audit_records[0]
    assert sorted(first["registered"]) == sorted(create.login.login_nodes) and len(first["registered"]) == 2
    # Replaced with another IP: the old target goes, the new one comes, in one change.
    (swap,) = replace.login.audit_records
    gone = set(create.login.login_nodes) - set(replace.login.login_nodes)
    came = set(replace.login.login_nodes) - set(create.login.login_nodes)
    assert (set(swap["deregistered"]), set(swap["registered"])) == (gone, came) and len(gone) == 1
    assert set(scale.login.targets) == set(scale.login.login_nodes) and len(scale.login.targets) == 3
    # The delete's events were lost: the target stays until the drift schedule deregisters it.
    assert delete.events_lost >= 1 and not delete.login.in_sync and delete.login.audit_records == []
    (healed,) = wait.login.audit_records
    assert set(healed["deregistered"]) == set(delete.login.targets) - set(delete.login.login_nodes)
    assert wait.login.in_sync and set(wait.login.targets) == set(wait.login.login_nodes)
    assert [e["text"] for e in wait.timeline if e["kind"] == "login"] == [
        f"targets: registered -; deregistered {healed['deregistered'][0]}; now 2"
    ]
    assert all(e["kind"] != "error" for step in result.steps for e in step.timeline)
    # Every change once in the history table (apart from the partition records) and once on the bus.
    history = world.runtime.audit.history(world.cluster.name, 100, event_name="UpdateLoginTargets")
    assert len(history) == 4 and all(r["event_name"] == "UpdateLoginTargets" for r in history)
    published = [e for e in capture.events() if e["detail-type"] == "UpdateLoginTargets"]
    assert sorted(e["detail"]["audit_id"] for e in published) == sorted(r["audit_id"] for r in history)
    assert all(r.get("partition") for step in result.steps for r in step.audit_records)
