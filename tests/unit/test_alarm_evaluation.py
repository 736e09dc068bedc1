"""The emulator's CloudWatch alarm evaluation against the CloudWatch User Guide's documented cases.

The two tables of "How alarm state is evaluated when data is missing" (5 most recent periods retrieved, oldest
first: 0 = not breaching, X = breaching, - = missing), for a 3-of-3 and a 2-of-3 alarm, under each setting of
TreatMissingData; RETAIN is "retain current state".
"""

from __future__ import annotations

import pytest

from topokeeper.contract.stack_spec import AlarmSpec, Comparison, MissingData
from topokeeper.sim.aws.alarms import AlarmState, evaluate, evaluate_range, period_values

OK, ALARM, INSUFFICIENT = AlarmState.OK, AlarmState.ALARM, AlarmState.INSUFFICIENT_DATA
RETAIN = None
SETTINGS = (MissingData.MISSING, MissingData.IGNORE, MissingData.BREACHING, MissingData.NOT_BREACHING)

THREE_OF_THREE = [
    ("0 - X - X", (OK, OK, OK, OK)),
    ("0 - - - -", (OK, OK, OK, OK)),
    ("- - - - -", (INSUFFICIENT, RETAIN, ALARM, OK)),
    ("0 X X - X", (ALARM, ALARM, ALARM, ALARM)),
    ("- - - - X", (INSUFFICIENT, RETAIN, ALARM, OK)),
    ("X - - - -", (ALARM, RETAIN, ALARM, OK)),
]
TWO_OF_THREE = [
    ("0 - X - X", (ALARM, ALARM, ALARM, ALARM)),
    ("0 0 X 0 X", (ALARM, ALARM, ALARM, ALARM)),
    ("0 - X - -", (OK, OK, ALARM, OK)),
    ("- - - - 0", (OK, OK, ALARM, OK)),
    ("- - - - X", (INSUFFICIENT, RETAIN, ALARM, OK)),
]


def _values(points: str) -> list[float | None]:
    return [{"0": 0.0, "X": 5.0, "-": None}[p] for p in points.split()]


def _cases() -> list[object]:
    cases = []
    for to_alarm, table in ((3, THREE_OF_THREE), (2, TWO_OF_THREE)):
        for points, outcomes in table:
            for missing, outcome in zip(SETTINGS, outcomes, strict=True):
                cases.append(pytest.param(to_alarm, points, missing, outcome, id=f"{to_alarm}of3 {points} {missing}"))
    return cases


@pytest.mark.parametrize(("to_alarm", "points", "missing", "expected"), _cases())
def test_the_documented_tables(to_alarm: int, points: str, missing: MissingData, expected: AlarmState | None) -> None:
    alarm = AlarmSpec("Maximum", 300, evaluation_periods=3, datapoints_to_alarm=to_alarm, threshold=1, missing=missing)
    for current in (OK, ALARM):  # "retain current state" must be told apart from a verdict
        assert evaluate_range(alarm, _values(points), current) == (expected or current)


def test_a_sustained_breach_alarms_and_one_good_period_clears_it() -> None:
    """The guide's first figure: threshold 3, 3 of 3; above in periods 3-5, below in 6, above again only in 9."""
    alarm = AlarmSpec("Maximum", 60, evaluation_periods=3, threshold=3, comparison=Comparison.GREATER_THAN_THRESHOLD)
    values = [1, 2, 4, 5, 4, 2, 1, 2, 4, 1]
    datapoints = [(60.0 * i + 1, float(v)) for i, v in enumerate(values)]
    state = AlarmState.INSUFFICIENT_DATA
    states = []
    for period in range(len(values)):
        state = evaluate(alarm, datapoints, 60.0 * period + 30, state)
        states.append(state)
    assert states == [OK, OK, OK, OK, ALARM, OK, OK, OK, OK, OK]


def test_datapoints_are_the_statistic_of_epoch_aligned_periods() -> None:
    alarm = AlarmSpec("Sum", 300, evaluation_periods=1)
    datapoints = [(600.0, 1.0), (899.0, 2.0), (900.0, 7.0), (1300.0, 9.0)]
    # The range ends with the period holding "now"; later datapoints are not seen yet.
    assert period_values(alarm, datapoints, now=1000.0) == [None, 3.0, 7.0]
    assert period_values(AlarmSpec("Maximum", 300), datapoints, now=1000.0) == [None, 2.0, 7.0]


def test_a_breach_stays_in_the_evaluation_range_until_it_ages_out() -> None:
    """notBreaching, 1 of 1: one failure keeps the alarm up while it is the most recent datapoint in range
    (the guide's note on re-evaluating the last datapoints after the metric stops), then OK."""
    alarm = AlarmSpec("Sum", 300, evaluation_periods=1, missing=MissingData.NOT_BREACHING)
    failure = [(310.0, 1.0)]
    assert [evaluate(alarm, failure, now, OK) for now in (320.0, 650.0, 950.0, 1250.0)] == [ALARM, ALARM, ALARM, OK]
