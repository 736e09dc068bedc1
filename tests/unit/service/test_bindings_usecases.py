"""The live NodeName/NodeAddr binding loop on the in-memory ports: the head node's node table comes back with
every result and verify, the reconcile names ParallelCluster nodes from it, the bundle records the bindings
it assumed, and a stale_bindings answer replans at once with the fresh table."""

from __future__ import annotations

import pytest

from tests.fakes import FakeFacts
from tests.helpers import event_envelope
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.ports import ApplyResult, Channel, Metric, Outcome
from topokeeper.domain.models import SlurmNodeRecord
from topokeeper.render.bundle import Bundle
from topokeeper.service.controller import check_drift, reconcile
from topokeeper.service.drift import pending_window
from topokeeper.service.result import record_result
from topokeeper.service.state import save_fields
from topokeeper.wire import AGENT_VERIFY_DETAIL_TYPE, agent_source

# FakeFacts' eight instances have the private IPs 10.0.0.0-7, four to a leaf switch.
STATIC = {f"q1-st-p5-{n}": f"10.0.0.{n - 1}" for n in range(1, 5)}
DYNAMIC = {f"q1-dy-p5-{n}": f"10.0.0.{n + 3}" for n in range(1, 5)} | {"q1-dy-p5-5": "q1-dy-p5-5"}  # 5: powered down
BOUND = STATIC | DYNAMIC
# q1-dy-p5-1 powered down, then resumed on the instance q1-st-p5-4 had (that one was replaced): re-bound.
REBOUND = BOUND | {"q1-dy-p5-1": "10.0.0.3", "q1-st-p5-4": "10.0.0.4"}


def _rows(addresses: dict[str, str]) -> list[list[str]]:
    return [[name, address, name, "gpu"] for name, address in sorted(addresses.items())]


def _table(addresses: dict[str, str]) -> list[SlurmNodeRecord]:
    return (
        ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=_rows(addresses)).node_table() or []
    )


def _parallelcluster(addresses: dict[str, str] = BOUND) -> Controller:
    controller = Controller(orchestrator="ec2")
    save_fields(controller.state, CLUSTER, {"slurm_nodes": _table(addresses)})
    return controller


def test_the_reconcile_names_nodes_from_the_head_nodes_table_and_records_the_bindings() -> None:
    controller = _parallelcluster()

    assert reconcile(controller.change(), controller.deps()).action == "delivered"

    (bundle,) = controller.channel.delivered
    assert bundle.nodes == sorted(BOUND)  # every Slurm node, the powered-down one too (no-topology)
    assert bundle.bindings == BOUND and bundle.bindings_sha256 is not None
    hyperpod = Controller()
    save_fields(hyperpod.state, CLUSTER, {"slurm_nodes": _table(BOUND)})
    reconcile(hyperpod.change(), hyperpod.deps())
    (named_by_host,) = hyperpod.channel.delivered
    assert named_by_host.nodes[0] == "ip-10-0-0-0" and named_by_host.bindings is None  # HyperPod: unchanged


def test_stale_bindings_store_the_fresh_table_and_replan_at_once() -> None:
    controller = _parallelcluster()
    reconcile(controller.change(), controller.deps())
    pending = controller.now_state().pending
    assert pending is not None
    first = controller.channel.delivered[0]
    controller.ssm_results[pending.handle.reference] = ApplyResult.model_validate(
        {
            "outcome": "stale_bindings",
            "applier_version": "1.0.0",
            "error": "2 node(s) not at the NodeAddr planned: ...",
            "slurm_nodes": _rows(REBOUND),
        }
    )

    report = record_result(ssm_event(pending.handle.reference), controller.result_deps())

    state = controller.now_state()
    assert (report.outcome, state.pending, state.applied_sha256) == (Outcome.STALE_BINDINGS, None, None)
    assert state.slurm_nodes == _table(REBOUND)
    assert controller.metrics.values(Metric.APPLY_FAILURES) == []  # not a failure: planned again
    replan = controller.queue.sent[-1]
    assert (replan.reason, state.triggers[-1].detail_type) == ("retry", "Slurm Node Bindings Changed")
    assert reconcile(replan, controller.deps()).action == "delivered"
    second = controller.channel.delivered[-1]
    assert second.bindings == REBOUND and second.plan_sha256 != first.plan_sha256  # the two swapped leaves


