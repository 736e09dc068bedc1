"""The live NodeName/NodeAddr binding loop on the in-memory ports: the head node's node table comes back with
every result and verify, the reconcile names ParallelCluster nodes from it, the bundle records the bindings
it assumed, and a stale_bindings answer replans at once with the fresh table."""

from __future__ import annotations

from tests.helpers import event_envelope
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.constants import AGENT_VERIFY_DETAIL_TYPE, agent_source
from topokeeper.engine.snapshot import SlurmNodeRecord
from topokeeper.ports import ApplyResult, Channel, Metric, Outcome
from topokeeper.service.drift import check_drift, pending_window
from topokeeper.service.reconcile import reconcile
from topokeeper.service.result import record_result
from topokeeper.service.state import save_fields

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
    report = check_drift(controller.cluster, controller.deps())

    # The powered-down node's topology retry is still queued: the difference is pending, and that reconcile
    # plans with the table this check stored.
    assert (report.live, report.aws, report.action) == ("in_sync", "pending", "none")
    assert controller.now_state().slurm_nodes == _table(REBOUND)
    assert reconcile(controller.queue.sent[-1], controller.deps()).action == "delivered"
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
