"""A simulation ended by a signal stops what it started (slurmctld, its namespace, the chroot's /proc) first.

Python's default for SIGTERM and SIGHUP ends the process at once, running no ``finally``: a run killed so left
its slurmctld running and the chroot's /proc mounted and counted for good. While a world runs, these signals
raise ``Terminated`` in the main thread instead, and while it stops, every ending signal waits for the stop.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# Held while a world stops: Ctrl-C too (it raises KeyboardInterrupt, which would cut the stop short as well).
HELD_SIGNALS = (signal.SIGINT, *ENDING_SIGNALS)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP while a world runs: every ``finally`` above runs, then the process exits 128 + the
    signal's number (what a shell reports for a process the signal ended)."""

    def __init__(self, number: int) -> None:
        super().__init__(128 + number)
        self.signal_number = number


def _raise_terminated(number: int, _frame: FrameType | None) -> None:
    raise Terminated(number)


def _in_main_thread() -> bool:
    # Python runs signal handlers in the main thread only, and only the main thread may install them.
    return threading.current_thread() is threading.main_thread()


@contextmanager
def ending_signals_raise() -> Iterator[None]:
    """While open, SIGTERM and SIGHUP raise ``Terminated``, where no one else handles them: a handler already
    installed (``topokeeper emulator``'s, which stops its world itself) is left as it is."""
    if not _in_main_thread():
        yield
        return
    previous = {
        number: signal.signal(number, _raise_terminated)
        for number in ENDING_SIGNALS
        if signal.getsignal(number) is signal.SIG_DFL
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def signals_held() -> Iterator[None]:
    """While open (a world's stop), SIGINT, SIGTERM and SIGHUP wait, so that no stop ends part way (slurmctld
    stopped but not its namespace, /proc counted but not released); each that came is raised again when it closes,
    to the handler it had before."""
    if not _in_main_thread():
        yield
        return
    came: list[int] = []
    hold: Callable[[int, FrameType | None], Any] = lambda number, _frame: came.append(number)  # noqa: E731
    previous = {number: signal.signal(number, hold) for number in HELD_SIGNALS}
    try:
        yield
    finally:
        for held, handler in previous.items():
            signal.signal(held, signal.SIG_DFL if handler is None else handler)
        for number in dict.fromkeys(came):
            signal.raise_signal(number)