def test_a_cut_node_table_is_not_stored() -> None:
    controller = _parallelcluster()
    cut = ApplyResult(
        outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=_rows(REBOUND)[:3], dropped={"slurm_nodes": 6}
    )
    assert cut.node_table() is None
    controller.channel.verify_result = cut
    reconcile(controller.change(), controller.deps())
    save_fields(controller.state, CLUSTER, {"pending": None, "applied_sha256": controller.now_state().desired_sha256})

    check_drift(controller.cluster, controller.deps())

    assert controller.now_state().slurm_nodes == _table(BOUND)


def test_the_drift_check_refreshes_the_table_and_a_rebinding_is_a_change_to_plan() -> None:
    controller = _parallelcluster()
    reconcile(controller.change(), controller.deps())
    save_fields(controller.state, CLUSTER, {"pending": None, "applied_sha256": controller.now_state().desired_sha256})
    controller.channel.verify_result = ApplyResult(
        outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=_rows(BOUND)
    )
    assert check_drift(controller.cluster, controller.deps()).aws == "current"

    controller.channel.verify_result = ApplyResult(
        outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=_rows(REBOUND)
    )
    on_its_way = controller.change("e-2")  # the EC2 event of the re-binding, not reconciled yet
    report = check_drift(controller.cluster, controller.deps())

    # The change on its way explains the difference (pending), and its reconcile plans with the table this
    # check stored.
    assert (report.live, report.aws, report.action) == ("in_sync", "pending", "none")
    assert controller.now_state().slurm_nodes == _table(REBOUND)
    assert reconcile(on_its_way, controller.deps()).action == "delivered"
    assert controller.channel.delivered[-1].bindings == REBOUND

    controller.clock.advance(int(pending_window(controller.deps().settings).total_seconds()) + 1)
    save_fields(controller.state, CLUSTER, {"pending": None, "slurm_nodes": _table(BOUND)})
    controller.channel.verify_result = ApplyResult(
        outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=_rows(BOUND)
    )
    report = check_drift(controller.cluster, controller.deps())  # nothing on its way explains it any more
    assert (report.aws, report.action) == ("changed", "reconcile-requested")


def test_an_agents_verify_report_stores_the_table_once() -> None:
    controller = Controller(orchestrator="ec2", channel_kind=Channel.AGENT)
    result = {"outcome": "in_sync", "applier_version": "1.0.0", "slurm_nodes": _rows(REBOUND)}
    detail = {"cluster": CLUSTER, "version_id": "v1", "result": result}

    report = record_result(
        event_envelope(agent_source(CLUSTER), AGENT_VERIFY_DETAIL_TYPE, detail), controller.result_deps()
    )

    state = controller.now_state()
    assert report.status == "verify-recorded" and state.slurm_nodes == _table(REBOUND)
    assert state.last_verify is not None and state.last_verify.slurm_nodes is None


def test_stale_bindings_with_a_cut_node_table_fail_rather_than_replan_the_same_stale_table() -> None:
    # Over 200 Slurm nodes the applier cuts slurm_nodes from its document: a replan would bind from the
    # stored (stale) table again, be refused again, and loop SendCommand after SendCommand.
    controller = _parallelcluster()
    reconcile(controller.change(), controller.deps())
    pending = controller.now_state().pending
    assert pending is not None
    sent = len(controller.queue.sent)
    controller.ssm_results[pending.handle.reference] = ApplyResult.model_validate(
        {
            "outcome": "stale_bindings",
            "applier_version": "1.0.0",
            "error": "2 node(s) not at the NodeAddr planned: ...",
            "slurm_nodes": _rows(REBOUND)[:3],
            "dropped": {"slurm_nodes": 6},
        }
    )

    record_result(ssm_event(pending.handle.reference), controller.result_deps())

    state = controller.now_state()
    assert state.pending is None and state.slurm_nodes == _table(BOUND)
    assert len(controller.queue.sent) == sent  # no replan with the table it was just refused for
    assert controller.metrics.values(Metric.APPLY_FAILURES) == [1]  # stuck until a whole table arrives: alarmed


# q1-dy-p5-4 still powered down in the stored table, while its new instance (10.0.0.7) already runs.
BEFORE_RESUME = BOUND | {"q1-dy-p5-4": "q1-dy-p5-4"}


