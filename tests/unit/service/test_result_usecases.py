"""record_result() on the in-memory ports: which events finish a delivery, and what a result records."""

from __future__ import annotations

import pytest

from tests.helpers import event_envelope
from tests.unit.service.usecase_support import CLUSTER, HEAD_NODE, Controller
from topokeeper.contract.errors import InputError, Retryable
from topokeeper.contract.event_schemas import SSM_INVOCATION_DETAIL_TYPE, TopokeeperEvent
from topokeeper.contract.ports import ApplyResult, Channel, Metric, Outcome
from topokeeper.service.controller import reconcile
from topokeeper.service.result import record_result
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, agent_source


def ssm_event(reference: str, instance_id: str = HEAD_NODE) -> TopokeeperEvent:
    detail = {
        "command-id": reference,
        "instance-id": instance_id,
        "document-name": "AWS-RunShellScript",
        "status": "Success",
    }
    return event_envelope("aws.ssm", SSM_INVOCATION_DETAIL_TYPE, detail)


def _delivered(controller: Controller) -> str:
    """A delivery in flight; returns its reference (the SSM command id)."""
    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    pending = controller.now_state().pending
    assert pending is not None
    return pending.handle.reference


def _applied(**fields: object) -> ApplyResult:
    return ApplyResult.model_validate({"outcome": "applied", "applier_version": "1.0.0", **fields})


def test_an_applied_result_finishes_the_delivery_and_audits_each_changed_partition() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = _applied(partitions_changed=["gpu"])
    report = record_result(ssm_event(command_id), controller.result_deps())
    state = controller.now_state()
    assert (report.status, report.outcome, report.audit_records) == ("recorded", Outcome.APPLIED, 1)
    assert state.pending is None and state.applied_sha256 == state.desired_sha256
    assert controller.metrics.values(Metric.TOPOLOGY_UPDATES) == [1]
    (record,) = controller.audit.records.values()
    assert (record.partition, record.outcome, record.delivery_reference) == ("gpu", Outcome.APPLIED, command_id)


def test_a_retried_result_is_audited_once() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = _applied()
    record_result(ssm_event(command_id), controller.result_deps())
    report = record_result(ssm_event(command_id), controller.result_deps())
    assert report.status == "ignored"  # the delivery is no longer in flight
    assert len(controller.audit.records) == 1


def test_a_failed_apply_keeps_the_applied_plan_and_counts_a_failure() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = ApplyResult.model_validate(
        {"outcome": "rolled_back", "applier_version": "1.0.0", "error": "slurmctld refused it"}
    )
    report = record_result(ssm_event(command_id), controller.result_deps())
    state = controller.now_state()
    assert report.outcome is Outcome.ROLLED_BACK
    assert state.pending is None and state.applied_sha256 is None
    assert controller.metrics.values(Metric.APPLY_FAILURES) == [1]
    (record,) = controller.audit.records.values()
    assert record.error == "slurmctld refused it"


@pytest.mark.parametrize("outcome", ["bad_signature", "replayed"])
def test_a_bundle_the_head_node_found_forged_or_replayed_is_audited_and_counted(outcome: str) -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = ApplyResult.model_validate(
        {"outcome": outcome, "applier_version": "1.0.0", "error": "the signature does not verify"}
    )
    report = record_result(ssm_event(command_id), controller.result_deps())
    assert (report.status, report.outcome) == ("recorded", Outcome(outcome))
    assert controller.now_state().applied_sha256 is None
    assert controller.metrics.values(Metric.BUNDLE_REFUSALS) == [1]
    assert controller.metrics.values(Metric.APPLY_FAILURES) == [1]
    (record,) = controller.audit.records.values()
    assert (record.outcome, record.error) == (Outcome(outcome), "the signature does not verify")


def test_a_rolled_back_apply_is_no_bundle_refusal() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = ApplyResult.model_validate({"outcome": "rolled_back", "applier_version": "1"})
    record_result(ssm_event(command_id), controller.result_deps())
    assert controller.metrics.values(Metric.BUNDLE_REFUSALS) == []


def test_a_result_not_readable_yet_fails_the_invocation_and_keeps_the_delivery() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = ApplyResult.from_channel(Outcome.PENDING)
    with pytest.raises(Retryable, match="still reads pending"):
        record_result(ssm_event(command_id), controller.result_deps())
    assert controller.now_state().pending is not None


def test_a_refusal_that_teaches_the_slurm_version_plans_again() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = ApplyResult.model_validate(
        {"outcome": "refused", "applier_version": "1.0.0", "slurm_version": "24.11.5", "error": "format"}
    )
    sent_before = len(controller.queue.sent)
    record_result(ssm_event(command_id), controller.result_deps())
    assert controller.now_state().slurm_version == "24.11.5"
    assert controller.queue.sent[sent_before:][-1].reason == "retry"


