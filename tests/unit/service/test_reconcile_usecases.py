"""reconcile() and process_message() on the in-memory ports: every decision a reconcile takes."""

from __future__ import annotations

import pytest

from tests.fakes import FakeFacts
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.errors import ConcurrentUpdate, Permanent, Retryable
from topokeeper.contract.ports import Metric, ReconcileRequest
from topokeeper.engine.snapshot import AwsSnapshot
from topokeeper.service.controller import process_message, reconcile
from topokeeper.service.reconcile import DELIVERY_TIMEOUT, ReconcileReport

RECEIPT = "receipt-1"


def _process(controller: Controller, request: ReconcileRequest, receipt: str = RECEIPT) -> ReconcileReport:
    body = request.model_dump_json()
    report = process_message(body, receipt, controller.deps(), {request.cluster: request.generation})
    assert report is not None
    return report


def _deliver_once(controller: Controller) -> None:
    report = reconcile(controller.change("first"), controller.deps())
    assert report.action == "delivered"


# ---------------------------------------------------------------- claim and release (issue 11, defect 4)


def test_a_send_that_aws_refused_releases_its_claim() -> None:
    """A ThrottlingException answer means SendCommand created nothing: the cluster must not stay blocked."""
    controller = Controller()
    controller.channel.fail_with = Retryable("Rate exceeded", code="ThrottlingException")
    request = controller.change()
    with pytest.raises(Retryable):
        _process(controller, request)
    assert controller.now_state().pending is None
    assert controller.queue.deferrals == [(RECEIPT, 60)]  # retried soon, not after the delivery timeout
    # The retry delivers at once: nothing waits for a delivery that never existed.
    controller.channel.fail_with = None
    report = reconcile(request, controller.deps())
    assert report.action == "delivered"


def test_a_permanent_send_failure_releases_its_claim_and_parks_the_message() -> None:
    controller = Controller()
    controller.channel.fail_with = Permanent("User is not authorized", code="AccessDeniedException")
    request = controller.change()
    assert process_message(request.model_dump_json(), RECEIPT, controller.deps(), {}) is None
    assert controller.now_state().pending is None
    (parked,) = controller.queue.dead_letters
    assert "not authorized" in parked[1]


def test_a_send_that_may_have_delivered_keeps_its_claim() -> None:
    """A read timeout after SendCommand may have created the command: the claim stays until it expires."""
    controller = Controller()
    controller.channel.fail_with = TimeoutError("Read timeout on endpoint URL")
    request = controller.change()
    with pytest.raises(TimeoutError):
        _process(controller, request)
    pending = controller.now_state().pending
    assert pending is not None and pending.handle.reference == ""


def test_releasing_a_claim_never_drops_someone_elses() -> None:
    """Compare-and-set: a claim replaced meanwhile (the old one expired, another writer claimed) stays."""
    controller = Controller()
    request = controller.change()
    deps = controller.deps()

    class StealingChannel:
        def deliver(self, bundle: object) -> object:
            state = controller.state.get(CLUSTER)
            assert state.pending is not None
            controller.clock.advance(DELIVERY_TIMEOUT.total_seconds())  # ours expired; another writer claimed
            handle = state.pending.handle.model_copy(update={"sent_at": controller.clock.now()})
            other = state.pending.model_copy(update={"handle": handle, "generation": 99})
            controller.state.save(state.model_copy(update={"pending": other}))
            raise Retryable("Rate exceeded", code="ThrottlingException")

    deps.channel = lambda cluster: StealingChannel()  # type: ignore[assignment,return-value]
    with pytest.raises(Retryable):
        reconcile(request, deps)
    pending = controller.now_state().pending
    assert pending is not None and pending.generation == 99


