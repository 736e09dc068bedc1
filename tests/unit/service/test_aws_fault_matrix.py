"""The AWS-side fault matrix (issue 11): throttling on every AWS call the backend makes, every SSM command and
invocation status, the head node replaced between deliver and result, DynamoDB conditional conflicts, S3
unavailable, a silent agent. Each row says what was injected, what happened, whether the cluster converged and
how long it took in simulated time.

The service code runs on the in-memory ports of ``test_crash_points`` (SQS FIFO, EventBridge's retried result
events, the drift schedule, a head node), in simulated time. A fault is what the adapter raises for AWS's answer
(``Retryable`` with the AWS code, after botocore's own retries: ``tests/unit/adapters`` prove that translation),
or, for DynamoDB, another writer's real conflicting write. SSM statuses go through the real
``parse_invocation``. Every row must converge with no reconcile message dead-lettered; an event whose three
attempts all failed goes to the event dead-letter queue and is counted. ``make test`` runs a representative
subset; ``make reliability`` (``TOPOKEEPER_RELIABILITY_FULL=1``) every row, written to docs/reliability.md.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from tests.fakes import FakeChannel
from tests.unit.service.test_crash_points import COMMAND_SECONDS, HORIZON, Crash, Fault, World
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER
from topokeeper.adapters.ssm_channel import parse_invocation
from topokeeper.contract.errors import Retryable
from topokeeper.contract.ports import ApplyResult, Channel, DeliveryHandle, Metric, Outcome
from topokeeper.render.bundle import Bundle
from topokeeper.service.reconcile import plan_cluster

FULL = os.environ.get("TOPOKEEPER_RELIABILITY_FULL") == "1"
RECORDS = os.environ.get("TOPOKEEPER_RELIABILITY_OUT")
THROTTLED_INVOCATIONS = 2  # throttling that outlasts botocore's retries in two invocations in a row


def throttled(code: str = "ThrottlingException") -> Callable[[], BaseException]:
    return lambda: Retryable("Rate exceeded", code=code)


@dataclass(frozen=True)
class Command:
    """How the first SendCommand after the fault is armed ends: GetCommandInvocation's Status and StatusDetails,
    whether the applier ran and applied (``applies``), what it printed, and whether a terminal status event
    is sent (the rule passes terminal statuses only)."""

    status: str
    details: str
    applies: bool = False
    document: str | None = None  # the applier's outcome it printed, if any
    event_status: str | None = None  # None: no terminal event ever comes
    stale_reads: int = 0  # GetCommandInvocation still reads InProgress this many times after the event
    replaced: bool = False  # the head node is replaced by one with no topology before the result
    delivery: int = 1  # which delivery after the fault is armed ends so (the scenario makes two)


@dataclass(frozen=True)
class Row:
    name: str  # the injected fault
    channel: Channel = Channel.SSM
    faults: tuple[Callable[[World], Fault], ...] = ()
    command: Command | None = None
    agent_silent: bool = False  # the agent applies the first bundle but its report never arrives
    audited: bool = True  # every apply is audited once (false where the fault takes the report away)
    quick: bool = False  # in make test


def _throttle(port: str, method: str, code: str = "ThrottlingException") -> Callable[[World], Fault]:
    return lambda world: Fault(port, method, throttled(code), times=THROTTLED_INVOCATIONS)


def _conflict(save: int) -> Callable[[World], Fault]:
    """Another writer (an operator's apply, a drift check) saves the cluster's state just before the ``save``-th
    save after the change: DynamoDB's condition on the version fails for real."""

    def make(world: World) -> Fault:
        store = world.controller.state._inner  # type: ignore[attr-defined]
        return Fault("state", "save", before=lambda: store.save(store.get(CLUSTER)), skip=save - 1)

    return make


THROTTLING = [
    Row(
        "throttled: HyperPod/EC2 facts (ListClusterNodes, DescribeInstanceTopology)",
        faults=(_throttle("facts", "read"),),
        quick=True,
    ),
    Row("throttled: DynamoDB GetItem (cluster state)", faults=(_throttle("state", "get"),)),
    Row("throttled: DynamoDB PutItem (claim, record, result)", faults=(_throttle("state", "save"),), quick=True),
    Row("throttled: DynamoDB UpdateItem (consume triggers)", faults=(_throttle("state", "consume_triggers"),)),
    Row("throttled: S3 PutObject (plan)", faults=(_throttle("plans", "put", "SlowDown"),)),
    Row("throttled: S3 GetObject (plan document, result)", faults=(_throttle("plans", "plan_document", "SlowDown"),)),
    Row("throttled: S3 GetObject (bundle, drift)", faults=(_throttle("plans", "bundle", "SlowDown"),)),
    Row(
        "throttled: SQS SendMessage (the drift check's reconcile request, head node replaced)",
        faults=(_throttle("queue", "send", "RequestThrottled"),),
        command=Command("Success", "Success", True, "applied", "Success", replaced=True, delivery=2),
    ),
    Row("throttled: SQS ChangeMessageVisibility (defer)", faults=(_throttle("queue", "defer", "RequestThrottled"),)),
    Row("throttled: SQS ChangeMessageVisibility (resume)", faults=(_throttle("queue", "resume", "RequestThrottled"),)),
    Row(
        "throttled: SQS DeleteMessage (batch response)",
        faults=(_throttle("sqs", "delete_message", "RequestThrottled"),),
    ),
    Row("throttled: EventBridge PutEvents (audit)", faults=(_throttle("audit", "publish"),), quick=True),
    Row("throttled: SSM SendCommand (deliver)", faults=(_throttle("channel", "deliver"),), quick=True),
    Row("throttled: SSM SendCommand (verify)", faults=(_throttle("channel", "verify"),)),
    Row("throttled: SSM GetCommandInvocation", faults=(_throttle("ssm", "get_command_invocation"),)),
    Row(
        "throttled: SSM GetCommandInvocation on every attempt of the result event",
        faults=(lambda world: Fault("ssm", "get_command_invocation", throttled(), times=3),),
        audited=False,
    ),
    Row("throttled: S3 PutObject (agent bundle)", Channel.AGENT, faults=(_throttle("channel", "deliver", "SlowDown"),)),
]
SSM_STATUSES = [
    Row("SSM Success / Success", command=Command("Success", "Success", True, "applied", "Success"), quick=True),
    Row(
        "SSM Failed / Failed (the applier failed)",
        command=Command("Failed", "Failed", False, "failed", "Failed"),
        quick=True,
    ),
    Row("SSM Failed / Failed, no result document", command=Command("Failed", "Failed", False, None, "Failed")),
    Row(
        "SSM TimedOut / Delivery Timed Out", command=Command("TimedOut", "Delivery Timed Out", event_status="TimedOut")
    ),
    Row(
        "SSM TimedOut / Execution Timed Out, after the applier's renames",
        command=Command("TimedOut", "Execution Timed Out", True, None, "TimedOut"),
        audited=False,
    ),
    Row("SSM Cancelled / Cancelled", command=Command("Cancelled", "Cancelled", event_status="Cancelled")),
    Row(
        "SSM Failed / Undeliverable",
        command=Command("Failed", "Undeliverable", event_status="Undeliverable"),
        quick=True,
    ),
    Row("SSM Failed / Terminated", command=Command("Failed", "Terminated", event_status="Terminated")),
    Row("SSM Pending / Pending, never ends", command=Command("Pending", "Pending")),
    Row("SSM InProgress / In Progress, never ends", command=Command("InProgress", "In Progress"), quick=True),
    Row("SSM Delayed / Delayed, never ends", command=Command("Delayed", "Delayed")),
    Row("SSM Cancelling / Cancelling, never ends", command=Command("Cancelling", "Cancelling")),
    Row(
        "SSM Success event, GetCommandInvocation still InProgress twice",
        command=Command("Success", "Success", True, "applied", "Success", stale_reads=2),
    ),
    Row(
        "head node replaced after the apply, before the result",
        command=Command("Success", "Success", True, "applied", "Success", replaced=True, delivery=2),
        quick=True,
    ),
    Row(
        "head node replaced before the command ran",
        command=Command("Failed", "Terminated", event_status="Terminated", replaced=True, delivery=2),
    ),
]
OTHERS = [
    Row("DynamoDB conditional conflict at the claim", faults=(_conflict(1),), quick=True),
    Row("DynamoDB conditional conflict at the reconcile's record", faults=(_conflict(2),)),
    Row("DynamoDB conditional conflict while a message registers behind the delivery", faults=(_conflict(3),)),
    Row("DynamoDB conditional conflict at the result", faults=(_conflict(4),)),
    Row(
        "S3 unavailable: PutObject (plan) 503 three times",
        faults=(lambda world: Fault("plans", "put", throttled("ServiceUnavailable"), times=3),),
    ),
    Row("agent silent: applied, its report never arrives", Channel.AGENT, agent_silent=True, audited=False, quick=True),
]
ROWS = [row for row in THROTTLING + SSM_STATUSES + OTHERS if FULL or row.quick]


class Scripted:
    """The head node's ``command.delivery``-th delivery after arming ends as the row says (for a silent agent,
    the first); the others as usual."""

    def __init__(self, world: World, row: Row) -> None:
        self.world, self.row = world, row
        self.armed = False
        self.deliveries = 0
        self.original = world.head_node.deliver
        world.head_node.deliver = self.deliver  # type: ignore[method-assign]

    def deliver(self, bundle: Bundle) -> DeliveryHandle:
        if self.armed:
            self.deliveries += 1
        if self.deliveries != (self.row.command.delivery if self.row.command else 1):
            return self.original(bundle)
        head_node, world = self.world.head_node, self.world
        if self.row.agent_silent:
            handle = self.original(bundle)
            world.events.pop()  # the report is lost
            return handle
        command = self.row.command
        assert command is not None
        if command.applies:
            handle = self.original(bundle)
            world.events.pop()  # the status event comes as the command ended, below
        else:
            handle = FakeChannel.deliver(head_node, bundle)
        document = None
        if command.document is not None:
            document = {"outcome": command.document, "applier_version": "1.0.0", "mode": "apply"}
            document["plan_sha256"] = bundle.plan_sha256
            document["partitions_changed"] = sorted(bundle.partitions) if command.applies else []
        result = parse_invocation(
            {
                "Status": command.status,
                "StatusDetails": command.details,
                "ResponseCode": 0 if command.document == "applied" else 1,
                "StandardOutputContent": json.dumps(document) if document else "",
            }
        )
        reads = [ApplyResult.from_channel(Outcome.PENDING)] * command.stale_reads + [result]
        world.controller.ssm_results = _StaleReads(world.controller.ssm_results, handle.reference, reads)
        if command.replaced:
            head_node.live = None  # a new head node from the lifecycle scripts: no topology yet
        if command.event_status is not None:
            event = ssm_event(handle.reference)
            event.detail["status"] = command.event_status
            world.emit(event, after_seconds=COMMAND_SECONDS)
        return handle


class _StaleReads(dict[str, ApplyResult]):
    """GetCommandInvocation for one command: each read takes the next of ``reads`` (the last one stays)."""

    def __init__(self, results: dict[str, ApplyResult], reference: str, reads: list[ApplyResult]) -> None:
        super().__init__(results)
        self.reference, self.reads = reference, list(reads)

    def __getitem__(self, key: str) -> ApplyResult:
        if key == self.reference:
            return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]
        return super().__getitem__(key)


