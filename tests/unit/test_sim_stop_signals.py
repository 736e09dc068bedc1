"""The simulator's signal handling in process (a real run ended by a signal: e2e/test_simulate_stops_on_signal)."""

from __future__ import annotations

import os
import signal

import pytest

from topokeeper.sim.stop_signals import Terminated, ending_signals_raise, signals_held


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_an_ending_signal_raises_terminated_and_the_handler_before_comes_back(number: signal.Signals) -> None:
    with pytest.raises(Terminated) as ended, ending_signals_raise():
        os.kill(os.getpid(), number)
        pytest.fail("the signal did not end the run")
    assert ended.value.code == 128 + number and ended.value.signal_number == number
    assert signal.getsignal(number) is signal.SIG_DFL


def test_a_handler_someone_installed_is_left_to_handle_the_signal() -> None:
    came: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda number, _frame: came.append(number))
    try:
        with ending_signals_raise():
            os.kill(os.getpid(), signal.SIGTERM)
        assert came == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_signals_during_a_stop_wait_for_it_and_then_end_the_run() -> None:
    stopped = []
    with pytest.raises(Terminated) as ended, ending_signals_raise(), signals_held():
        for number in (signal.SIGTERM, signal.SIGTERM, signal.SIGHUP):
            os.kill(os.getpid(), number)
        stopped.append("the whole stop ran")
    assert stopped == ["the whole stop ran"] and ended.value.signal_number == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL


def test_ctrl_c_during_a_stop_waits_for_it() -> None:
    stopped = []
    # Python's Ctrl-C handler, as an interactive run has it: a job started in the background without job control
    # inherits SIGINT ignored, and Python then installs none.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            stopped.append("the whole stop ran")
    finally:
        signal.signal(signal.SIGINT, before)
    assert stopped == ["the whole stop ran"]