def test_a_claim_lost_to_a_concurrent_writer_defers_briefly() -> None:
    controller = Controller()
    request = controller.change()
    real_save = controller.state.save
    calls = {"n": 0}

    def racing_save(state: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConcurrentUpdate()
        return real_save(state)  # type: ignore[arg-type]

    controller.state.save = racing_save  # type: ignore[method-assign]
    report = reconcile(request, controller.deps())
    assert report.action == "deferred" and report.defer_seconds == 5
    assert controller.channel.delivered == []


# ---------------------------------------------------------------- deferral (issue 11, defect 4)


def test_a_message_behind_a_delivery_waits_once_for_its_remaining_time() -> None:
    """One ChangeMessageVisibility for the time the delivery may still take, not a receive every 30 s."""
    controller = Controller()
    _deliver_once(controller)
    controller.clock.advance(120)
    report = _process(controller, controller.change("second"))
    assert report.action == "deferred"
    assert controller.queue.deferrals == [(RECEIPT, (DELIVERY_TIMEOUT.total_seconds() - 120))]
    pending = controller.now_state().pending
    assert pending is not None and pending.waiting_receipt == RECEIPT


def test_a_delivery_in_flight_costs_the_waiting_message_two_receives_at_most() -> None:
    """The old loop re-deferred every 30 s: 50 receives in 25 minutes, then the dead-letter queue."""
    controller = Controller()
    _deliver_once(controller)
    request = controller.change("second")
    receives = 0
    while True:
        receives += 1
        report = _process(controller, request, receipt=f"receipt-{receives}")
        if report.action != "deferred":
            break
        controller.clock.advance(controller.queue.deferrals[-1][1])
    assert receives == 2
    assert report.action == "delivered"


def test_the_result_resumes_the_message_waiting_behind_its_delivery() -> None:
    from tests.unit.service.test_result_usecases import ssm_event
    from topokeeper.contract.ports import ApplyResult, Outcome
    from topokeeper.service.result import record_result

    controller = Controller()
    _deliver_once(controller)
    _process(controller, controller.change("second"))
    reference = controller.channel.reference(1)
    controller.ssm_results[reference] = ApplyResult(outcome=Outcome.APPLIED, applier_version="1.0.0")
    record_result(ssm_event(reference), controller.result_deps())
    assert controller.queue.resumed == [RECEIPT]
    assert controller.now_state().pending is None


def test_a_delivery_that_finished_while_deferring_resumes_at_once() -> None:
    """The result came between the decision and the bookkeeping: nobody would resume the message."""
    controller = Controller()
    _deliver_once(controller)
    deps = controller.deps()
    real_defer = controller.queue.defer

    def defer_then_finish(receipt: str, seconds: float) -> None:
        real_defer(receipt, seconds)
        state = controller.state.get(CLUSTER)
        controller.state.save(state.model_copy(update={"pending": None}))

    controller.queue.defer = defer_then_finish  # type: ignore[method-assign]
    request = controller.change("second")
    process_message(request.model_dump_json(), RECEIPT, deps, {})
    assert controller.queue.resumed == [RECEIPT]


# ---------------------------------------------------------------- the other decisions


def test_debounce_waits_for_a_quiet_period() -> None:
    controller = Controller(debounce_seconds=10, max_wait_seconds=60)
    request = controller.change()
    controller.clock.advance(3)
    report = reconcile(request, controller.deps())
    assert (report.action, report.defer_seconds) == ("deferred", 7)
    controller.clock.advance(7)
    assert reconcile(request, controller.deps()).action == "delivered"


def test_debounce_is_bounded_by_the_maximum_wait() -> None:
    controller = Controller(debounce_seconds=10, max_wait_seconds=30)
    request = controller.change("e-0")
    for second in range(1, 31):  # a change every second: never quiet
        controller.clock.advance(1)
        request = controller.change(f"e-{second}")
    assert reconcile(request, controller.deps()).action == "delivered"


def test_writes_keep_the_minimum_interval() -> None:
    """A change that stopped (no debounce here) waits half the interval since the last write, then goes."""
    controller = Controller(min_write_interval_seconds=60)
    _deliver_once(controller)
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None}))
    controller.clock.advance(20)
    request = controller.change("second")
    report = reconcile(request, controller.deps())
    assert (report.action, report.defer_seconds) == ("deferred", 10)
    controller.clock.advance(10)
    assert reconcile(request, controller.deps()).action == "delivered"


def _deliver_quiet(controller: Controller) -> None:
    request = controller.change("first")
    controller.clock.advance(controller.debounce_seconds)
    assert reconcile(request, controller.deps()).action == "delivered"


class LastNodeNotReported(FakeFacts):
    """EC2 has not reported the newest node's topology yet (``reported`` says when it has)."""

    reported = False

    def read(self, cluster: str) -> AwsSnapshot:
        raw = super().read(cluster)
        return raw if self.reported else raw.model_copy(update={"instance_topology": raw.instance_topology[:-1]})


