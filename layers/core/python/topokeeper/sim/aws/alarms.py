"""CloudWatch metric-alarm evaluation, which moto lacks (it stores alarms but never evaluates them).

``evaluate`` follows "Evaluating an alarm" and "How alarm state is evaluated when data is missing" in the
CloudWatch User Guide: datapoints are the alarm's statistic over periods aligned to the epoch; CloudWatch looks at
an *evaluation range* longer than ``EvaluationPeriods`` (the guide's example: 5 periods for 3; we take N + 2); with
at least N real datapoints in range it evaluates the N most recent ones, else it fills the gaps as
``TreatMissingData`` says (as few times as possible). ALARM when at least ``DatapointsToAlarm`` of the N breach.

The guide gives the outcome of partial data under ``missing`` and ``ignore`` only by example; the rule below
reproduces every row of its two tables (tests/unit/sim/test_alarm_evaluation.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum

from topokeeper.contract.stack_spec import AlarmSpec, Comparison, MissingData

EXTRA_PERIODS = 2  # evaluation range = EvaluationPeriods + EXTRA_PERIODS


class AlarmState(StrEnum):
    OK = "OK"
    ALARM = "ALARM"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


def aggregate(statistic: str, values: list[float]) -> float:
    if statistic == "Maximum":
        return max(values)
    if statistic == "Minimum":
        return min(values)
    if statistic == "Sum":
        return math.fsum(values)
    if statistic == "Average":
        return math.fsum(values) / len(values)
    if statistic == "SampleCount":
        return float(len(values))
    raise ValueError(f"the emulator evaluates Maximum, Minimum, Sum, Average and SampleCount, not {statistic}")


def breaches(alarm: AlarmSpec, value: float) -> bool:
    threshold = alarm.threshold
    return {
        Comparison.GREATER_THAN_OR_EQUAL_TO_THRESHOLD: value >= threshold,
        Comparison.GREATER_THAN_THRESHOLD: value > threshold,
        Comparison.LESS_THAN_THRESHOLD: value < threshold,
        Comparison.LESS_THAN_OR_EQUAL_TO_THRESHOLD: value <= threshold,
    }[alarm.comparison]


def period_values(alarm: AlarmSpec, datapoints: Iterable[tuple[float, float]], now: float) -> list[float | None]:
    """The statistic per period of the evaluation range, oldest first, ending with the period holding ``now``
    (epoch seconds); None where the period has no data."""
    period = alarm.period_seconds
    current = int(now // period)
    first = current - (alarm.evaluation_periods + EXTRA_PERIODS) + 1
    samples: dict[int, list[float]] = {}
    for timestamp, value in datapoints:
        index = int(timestamp // period)
        if first <= index <= current and timestamp <= now:
            samples.setdefault(index, []).append(value)
    return [aggregate(alarm.statistic, samples[i]) if i in samples else None for i in range(first, current + 1)]


def evaluate_range(alarm: AlarmSpec, values: list[float | None], current: AlarmState) -> AlarmState:
    """The alarm's state for one evaluation range (oldest first; None = missing)."""
    needed, to_alarm = alarm.evaluation_periods, alarm.datapoints
    present = [breaches(alarm, v) for v in values if v is not None]
    if len(present) >= needed:
        return AlarmState.ALARM if sum(present[-needed:]) >= to_alarm else AlarmState.OK
    missing = alarm.missing
    if not present:
        return {
            MissingData.MISSING: AlarmState.INSUFFICIENT_DATA,
            MissingData.IGNORE: current,
            MissingData.BREACHING: AlarmState.ALARM,
            MissingData.NOT_BREACHING: AlarmState.OK,
        }[missing]
    if missing in (MissingData.BREACHING, MissingData.NOT_BREACHING):
        filled = sum(present) + (needed - len(present)) * (missing is MissingData.BREACHING)
        return AlarmState.ALARM if filled >= to_alarm else AlarmState.OK
    # missing / ignore with some data: decided by the real datapoints where they can decide it.
    if sum(present) >= to_alarm:
        return AlarmState.ALARM
    if not all(present):
        return AlarmState.OK
    if missing is MissingData.IGNORE:
        return current
    # Only breaching datapoints, fewer than DatapointsToAlarm: ALARM when they are all older than the last N
    # periods (the guide's "X - - - -"), INSUFFICIENT_DATA when the last N periods hold one ("- - - - X").
    recent = values[-needed:]
    return AlarmState.INSUFFICIENT_DATA if any(v is not None for v in recent) else AlarmState.ALARM


def evaluate(
    alarm: AlarmSpec, datapoints: Iterable[tuple[float, float]], now: float, current: AlarmState
) -> AlarmState:
    """The state CloudWatch would give the alarm at ``now`` (epoch seconds) from (timestamp, value) datapoints."""
    return evaluate_range(alarm, period_values(alarm, datapoints, now), current)
