"""How the services behave when something fails half-way: no change is lost, no result is forgotten,
a late result never undoes a newer delivery, and permanent errors stop being retried.

Real adapters on the emulator (DynamoDB, SQS FIFO, S3); the facts and the head node are small stand-ins,
because what is tested here is the services' bookkeeping, not planning or delivery.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers import RecordingMetrics, event_envelope, p5_nodes, snapshot
from topokeeper.adapters.agent_channel import AgentChannel
from topokeeper.adapters.dynamodb import DynamoStateStore
from topokeeper.adapters.plans import S3PlanStore
from topokeeper.adapters.queue import SqsWorkQueue
from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.errors import InputError, Retryable
from topokeeper.contract.event_schemas import HYPERPOD_DETAIL_TYPES, TopokeeperEvent
from topokeeper.contract.ports import (
    ApplyResult,
    Channel,
    DeliveryHandle,
    Outcome,
    PendingDelivery,
    ReconcileRequest,
    Trigger,
)
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import AwsSnapshot
from topokeeper.render.bundle import Bundle, render
from topokeeper.service.controller import check_drift, process_message, reconcile
from topokeeper.service.ingest import IngestDeps, ingest
from topokeeper.service.reconcile import DELIVERY_TIMEOUT, ControllerDeps
from topokeeper.service.result import ResultDeps, finish_delivery, record_result
from topokeeper.service.state import save_fields
from topokeeper.sim.aws_emulator import AwsEmulator, ManualClock
from topokeeper.sim.stack import create_state_table
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, agent_bundle_key, agent_source

CLUSTER = "topo-test"
HEAD_NODE = "mi-0123456789abcdef0"
RENDERED = render(plan(snapshot({"p5": p5_nodes(8, partition="p5")})))


class Facts:
    """Whatever AWS says: here, a fixed plan's facts are not needed, planning is patched per test."""

    def read(self, cluster: str) -> AwsSnapshot:
        return AwsSnapshot.model_validate({"describe_cluster": {"ClusterName": cluster}})