def test_a_nonsense_slurm_version_is_not_learned() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = _applied(slurm_version="banana")
    record_result(ssm_event(command_id), controller.result_deps())
    assert controller.now_state().slurm_version is None


def test_events_of_other_instances_and_commands_change_nothing() -> None:
    controller = Controller()
    command_id = _delivered(controller)
    assert record_result(ssm_event(command_id, "i-0fedcba9876543210"), controller.result_deps()).status == "ignored"
    other = controller.channel.reference(9)
    assert record_result(ssm_event(other), controller.result_deps()).status == "ignored"
    assert controller.now_state().pending is not None


def test_an_agent_report_finishes_the_agent_delivery() -> None:
    controller = Controller(channel_kind=Channel.AGENT)
    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    pending = controller.now_state().pending
    assert pending is not None
    detail = {
        "cluster": CLUSTER,
        "version_id": pending.handle.reference,
        "result": {"outcome": "unchanged", "applier_version": "1.0.0", "from_a_newer_applier": 1},
    }
    report = record_result(
        event_envelope(agent_source(CLUSTER), AGENT_APPLY_DETAIL_TYPE, detail), controller.result_deps()
    )
    assert (report.status, report.outcome, report.audit_records) == ("recorded", Outcome.UNCHANGED, 0)
    assert controller.now_state().applied_sha256 == pending.handle.plan_sha256


def test_an_agent_report_finishes_a_claim_whose_version_id_was_never_saved_only_for_the_claimed_plan() -> None:
    """The reconcile died after PutObject: the claim has no reference. Only an apply of the claimed plan
    is its delivery, and it is recorded under the version id the agent names."""
    controller = Controller(channel_kind=Channel.AGENT)
    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    pending = controller.now_state().pending
    assert pending is not None
    claim = pending.model_copy(update={"handle": pending.handle.model_copy(update={"reference": ""})})
    controller.state.save(controller.now_state().model_copy(update={"pending": claim}))

    def report(plan_sha256: str, mode: str) -> str:
        result = {"outcome": "applied", "applier_version": "1.0.0", "mode": mode, "plan_sha256": plan_sha256}
        detail = {"cluster": CLUSTER, "version_id": "v-unsaved", "etag": '"e1"', "result": result}
        event = event_envelope(agent_source(CLUSTER), AGENT_APPLY_DETAIL_TYPE, detail)
        return record_result(event, controller.result_deps()).status

    assert report("0" * 64, "apply") == "ignored"  # an older bundle's late report
    assert report(claim.handle.plan_sha256, "dry-run") == "ignored"
    assert controller.now_state().pending == claim
    assert report(claim.handle.plan_sha256, "apply") == "recorded"
    state = controller.now_state()
    assert state.pending is None and state.applied_sha256 == claim.handle.plan_sha256
    assert {r.delivery_reference for r in controller.audit.records.values()} == {"v-unsaved"}


def test_a_result_document_without_applier_version_is_refused_naming_the_field() -> None:
    controller = Controller()
    detail = {"cluster": CLUSTER, "version_id": "v1", "result": {"outcome": "applied"}}
    with pytest.raises(InputError, match=r"^detail\.result\.applier_version"):
        record_result(event_envelope(agent_source(CLUSTER), AGENT_APPLY_DETAIL_TYPE, detail), controller.result_deps())


def test_unknown_result_fields_are_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    result = ApplyResult.model_validate({"outcome": "in_sync", "applier_version": "9.0.0", "journal": {"a": 1}})
    assert result.outcome is Outcome.IN_SYNC and "journal" not in result.model_dump()
    assert "journal" in caplog.text


def test_state_saved_before_applier_version_was_required_still_loads() -> None:
    from topokeeper.contract.ports import ClusterState

    state = ClusterState.model_validate({"cluster": CLUSTER, "last_verify": {"outcome": "in_sync"}})
    assert state.last_verify is not None and state.last_verify.applier_version is None


def test_a_head_node_reporting_parallelclusters_topology_turns_the_cluster_to_verify() -> None:
    controller = Controller(orchestrator="ec2")
    command_id = _delivered(controller)
    controller.ssm_results[command_id] = ApplyResult.model_validate(
        {"outcome": "refused", "applier_version": "1.0.0", "managed_by": "parallelcluster", "error": "pcluster's"}
    )
    record_result(ssm_event(command_id), controller.result_deps())
    assert controller.now_state().managed_by == "parallelcluster"

    controller.facts.move(0, 1)
    report = reconcile(controller.change("moved"), controller.deps())
    assert report.action == "planned-only" and len(controller.channel.delivered) == 1
    assert report.reason == "verify mode: the head node's topology file is generated by parallelcluster"
