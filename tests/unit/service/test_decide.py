import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.event_schemas import WORK_QUEUE_MAX_RECEIVES
from topokeeper.contract.ports import Channel, ClusterState, DeliveryHandle, PendingDelivery, ReconcileRequest, Trigger
from topokeeper.service.reconcile import DELIVERY_TIMEOUT, TOPOLOGY_RETRY, TOPOLOGY_RETRY_SECONDS, Decision, decide
from topokeeper.service.result import REGISTRATION_CHECK, REGISTRATION_CHECK_MARGIN
from topokeeper.service.state import OWN_TRIGGER_SOURCE
from topokeeper.wire import REGISTRATION_WAIT_SECONDS

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SETTINGS = Settings(
    clusters=[ClusterConfig(name="c1", orchestrator="ec2", head_node="i-0123456789abcdef0")],
    debounce_seconds=10,
    max_wait_seconds=300,
    min_write_interval_seconds=60,
)


def _state(**fields) -> ClusterState:
    base = {"cluster": "c1", "generation": 5, "reconciled_generation": 2}
    return ClusterState.model_validate({**base, **fields})


def _request(generation: int = 5) -> ReconcileRequest:
    return ReconcileRequest(cluster="c1", generation=generation)


def test_generation_already_covered_is_dropped() -> None:
    assert decide(_state(reconciled_generation=5), _request(5), NOW, SETTINGS).decision is Decision.COVERED


def test_an_older_message_of_the_open_cycle_still_reconciles() -> None:
    """Later changes of the cycle were deduplicated into this message: it must not be dropped."""
    assert decide(_state(generation=7), _request(5), NOW, SETTINGS).decision is Decision.PROCEED


def test_quiet_cluster_proceeds() -> None:
    state = _state(last_event_at=NOW - timedelta(seconds=11), first_pending_at=NOW - timedelta(seconds=30))
    assert decide(state, _request(), NOW, SETTINGS).decision is Decision.PROCEED


def test_trailing_debounce_waits_for_quiet() -> None:
    state = _state(last_event_at=NOW - timedelta(seconds=3), first_pending_at=NOW - timedelta(seconds=30))
    verdict = decide(state, _request(), NOW, SETTINGS.model_copy(update={"max_wait_seconds": 60}))
    assert verdict.decision is Decision.DEFERRED
    assert verdict.defer_seconds == pytest.approx(7)
    # Under a 300 s max wait, the message looks again no sooner than 300 / 20 s: each look is a receive.
    assert decide(state, _request(), NOW, SETTINGS).defer_seconds == pytest.approx(15)


def test_debounce_is_bounded_by_max_wait() -> None:
    state = _state(last_event_at=NOW - timedelta(seconds=1), first_pending_at=NOW - timedelta(seconds=301))
    assert decide(state, _request(), NOW, SETTINGS).decision is Decision.PROCEED


def test_a_debounce_wait_ends_when_the_oldest_change_has_waited_max_wait() -> None:
    """Changes keep arriving: the message comes back when max_wait is reached, not a whole debounce later."""
    state = _state(last_event_at=NOW - timedelta(seconds=1), first_pending_at=NOW - timedelta(seconds=296))
    verdict = decide(state, _request(), NOW, SETTINGS)
    assert verdict.decision is Decision.DEFERRED
    assert verdict.defer_seconds == pytest.approx(4)


def test_minimum_interval_between_writes() -> None:
    """Changes that stopped wait at least half the interval since the last write."""
    state = _state(last_write_at=NOW - timedelta(seconds=20))
    verdict = decide(state, _request(), NOW, SETTINGS)
    assert verdict.decision is Decision.DEFERRED
    assert verdict.defer_seconds == pytest.approx(10)


def test_delivery_in_flight_blocks_until_timeout() -> None:
    handle = DeliveryHandle(
        channel=Channel.SSM,
        cluster="c1",
        plan_sha256="a" * 64,
        reference="cmd",
        target="i-0123456789abcdef0",
        sent_at=NOW - timedelta(minutes=2),
    )
    state = _state(pending=PendingDelivery(handle=handle, generation=4))
    verdict = decide(state, _request(), NOW, SETTINGS)
    assert (verdict.decision, verdict.reason, verdict.behind_delivery) == (
        Decision.DEFERRED,
        "a delivery is in flight",
        True,
    )
    assert verdict.defer_seconds == (DELIVERY_TIMEOUT - timedelta(minutes=2)).total_seconds()
    stale = handle.model_copy(update={"sent_at": NOW - timedelta(minutes=26)})
    verdict = decide(_state(pending=PendingDelivery(handle=stale, generation=4)), _request(), NOW, SETTINGS)
    assert verdict.decision is Decision.PROCEED


