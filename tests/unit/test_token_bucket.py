"""The emulator's AWS token bucket (topokeeper.sim.aws.clock.TokenBucket)."""

from topokeeper.sim.aws.clock import TokenBucket


def test_one_token_a_second_refuses_a_second_call_within_the_second() -> None:
    bucket = TokenBucket(capacity=1, refill_per_second=1)
    assert bucket.take(10.0) and not bucket.take(10.5) and bucket.take(11.0)


def test_a_caller_pacing_by_epoch_timestamps_is_not_throttled_by_float_error() -> None:
    bucket = TokenBucket(capacity=1, refill_per_second=1)
    assert bucket.take(0.0)
    # 1.0 s later as an epoch-timestamp schedule computes it: 2.4e-7 s short.
    assert bucket.take(1767603600.0 + 1.0 - 1767603600.0000002)
