"""Timed work in simulated time: what runs when (SSM command executions, agent polls, the drift schedule,
alarm evaluations, deferred queue messages). The world jumps from one item to the next when nothing is runnable."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator


class Agenda:
    """``periodic`` items (schedules) do not keep the world from being quiet."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int, bool, Callable[[], None]]] = []
        self._order = itertools.count()

    def add(self, at: float, action: Callable[[], None], *, periodic: bool = False) -> None:
        heapq.heappush(self._items, (at, next(self._order), periodic, action))

    def next_time(self) -> float | None:
        return self._items[0][0] if self._items else None

    def has_work(self) -> bool:
        return any(not periodic for _, _, periodic, _ in self._items)

    def discard(self, action: Callable[[], None]) -> None:
        self._items = [item for item in self._items if item[3] is not action]
        heapq.heapify(self._items)

    def pop_due(self, now: float) -> Iterator[Callable[[], None]]:
        while self._items and self._items[0][0] <= now:
            yield heapq.heappop(self._items)[3]
