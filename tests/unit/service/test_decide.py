from datetime import UTC, datetime, timedelta

import pytest

from topokeeper.config import ClusterConfig, Settings
from topokeeper.ports import Channel, ClusterState, DeliveryHandle, PendingDelivery, ReconcileRequest
from topokeeper.service.reconcile import DELIVERY_TIMEOUT, Decision, decide

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
    verdict = decide(state, _request(), NOW, SETTINGS)
    assert verdict.decision is Decision.DEFERRED
    assert verdict.defer_seconds == pytest.approx(7)


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
    state = _state(last_write_at=NOW - timedelta(seconds=45))
    verdict = decide(state, _request(), NOW, SETTINGS)
    assert verdict.decision is Decision.DEFERRED
    assert verdict.defer_seconds == pytest.approx(15)


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
    from topokeeper.service.reconcile import newest_generations

    bodies = [ReconcileRequest(cluster="c1", generation=g).model_dump_json() for g in (3, 5, 4)] + ["{broken"]
    assert newest_generations(bodies) == {"c1": 5}