@dataclass
class RowResult:
    converged: bool
    seconds: float | None
    audited_once: bool
    summary: str
    failures: collections.Counter[str] = field(default_factory=collections.Counter)


def run_row(row: Row) -> tuple[World, RowResult]:
    crash = Crash("none", "none", "none")
    world = World(crash, row.channel)
    scripted = Scripted(world, row) if row.command or row.agent_silent else None
    world.change("e-initial")
    world.run(timedelta(minutes=2))
    c = world.controller
    crash.faults = [make(world) for make in row.faults]
    for fault in crash.faults:
        fault.armed = True
    if scripted is not None:
        scripted.armed = True
    applies_before, audited_before = len(world.head_node.applies), set(c.audit.records)  # type: ignore[attr-defined]
    start = c.clock.now()
    world.two_moves()
    expected = plan_cluster(c.cluster, c.now_state(), c.facts).sha256

    def converged() -> bool:
        state = c.now_state()
        return (
            world.head_node.live == state.applied_sha256 == state.desired_sha256 == expected
            and state.pending is None
            and state.reconciled_generation == state.generation
            and not world.queue.messages
        )

    since = None
    end = c.clock.now() + HORIZON
    while c.clock.now() < end:
        world.step()
        since = (since or c.clock.now()) if converged() else None  # converged from then on
    applies = world.head_node.applies[applies_before:]
    records = [r for key, r in c.audit.records.items() if key not in audited_before]  # type: ignore[attr-defined]
    audited = sorted((r.plan_sha256, r.delivery_reference) for r in records if r.outcome is Outcome.APPLIED)
    audited_once = audited == sorted((a.after, a.reference) for a in applies)
    failures = collections.Counter(world.failures)
    outcomes = collections.Counter(str(r.outcome) for r in records)
    parts = [f"deliveries: {len(world.head_node.delivered) - 1}"]  # the initial one before the change excluded
    if failures:
        parts.append("failed invocations: " + ", ".join(f"{k} x{n}" for k, n in sorted(failures.items())))
    parts.append("audited: " + (", ".join(f"{k} x{n}" for k, n in sorted(outcomes.items())) or "nothing"))
    failures_metric = sum(c.metrics.values(Metric.APPLY_FAILURES))
    if failures_metric:
        parts.append(f"ApplyFailures {failures_metric:g}")
    if world.lost_events:
        parts.append(f"{len(world.lost_events)} result event(s) to the event dead-letter queue")
    seconds = (since - start).total_seconds() if since is not None else None
    return world, RowResult(since is not None, seconds, audited_once, "; ".join(parts), failures)


def _record(row: Row, outcome: RowResult) -> None:
    if RECORDS:
        Path(RECORDS).parent.mkdir(parents=True, exist_ok=True)
        record = {
            "kind": "aws-fault",
            "fault": row.name,
            "channel": row.channel.value,
            "outcome": outcome.summary,
            "converged": outcome.converged,
            "converge_seconds": outcome.seconds,
            "audited_once": outcome.audited_once,
        }
        with open(RECORDS, "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_each_aws_fault_converges_with_nothing_dead_lettered(row: Row) -> None:
    world, outcome = run_row(row)
    _record(row, outcome)
    for fault in world.crash.faults:
        assert fault.fired, f"{fault.port}.{fault.method} was never called after the fault was armed"
    assert outcome.converged, outcome.summary
    assert world.queue.dead_letters == []
    # An event whose every attempt failed is not dropped: it is in the event dead-letter queue (counted).
    assert bool(world.lost_events) == (row.name.endswith("every attempt of the result event")), outcome.summary
    assert outcome.audited_once == row.audited, outcome.summary
    if row.command is not None and not row.command.applies:
        assert world.controller.metrics.values(Metric.APPLY_FAILURES) or row.command.event_status is None