class Channel_:
    def __init__(self, verify_result: ApplyResult | None = None) -> None:
        self.delivered: list[str] = []
        self.verified = 0
        self.verify_result = verify_result or ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0")

    def deliver(self, bundle: Bundle) -> DeliveryHandle:
        self.delivered.append(bundle.plan_sha256)
        return DeliveryHandle(
            channel=Channel.SSM,
            cluster=CLUSTER,
            plan_sha256=bundle.plan_sha256,
            reference=f"cmd-{len(self.delivered)}",
            target=HEAD_NODE,
            sent_at=datetime(2026, 1, 5, tzinfo=UTC),
        )

    def verify(self, bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        self.verified += 1
        return self.verify_result


class Stack:
    def __init__(self, aws: AwsEmulator, clock: ManualClock, mode: str = "enforce") -> None:
        dynamodb, sqs, s3 = aws.client("dynamodb"), aws.client("sqs"), aws.client("s3")
        create_state_table(dynamodb, "t")
        s3.create_bucket(Bucket="plans")
        fifo = {"FifoQueue": "true"}
        self.dlq_url = sqs.create_queue(QueueName="w-dlq.fifo", Attributes=fifo)["QueueUrl"]
        self.url = sqs.create_queue(QueueName="w.fifo", Attributes=fifo)["QueueUrl"]
        self.sqs = sqs
        self.state = DynamoStateStore(dynamodb, "t")
        self.queue = SqsWorkQueue(sqs, self.url, self.dlq_url)
        self.plans = S3PlanStore(s3, "plans")
        self.metrics = RecordingMetrics()
        self.channel = Channel_()
        self.clock = clock
        self.settings = Settings(
            clusters=[ClusterConfig(name=CLUSTER, orchestrator="ec2", mode=mode, head_node=HEAD_NODE)],
            debounce_seconds=0,
            min_write_interval_seconds=0,
        )

    def controller(self) -> ControllerDeps:
        return ControllerDeps(
            settings=self.settings,
            state=self.state,
            plans=self.plans,
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            facts=lambda c: Facts(),
            channel=lambda c: self.channel,
        )

    def results(self, ssm: ApplyResult) -> ResultDeps:
        return ResultDeps(
            settings=self.settings,
            state=self.state,
            plans=self.plans,
            audit=_NoAudit(),
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            ssm_result=lambda c, i: ssm,
        )

    def messages(self, url: str | None = None) -> list[dict[str, Any]]:
        found = self.sqs.receive_message(
            QueueUrl=url or self.url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=0
        )
        return found.get("Messages", [])


class _NoAudit:
    def publish(self, records: Any) -> int:
        return len(records)


@pytest.fixture
def stack(aws: AwsEmulator, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setattr("topokeeper.service.reconcile.plan_facts", lambda cluster, state, raw: RENDERED)
    monkeypatch.setattr("topokeeper.service.drift.plan_cluster", lambda cluster, state, facts: RENDERED)
    yield Stack(aws, clock)


def _event(event_id: str = "e-1") -> TopokeeperEvent:
    return TopokeeperEvent.model_validate(
        {
            "version": "0",
            "id": event_id,
            "detail-type": HYPERPOD_DETAIL_TYPES[0],
            "source": "aws.sagemaker",
            "account": "111122223333",
            "time": "2026-01-05T09:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": {"ClusterArn": "arn", "ClusterName": CLUSTER},
        }
    )


def _ingest_deps(stack: Stack, queue: Any = None) -> IngestDeps:
    return IngestDeps(
        settings=stack.settings,
        state=stack.state,
        queue=queue or stack.queue,
        metrics=stack.metrics,
        clock=stack.clock,
        cluster_name_of_arn=lambda arn: None,
        instance_tags=lambda i: {},
    )


def test_an_ingest_that_dies_before_queueing_is_retried_whole(stack: Stack) -> None:
    class FailingOnce:
        failed = False

        def send(self, request: ReconcileRequest) -> None:
            if not self.failed:
                self.failed = True
                raise ConnectionError("throttled")
            stack.queue.send(request)

    queue = FailingOnce()
    with pytest.raises(ConnectionError):
        ingest(_event(), _ingest_deps(stack, queue))
    # Lambda retries the same event: it must not read as a duplicate, and must queue its change.
    assert ingest(_event(), _ingest_deps(stack, queue)).status == "queued"
    assert len(stack.messages()) == 1


def test_a_duplicate_requeues_a_change_nobody_queued(stack: Stack) -> None:
    assert ingest(_event(), _ingest_deps(stack)).status == "queued"
    stack.sqs.purge_queue(QueueUrl=stack.url)  # as if the message of this cycle were gone
    assert ingest(_event(), _ingest_deps(stack)).status == "duplicate"
    assert len(stack.messages()) == 1


def test_a_covered_message_queues_the_changes_after_it(stack: Stack) -> None:
    now = stack.clock.now()
    trigger = Trigger(source="s", detail_type="d", event_id="x", time=now)
    stack.state.record_change(CLUSTER, trigger, now)
    assert reconcile(ReconcileRequest(cluster=CLUSTER, generation=1), stack.controller()).action == "delivered"
    stack.sqs.purge_queue(QueueUrl=stack.url)
    stack.state.record_change(CLUSTER, trigger, now)  # generation 2, its message lost with a crashed reconcile
    report = reconcile(ReconcileRequest(cluster=CLUSTER, generation=1), stack.controller())
    assert report.action == "covered"
    (message,) = stack.messages()
    assert json.loads(message["Body"]) == {"cluster": CLUSTER, "generation": 2, "since": 1, "reason": "event"}


def test_a_delivery_is_claimed_before_it_is_sent(stack: Stack) -> None:
    """Two writers (the Lambda, an operator) that read the same state: only one delivers."""
    now = stack.clock.now()
    stack.state.record_change(CLUSTER, Trigger(source="s", detail_type="d", event_id="x", time=now), now)
    stale = stack.state.get(CLUSTER)
    stack.state.save(stale)  # someone else saved in between
    from topokeeper.service import reconcile as module

    assert module._claim_delivery(stack.controller(), stack.settings.clusters[0], stale, RENDERED, now) is None
    assert stack.channel.delivered == []


def test_an_ssm_result_not_readable_yet_is_retried_not_forgotten(stack: Stack) -> None:
    now = stack.clock.now()
    handle = DeliveryHandle(
        channel=Channel.SSM,
        cluster=CLUSTER,
        plan_sha256=RENDERED.sha256,
        reference="0e8d3c0e-71f7-4491-898f-c9b35bee5f3b",
        target=HEAD_NODE,
        sent_at=now,
    )
    save_fields(stack.state, CLUSTER, {"pending": PendingDelivery(handle=handle, generation=1)})
    event = TopokeeperEvent.model_validate(
        {
            "version": "0",
            "id": "s-1",
            "detail-type": "EC2 Command Invocation Status-change Notification",
            "source": "aws.ssm",
            "account": "111122223333",
            "time": "2026-01-05T09:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": {
                "command-id": handle.reference,
                "instance-id": HEAD_NODE,
                "document-name": "AWS-RunShellScript",
                "status": "Success",
            },
        }
    )
    with pytest.raises(Retryable, match="still reads pending"):
        record_result(event, stack.results(ApplyResult.from_channel(Outcome.PENDING)))
    assert stack.state.get(CLUSTER).pending is not None


def test_a_late_result_never_undoes_a_newer_delivery(stack: Stack) -> None:
    now = stack.clock.now()
    stack.plans.put(CLUSTER, RENDERED.bundle, RENDERED.files()["plan.json"])

    def delivery(reference: str) -> PendingDelivery:
        handle = DeliveryHandle(
            channel=Channel.SSM,
            cluster=CLUSTER,
            plan_sha256=RENDERED.sha256,
            reference=reference,
            target=HEAD_NODE,
            sent_at=now,
        )
        return PendingDelivery(handle=handle, generation=1)

    old, new = delivery("cmd-old"), delivery("cmd-new")
    save_fields(stack.state, CLUSTER, {"pending": new})
    applied = ApplyResult.model_validate({"outcome": "applied", "applier_version": "1.0.0", "slurm_version": "26.05.5"})
    finish_delivery(stack.settings.clusters[0], stack.state.get(CLUSTER), old, applied, stack.results(applied))
    state = stack.state.get(CLUSTER)
    assert state.pending == new and state.applied_sha256 is None
    assert state.slurm_version == "26.05.5"


def test_a_version_string_that_is_not_a_version_is_ignored(stack: Stack) -> None:
    stack.plans.put(CLUSTER, RENDERED.bundle, RENDERED.files()["plan.json"])
    handle = DeliveryHandle(
        channel=Channel.SSM,
        cluster=CLUSTER,
        plan_sha256=RENDERED.sha256,
        reference="c",
        target=HEAD_NODE,
        sent_at=stack.clock.now(),
    )
    pending = PendingDelivery(handle=handle, generation=1)
    save_fields(stack.state, CLUSTER, {"pending": pending})
    result = ApplyResult.model_validate(
        {"outcome": "applied", "applier_version": "1.0.0", "slurm_version": "26.05'; reboot"}
    )
    finish_delivery(stack.settings.clusters[0], stack.state.get(CLUSTER), pending, result, stack.results(result))
    state = stack.state.get(CLUSTER)
    assert state.slurm_version is None and state.applied_sha256 == RENDERED.sha256


def test_permanent_failures_go_to_the_dead_letter_queue_others_come_back_soon(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = ReconcileRequest(cluster=CLUSTER, generation=1).model_dump_json()
    stack.queue.send(ReconcileRequest(cluster=CLUSTER, generation=1))
    (message,) = stack.sqs.receive_message(QueueUrl=stack.url, VisibilityTimeout=600)["Messages"]

    def bad_facts(*_: Any) -> Any:
        raise InputError("nodes[3].PrivateDnsHostname", "not a safe Slurm name")

    monkeypatch.setattr("topokeeper.service.controller.reconcile", bad_facts)
    assert process_message(body, message["ReceiptHandle"], stack.controller(), {}) is None
    (parked,) = stack.messages(stack.dlq_url)
    assert "nodes[3].PrivateDnsHostname" in parked["MessageAttributes"]["reason"]["StringValue"]

    deferred: list[float] = []
    monkeypatch.setattr(stack.queue, "defer", lambda receipt, seconds: deferred.append(seconds))

    def flaky(*_: Any) -> Any:
        raise ConnectionError("DynamoDB throttled")

    monkeypatch.setattr("topokeeper.service.controller.reconcile", flaky)
    with pytest.raises(ConnectionError):
        process_message(body, message["ReceiptHandle"], stack.controller(), {})
    assert deferred == [60]


def _desired(stack: Stack, **fields: Any) -> None:
    stack.plans.put(CLUSTER, RENDERED.bundle, RENDERED.files()["plan.json"])
    save_fields(stack.state, CLUSTER, {"desired_sha256": RENDERED.sha256, **fields})


def test_drift_is_not_judged_while_a_delivery_is_in_flight(stack: Stack) -> None:
    handle = DeliveryHandle(
        channel=Channel.SSM,
        cluster=CLUSTER,
        plan_sha256=RENDERED.sha256,
        reference="c",
        target=HEAD_NODE,
        sent_at=stack.clock.now(),
    )
    _desired(stack, pending=PendingDelivery(handle=handle, generation=1))
    report = check_drift(stack.settings.clusters[0], stack.controller())
    assert (report.live, report.drift, stack.channel.verified) == ("pending", 0, 0)  # a change on its way


def test_a_write_that_did_not_land_is_tried_again_by_the_drift_schedule(stack: Stack) -> None:
    _desired(stack, applied_sha256="0" * 64)  # the last delivery was refused or rolled back
    report = check_drift(stack.settings.clusters[0], stack.controller())
    assert report.action == "reconcile-requested" and len(stack.messages()) == 1


def test_verify_mode_plans_again_after_a_lost_event(aws: AwsEmulator, clock: ManualClock, monkeypatch) -> None:
    stack = Stack(aws, clock, mode="verify")
    monkeypatch.setattr("topokeeper.service.drift.plan_cluster", lambda cluster, state, facts: RENDERED)
    before = render(plan(snapshot({"p5": p5_nodes(4, partition="p5")})))  # planned before AWS changed
    stack.plans.put(CLUSTER, before.bundle, before.files()["plan.json"])
    save_fields(stack.state, CLUSTER, {"desired_sha256": before.sha256})
    report = check_drift(stack.settings.clusters[0], stack.controller())
    assert (report.aws, report.action) == ("changed", "reconcile-requested")
    assert stack.channel.delivered == []


def test_agent_results_are_matched_by_the_object_version_they_applied(stack: Stack) -> None:
    # An agent's reports count only for a cluster served by the agent channel (its source is its identity).
    stack.settings = Settings(
        clusters=[ClusterConfig(name=CLUSTER, orchestrator="ec2", channel=Channel.AGENT)],
        debounce_seconds=0,
        min_write_interval_seconds=0,
    )
    stack.plans.put(CLUSTER, RENDERED.bundle, RENDERED.files()["plan.json"])
    handle = DeliveryHandle(
        channel=Channel.AGENT,
        cluster=CLUSTER,
        plan_sha256=RENDERED.sha256,
        reference="v-2",
        target="s3://b/k",
        sent_at=stack.clock.now(),
    )
    save_fields(stack.state, CLUSTER, {"pending": PendingDelivery(handle=handle, generation=1)})

    def report(version: str) -> TopokeeperEvent:
        return TopokeeperEvent.model_validate(
            {
                "version": "0",
                "id": f"a-{version}",
                "detail-type": "Topology Apply Result",
                "source": agent_source(CLUSTER),
                "account": "111122223333",
                "time": "2026-01-05T09:00:00Z",
                "region": "us-east-1",
                "resources": [],
                "detail": {
                    "cluster": CLUSTER,
                    "plan_sha256": RENDERED.sha256,
                    "version_id": version,
                    "etag": '"x"',
                    "result": {"outcome": "applied", "applier_version": "1.0.0"},
                },
            }
        )

    deps = stack.results(ApplyResult.from_channel(Outcome.PENDING))
    assert record_result(report("v-1"), deps).status == "ignored"  # same plan, an older object version
    assert record_result(report("v-2"), deps).status == "recorded"
    assert stack.state.get(CLUSTER).applied_sha256 == RENDERED.sha256


def test_a_message_behind_a_delivery_hides_once_and_returns_with_the_result(stack: Stack) -> None:
    """Real SQS FIFO: one ChangeMessageVisibility for the delivery's remaining time (not a receive every
    30 s into the dead-letter queue), and the delivery's result makes the message visible at once."""
    now = stack.clock.now()
    stack.state.record_change(CLUSTER, Trigger(source="s", detail_type="d", event_id="x", time=now), now)
    assert reconcile(ReconcileRequest(cluster=CLUSTER, generation=1), stack.controller()).action == "delivered"
    sent = stack.state.get(CLUSTER).pending
    assert sent is not None
    just_now = sent.model_copy(update={"handle": sent.handle.model_copy(update={"sent_at": now})})
    save_fields(stack.state, CLUSTER, {"pending": just_now})  # the stand-in channel's clock is not the stack's
    stack.sqs.purge_queue(QueueUrl=stack.url)
    second = stack.state.record_change(CLUSTER, Trigger(source="s", detail_type="d", event_id="y", time=now), now)
    request = ReconcileRequest(cluster=CLUSTER, generation=second.generation, since=second.reconciled_generation)
    stack.queue.send(request)
    (message,) = stack.sqs.receive_message(QueueUrl=stack.url, VisibilityTimeout=5, AttributeNames=["All"])["Messages"]

    report = process_message(request.model_dump_json(), message["ReceiptHandle"], stack.controller(), {})
    assert report is not None and report.defer_seconds == DELIVERY_TIMEOUT.total_seconds()
    assert stack.messages() == []  # hidden for the delivery's remaining time, not for 30 s

    pending = stack.state.get(CLUSTER).pending
    assert pending is not None and pending.waiting_receipt == message["ReceiptHandle"]
    stack.plans.put(CLUSTER, RENDERED.bundle, RENDERED.files()["plan.json"])
    applied = ApplyResult(outcome=Outcome.APPLIED, applier_version="1.0.0")
    finish_delivery(stack.settings.clusters[0], stack.state.get(CLUSTER), pending, applied, stack.results(applied))
    (again,) = stack.messages()
    assert again["MessageId"] == message["MessageId"]
    stack.queue.resume(message["ReceiptHandle"])  # a stale handle (received again since) is no error


def test_an_agent_report_finishes_the_claim_of_a_reconcile_that_died_after_put_object(
    stack: Stack, aws: AwsEmulator
) -> None:
    """The reconcile's PutObject reached the versioned bucket, then the function died before saving the version
    id. The agent applies that object and reports the version it read: that report finishes the claim."""

    class Died(BaseException):
        pass

    s3 = aws.client("s3")
    s3.create_bucket(Bucket="bundles")
    s3.put_bucket_versioning(Bucket="bundles", VersioningConfiguration={"Status": "Enabled"})
    channel = AgentChannel(
        s3, "bundles", stack.state, now=stack.clock.now, max_report_age=timedelta(minutes=30), verify_only=False
    )

    class DiesAfterPutObject:
        def deliver(self, bundle: Bundle) -> DeliveryHandle:
            channel.deliver(bundle)
            raise Died

    stack.settings = Settings(
        clusters=[ClusterConfig(name=CLUSTER, orchestrator="ec2", channel=Channel.AGENT)],
        debounce_seconds=0,
        min_write_interval_seconds=0,
    )
    stack.channel = DiesAfterPutObject()  # type: ignore[assignment]
    save_fields(stack.state, CLUSTER, {"slurm_nodes": []})  # the head node's table is known: no read first
    now = stack.clock.now()
    stack.state.record_change(CLUSTER, Trigger(source="s", detail_type="d", event_id="x", time=now), now)
    with pytest.raises(Died):
        reconcile(ReconcileRequest(cluster=CLUSTER, generation=1), stack.controller())
    claim = stack.state.get(CLUSTER).pending
    assert claim is not None and claim.handle.reference == ""

    key = agent_bundle_key(RENDERED.bundle.cluster_name)  # the planned stand-in bundle's own cluster name
    got = s3.get_object(Bucket="bundles", Key=key)  # what the agent's poll reads
    detail = {
        "cluster": CLUSTER,
        "plan_sha256": RENDERED.sha256,
        "etag": got["ETag"],
        "version_id": got["VersionId"],
        "result": {"outcome": "applied", "applier_version": "1.0.0", "mode": "apply", "plan_sha256": RENDERED.sha256},
    }
    event = event_envelope(agent_source(CLUSTER), AGENT_APPLY_DETAIL_TYPE, detail)
    assert record_result(event, stack.results(ApplyResult.from_channel(Outcome.PENDING))).status == "recorded"
    state = stack.state.get(CLUSTER)
    assert state.pending is None and state.applied_sha256 == RENDERED.sha256