def test_messages_of_one_cycle_share_their_deduplication_id() -> None:
    first = ReconcileRequest(cluster="c1", generation=3, since=2)
    later = ReconcileRequest(cluster="c1", generation=9, since=2, reason="drift")
    next_cycle = ReconcileRequest(cluster="c1", generation=10, since=9)
    assert first.deduplication_id == later.deduplication_id != next_cycle.deduplication_id


def test_only_a_newer_message_in_the_same_batch_supersedes() -> None:
    from topokeeper.service.controller import newest_generations

    bodies = [ReconcileRequest(cluster="c1", generation=g).model_dump_json() for g in (3, 5, 4)] + ["{broken"]
    assert newest_generations(bodies) == {"c1": 5}


# ------------------------------------------------------------------ pacing: writes against latency, any event spacing

CHANGE = Trigger(source="aws.sagemaker", detail_type="Cluster Node Change", event_id="e", time=NOW)
RETRY = Trigger(source=OWN_TRIGGER_SOURCE, detail_type=TOPOLOGY_RETRY, event_id="retry", time=NOW)
PACED = SETTINGS.model_copy(update={"max_wait_seconds": 30})  # the defaults: debounce 10, max wait 30, interval 60


def test_once_changes_stop_the_pending_ones_are_written_after_half_the_interval() -> None:
    """A burst ended 11 s ago, 35 s after the last write: its second write goes now, not 25 s later (if it places
    every node: the verdict says how long the full interval still has, for a write that would not)."""
    state = _state(
        last_event_at=NOW - timedelta(seconds=11),
        first_pending_at=NOW - timedelta(seconds=40),
        last_write_at=NOW - timedelta(seconds=35),
    )
    verdict = decide(state, _request(), NOW, PACED)
    assert (verdict.decision, verdict.full_interval_in) == (Decision.PROCEED, pytest.approx(25))
    sooner = state.model_copy(update={"last_write_at": NOW - timedelta(seconds=25)})
    verdict = decide(sooner, _request(), NOW, PACED)
    assert (verdict.decision, verdict.defer_seconds) == (Decision.DEFERRED, pytest.approx(5))
    after_the_interval = state.model_copy(update={"last_write_at": NOW - timedelta(seconds=61)})
    verdict = decide(after_the_interval, _request(), NOW, PACED)
    assert (verdict.decision, verdict.full_interval_in) == (Decision.PROCEED, None)


def test_while_changes_arrive_the_full_interval_holds_and_the_message_looks_again_when_it_could_be_quiet() -> None:
    state = _state(
        last_event_at=NOW - timedelta(seconds=2),
        first_pending_at=NOW - timedelta(seconds=40),
        last_write_at=NOW - timedelta(seconds=35),
    )
    verdict = decide(state, _request(), NOW, PACED)
    assert (verdict.decision, verdict.defer_seconds) == (Decision.DEFERRED, pytest.approx(8))  # quiet in 8 s at best
    just_written = state.model_copy(update={"last_write_at": NOW - timedelta(seconds=1)})
    verdict = decide(just_written, _request(), NOW, PACED)
    assert (verdict.decision, verdict.defer_seconds) == (Decision.DEFERRED, pytest.approx(29))  # half the interval
    almost_quiet = state.model_copy(update={"last_event_at": NOW - timedelta(seconds=9.5)})
    verdict = decide(almost_quiet, _request(), NOW, PACED)  # not sooner than a tenth of the interval: 6 s
    assert (verdict.decision, verdict.defer_seconds) == (Decision.DEFERRED, pytest.approx(6))
    nearly_the_interval = state.model_copy(update={"last_write_at": NOW - timedelta(seconds=57)})
    verdict = decide(nearly_the_interval, _request(), NOW, PACED)  # never later than the full interval
    assert (verdict.decision, verdict.defer_seconds) == (Decision.DEFERRED, pytest.approx(3))


@dataclass
class Run:
    writes: list[float]
    most_receives: int  # the most receives one message took before it was written or dropped