def test_an_early_write_is_taken_only_when_it_places_every_node() -> None:
    """The changes stopped half an interval after the last write; EC2 has not reported a new node yet: an early
    write would need another when it does, so the message waits for the full interval, which writes."""
    controller = Controller(debounce_seconds=10, max_wait_seconds=30, min_write_interval_seconds=60)
    controller.facts = LastNodeNotReported(8)
    controller.facts.reported = True
    _deliver_quiet(controller)
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None}))
    controller.facts.nodes, controller.facts.reported = 9, False  # a node launched
    controller.facts.move(8, 2)
    controller.clock.advance(25)
    controller.change("launch")
    request = controller.change("running")
    controller.clock.advance(10)  # quiet for the debounce, 35 s after the write

    early = reconcile(request, controller.deps())

    assert (early.action, early.defer_seconds) == ("deferred", 25)
    assert "1 node(s) without topology" in early.reason
    assert len(controller.channel.delivered) == 1 and controller.now_state().reconciled_generation == 1
    assert controller.metrics.values(Metric.EVENTS_COALESCED) == []  # counted once, by the reconcile that writes
    controller.clock.advance(25)
    full = reconcile(request, controller.deps())
    assert (full.action, full.nodes_without_topology) == ("delivered", 1)  # it writes what is there
    assert controller.metrics.values(Metric.EVENTS_COALESCED) == [1]


def test_an_early_write_that_places_every_node_goes_at_half_the_interval() -> None:
    controller = Controller(debounce_seconds=10, max_wait_seconds=30, min_write_interval_seconds=60)
    _deliver_quiet(controller)
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None}))
    controller.facts.nodes = 9
    controller.facts.move(8, 2)
    controller.clock.advance(25)
    request = controller.change("launch")
    controller.clock.advance(10)
    report = reconcile(request, controller.deps())
    assert (report.action, report.nodes_without_topology) == ("delivered", 0)


def test_a_covered_message_is_dropped_and_queues_the_changes_after_it() -> None:
    controller = Controller()
    _deliver_once(controller)
    controller.change("late")  # generation 2, its message lost with a crashed reconcile
    report = reconcile(ReconcileRequest(cluster=CLUSTER, generation=1), controller.deps())
    assert report.action == "covered"
    assert controller.queue.sent[-1] == ReconcileRequest(cluster=CLUSTER, generation=2, since=1)


def test_an_older_message_of_the_batch_is_superseded() -> None:
    controller = Controller()
    old = controller.change("a")
    controller.change("b")
    report = process_message(old.model_dump_json(), RECEIPT, controller.deps(), {CLUSTER: 2})
    assert report is not None and report.action == "superseded"
    assert controller.facts.reads == 0


def test_an_unchanged_plan_is_not_delivered_again() -> None:
    controller = Controller()
    _deliver_once(controller)
    state = controller.now_state()
    assert state.pending is not None
    controller.state.save(state.model_copy(update={"pending": None, "applied_sha256": state.desired_sha256}))
    report = reconcile(controller.change("again"), controller.deps())
    assert report.action == "unchanged"
    assert len(controller.channel.delivered) == 1


def test_a_changed_network_delivers_the_new_plan() -> None:
    controller = Controller()
    _deliver_once(controller)
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None, "applied_sha256": state.desired_sha256}))
    controller.facts.move(0, 1)
    report = reconcile(controller.change("moved"), controller.deps())
    assert report.action == "delivered" and report.plan_sha256 != state.desired_sha256


def test_verify_mode_plans_but_never_delivers() -> None:
    controller = Controller(mode="verify")
    report = reconcile(controller.change(), controller.deps())
    assert report.action == "planned-only"
    assert controller.channel.delivered == []
    assert controller.now_state().desired_sha256 == report.plan_sha256


def test_a_burst_is_one_reconcile_and_counts_the_coalesced_changes() -> None:
    controller = Controller()
    for index in range(5):
        request = controller.change(f"e-{index}")
    report = reconcile(request, controller.deps())
    assert report.action == "delivered"
    assert controller.metrics.values(Metric.EVENTS_COALESCED) == [4]
    assert len(controller.channel.delivered) == 1


def test_a_malformed_message_goes_to_the_dead_letter_queue_naming_the_field() -> None:
    controller = Controller()
    assert process_message('{"cluster": "c1", "generation": 0}', RECEIPT, controller.deps(), {}) is None
    ((_, reason),) = controller.queue.dead_letters
    assert reason.startswith("message.generation:")


def test_a_retryable_failure_is_retried_soon() -> None:
    controller = Controller()

    class Throttled:
        def read(self, cluster: str) -> object:
            raise Retryable("Rate exceeded", code="ThrottlingException")

    controller.facts = Throttled()  # type: ignore[assignment]
    with pytest.raises(Retryable):
        _process(controller, controller.change())
    assert controller.queue.deferrals == [(RECEIPT, 60)]
    assert controller.queue.dead_letters == []


def test_an_unmanaged_cluster_is_ignored() -> None:
    controller = Controller()
    report = reconcile(ReconcileRequest(cluster="other", generation=1), controller.deps())
    assert report.action == "ignored"
