"""Issue 27 item 3: a change the head node applies live (``scontrol update NodeName= Topology=``, no reconfigure) is
not held back by ``min_write_interval_seconds``, which exists to space reconfigures; the debounce still coalesces a
burst, one delivery is in flight at a time, and a 20,000-node burst is a handful of commands. A change that needs a
reconfigure keeps today's pacing."""

from __future__ import annotations

import re

from tests.fakes import FakeFacts
from tests.unit.service.test_reconcile_usecases import LastNodeNotReported
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.ports import ApplyResult, ClusterState, Outcome
from topokeeper.service.controller import reconcile
from topokeeper.service.live_writes import live_update_problem
from topokeeper.service.reconcile import LIVE_MAX_WAIT_SECONDS, MIN_LIVE_WRITE_SECONDS, ReconcileReport, plan_facts
from topokeeper.service.result import finish_delivery


def _applied(controller: Controller, slurm_version: str, nodes: int = 8) -> None:
    """The head node (``slurm_version``) applied the plan of ``nodes`` nodes; its result came back."""
    controller.facts = FakeFacts(nodes)
    controller.state.save(ClusterState(cluster=CLUSTER, slurm_version=slurm_version))
    request = controller.change("first")
    controller.clock.advance(controller.debounce_seconds)
    assert reconcile(request, controller.deps()).action == "delivered"
    state = controller.now_state()
    assert state.pending is not None
    controller.state.save(state.model_copy(update={"pending": None, "applied_sha256": state.desired_sha256}))


def _paced() -> Controller:
    return Controller(debounce_seconds=10, max_wait_seconds=30, min_write_interval_seconds=60)


def test_a_node_joining_an_existing_leaf_is_written_without_waiting_for_the_write_interval() -> None:
    controller = _paced()
    _applied(controller, "26.05")
    controller.facts.nodes = 9  # the new node lands on leaf 1, which exists
    controller.facts.move(8, 1)
    controller.clock.advance(5)
    request = controller.change("launch")
    controller.clock.advance(10)  # quiet for the debounce, 15 s after the last write
    report = reconcile(request, controller.deps())
    assert (report.action, report.reason) == ("delivered", "")
    assert len(controller.channel.delivered) == 2


def test_a_new_leaf_under_an_existing_switch_is_written_live_too() -> None:
    controller = _paced()
    _applied(controller, "26.05")
    controller.facts.nodes = 9
    controller.facts.move(8, 2)  # leaf 2 is new, under the existing block switch
    controller.clock.advance(15)
    request = controller.change("launch")
    controller.clock.advance(10)
    assert reconcile(request, controller.deps()).action == "delivered"


def test_the_debounce_still_coalesces_a_live_change() -> None:
    controller = _paced()
    _applied(controller, "26.05")
    controller.facts.nodes = 9
    controller.facts.move(8, 1)
    controller.clock.advance(15)
    request = controller.change("launch")
    controller.clock.advance(3)
    report = reconcile(request, controller.deps())
    assert (report.action, report.defer_seconds) == ("deferred", 7)


def test_live_writes_are_spaced_even_without_a_debounce() -> None:
    controller = Controller(min_write_interval_seconds=60)
    _applied(controller, "26.05")
    controller.facts.nodes = 9
    controller.facts.move(8, 1)
    controller.clock.advance(2)
    request = controller.change("launch")
    report = reconcile(request, controller.deps())
    assert (report.action, report.defer_seconds) == ("deferred", MIN_LIVE_WRITE_SECONDS - 2)
    controller.clock.advance(MIN_LIVE_WRITE_SECONDS - 2)
    assert reconcile(request, controller.deps()).action == "delivered"


def test_slurm_24_11_keeps_the_write_interval() -> None:
    """topology.conf is loaded by reconfigure only: today's pacing."""
    controller = _paced()
    _applied(controller, "24.11")
    controller.facts.nodes = 9
    controller.facts.move(8, 1)
    controller.clock.advance(15)
    request = controller.change("launch")
    controller.clock.advance(10)
    report = reconcile(request, controller.deps())
    assert (report.action, report.reason) == ("deferred", "minimum interval between writes")
    assert report.defer_seconds == 5  # half the interval after the write, the changes having stopped
    assert len(controller.channel.delivered) == 1