def _paced(events: list[float], settings: Settings, *, report_delay: float = 0, horizon: float = 3600.0) -> Run:
    """The queue around ``decide`` and ``reconcile``'s use of its verdict, in simulated seconds. Each change is a
    node launched, recorded as ingest records it, with one message per cycle (SQS deduplicates the rest); a
    deferred message comes back after its wait. EC2 reports a node's topology ``report_delay`` after its launch:
    an early write that would leave a node without it waits for the full interval; a write that proceeds (the
    worst case: every one changes the plan) and leaves nodes without topology asks again (``close_cycle``)."""
    state = ClusterState(cluster="c1")
    at = NOW.timestamp()
    pending = sorted(events)
    launched: list[float] = []
    message: float | None = None  # when the cycle's message is visible next
    receives = most = 0
    writes: list[float] = []

    def record(t: float, trigger: Trigger) -> None:
        nonlocal state, message
        when = datetime.fromtimestamp(at + t, UTC)
        state = state.model_copy(
            update={
                "generation": state.generation + 1,
                "last_event_at": when,
                "first_pending_at": state.first_pending_at or when,
                "triggers": [*state.triggers, trigger],
                "trigger_count": state.trigger_count + 1,
            }
        )
        message = t if message is None else message

    while pending or message is not None:
        if pending and (message is None or pending[0] <= message):
            launched.append(pending[0])
            record(pending.pop(0), CHANGE)
            continue
        assert message is not None and message <= horizon, "a change was never written"
        assert len(writes) <= horizon, "writes back to back"
        t, receives = message, receives + 1
        verdict = decide(state, _request(state.generation), datetime.fromtimestamp(at + t, UTC), settings)
        without_topology = any(t - report_delay < launch <= t for launch in launched)
        if verdict.decision is Decision.PROCEED and verdict.full_interval_in is not None and without_topology:
            message = t + verdict.full_interval_in
            continue
        if verdict.decision is Decision.DEFERRED:
            message = t + (verdict.defer_seconds or 0)
            continue
        most, receives, message = max(most, receives), 0, None
        if verdict.decision is Decision.PROCEED:
            writes.append(t)
            when = datetime.fromtimestamp(at + t, UTC)
            state = state.model_copy(
                update={
                    "reconciled_generation": state.generation,
                    "last_write_at": when,
                    "first_pending_at": None,
                    "triggers": [],
                    "trigger_count": 0,
                }
            )
            if without_topology:
                record(t, RETRY)
    return Run(writes, most)


BURST = [i * 0.06 for i in range(1000)]  # 1,000 nodes in one minute
ROLLING = [i * 0.3 for i in range(1000)]  # 1,000 nodes in five minutes


def test_a_burst_gets_its_second_write_right_after_it_ends() -> None:
    """Written after max wait (30 s), then 10 s after the last change (70 s), not a full interval after the first
    write (90 s)."""
    assert _paced(BURST, PACED).writes == pytest.approx([30, 59.94 + 10], abs=1)


def test_a_rolling_scale_up_keeps_one_write_per_interval_while_it_lasts() -> None:
    """Never quiet while the changes arrive, so one write a minute, and the last one 10 s after the last change."""
    assert _paced(ROLLING, PACED).writes == pytest.approx([30, 90, 150, 210, 270, 299.7 + 10], abs=1)


def test_nodes_ec2_has_not_reported_yet_add_no_write() -> None:
    """EC2 reports topology 30 s after launch: 10 s after the last change the newest nodes have none yet, so the
    early write would need another; the writes keep the full interval instead, as many as without the early
    write (a write at the full interval that leaves nodes without topology asks again, at the full interval)."""
    assert _paced(BURST, PACED, report_delay=30).writes == pytest.approx([30, 90], abs=1)
    assert _paced(ROLLING, PACED, report_delay=30).writes == pytest.approx([30, 90, 150, 210, 270, 330], abs=1)
    longer = _paced(BURST, PACED, report_delay=100).writes  # nodes reported only after the next full interval
    assert longer == pytest.approx([30, 90, 150, 180], abs=1), longer


@pytest.mark.parametrize("report_delay", [0, 5, 30])
@pytest.mark.parametrize("spacing", [0.5, *range(1, 121)])
def test_writes_stay_bounded_whatever_the_spacing_of_the_changes(spacing: float, report_delay: float) -> None:
    """Adversarial spacing: a change just often enough to end a quiet spell at every half interval earns a
    write each half interval, never more; while changes arrive closer than the debounce, one per interval.
    Every message is written within the queue's receive budget."""
    span = 1800.0
    run = _paced([i * spacing for i in range(int(span / spacing) + 1)], PACED, report_delay=report_delay)
    interval = PACED.min_write_interval_seconds
    assert all(b - a >= interval / 2 - 1e-6 for a, b in zip(run.writes, run.writes[1:], strict=False))
    assert len(run.writes) <= 2 * span / interval + 2
    if spacing < PACED.debounce_seconds:
        assert len(run.writes) <= span / interval + 2
    assert run.most_receives < WORK_QUEUE_MAX_RECEIVES


