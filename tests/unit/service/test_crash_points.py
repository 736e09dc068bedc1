"""Crash points of the backend flow (issue 11): the reconcile or result function dies between two AWS calls.

A ``Killed`` (not an Exception, so nothing in the service catches it) stands in for the Lambda process
dying: SIGKILL, a timeout, out of memory. After it, what happens in reality runs on the fake clock: SQS
shows the message again after its visibility timeout, EventBridge retries the result event, the drift
schedule runs, the delivery timeout passes. Every case must end converged (the head node serving the
plan of the facts now), with every apply audited exactly once, no change left unreconciled and no claim
left blocking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.fakes import FakeChannel, FakeClock, MemoryWorkQueue
from tests.helpers import event_envelope
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.event_schemas import TopokeeperEvent
from topokeeper.contract.ports import ApplyResult, Channel, DeliveryHandle, Outcome, ReconcileRequest
from topokeeper.contract.stack_spec import WORK_VISIBILITY_TIMEOUT_SECONDS
from topokeeper.render.bundle import Bundle
from topokeeper.service.controller import DriftRequest, check_requested, process_message
from topokeeper.service.reconcile import DELIVERY_TIMEOUT, plan_cluster
from topokeeper.service.result import record_result
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, agent_source

STEP_SECONDS = 5
COMMAND_SECONDS = 30  # SendCommand to the terminal status event
EVENT_RETRY_SECONDS = 60
EVENT_ATTEMPTS = 3  # an asynchronous Lambda invocation: the first and two retries
DRIFT_SECONDS = 15 * 60  # the default drift_schedule
# Long enough for the worst case: a claim that waits out the delivery timeout, then the next drift check.
HORIZON = DELIVERY_TIMEOUT + timedelta(seconds=WORK_VISIBILITY_TIMEOUT_SECONDS + 2 * DRIFT_SECONDS)


class Killed(BaseException):
    """The function's process dies here: no handler, no finally that talks to AWS."""


@dataclass
class Fault:
    """AWS fails the first ``times`` calls of ``port.method`` by any function once armed: ``error`` is raised
    instead of the call (as the adapter raises what AWS answered), after ``before`` ran (another writer)."""

    port: str
    method: str
    error: Callable[[], BaseException] | None = None
    times: int = 1
    before: Callable[[], object] | None = None
    skip: int = 0  # the first calls that pass untouched
    armed: bool = False
    fired: int = 0

    def hit(self, port: str, method: str) -> None:
        if not self.armed or self.fired >= self.times or (port, method) != (self.port, self.method):
            return
        if self.skip > 0:
            self.skip -= 1
            return
        self.fired += 1
        if self.before is not None:
            self.before()
        if self.error is not None:
            raise self.error()


@dataclass
class Crash:
    """Kill the invocation right after the ``occurrence``-th call of ``port.method`` by ``function`` once armed;
    ``faults`` fail calls before they are made."""

    function: str
    port: str
    method: str
    occurrence: int = 1
    armed: bool = False
    running: str = ""  # the function being invoked
    calls: int = 0
    fired: bool = False
    faults: list[Fault] = field(default_factory=list)

    def before(self, port: str, method: str) -> None:
        if self.running:  # the functions' calls only, not the test's own reads
            for fault in self.faults:
                fault.hit(port, method)

    def after(self, port: str, method: str) -> None:
        if not self.armed or self.fired or (self.running, port, method) != (self.function, self.port, self.method):
            return
        self.calls += 1
        if self.calls == self.occurrence:
            self.fired = True
            raise Killed(f"killed after {port}.{method}")


class Crashing:
    """A port whose every method call passes ``crash.before`` (faults) and ``crash.after`` once it returned."""

    def __init__(self, port: str, inner: Any, crash: Crash) -> None:
        self._port, self._inner, self._crash = port, inner, crash

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._crash.before(self._port, name)
            value = attribute(*args, **kwargs)
            self._crash.after(self._port, name)
            return value

        return call


@dataclass
class Message:
    request: ReconcileRequest
    visible_at: datetime
    receipt: str = ""
    receives: int = 0