def _answering(controller: Controller, addresses: dict[str, str] | None) -> Controller:
    """The head node answers a read with this node table (None: with no table)."""
    rows = None if addresses is None else _rows(addresses)
    controller.channel.verify_result = ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=rows)
    return controller


def test_a_scale_up_reads_the_head_nodes_table_before_it_plans() -> None:
    # The instance an EC2 event just reported matches no NodeAddr of the stored table: the head node's table is
    # read first (read-only), so the plan it delivers already names and places the resumed node.
    controller = _answering(_parallelcluster(BEFORE_RESUME), BOUND)

    report = reconcile(controller.change(), controller.deps())

    assert (report.action, controller.channel.verified) == ("delivered", 1)
    (bundle,) = controller.channel.delivered
    assert bundle.bindings == BOUND
    assert controller.now_state().slurm_nodes == _table(BOUND)


def test_an_instance_still_unbound_after_a_read_is_left_out_and_not_asked_about_again() -> None:
    controller = _answering(_parallelcluster(BEFORE_RESUME), BEFORE_RESUME)

    reconcile(controller.change(), controller.deps())
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change("e-2"), controller.deps())

    assert controller.channel.verified == 1  # asked once for it, then left out: no read per reconcile
    bundle = controller.channel.delivered[0]
    assert bundle.bindings == BEFORE_RESUME and "10.0.0.7" not in bundle.bindings.values()
    plan = controller.plans.plan_document(CLUSTER, bundle.plan_sha256)
    assert any("is no Slurm node's NodeAddr" in w for w in plan["warnings"])

    # A newer instance than that read is asked about again.
    controller.facts = FakeFacts(nodes=9)
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change("e-3"), controller.deps())
    assert controller.channel.verified == 2


def test_the_first_reconcile_of_an_ec2_cluster_reads_the_table_and_names_nodes_as_slurmctld_does() -> None:
    controller = _answering(Controller(orchestrator="ec2"), BOUND)

    assert reconcile(controller.change(), controller.deps()).action == "delivered"

    (bundle,) = controller.channel.delivered
    assert bundle.nodes == sorted(BOUND) and bundle.bindings == BOUND  # no ip-... host names slurmctld refuses


def test_a_first_reconcile_whose_read_brings_no_table_delivers_nothing_until_it_comes() -> None:
    # The agent answers later: the reconcile holds the write (host names would be refused as unknown nodes),
    # and the agent's report of that read asks for the plan again.
    controller = Controller(orchestrator="ec2", channel_kind=Channel.AGENT)
    controller.channel.verify_result = ApplyResult.from_channel(Outcome.PENDING, "asked the agent")

    report = reconcile(controller.change(), controller.deps())

    assert (report.action, controller.channel.delivered) == ("planned-only", [])
    assert "node table" in report.reason
    request = controller.channel.requests[-1]
    assert request is not None
    result = {"outcome": "in_sync", "applier_version": "1.0.0", "slurm_nodes": _rows(BOUND)}
    detail = {"cluster": CLUSTER, "version_id": "v1", "result": result, "verify_request": request}
    record_result(event_envelope(agent_source(CLUSTER), AGENT_VERIFY_DETAIL_TYPE, detail), controller.result_deps())
    replan = controller.queue.sent[-1]
    assert controller.now_state().triggers[-1].detail_type == "Slurm Node Table Read"

    assert reconcile(replan, controller.deps()).action == "delivered"
    assert controller.channel.verified == 1 and controller.channel.delivered[0].bindings == BOUND


def test_powered_down_nodes_are_not_nodes_without_topology() -> None:
    controller = _parallelcluster()  # q1-dy-p5-5 has no instance

    report = reconcile(controller.change(), controller.deps())

    assert report.nodes_without_topology == 0
    assert controller.metrics.values(Metric.NODES_WITHOUT_TOPOLOGY) == [0]
    assert not any(t.detail_type == "Topology Retry" for t in controller.now_state().triggers)
    plan = controller.plans.plan_document(CLUSTER, controller.channel.delivered[0].plan_sha256)
    (gpu,) = plan["partitions"]
    assert (gpu["nodes_without_instance"], gpu["nodes_without_topology"]) == (["q1-dy-p5-5"], [])