def test_a_leaf_losing_its_last_nodes_is_written_live_too() -> None:
    """The switch leaves the file; slurmctld keeps it live, empty, until a reconfigure (headnode/incremental.py)."""
    controller = _paced()
    _applied(controller, "26.05")
    controller.facts.nodes = 4  # leaf 1 loses all its nodes
    controller.clock.advance(15)
    request = controller.change("terminated")
    controller.clock.advance(10)
    report = reconcile(request, controller.deps())
    assert (report.action, report.reason) == ("delivered", "")


def test_the_backend_reads_the_rule_the_head_node_applies() -> None:
    """One rule (headnode/incremental.py's): the backend asks it of the two plans' bundles."""
    controller = _paced()
    _applied(controller, "26.05")
    previous = controller.plans.bundle(CLUSTER, controller.now_state().applied_sha256 or "")
    controller.facts.nodes = 4
    smaller = plan_facts(controller.cluster, controller.now_state(), controller.facts.read(CLUSTER)).bundle
    assert live_update_problem(previous, previous, "26.05.5") == ""
    assert live_update_problem(previous, smaller, "26.05.5") == ""  # leaf nn-leaf-1 emptied: it stays live, empty
    assert live_update_problem(previous, previous, "25.11.2") == ""  # proven on 25.11.7 too
    assert "from Slurm 25.11 only" in live_update_problem(previous, previous, "25.05.4")
    assert live_update_problem(smaller, previous, "26.05.5") == ""  # a new leaf under an existing switch