def test_the_early_write_is_what_doubles_the_writes_at_worst() -> None:
    """The bound above is reached: a change every 30 s, each quiet 10 s later, is written every 30 s."""
    assert len(_paced([i * 30.0 for i in range(61)], PACED).writes) == 61


def test_random_spacing_keeps_the_bound() -> None:
    rng = random.Random(13)
    for _ in range(20):
        events, t = [], 0.0
        while t < 1800:
            events.append(t)
            t += rng.choice((0.1, 1.0, 5.0, 9.9, 10.1, 20.0, 29.0, 31.0, 45.0, 61.0))
        run = _paced(events, PACED, report_delay=rng.choice((0, 5, 30, 90)))
        assert all(b - a >= 30 - 1e-6 for a, b in zip(run.writes, run.writes[1:], strict=False))
        assert len(run.writes) <= 2 * 1800 / 60 + 3
        assert run.most_receives < WORK_QUEUE_MAX_RECEIVES


@pytest.mark.parametrize("spacing", [0.3, 0.5, 0.95, 2.0])
def test_a_short_debounce_under_a_long_max_wait_stays_within_the_receive_budget(spacing: float) -> None:
    """Each debounce wait is one receive: a 1 s debounce under a 600 s max wait, with changes arriving all the
    while, must not spend the queue's 50 receives (the message would go to the dead-letter queue unwritten)."""
    settings = PACED.model_copy(update={"debounce_seconds": 1, "max_wait_seconds": 600})
    run = _paced([i * spacing for i in range(int(1800 / spacing) + 1)], settings)
    if spacing < settings.debounce_seconds:  # never quiet: the oldest change waited max_wait, no more
        assert run.writes[0] == pytest.approx(600, abs=1)
    assert run.most_receives < WORK_QUEUE_MAX_RECEIVES


UNPACED = PACED.model_copy(update={"debounce_seconds": 0, "min_write_interval_seconds": 0, "max_wait_seconds": 0})


def test_a_topology_retry_waits_a_moment_even_when_nothing_paces_the_writes() -> None:
    """No debounce and no write interval: a cycle that holds only a topology retry still waits
    TOPOLOGY_RETRY_SECONDS after the reconcile that asked for it; a change of the cluster in the cycle does not."""
    asked = NOW - timedelta(seconds=3)
    state = _state(last_event_at=asked, first_pending_at=asked, last_write_at=asked, triggers=[RETRY], trigger_count=1)
    verdict = decide(state, _request(), NOW, UNPACED)
    assert (verdict.decision, verdict.defer_seconds) == (Decision.DEFERRED, 1)  # looks again each second
    debounced = decide(state, _request(), NOW, UNPACED.model_copy(update={"debounce_seconds": 10}))
    assert (debounced.decision, debounced.defer_seconds) == (Decision.DEFERRED, pytest.approx(7))  # one look
    later = NOW + timedelta(seconds=TOPOLOGY_RETRY_SECONDS - 3)
    assert decide(state, _request(), later, UNPACED).decision is Decision.PROCEED
    with_a_change = state.model_copy(update={"triggers": [RETRY, CHANGE], "trigger_count": 2})
    assert decide(with_a_change, _request(), NOW, UNPACED).decision is Decision.PROCEED
    beyond_the_kept_triggers = state.model_copy(update={"trigger_count": 2})  # the second, uncounted, was a change
    assert decide(beyond_the_kept_triggers, _request(), NOW, UNPACED).decision is Decision.PROCEED


def test_nodes_not_reported_yet_are_asked_again_a_moment_apart_without_pacing() -> None:
    """EC2 reports a node's topology 45 s after launch: with nothing pacing the writes, the retries come
    TOPOLOGY_RETRY_SECONDS apart (the fifth one places the node), not back to back (30 retries in a few seconds,
    all spent before EC2 answers)."""
    run = _paced([0.0], UNPACED, report_delay=45)
    spacing = TOPOLOGY_RETRY_SECONDS
    assert run.writes == pytest.approx([0, spacing, 2 * spacing, 3 * spacing, 4 * spacing, 5 * spacing], abs=0.01)