class SqsFifo(MemoryWorkQueue):
    """The work queue as SQS FIFO keeps it: deduplication per cycle, one message group per cluster (the
    first message blocks the rest until deleted), a received message hidden for the visibility timeout."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.messages: list[Message] = []
        self.deduplicated: dict[str, datetime] = {}
        self.deleted: list[ReconcileRequest] = []
        self.receipts = 0

    def send(self, request: ReconcileRequest) -> None:
        super().send(request)
        sent_at = self.deduplicated.get(request.deduplication_id)
        if sent_at is not None and self.clock.now() - sent_at < timedelta(minutes=5):
            return
        self.deduplicated[request.deduplication_id] = self.clock.now()
        self.messages.append(Message(request, self.clock.now()))

    def _by_receipt(self, receipt_handle: str) -> Message | None:
        return next((m for m in self.messages if m.receipt == receipt_handle), None)

    def defer(self, receipt_handle: str, seconds: float) -> None:
        super().defer(receipt_handle, seconds)
        message = self._by_receipt(receipt_handle)
        if message is not None:
            message.visible_at = self.clock.now() + timedelta(seconds=seconds)

    def resume(self, receipt_handle: str) -> None:
        super().resume(receipt_handle)
        message = self._by_receipt(receipt_handle)
        if message is not None:
            message.visible_at = self.clock.now()

    def receive(self) -> Message | None:
        if not self.messages or self.messages[0].visible_at > self.clock.now():
            return None
        message = self.messages[0]
        self.receipts += 1
        message.receipt, message.receives = f"receipt-{self.receipts}", message.receives + 1
        message.visible_at = self.clock.now() + timedelta(seconds=WORK_VISIBILITY_TIMEOUT_SECONDS)
        return message

    def delete(self, message: Message) -> None:
        self.messages.remove(message)
        self.deleted.append(message.request)


@dataclass
class Apply:
    before: str | None
    after: str
    reference: str


class HeadNode(FakeChannel):
    """Runs every delivered bundle at once (the applier is idempotent: the same plan again is unchanged)
    and answers a verify by comparing what it serves with the bundle. Over SSM the result is a status
    event whose document GetCommandInvocation reads; over the agent channel (every PutObject is a new
    version the agent polls) it is the agent's report naming the S3 object it applied."""

    def __init__(self, clock: FakeClock, world: World) -> None:
        super().__init__(clock, world.channel_kind)
        self.world = world
        self.live: str | None = None
        self.applies: list[Apply] = []

    def deliver(self, bundle: Bundle) -> DeliveryHandle:
        handle = super().deliver(bundle)
        if self.live == bundle.plan_sha256:
            result = ApplyResult(outcome=Outcome.UNCHANGED, applier_version="1.0.0", plan_sha256=bundle.plan_sha256)
        else:
            self.applies.append(Apply(self.live, bundle.plan_sha256, handle.reference))
            self.live = bundle.plan_sha256
            result = ApplyResult(
                outcome=Outcome.APPLIED,
                applier_version="1.0.0",
                plan_sha256=bundle.plan_sha256,
                partitions_changed=sorted(bundle.partitions),
            )
        if self.kind is Channel.AGENT:
            detail = {
                "cluster": CLUSTER,
                "plan_sha256": bundle.plan_sha256,
                "etag": f'"etag-{handle.reference}"',
                "version_id": handle.reference,
                "result": result.model_dump(mode="json"),
            }
            self.world.emit(
                event_envelope(agent_source(CLUSTER), AGENT_APPLY_DETAIL_TYPE, detail), after_seconds=COMMAND_SECONDS
            )
            return handle
        self.world.controller.ssm_results[handle.reference] = result
        self.world.emit(ssm_event(handle.reference), after_seconds=COMMAND_SECONDS)
        return handle

    def verify(self, bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        self.verified += 1
        if self.live == bundle.plan_sha256:
            return ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0")
        return ApplyResult(outcome=Outcome.DRIFT, applier_version="1.0.0", drift=[{"what": "file"}])


@dataclass
class PendingEvent:
    event: TopokeeperEvent
    due: datetime
    attempts: int = 0


@dataclass
class World:
    """One cluster's backend: the ports, the SQS queue, EventBridge's result events, the drift schedule."""

    crash: Crash
    channel_kind: Channel = Channel.SSM
    controller: Controller = field(init=False)
    events: list[PendingEvent] = field(default_factory=list)
    lost_events: list[TopokeeperEvent] = field(default_factory=list)
    kills: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.controller = Controller(channel_kind=self.channel_kind)
        self.queue = SqsFifo(c.clock)
        self.head_node = HeadNode(c.clock, self)
        self.next_drift = c.clock.now() + timedelta(seconds=DRIFT_SECONDS)
        self.facts = Crashing("facts", c.facts, self.crash)
        self.failures: list[str] = []  # each failed invocation: function and error
        c.queue = Crashing("queue", self.queue, self.crash)  # type: ignore[assignment]
        c.state = Crashing("state", c.state, self.crash)  # type: ignore[assignment]
        c.plans = Crashing("plans", c.plans, self.crash)  # type: ignore[assignment]
        c.audit = Crashing("audit", c.audit, self.crash)  # type: ignore[assignment]
        c.channel = Crashing("channel", self.head_node, self.crash)  # type: ignore[assignment]

    def emit(self, event: TopokeeperEvent, after_seconds: float) -> None:
        self.events.append(PendingEvent(event, self.controller.clock.now() + timedelta(seconds=after_seconds)))

    def change(self, event_id: str) -> None:
        """What ingest does for a cluster event: count the change, queue its cycle's message."""
        self.queue.send(self.controller.change(event_id))

    def _invoke(self, name: str, call: Callable[[], object]) -> bool:
        """One Lambda invocation; False if it failed (killed, or raised for a retry)."""
        self.crash.running = name
        try:
            call()
        except Killed as killed:
            self.kills.append(f"{name}: {killed}")
            return False
        except Exception as error:  # the invocation fails and its trigger retries it
            self.failures.append(f"{name}: {type(error).__name__} {getattr(error, 'code', None) or ''}".strip())
            return False
        finally:
            self.crash.running = ""
        return True

    def deps(self) -> Any:
        deps = self.controller.deps()
        deps.facts = lambda cluster: self.facts
        return deps

    def _reconcile_one(self, message: Message) -> None:
        deps = self.deps()
        body = message.request.model_dump_json()
        reports: list[Any] = []
        ok = self._invoke(
            "reconcile",
            lambda: reports.append(
                process_message(body, message.receipt, deps, {message.request.cluster: message.request.generation})
            ),
        )
        # Partial batch response: a deferred message stays (hidden as process_message set it), others go.
        if ok and (reports[0] is None or reports[0].defer_seconds is None):
            self.crash.running = "reconcile"
            try:
                self.crash.before("sqs", "delete_message")  # Lambda deletes the batch's done messages
                self.crash.after("sqs", "delete_message")  # the batch response, not yet acted on
            except Killed as killed:
                self.kills.append(f"reconcile: {killed}")
                return
            except Exception as error:  # not deleted: the message shows again after its visibility timeout
                self.failures.append(f"sqs delete: {type(error).__name__} {getattr(error, 'code', None) or ''}".strip())
                return
            finally:
                self.crash.running = ""
            self.queue.delete(message)

    def _result_one(self, pending: PendingEvent) -> None:
        pending.attempts += 1
        deps = self.controller.result_deps()
        ssm_result = deps.ssm_result

        def get_command_invocation(cluster: Any, command_id: str) -> ApplyResult:
            self.crash.before("ssm", "get_command_invocation")
            result = ssm_result(cluster, command_id)
            self.crash.after("ssm", "get_command_invocation")
            return result

        deps.ssm_result = get_command_invocation
        if self._invoke("result", lambda: record_result(pending.event, deps)):
            self.events.remove(pending)
        elif pending.attempts >= EVENT_ATTEMPTS:
            self.events.remove(pending)
            self.lost_events.append(pending.event)
        else:
            pending.due = self.controller.clock.now() + timedelta(seconds=EVENT_RETRY_SECONDS)

    def step(self) -> None:
        now = self.controller.clock.now()
        for pending in [e for e in self.events if e.due <= now]:
            self._result_one(pending)
        while (message := self.queue.receive()) is not None:
            self._reconcile_one(message)
        if now >= self.next_drift:
            self.next_drift = now + timedelta(seconds=DRIFT_SECONDS)
            self._invoke("drift", lambda: check_requested(DriftRequest(), self.deps()))
        self.controller.clock.advance(STEP_SECONDS)

    def two_moves(self) -> None:
        """A node moves (one change), and while its delivery is in flight another moves (a second change, whose
        message waits behind the delivery until the result resumes it)."""
        c = self.controller
        c.facts.move(0, 1)
        self.change("e-move-1")
        self.step()
        c.clock.advance(10)
        c.facts.move(5, 0)
        self.change("e-move-2")

    def run(self, duration: timedelta) -> None:
        end = self.controller.clock.now() + duration
        while self.controller.clock.now() < end:
            self.step()


# Every boundary between two port calls of one reconcile (a changed plan, delivered over SSM or the agent
# channel) and of one result recording, named by what has happened and what has not. The send is SSM's
# SendCommand or the agent channel's PutObject; its reference the command id or the S3 version id.
CASES = {
    "reconcile-after-plan-put-before-claim": Crash("reconcile", "plans", "put"),
    "reconcile-after-claim-before-send": Crash("reconcile", "state", "save", 1),
    "reconcile-after-send-before-reference-saved": Crash("reconcile", "channel", "deliver"),
    "reconcile-after-reference-saved-before-triggers-consumed": Crash("reconcile", "state", "save", 2),
    "reconcile-after-triggers-consumed-before-next-cycle": Crash("reconcile", "state", "consume_triggers"),
    "reconcile-after-return-before-message-deleted": Crash("reconcile", "sqs", "delete_message"),
    # The second change's message, deferred behind the delivery in flight:
    "reconcile-deferred-after-hiding-message-before-registering-it": Crash("reconcile", "queue", "defer"),
    "reconcile-deferred-after-registering-message-before-return": Crash("reconcile", "state", "save", 3),
    "result-after-get-command-invocation-before-audit": Crash("result", "ssm", "get_command_invocation"),
    "result-after-audit-before-state-records-it": Crash("result", "audit", "publish"),
    "result-after-state-records-it-before-waiting-message-resumed": Crash("result", "state", "save"),
    "result-after-waiting-message-resumed-before-return": Crash("result", "queue", "resume"),
}

SSM_ONLY = {"result-after-get-command-invocation-before-audit"}  # the agent's report carries its document
XFAIL: dict[str, str] = {}


def _converged_world(crash: Crash, channel: Channel) -> World:
    world = World(crash, channel)
    world.change("e-initial")
    world.run(timedelta(minutes=2))
    state = world.controller.now_state()
    assert state.applied_sha256 is not None and world.head_node.live == state.applied_sha256
    return world


@pytest.mark.parametrize(
    ("channel", "name"),
    [
        pytest.param(
            channel,
            name,
            id=f"{channel.value}-{name}",
            marks=[pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else [],
        )
        for channel in (Channel.SSM, Channel.AGENT)
        for name in CASES
        if channel is Channel.SSM or name not in SSM_ONLY
    ],
)
def test_a_crash_at_each_boundary_converges_without_loss_or_double_audit(channel: Channel, name: str) -> None:
    crash = replace(CASES[name])  # a fresh counter per run
    world = _converged_world(crash, channel)
    c = world.controller
    crash.armed = True
    world.two_moves()
    world.run(HORIZON)

    assert world.kills, f"the crash point {crash.port}.{crash.method} was never reached"
    state = c.now_state()
    expected = plan_cluster(c.cluster, state, c.facts).sha256
    # Converged: the head node serves the plan of the facts now, and the state knows it.
    assert (world.head_node.live, state.desired_sha256, state.applied_sha256) == (expected, expected, expected)
    # No claim left blocking, no change left unreconciled, no message parked or still queued.
    assert state.pending is None
    assert state.reconciled_generation == state.generation
    assert world.queue.messages == [] and world.queue.dead_letters == []
    assert world.lost_events == []
    # Every apply on the head node audited exactly once, under its own delivery, and nothing else audited.
    audited = sorted((r.plan_sha256, r.delivery_reference) for r in c.audit.records.values())  # type: ignore[attr-defined]
    applied = sorted((a.after, a.reference) for a in world.head_node.applies)
    assert audited == applied


@pytest.mark.parametrize("channel", [Channel.SSM, Channel.AGENT], ids=lambda channel: channel.value)
def test_a_result_that_beats_the_saved_reference_finishes_the_delivery_once(channel: Channel) -> None:
    """SSM's status event (or the agent's report) may be handled before the reconcile saved the command id
    (or S3 version id): it finishes the claim (matched by its plan), and the reconcile's late save does not
    bring the finished delivery back."""
    world = World(Crash("none", "none", "none"), channel)
    send = world.head_node.deliver

    def send_and_report_at_once(bundle: Bundle) -> DeliveryHandle:
        handle = send(bundle)
        report = record_result(world.events.pop().event, world.controller.result_deps())
        assert (report.status, report.audit_records) == ("recorded", 1)
        return handle

    world.head_node.deliver = send_and_report_at_once  # type: ignore[method-assign]
    world.change("e-1")
    world.step()
    state = world.controller.now_state()
    assert state.pending is None and state.applied_sha256 == world.head_node.live
    ((plan_sha256, reference),) = [
        (r.plan_sha256, r.delivery_reference) for r in world.controller.audit.records.values()
    ]  # type: ignore[attr-defined]
    assert (plan_sha256, reference) == (world.head_node.live, world.head_node.applies[0].reference)
