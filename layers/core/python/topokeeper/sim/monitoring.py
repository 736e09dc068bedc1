"""The functions' metrics and the stack's alarms in simulated time.

Metrics are kept as the functions emit them (``points``) and, where one of the stack's alarms watches them, put
into the emulated CloudWatch. moto stores alarms but never evaluates them, so this evaluates each one the way
CloudWatch does for its settings (``topokeeper.sim.aws.alarms``): whenever a datapoint arrives and at every period
boundary (when the evaluation range moves on), and sets the alarm's state in the emulator when it changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topokeeper.adapters.aws import client
from topokeeper.contract.ports import METRICS_DIMENSION, METRICS_NAMESPACE, Metric
from topokeeper.sim.aws.alarms import AlarmState, evaluate, period_values
from topokeeper.sim.stack import ClusterAlarm

if TYPE_CHECKING:
    from topokeeper.sim.world import World

# Evaluate just after a period boundary, so the new (empty) period is the range's last.
_AFTER_BOUNDARY = 0.001


class SimMetrics:
    """The runtime's ``Metrics`` port for the simulated world."""

    def __init__(self, world: World) -> None:
        self._world = world
        self.points: list[tuple[float, str, str, float]] = []  # (simulated seconds, cluster, metric, value)
        # (simulated seconds, cluster, partition, metric, value): per-partition points, which no alarm here watches
        self.partition_points: list[tuple[float, str, str, str, float]] = []
        self.alarm_states: list[tuple[float, str, AlarmState]] = []  # (simulated seconds, alarm, new state)
        self._alarms = {(a.cluster, a.metric): a for a in world.stack.alarms}
        self._datapoints: dict[str, list[tuple[float, float]]] = {a.name: [] for a in world.stack.alarms}
        # CloudWatch's state for a new alarm; moto's (OK) is replaced on the first evaluation.
        self._states = dict.fromkeys(self._datapoints, AlarmState.INSUFFICIENT_DATA)

    def start(self) -> None:
        """First evaluation of every alarm, then one at each period boundary."""
        for alarm in self._alarms.values():
            self._evaluate(alarm, force=True)
        for period in sorted({a.spec.period_seconds for a in self._alarms.values()}):
            self._schedule_boundary(period)

    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        world = self._world
        if partition is not None:
            self.partition_points.append((world.clock.monotonic(), cluster, partition, metric.value, value))
            return
        self.points.append((world.clock.monotonic(), cluster, metric.value, value))
        if metric is Metric.RECONCILE_SECONDS:
            world.counters.reconciles += 1
        alarm = self._alarms.get((cluster, metric))
        if alarm is None:
            return  # only alarmed metrics go to the emulated CloudWatch; the rest stay in ``points``
        now = world.clock.now()
        # The functions publish metrics as EMF lines in their logs: no request of their roles (Lambda's own).
        with world.emulator.iam.as_harness():
            client("cloudwatch").put_metric_data(
                Namespace=METRICS_NAMESPACE,
                MetricData=[
                    {
                        "MetricName": metric.value,
                        "Dimensions": [{"Name": METRICS_DIMENSION, "Value": cluster}],
                        "Timestamp": now,
                        "Value": value,
                    }
                ],
            )
            self._datapoints[alarm.name].append((now.timestamp(), value))
            self._evaluate(alarm)  # CloudWatch's own evaluation

    def state(self, cluster: str, metric: Metric) -> AlarmState:
        return self._states[self._alarms[(cluster, metric)].name]

    def peak(self, cluster: str, metric: Metric, since: float) -> float | None:
        values = [v for t, c, m, v in self.points if c == cluster and m == metric.value and t >= since]
        return max(values) if values else None

    def alarmed_since(self, since: float, metric: Metric = Metric.TOPOLOGY_DRIFT) -> bool:
        """Whether an alarm on ``metric`` went to ALARM at or after ``since`` (simulated seconds)."""
        names = {a.name for a in self._alarms.values() if a.metric is metric}
        return any(s is AlarmState.ALARM and n in names and t >= since for t, n, s in self.alarm_states)

    def _schedule_boundary(self, period: int) -> None:
        world = self._world
        now = world.clock.now().timestamp()
        wait = (now // period + 1) * period - now + _AFTER_BOUNDARY

        def at_boundary() -> None:
            for alarm in self._alarms.values():
                if alarm.spec.period_seconds == period:
                    self._evaluate(alarm)
            self._schedule_boundary(period)

        world.agenda.add(world.clock.monotonic() + wait, at_boundary, periodic=True)

    def _evaluate(self, alarm: ClusterAlarm, *, force: bool = False) -> None:
        world = self._world
        now = world.clock.now().timestamp()
        current = self._states[alarm.name]
        state = evaluate(alarm.spec, self._datapoints[alarm.name], now, current)
        if state is current and not force:
            return
        self._states[alarm.name] = state
        values = ", ".join(
            "-" if v is None else f"{v:g}" for v in period_values(alarm.spec, self._datapoints[alarm.name], now)
        )
        client("cloudwatch").set_alarm_state(
            AlarmName=alarm.name, StateValue=state.value, StateReason=f"{alarm.metric.value} by period: [{values}]"
        )
        self.alarm_states.append((world.clock.monotonic(), alarm.name, state))
        world.note("alarm", f"{alarm.name} -> {state}")