def test_a_change_of_the_cluster_while_a_topology_retry_waits_is_not_held_by_the_retry() -> None:
    """No debounce and no write interval: a node joins 15 s after the first, while the first one's topology retry
    waits (EC2 reports 12 s after a launch). The retry's message is the cycle's (the change is deduplicated into
    it, and its FIFO group waits behind it), so a deferral for the whole retry wait would hold the change too: it
    is written within a second of arriving, as the settings say, not when the retry's wait ends (20 s)."""
    run = _paced([0.0, 15.0], UNPACED, report_delay=12)
    assert any(15 <= t <= 16 for t in run.writes), run.writes
    assert run.most_receives <= TOPOLOGY_RETRY_SECONDS + 1


@pytest.mark.parametrize("ahead", [5.0, 60.0, 3600.0])
def test_a_topology_retry_stamped_by_a_clock_ahead_is_not_looked_at_each_second_until_dead_lettered(
    ahead: float,
) -> None:
    """``topokeeper apply`` reconciles on the operator's machine, whose clock stamps the retry it records: a clock
    ahead of the Lambda's puts the cycle's first change in the future. The debounce holds such a change once for
    the skew (as any change stamped ahead); the retry's wait, which looks again each second, must not keep
    looking until the skew has passed: the queue dead-letters a message at its 50th receive."""
    stamped = NOW + timedelta(seconds=ahead)
    state = _state(
        last_event_at=stamped, first_pending_at=stamped, last_write_at=NOW, triggers=[RETRY], trigger_count=1
    )
    waited, receives = 0.0, 0
    while (
        verdict := decide(state, _request(), NOW + timedelta(seconds=waited), UNPACED)
    ).decision is not Decision.PROCEED:
        assert verdict.decision is Decision.DEFERRED and receives < WORK_QUEUE_MAX_RECEIVES, (waited, receives)
        waited, receives = waited + (verdict.defer_seconds or 0), receives + 1
    assert receives <= TOPOLOGY_RETRY_SECONDS + 1, (waited, receives)
    assert waited <= ahead + TOPOLOGY_RETRY_SECONDS, (waited, receives)


def _registration_wait_receives(wait_ends: datetime, settings: Settings, whole_seconds: bool) -> tuple[datetime, int]:
    """When a cycle holding only the registration wait's own trigger (changes last seen at NOW) is reconciled, and
    after how many receives of its message (``whole_seconds``: each deferral rounded as SQS's visibility timeout)."""
    check = Trigger(source=OWN_TRIGGER_SOURCE, detail_type=REGISTRATION_CHECK, event_id="retry-1", time=NOW)
    state = _state(
        last_event_at=NOW, first_pending_at=NOW, triggers=[check], trigger_count=1, registration_check_at=wait_ends
    )
    at, receives = NOW, 1
    while (verdict := decide(state, _request(), at, settings)).decision is Decision.DEFERRED:
        deferred = verdict.defer_seconds or 0
        at, receives = at + timedelta(seconds=max(1, round(deferred)) if whole_seconds else deferred), receives + 1
    return at, receives


def test_a_registration_wait_stays_within_the_receive_budget_whatever_the_debounce() -> None:
    """A cycle holding only the registration wait's own trigger looks for a change arriving meanwhile as often as
    the debounce would: with no debounce, once a second through the whole wait would be 330 receives of one message,
    which the queue dead-letters at 50, and nothing would then bring the plan again when the wait ends."""
    wait_ends = NOW + timedelta(seconds=REGISTRATION_WAIT_SECONDS) + REGISTRATION_CHECK_MARGIN
    for settings in (UNPACED, SETTINGS):
        at, receives = _registration_wait_receives(wait_ends, settings, whole_seconds=False)
        assert at >= wait_ends and receives < WORK_QUEUE_MAX_RECEIVES, (settings.debounce_seconds, receives)


@pytest.mark.parametrize("fraction", [0.0, 0.4, 0.6])
def test_a_registration_wait_takes_at_most_35_receives_with_sqs_whole_second_visibility(fraction: float) -> None:
    """docs/deploy.md's count: 33 looks 10 s apart through the wait and its margin, one more where SQS rounds the
    visibility timeout to whole seconds short of the end, and the receive that reconciles."""
    wait_ends = NOW + timedelta(seconds=REGISTRATION_WAIT_SECONDS - fraction) + REGISTRATION_CHECK_MARGIN
    for settings in (UNPACED, SETTINGS):
        at, receives = _registration_wait_receives(wait_ends, settings, whole_seconds=True)
        assert at >= wait_ends and receives <= 35, (settings.debounce_seconds, receives)