def test_a_read_refused_for_the_slurm_format_is_asked_again_once_in_the_format_it_told() -> None:
    # The configured Slurm version differs from the head node's: the applier refuses the read's bundle before it
    # reads the table, but says its version. The reconcile renders for that version and reads once more.
    controller = Controller(orchestrator="ec2")
    refused = ApplyResult(
        outcome=Outcome.REFUSED, applier_version="1.0.0", slurm_version="24.11.3", error="rendered as yaml"
    )
    answers = [refused, ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=_rows(BOUND))]
    formats: list[str] = []

    def verify(bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        formats.append(bundle.slurm_format)
        return answers.pop(0) if answers else refused

    controller.channel.verify = verify  # type: ignore[method-assign]

    assert reconcile(controller.change(), controller.deps()).action == "delivered"

    assert formats == ["topology.yaml", "topology.conf"]  # asked twice, the second time as Slurm 24.11 reads
    (bundle,) = controller.channel.delivered
    assert (bundle.slurm_format, bundle.bindings) == ("topology.conf", BOUND)


def test_a_read_remembers_only_the_instances_it_left_unnamed() -> None:
    """The state keeps, of a read, the instances its table did not name (those are not asked about again), not every
    instance it was read for: on the first read that is the whole cluster, 22 bytes an instance in the state item
    (DynamoDB's 400 KB: about 18,000 instances), saved with every reconcile after."""
    controller = _answering(Controller(orchestrator="ec2"), BEFORE_RESUME)

    reconcile(controller.change(), controller.deps())

    state = controller.now_state()
    assert state.slurm_nodes == _table(BEFORE_RESUME)
    (unnamed,) = state.table_read_for  # the eighth instance, 10.0.0.7, is no Slurm node's NodeAddr yet
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change("e-2"), controller.deps())
    assert controller.channel.verified == 1 and controller.now_state().table_read_for == [unnamed]

    # A read that brings no table remembers nothing: the next reconcile reads again anyway.
    pending = _answering(Controller(orchestrator="ec2"), None)
    pending.channel.verify_result = ApplyResult.from_channel(Outcome.PENDING, "no answer yet")
    reconcile(pending.change(), pending.deps())
    assert pending.now_state().table_read_for == []


def _finish(controller: Controller, outcome: str, **fields: object) -> None:
    """The delivery in flight answered with this result (and its node table, whole)."""
    pending = controller.now_state().pending
    assert pending is not None
    document = {"outcome": outcome, "applier_version": "1.0.0", "slurm_nodes": _rows(REBOUND), **fields}
    controller.ssm_results[pending.handle.reference] = ApplyResult.model_validate(document)
    record_result(ssm_event(pending.handle.reference), controller.result_deps())


def _rebound_plan_delivered() -> Controller:
    """BOUND applied, then a plan of REBOUND (q1-dy-p5-1 and q1-st-p5-4 swap leaves) in flight."""
    controller = _parallelcluster()
    reconcile(controller.change(), controller.deps())
    _finish(controller, "applied", slurm_nodes=_rows(BOUND))
    save_fields(controller.state, CLUSTER, {"slurm_nodes": _table(REBOUND)})
    assert reconcile(controller.change("e-2"), controller.deps()).action == "delivered"
    controller.audit.records.clear()
    return controller


def test_a_refused_apply_is_audited_with_nothing_moved_on_the_head_node() -> None:
    controller = _rebound_plan_delivered()

    _finish(controller, "stale_bindings", error="1 node(s) not at the NodeAddr planned: ...")

    (record,) = controller.audit.records.values()
    assert (record.outcome, record.reason) == (Outcome.STALE_BINDINGS, "plan-change")
    assert (record.nodes_moved, record.nodes_moved_count) == ([], 0)
    assert (record.nodes_added_count, record.nodes_removed_count, record.nodes_deferred) == (0, 0, [])


def test_an_apply_that_deferred_rebound_nodes_audits_what_moved_and_what_waits_and_places_them_next() -> None:
    controller = _rebound_plan_delivered()
    delivered = controller.now_state().pending
    assert delivered is not None

    _finish(controller, "applied", deferred=[["q1-dy-p5-1", "10.0.0.3", "10.0.0.9"]])

    (record,) = controller.audit.records.values()
    assert record.outcome is Outcome.APPLIED
    assert [(m.node, m.after) for m in record.nodes_moved] == [("q1-st-p5-4", "nn-leaf-1")]
    assert (record.nodes_moved_count, record.nodes_deferred, record.nodes_deferred_count) == (1, ["q1-dy-p5-1"], 1)
    state = controller.now_state()
    assert (state.pending, state.applied_sha256) == (None, delivered.handle.plan_sha256)
    assert controller.metrics.values(Metric.APPLY_FAILURES) == []
    replan = controller.queue.sent[-1]
    assert (replan.reason, state.triggers[-1].detail_type) == ("retry", "Slurm Node Bindings Changed")
    # The retry delivers even when the plan it makes is the same: the head node does not have all of it yet.
    assert reconcile(replan, controller.deps()).action == "delivered"
    assert controller.channel.delivered[-1].bindings == REBOUND


