"""Which cluster a result is about comes from who could have sent it, never from the event's detail.

Agent reports: the per-cluster event source, which only that cluster's IAM policy may send (the policy's
events:source condition is checked statically in tests/infra/test_least_privilege.py: moto evaluates no
IAM). SSM results: the command topokeeper issued. The result service runs on the emulator's DynamoDB and S3.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import RecordingMetrics, event_envelope, p5_nodes, snapshot
from topokeeper.adapters.dynamodb import DynamoStateStore
from topokeeper.adapters.plans import S3PlanStore
from topokeeper.adapters.queue import SqsWorkQueue
from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.event_schemas import SSM_INVOCATION_DETAIL_TYPE
from topokeeper.contract.ports import ApplyResult, Channel, DeliveryHandle, Outcome, PendingDelivery
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render
from topokeeper.service.result import ResultDeps, record_result
from topokeeper.service.state import save_fields
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock
from topokeeper.sim.stack import create_state_table
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, AGENT_SOURCE, AGENT_VERIFY_DETAIL_TYPE, agent_source

ALPHA, BETA = "alpha", "beta"  # two agent clusters
SHARED_HEAD_NODE = "i-0123456789abcdef0"  # two SSM clusters managed from one head node
GAMMA, DELTA = "gamma", "delta"
RENDERED = render(plan(snapshot({"p5": p5_nodes(4, partition="p5")})))
COMMAND = "11111111-2222-3333-4444-555555555555"


class _NoAudit:
    def publish(self, records: Any) -> int:
        return len(records)


class Results:
    """The result function's dependencies on the emulator, with a delivery in flight to each cluster."""

    def __init__(self, aws: AwsEmulator, clock: ManualClock) -> None:
        dynamodb, sqs, s3 = aws.client("dynamodb"), aws.client("sqs"), aws.client("s3")
        create_state_table(dynamodb, "t")
        s3.create_bucket(Bucket="plans")
        url = sqs.create_queue(QueueName="w.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        self.state = DynamoStateStore(dynamodb, "t")
        self.plans = S3PlanStore(s3, "plans")
        self.metrics = RecordingMetrics()
        self.clock = clock
        self.ssm_outcome = Outcome.APPLIED
        agent = {"orchestrator": "ec2", "mode": "enforce", "channel": "agent"}
        ssm = {"orchestrator": "ec2", "mode": "enforce", "head_node": SHARED_HEAD_NODE}
        settings = Settings(
            clusters=[
                ClusterConfig(name=ALPHA, **agent),
                ClusterConfig(name=BETA, **agent),
                ClusterConfig(name=GAMMA, **ssm),
                ClusterConfig(name=DELTA, **ssm),
            ]
        )
        self.deps = ResultDeps(
            settings=settings,
            state=self.state,
            plans=self.plans,
            audit=_NoAudit(),
            queue=SqsWorkQueue(sqs, url, url),
            metrics=self.metrics,
            clock=clock,
            ssm_result=lambda cluster, command: ApplyResult(
                outcome=self.ssm_outcome, plan_sha256=RENDERED.sha256, applier_version="1.0.0"
            ),
        )
        for cluster in (ALPHA, BETA):
            self._in_flight(cluster, Channel.AGENT, f"v-{cluster}")
        self._in_flight(GAMMA, Channel.SSM, "00000000-0000-0000-0000-000000000000")
        self._in_flight(DELTA, Channel.SSM, COMMAND)

    def _in_flight(self, cluster: str, channel: Channel, reference: str) -> None:
        self.plans.put(cluster, RENDERED.bundle, RENDERED.files()["plan.json"])
        handle = DeliveryHandle(
            channel=channel,
            cluster=cluster,
            plan_sha256=RENDERED.sha256,
            reference=reference,
            target="s3://plans/k" if channel is Channel.AGENT else SHARED_HEAD_NODE,
            sent_at=self.clock.now(),
        )
        save_fields(self.state, cluster, {"pending": PendingDelivery(handle=handle, generation=1)})

    def record(self, source: str, detail_type: str, detail: dict[str, Any]) -> Any:
        return record_result(event_envelope(source, detail_type, detail, event_id="e-1"), self.deps)


@pytest.fixture
def results(aws: AwsEmulator, clock: ManualClock) -> Iterator[Results]:
    yield Results(aws, clock)


def _report(cluster: str, outcome: str = "applied") -> dict[str, Any]:
    """What an agent sends about ``cluster``'s delivery in flight."""
    return {
        "cluster": cluster,
        "plan_sha256": RENDERED.sha256,
        "version_id": f"v-{cluster}",
        "etag": '"x"',
        "result": {"outcome": outcome, "plan_sha256": RENDERED.sha256, "applier_version": "1.0.0"},
    }


def test_a_report_is_recorded_for_the_cluster_its_source_names(results: Results) -> None:
    report = results.record(agent_source(BETA), AGENT_APPLY_DETAIL_TYPE, _report(BETA))

    assert (report.status, report.cluster, report.outcome) == ("recorded", BETA, Outcome.APPLIED)
    assert results.state.get(BETA).applied_sha256 == RENDERED.sha256
    assert results.state.get(ALPHA).pending is not None


def test_a_forged_apply_report_for_another_cluster_is_refused_counted_and_changes_nothing(results: Results) -> None:
    """Cluster alpha's controller (its role may send only alpha's source) claims beta applied its plan."""
    report = results.record(agent_source(ALPHA), AGENT_APPLY_DETAIL_TYPE, _report(BETA))

    assert (report.status, report.cluster) == ("refused", ALPHA)
    assert report.reason == "forged report: source topokeeper.agent.alpha may only report on alpha, not 'beta'"
    assert results.metrics.points == [(ALPHA, "ForgedReports", 1)]
    beta = results.state.get(BETA)
    assert (beta.applied_sha256, beta.pending is not None) == (None, True)
    assert results.state.get(ALPHA).pending is not None


def test_a_forged_verify_report_for_another_cluster_is_refused(results: Results) -> None:
    report = results.record(agent_source(ALPHA), AGENT_VERIFY_DETAIL_TYPE, _report(BETA, "in_sync"))

    assert report.status == "refused"
    assert results.metrics.points == [(ALPHA, "ForgedReports", 1)]
    assert results.state.get(BETA).last_verify is None


def test_a_source_of_an_unmanaged_cluster_is_ignored(results: Results) -> None:
    report = results.record(agent_source("someone-elses"), AGENT_APPLY_DETAIL_TYPE, _report(BETA))

    assert (report.status, report.reason) == (
        "ignored",
        "no agent cluster someone-elses (source topokeeper.agent.someone-elses)",
    )
    assert results.metrics.points == []
    assert results.state.get(BETA).applied_sha256 is None


def test_an_agent_source_of_an_ssm_cluster_is_ignored(results: Results) -> None:
    """No agent policy names an SSM cluster's source: whoever sent it, it is not that cluster's agent."""
    report = results.record(agent_source(GAMMA), AGENT_VERIFY_DETAIL_TYPE, _report(GAMMA, "in_sync"))

    assert (report.status, report.reason) == ("ignored", "no agent cluster gamma (source topokeeper.agent.gamma)")
    assert results.state.get(GAMMA).last_verify is None


def test_a_report_on_the_shared_legacy_source_records_nothing_and_counts_an_outdated_agent(results: Results) -> None:
    """Agents from before per-cluster sources: any cluster's role could have sent it, so it proves nothing."""
    report = results.record(AGENT_SOURCE, AGENT_APPLY_DETAIL_TYPE, _report(BETA))

    assert (report.status, report.cluster) == ("outdated", BETA)
    assert results.metrics.points == [(BETA, "AgentOutdated", 1)]
    assert results.state.get(BETA).applied_sha256 is None
    assert results.state.get(BETA).pending is not None


def test_a_source_that_only_starts_like_ours_is_ignored(results: Results) -> None:
    report = results.record(AGENT_SOURCE + "-impostor", AGENT_APPLY_DETAIL_TYPE, _report(BETA))

    assert report.status == "ignored"
    assert results.metrics.points == []


def test_an_agent_outdated_verify_is_counted_and_kept_as_the_last_verify(results: Results) -> None:
    report = results.record(agent_source(BETA), AGENT_VERIFY_DETAIL_TYPE, _report(BETA, "agent_outdated"))

    assert (report.status, report.outcome) == ("verify-recorded", Outcome.AGENT_OUTDATED)
    assert results.metrics.points == [(BETA, "AgentOutdated", 1)]
    last_verify = results.state.get(BETA).last_verify
    assert last_verify is not None and last_verify.outcome is Outcome.AGENT_OUTDATED


def _ssm_status(command: str) -> dict[str, Any]:
    return {
        "command-id": command,
        "instance-id": SHARED_HEAD_NODE,
        "document-name": "AWS-RunShellScript",
        "status": "Success",
    }


def test_an_ssm_result_belongs_to_the_cluster_whose_command_it_is(results: Results) -> None:
    """Two clusters on one head node: the command id, not the instance, says whose delivery finished."""
    report = results.record("aws.ssm", SSM_INVOCATION_DETAIL_TYPE, _ssm_status(COMMAND))

    assert (report.status, report.cluster) == ("recorded", DELTA)
    assert results.state.get(DELTA).applied_sha256 == RENDERED.sha256
    assert results.state.get(GAMMA).applied_sha256 is None


def test_an_ssm_command_topokeeper_did_not_issue_is_ignored(results: Results) -> None:
    report = results.record("aws.ssm", SSM_INVOCATION_DETAIL_TYPE, _ssm_status("99999999-2222-3333-4444-555555555555"))

    assert (report.status, report.reason) == ("ignored", "not the delivery in flight")
    assert results.state.get(GAMMA).pending is not None and results.state.get(DELTA).pending is not None
