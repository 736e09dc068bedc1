"""Time for the emulator: a pluggable clock, and the token buckets AWS throttles with.

``monotonic()`` drives throttling and "not yet available" delays; ``now()`` stamps launch times,
creation times and events. ``SystemClock`` is real time; ``ManualClock`` is simulated time that only
moves when the simulator calls ``advance``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

DEFAULT_EPOCH = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
_HAIR = 1e-6  # tokens


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def now(self) -> datetime:
        """The current UTC time."""
        ...


class SystemClock:
    """Real time: ``time.monotonic`` and the UTC wall clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """Simulated time: starts at ``start`` and moves only with ``advance`` (thread-safe)."""

    def __init__(self, start: datetime = DEFAULT_EPOCH) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime (UTC)")
        self._start = start
        self._elapsed = 0.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def now(self) -> datetime:
        with self._lock:
            return self._start + timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go back")
        with self._lock:
            self._elapsed += seconds


@dataclass
class TokenBucket:
    """AWS's request token bucket: ``capacity`` tokens, ``refill_per_second`` back each second."""

    capacity: float
    refill_per_second: float
    tokens: float = -1.0
    updated_at: float | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.refill_per_second <= 0:
            raise ValueError("a bucket needs capacity >= 1 and a positive refill rate")
        if self.tokens < 0:
            self.tokens = self.capacity

    def take(self, now: float) -> bool:
        """Spend one token at ``now`` (monotonic seconds); False when the bucket is empty."""
        if self.updated_at is not None and now > self.updated_at:
            self.tokens = min(self.capacity, self.tokens + (now - self.updated_at) * self.refill_per_second)
        self.updated_at = now if self.updated_at is None else max(now, self.updated_at)
        # A caller pacing itself by epoch timestamps (about 1.7e9 s, float steps of about 2e-7 s) arrives a hair
        # early now and then: a token within a microsecond of whole is whole.
        if self.tokens >= 1 - _HAIR:
            self.tokens = max(0.0, self.tokens - 1)
            return True
        return False


class RateLimits:
    """Per-operation token buckets, read against the emulator's clock.

    ``DescribeInstanceTopology`` is throttled as AWS documents it (capacity 1, refill 1/s); any other
    operation can be given a bucket with ``set``.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._limits: dict[str, tuple[float, float]] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self.enabled = True

    def set(self, operation: str, *, capacity: float, refill_per_second: float) -> None:
        TokenBucket(capacity, refill_per_second)  # validates
        with self._lock:
            self._limits[operation] = (capacity, refill_per_second)
            self._buckets.pop(operation, None)

    def remove(self, operation: str) -> None:
        with self._lock:
            self._limits.pop(operation, None)
            self._buckets.pop(operation, None)

    def limits(self) -> dict[str, tuple[float, float]]:
        with self._lock:
            return dict(self._limits)

    def reset(self) -> None:
        """Refill every bucket."""
        with self._lock:
            self._buckets.clear()

    def allow(self, operation: str) -> bool:
        """Spend a token for one request; False means AWS would throttle it."""
        with self._lock:
            if not self.enabled or operation not in self._limits:
                return True
            bucket = self._buckets.get(operation)
            if bucket is None:
                bucket = self._buckets[operation] = TokenBucket(*self._limits[operation])
            return bucket.take(self._clock.monotonic())