def test_a_20000_node_burst_is_a_handful_of_commands() -> None:
    """20,000 nodes launch over a minute, one change a second; each delivery's result comes 5 s after it is sent
    (a message behind it is resumed then). Default pacing; Slurm 26.05: every change is written live."""
    controller = Controller(debounce_seconds=10, max_wait_seconds=30, min_write_interval_seconds=60)
    _applied(controller, "26.05")
    controller.clock.advance(120)
    due, results = 0.0, []  # when the cycle's message is received next; when the delivery's result arrives
    for second in range(120):
        if second < 60:
            controller.facts.nodes = 8 + (second + 1) * 20_000 // 60
            controller.facts.leaf_of.update({i: i // 16 for i in range(len(controller.facts.leaf_of), 20_008)})
            request = controller.change(f"launch-{second}")
        if results and results[0] <= second:
            results.pop(0)
            state = controller.now_state()
            assert state.pending is not None
            done = {"pending": None, "applied_sha256": state.pending.handle.plan_sha256}
            controller.state.save(state.model_copy(update=done))
            due = second
        if due <= second and controller.now_state().has_unreconciled_changes:
            report = reconcile(request, controller.deps())
            if report.action == "delivered":
                results.append(second + 5)
            due = second + (report.defer_seconds or 0)
        controller.clock.advance(1)
    delivered = controller.channel.delivered[1:]
    assert len(delivered[-1].nodes) == 20_008
    # One delivery per live wait while the burst lasts, its last one when the burst ends.
    assert len(delivered) <= 60 // LIVE_MAX_WAIT_SECONDS, [len(bundle.nodes) for bundle in delivered]


def _result(controller: Controller, **fields: object) -> None:
    """The head node's result for the delivery in flight: applied, by ``fields``' path."""
    state = controller.now_state()
    assert state.pending is not None
    result = ApplyResult(outcome=Outcome.APPLIED, applier_version="1.0.0", slurm_version="26.05.5", **fields)
    finish_delivery(controller.cluster, state, state.pending, result, controller.result_deps())


def _launch(controller: Controller, nodes: int) -> ReconcileReport:
    """A node joins leaf 1; the changes stop; 25 s after the last write, the reconcile."""
    controller.facts.nodes = nodes
    controller.facts.move(nodes - 1, 1)
    controller.clock.advance(15)
    request = controller.change(f"launch-{nodes}")
    controller.clock.advance(10)
    report = reconcile(request, controller.deps())
    if report.action == "deferred":
        controller.clock.advance(report.defer_seconds or 0)
        assert reconcile(request, controller.deps()).action == "delivered"
    return report


def test_a_head_node_that_reconfigured_instead_is_paced_as_for_reconfigures_until_it_goes_live_again() -> None:
    """The rule said live, the head node fell back to the whole file (an update refused): later writes keep the
    interval, so such a head node is not reconfigured at the live writes' pace. An apply that goes live lifts it."""
    controller = _paced()
    _applied(controller, "26.05")
    assert _launch(controller, 9).action == "delivered"
    reason = "scontrol update NodeName=x Topology=t: refused"
    _result(controller, apply_path="whole_file", reconfigured=True, whole_file_reason=reason)
    assert controller.now_state().live_write_refused == reason

    paced = _launch(controller, 10)
    assert (paced.action, paced.reason) == ("deferred", "minimum interval between writes")
    _result(controller, apply_path="incremental")
    assert controller.now_state().live_write_refused is None

    assert _launch(controller, 11).action == "delivered"


def test_a_live_write_does_not_wait_the_full_interval_for_nodes_ec2_has_not_reported() -> None:
    """The early write (half an interval after the last, the changes stopped) waits for the full interval when EC2
    has not reported a new node yet, so as not to reconfigure twice; a live write goes, and the node follows with
    its topology retry."""
    controller = _paced()
    _applied(controller, "26.05")
    controller.facts = LastNodeNotReported(10)
    controller.facts.move(8, 1)
    controller.facts.move(9, 1)
    controller.clock.advance(25)
    request = controller.change("launch")
    controller.clock.advance(10)  # quiet, 35 s after the write: an early write
    report = reconcile(request, controller.deps())
    assert (report.action, report.nodes_without_topology) == ("delivered", 1)


def test_a_live_change_waits_for_a_quiet_spell_at_most_the_live_wait_not_max_wait() -> None:
    """A rolling scale-up is never quiet for the debounce: a change the head node applies live goes once the oldest
    change has waited ``LIVE_MAX_WAIT_SECONDS`` (max_wait_seconds bounds the wait of a reconfigure)."""
    controller = _paced()
    _applied(controller, "26.05")
    controller.facts.nodes = 9
    controller.facts.move(8, 1)
    controller.clock.advance(30)
    request = controller.change("launch-1")
    for second in range(1, LIVE_MAX_WAIT_SECONDS):  # a change every second: the debounce never ends
        controller.clock.advance(1)
        controller.change(f"launch-{second + 1}")
        report = reconcile(request, controller.deps())
        assert report.action == "deferred", second
    controller.clock.advance(1)
    assert reconcile(request, controller.deps()).action == "delivered"


def test_a_change_that_needs_a_reconfigure_keeps_max_wait() -> None:
    controller = _paced()
    _applied(controller, "24.11")
    controller.facts.nodes = 9
    controller.facts.move(8, 1)
    controller.clock.advance(70)
    request = controller.change("launch-1")
    for second in range(1, 30):
        controller.clock.advance(1)
        controller.change(f"launch-{second + 1}")
        assert reconcile(request, controller.deps()).action == "deferred", second
    controller.clock.advance(1)
    assert reconcile(request, controller.deps()).action == "delivered"


def test_the_bench_notes_state_the_live_wait_that_ships() -> None:
    """docs/performance.md's notes come from bench/incremental.py: they give the shipped bound, not an older one."""
    import bench.incremental  # here: the bench's own imports (the simulator) are not this module's

    stated = {int(s) for s in re.findall(r"quiet spell at most (\d+) s", " ".join(bench.incremental.NOTES))}
    stated |= {int(s) for s in re.findall(r"waits at most (\d+) s", bench.incremental.__doc__ or "")}
    assert stated == {LIVE_MAX_WAIT_SECONDS}