def _deferred_apply(version: str, path: str) -> Controller:
    """Paced as shipped, a head node on Slurm ``version`` applied BOUND, then REBOUND but for q1-dy-p5-1 (re-bound
    once more meanwhile), by ``path``; 15 s after that write, the retry its result asked for is due."""
    controller = Controller(orchestrator="ec2", debounce_seconds=10, max_wait_seconds=30, min_write_interval_seconds=60)
    save_fields(controller.state, CLUSTER, {"slurm_nodes": _table(BOUND), "slurm_version": version})
    request = controller.change()
    controller.clock.advance(10)
    assert reconcile(request, controller.deps()).action == "delivered"
    applied = {"slurm_version": version, "apply_path": path}
    _finish(controller, "applied", slurm_nodes=_rows(BOUND), **applied)
    save_fields(controller.state, CLUSTER, {"slurm_nodes": _table(REBOUND)})
    controller.clock.advance(61)
    request = controller.change("e-2")
    controller.clock.advance(10)
    assert reconcile(request, controller.deps()).action == "delivered"
    controller.clock.advance(5)

    _finish(controller, "applied", deferred=[["q1-dy-p5-1", "10.0.0.3", "10.0.0.9"]], **applied)
    controller.clock.advance(10)  # the retry's debounce
    return controller


def test_a_deferred_nodes_follow_up_goes_at_the_live_pace_and_a_drift_repair_keeps_the_write_interval() -> None:
    """The head node applied all but a re-bound node, live: placing that node is a live write too, not held back by
    the write interval that spaces reconfigures. A drift repair (the live topology not the file's) still is."""
    controller = _deferred_apply("26.05.5", "incremental")

    report = reconcile(controller.queue.sent[-1], controller.deps())
    assert (report.action, report.reason) == ("delivered", "")
    _finish(controller, "applied", slurm_version="26.05.5", apply_path="incremental")
    save_fields(controller.state, CLUSTER, {"repair_partitions": ["gpu"]})  # as a verify finding drift marks it
    controller.clock.advance(15)
    request = controller.change("e-3")
    controller.clock.advance(10)
    assert reconcile(request, controller.deps()).reason == "minimum interval between writes"


def test_a_deferred_nodes_follow_up_on_slurm_24_11_keeps_the_write_interval() -> None:
    """topology.conf is loaded by reconfigure only: placing the deferred node is a reconfigure, paced as one."""
    controller = _deferred_apply("24.11.3", "whole_file")

    report = reconcile(controller.queue.sent[-1], controller.deps())
    assert (report.action, report.reason) == ("deferred", "minimum interval between writes")
    controller.clock.advance(report.defer_seconds or 0)
    assert reconcile(controller.queue.sent[-1], controller.deps()).action == "delivered"


@pytest.mark.parametrize(
    ("fields", "moved"),
    [
        ({"outcome": "failed", "before_sha256": "a" * 64, "after_sha256": "a" * 64}, 0),  # lock busy: untouched
        ({"outcome": "failed", "before_sha256": "a" * 64, "after_sha256": "a" * 64, "reconfigured": True}, 2),
        ({"outcome": "failed", "before_sha256": "a" * 64, "after_sha256": "b" * 64}, 2),  # written: may have moved
        ({"outcome": "rolled_back"}, 0),
    ],
)
def test_a_failed_apply_audits_moves_only_when_its_document_shows_it_touched_the_head_node(
    fields: dict[str, object], moved: int
) -> None:
    controller = _rebound_plan_delivered()

    _finish(controller, str(fields["outcome"]), **{k: v for k, v in fields.items() if k != "outcome"})

    (record,) = controller.audit.records.values()
    assert record.nodes_moved_count == moved
