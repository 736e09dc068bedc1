"""The whole system on one machine: emulated AWS, the stack's wiring, the real functions, a real head node.

Simulated time: one ``ManualClock`` drives the emulator (launch times, events, the DescribeInstanceTopology
token bucket), the functions (debounce, write intervals) and an agenda of timed work (SSM command
execution after ``ssm_delivery_seconds``, agent polls, the drift schedule, deferred queue messages).
Time jumps from one agenda item to the next whenever nothing is runnable, so minutes of cluster life
take seconds. Each emulated AWS request also costs ``api_call_seconds`` of simulated time, and a
function sleeping (the rate limiter, the drift function waiting for SSM) runs the agenda meanwhile.

EventBridge rules are created with the stack's patterns, but target SQS inbox queues (moto cannot
invoke a Lambda); the world drains them into the very handlers the stack deploys.
"""

from __future__ import annotations

import functools
import heapq
import importlib.util
import itertools
import json
import logging
import os
import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, NamedTuple

from moto.sqs.models import sqs_backends

from topokeeper.adapters.aws import client
from topokeeper.adapters.queue import SqsWorkQueue
from topokeeper.config import ClusterConfig, Mode, Settings
from topokeeper.deployment import Deployment
from topokeeper.domain.catalog import ec2_instance_type
from topokeeper.domain.models import SlurmVersion
from topokeeper.events import WORK_QUEUE_MAX_RECEIVES, change_patterns, result_patterns
from topokeeper.ports import METRICS_DIMENSION, METRICS_NAMESPACE, Channel, Metric, Outcome
from topokeeper.runtime import Runtime, install_runtime
from topokeeper.service.reconcile import plan_cluster
from topokeeper.sim.aws.clock import ManualClock
from topokeeper.sim.aws.emulator import AwsEmulator
from topokeeper.sim.aws.events import HYPERPOD
from topokeeper.sim.aws.network import NetworkLayout
from topokeeper.sim.aws.ssm import CommandInvocationRequest, CommandOutcome
from topokeeper.sim.file_head_node import FileHeadNode
from topokeeper.sim.head_node import ChrootHeadNode, HeadNode
from topokeeper.sim.scenario import Scenario
from topokeeper.sim.slurm_chroot import HarnessError, can_run

FUNCTIONS_DIR = Path(__file__).resolve().parents[5] / "functions"
TABLE = "topokeeper-state"
BUCKET = "topokeeper-plans-sim"
WORK_QUEUE = "topokeeper-work.fifo"
WORK_DEAD_LETTERS = "topokeeper-work-dlq.fifo"
FAILED_VISIBILITY_SECONDS = 30.0
DRIFT_ALARM = "topokeeper-{cluster}-TopologyDrift"
# "chroot" or "file": which head node to run, whatever this machine could run (tests force "file").
HEAD_NODE_VARIABLE = "TOPOKEEPER_HEAD_NODE"
log = logging.getLogger("topokeeper.sim")


def load_handler(name: str) -> Callable[[Any, Any], Any]:
    """``functions/<name>/handler.py``'s ``lambda_handler``, exactly as the stack deploys it."""
    path = FUNCTIONS_DIR / name / "handler.py"
    spec = importlib.util.spec_from_file_location(f"topokeeper_function_{name}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    handler: Callable[[Any, Any], Any] = module.lambda_handler
    return handler


@dataclass
class LambdaContext:
    function_name: str
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = ""
    log_group_name: str = ""
    log_stream_name: str = ""

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


class Agenda:
    """Timed work in simulated time; ``periodic`` items do not keep the world from being quiet."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int, bool, Callable[[], None]]] = []
        self._order = itertools.count()

    def add(self, at: float, action: Callable[[], None], *, periodic: bool = False) -> None:
        heapq.heappush(self._items, (at, next(self._order), periodic, action))

    def next_time(self) -> float | None:
        return self._items[0][0] if self._items else None

    def has_work(self) -> bool:
        return any(not periodic for _, _, periodic, _ in self._items)

    def pop_due(self, now: float) -> Iterator[Callable[[], None]]:
        while self._items and self._items[0][0] <= now:
            yield heapq.heappop(self._items)[3]


@dataclass
class Counters:
    events_sent: int = 0
    events_lost: int = 0
    events_duplicated: int = 0
    reconciles: int = 0
    head_node_writes: int = 0
    reconfigures: int = 0
    apply_failures: int = 0
    last_event_at: float | None = None


class SimMetrics:
    """Metrics as the functions emit them, also put into the emulated CloudWatch; evaluates the drift alarm."""

    def __init__(self, world: World) -> None:
        self._world = world
        self.points: list[tuple[float, str, str, float]] = []
        self.alarm_states: list[tuple[float, str]] = []
        self._drift_streak: dict[str, int] = {}

    def emit(self, cluster: str, metric: Metric, value: float) -> None:
        world = self._world
        self.points.append((world.clock.monotonic(), cluster, metric.value, value))
        if metric is Metric.RECONCILE_SECONDS:
            world.counters.reconciles += 1
        if metric is Metric.TOPOLOGY_DRIFT:
            # Only the alarm's metric goes to the emulated CloudWatch; the rest stay in ``points``.
            client("cloudwatch").put_metric_data(
                Namespace=METRICS_NAMESPACE,
                MetricData=[
                    {
                        "MetricName": metric.value,
                        "Dimensions": [{"Name": METRICS_DIMENSION, "Value": cluster}],
                        "Timestamp": world.clock.now(),
                        "Value": value,
                    }
                ],
            )
            self._evaluate_drift_alarm(cluster, value)

    def _evaluate_drift_alarm(self, cluster: str, value: float) -> None:
        """moto stores alarms but never evaluates them, so the world does, with the stack's rule."""
        streak = self._drift_streak.get(cluster, 0) + 1 if value >= 1 else 0
        self._drift_streak[cluster] = streak
        periods = self._world.settings.drift_alarm_periods
        state = "ALARM" if streak >= periods else "OK"
        name = DRIFT_ALARM.format(cluster=cluster)
        current = client("cloudwatch").describe_alarms(AlarmNames=[name])["MetricAlarms"][0]["StateValue"]
        if current != state:
            client("cloudwatch").set_alarm_state(
                AlarmName=name, StateValue=state, StateReason=f"TopologyDrift={value:.0f} for {streak} period(s)"
            )
            self.alarm_states.append((self._world.clock.monotonic(), state))
            self._world.note("alarm", f"{name} -> {state}")

    def peak(self, cluster: str, metric: Metric, since: float) -> float | None:
        values = [v for t, c, m, v in self.points if c == cluster and m == metric.value and t >= since]
        return max(values) if values else None

    def alarmed_since(self, since: float) -> bool:
        return any(state == "ALARM" for t, state in self.alarm_states if t >= since)


class SimWorkQueue(SqsWorkQueue):
    """The real SQS adapter; a deferral also schedules the message's return in simulated time."""

    def __init__(self, world: World, sqs: Any, queue_url: str, dead_letter_url: str) -> None:
        super().__init__(sqs, queue_url, dead_letter_url)
        self._world = world

    def defer(self, receipt_handle: str, seconds: float) -> None:
        self._world.deferred[receipt_handle] = seconds


class HeadNodeChoice(NamedTuple):
    kind: Literal["chroot", "file"]
    note: str  # for the operator, when it is the file-only head node


def choose_head_node(requested: str | None = None) -> HeadNodeChoice:
    """``requested``, else $TOPOKEEPER_HEAD_NODE, else the real slurmctld in a chroot where it can run here."""
    requested = requested or os.environ.get(HEAD_NODE_VARIABLE) or None
    if requested not in (None, "chroot", "file"):
        raise HarnessError(f"{HEAD_NODE_VARIABLE} is chroot or file, not {requested!r}")
    if requested == "file":
        return HeadNodeChoice("file", "using a file-only head node (no slurmctld), as requested")
    ok, reason = can_run()
    if not ok and requested == "chroot":
        raise HarnessError(f"the real head node cannot run here: {reason}")
    if not ok:
        return HeadNodeChoice(
            "file", f"the real head node cannot run here: {reason}; using a file-only head node (no slurmctld)"
        )
    return HeadNodeChoice("chroot", "")


class World:
    def __init__(
        self,
        scenario: Scenario,
        *,
        name: str | None = None,
        configured_slurm_version: str | None = None,
        head_node: str | None = None,
    ) -> None:
        self.scenario = scenario
        spec = scenario.cluster
        self.clock = ManualClock()
        self.agenda = Agenda()
        self.counters = Counters()
        self.timeline: list[dict[str, Any]] = []
        self.deferred: dict[str, float] = {}  # receipt handle -> seconds, filled by SimWorkQueue.defer
        # True: SSM commands run at once (for callers outside simulated time, such as the operator CLI).
        self.ssm_synchronous = False
        self.apply_times: dict[str, float] = {}  # plan sha256 -> when the head node confirmed it
        self.event_filter: Callable[[dict[str, Any]], list[dict[str, Any]]] = lambda event: [event]
        # Deterministic simulation, not security: the same scenario and seed tell the same story.
        self.random = random.Random(spec.seed)  # noqa: S311
        self._ids = random.Random(spec.seed + 1)  # noqa: S311
        self._saved_environment: dict[str, str | None] = {}
        self.emulator = AwsEmulator(seed=spec.seed, clock=self.clock)
        self.slurm_format = SlurmVersion.parse(spec.slurm_version).format
        node_name = name or f"sim-{spec.name}"
        self.head: HeadNode = (
            FileHeadNode(SlurmVersion.parse(spec.slurm_version), node_name)
            if choose_head_node(head_node).kind == "file"
            else ChrootHeadNode(self.slurm_format, node_name, spec.head_node_style)
        )
        self.head_node_id = f"mi-{self._ids.getrandbits(68):017x}"[:20]
        cluster = ClusterConfig(
            name=spec.name,
            mode=spec.mode,
            channel=spec.channel,
            head_node=self.head_node_id if spec.channel is Channel.SSM else None,
            # What the operator configured; the head node may run another version (it reports its own).
            slurm_version=configured_slurm_version or spec.slurm_version,
        )
        self.settings = Settings(
            clusters=[cluster],
            debounce_seconds=scenario.debounce_seconds,
            min_write_interval_seconds=scenario.min_write_interval_seconds,
            drift_alarm_periods=scenario.drift_alarm_periods,
        )
        self.cluster = cluster
        self.handlers = {name: load_handler(name) for name in ("ingest", "reconcile", "result", "drift")}

    # ----------------------------------------------------------------- setup and teardown

    def start(self) -> None:
        self.emulator.start()
        self._saved_environment = {key: os.environ.get(key) for key in self.emulator.env()}
        os.environ.update(self.emulator.env())
        client.cache_clear()
        self._create_stack()
        self._create_cluster()
        self.head.start(self.partitions())
        self.metrics = SimMetrics(self)
        self.runtime = Runtime.from_environment(
            self.deployment.environment(),
            clock=self.clock,
            metrics=self.metrics,
            sleep=self.sleep,
            work_queue=SimWorkQueue(self, client("sqs"), self.queue_url, self.dead_letter_url),
        )
        install_runtime(self.runtime)
        self.emulator.ssm.on_command = self._on_command
        self.emulator.ssm.strict_targets = True
        self.emulator.ssm.register_managed_instance(self.head_node_id)
        self._schedule_drift()
        if self.cluster.effective_channel is Channel.AGENT:
            self._install_agent()
        self.note("start", f"cluster {self.cluster.name}: {len(self.emulator.hyperpod.nodes(self.cluster.name))} nodes")

    def stop(self) -> None:
        install_runtime(None)
        try:
            self.head.stop()
        finally:
            self.emulator.stop()
            client.cache_clear()
            for key, value in self._saved_environment.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def __enter__(self) -> World:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _create_stack(self) -> None:
        """The stack's resources, as infra/ creates them (rules target inbox queues instead of Lambdas)."""
        s3, sqs, events = client("s3"), client("sqs"), client("events")
        create_state_table(client("dynamodb"), TABLE)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        fifo = {"FifoQueue": "true"}
        self.dead_letter_url = sqs.create_queue(QueueName=WORK_DEAD_LETTERS, Attributes=fifo)["QueueUrl"]
        dead_letter_arn = _queue_arn(sqs, self.dead_letter_url)
        redrive = json.dumps({"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": WORK_QUEUE_MAX_RECEIVES})
        self.queue_url = sqs.create_queue(QueueName=WORK_QUEUE, Attributes={**fifo, "RedrivePolicy": redrive})[
            "QueueUrl"
        ]
        self.inboxes: dict[str, str] = {}
        patterns = {
            "ingest": change_patterns(),
            "result": result_patterns([self.head_node_id] if self.cluster.effective_channel is Channel.SSM else []),
        }
        for function, rules in patterns.items():
            inbox = sqs.create_queue(QueueName=f"topokeeper-{function}-inbox")["QueueUrl"]
            self.inboxes[function] = inbox
            for rule, pattern in rules.items():
                events.put_rule(Name=rule, EventPattern=json.dumps(pattern), State="ENABLED")
                events.put_targets(Rule=rule, Targets=[{"Id": function, "Arn": _queue_arn(sqs, inbox)}])
        client("cloudwatch").put_metric_alarm(
            AlarmName=DRIFT_ALARM.format(cluster=self.cluster.name),
            Namespace=METRICS_NAMESPACE,
            MetricName=Metric.TOPOLOGY_DRIFT.value,
            Dimensions=[{"Name": METRICS_DIMENSION, "Value": self.cluster.name}],
            Statistic="Maximum",
            Period=300,
            EvaluationPeriods=self.settings.drift_alarm_periods,
            Threshold=1,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
        )
        self.deployment = Deployment(
            table=TABLE,
            bucket=BUCKET,
            queue_url=self.queue_url,
            dead_letter_queue_url=self.dead_letter_url,
            settings=self.settings,
        )

    def _create_cluster(self) -> None:
        spec = self.scenario.cluster
        node_types = {"controller": "Controller", "login": "Login", "compute": "Compute"}
        groups = []
        for group in spec.instance_groups:
            slurm: dict[str, Any] = {"NodeType": node_types[group.role]}
            if group.partition:
                slurm["PartitionNames"] = [group.partition]
            groups.append(
                {
                    "InstanceGroupName": group.name,
                    "InstanceType": group.type,
                    "InstanceCount": group.count,
                    "ExecutionRole": f"arn:aws:iam::{self.emulator.account_id}:role/HyperPodExecution",
                    "LifeCycleConfig": {
                        "SourceS3Uri": f"s3://sagemaker-{spec.name}-lcs/src/",
                        "OnCreate": "on_create.sh",
                    },
                    "SlurmConfig": slurm,
                }
            )
            layout = group.network
            self.emulator.network.layouts[ec2_instance_type(group.type)] = NetworkLayout(
                nodes_per_leaf=layout.nodes_per_leaf,
                leaves_per_spine=layout.leaves_per_spine,
                ultraserver_size=layout.ultraserver_size,
            )
        client("sagemaker").create_cluster(
            ClusterName=spec.name, InstanceGroups=groups, Orchestrator={"Slurm": {"SlurmConfigStrategy": "Merge"}}
        )

    def scale(self, group: str, count: int) -> None:
        """One instance joins or leaves (HyperPod scaling)."""
        self.emulator.hyperpod.scale(self.cluster.name, group, count)

    def sync_head_node(self) -> None:
        """HyperPod's side: bring slurm.conf's node lines up to date. Done before anything runs on the head
        node and when a step ends, rather than per instance: slurmctld only needs them when it is asked."""
        self.head.sync_nodes(self.partitions())

    def partitions(self) -> dict[str, list[str]]:
        """Partition -> Slurm node names of the cluster's present nodes (what HyperPod puts in slurm.conf)."""
        by_group = {g.name: g.partition for g in self.scenario.cluster.instance_groups if g.partition}
        partitions: dict[str, list[str]] = {p: [] for p in by_group.values() if p}
        for node in self.emulator.hyperpod.nodes(self.cluster.name):
            partition = by_group.get(node.group)
            if partition and node.status in ("Running", "Pending", "SystemUpdating", "DeepHealthCheckInProgress"):
                partitions[partition].append(node.slurm_name)
        return partitions

    # ----------------------------------------------------------------- time

    def sleep(self, seconds: float) -> None:
        """A function waits: time passes and whatever falls due meanwhile runs."""
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        target = self.clock.monotonic() + max(seconds, 0.0)
        while True:
            due = self.agenda.next_time()
            if due is None or due > target:
                break
            self.clock.advance(max(0.0, due - self.clock.monotonic()))
            self._run_due()
        self.clock.advance(max(0.0, target - self.clock.monotonic()))

    def _run_due(self) -> None:
        # Items are popped before they run, so an item that sleeps (and so runs the agenda) never reruns.
        for action in self.agenda.pop_due(self.clock.monotonic()):
            action()

    def note(self, kind: str, text: str) -> None:
        self.timeline.append({"t": round(self.clock.monotonic(), 3), "kind": kind, "text": text})
        log.info("[t=%8.1fs] %-8s %s", self.clock.monotonic(), kind, text)

    # ----------------------------------------------------------------- the head node's channels

    def _on_command(self, request: CommandInvocationRequest) -> CommandOutcome | None:
        if self.ssm_synchronous:
            return self._execute(request)
        self.agenda.add(self.clock.monotonic() + self.scenario.timing.ssm_delivery_seconds, lambda: self._run(request))
        return None

    def _execute(self, request: CommandInvocationRequest) -> CommandOutcome:
        """What the SSM agent on the head node does: run the script, report status and output."""
        self.sync_head_node()
        code, stdout, stderr = self.head.run_script(request.commands)
        self._count_head_node_result(stdout)
        return CommandOutcome("Success" if code == 0 else "Failed", code, stdout[-24_000:], stderr[-8_000:])

    def _run(self, request: CommandInvocationRequest) -> None:
        outcome = self._execute(request)
        self.emulator.ssm.complete(
            request.command_id,
            request.instance_id,
            status=outcome.status,
            response_code=outcome.response_code,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
        )

    def _count_head_node_result(self, document_text: str) -> None:
        try:
            document = json.loads(document_text.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            return
        if document.get("mode") != "apply":
            return
        if document.get("outcome") == Outcome.APPLIED.value:
            self.counters.head_node_writes += 1
        if document.get("reconfigured"):
            self.counters.reconfigures += 1
        error = f" ({document['error']})" if document.get("error") else ""
        self.note(
            "apply", f"head node: {document.get('outcome')} {str(document.get('after_sha256') or '')[:12]}{error}"
        )

    def _install_agent(self) -> None:
        config = {
            "cluster": self.cluster.name,
            "bucket": BUCKET,
            "region": self.emulator.region,
            "endpoint_url": self.emulator.endpoint_url,
            "verify_interval_seconds": self.scenario.timing.drift_interval_seconds / 2,
            "mode": "verify" if self.cluster.effective_mode is Mode.VERIFY else "enforce",
        }
        self._agent_config = self.head.install_agent(config)

        def poll() -> None:
            self.sync_head_node()
            environment = {
                k: v for k, v in self.emulator.env().items() if k.startswith("AWS_") and k != "AWS_ENDPOINT_URL"
            }
            self.head.run_agent_once(self._agent_config, environment)
            self.agenda.add(self.clock.monotonic() + self.scenario.timing.agent_poll_seconds, poll, periodic=True)

        self.agenda.add(self.clock.monotonic() + self.scenario.timing.agent_poll_seconds, poll, periodic=True)

    def _schedule_drift(self) -> None:
        def check() -> None:
            try:
                reports = self.handlers["drift"]({}, LambdaContext("drift"))
                for report in reports:
                    self.note(
                        "drift",
                        f"live {report['live']}, AWS {report['aws']}, drift {report['drift']}, {report['action']}",
                    )
            except Exception as error:  # the Lambda would fail; the world goes on
                self.note("error", f"drift function failed: {error}")
            self.agenda.add(self.clock.monotonic() + self.scenario.timing.drift_interval_seconds, check, periodic=True)

        self.agenda.add(self.clock.monotonic() + self.scenario.timing.drift_interval_seconds, check, periodic=True)

    # ----------------------------------------------------------------- the functions

    def _has_visible_messages(self, queue_url: str) -> bool:
        """A peek into the emulator's in-process queue, so an idle loop costs no ReceiveMessage requests."""
        queue = sqs_backends[self.emulator.account_id][self.emulator.region].get_queue(queue_url.rsplit("/", 1)[-1])
        return bool(queue.approximate_number_of_messages)

    def _drain_inbox(self, function: str) -> int:
        sqs = client("sqs")
        handled = 0
        while self._has_visible_messages(self.inboxes[function]) and (
            messages := sqs.receive_message(QueueUrl=self.inboxes[function], MaxNumberOfMessages=10).get("Messages")
        ):
            _delete(sqs, self.inboxes[function], messages)
            for message in messages:
                event = json.loads(message["Body"])
                deliveries = self.event_filter(event) if function == "ingest" else [event]
                for delivery in deliveries:
                    handled += 1
                    self._invoke(function, delivery)
        return handled

    def _invoke(self, function: str, event: dict[str, Any]) -> Any:
        try:
            result = self.handlers[function](event, LambdaContext(function))
        except Exception as error:  # an async invocation that fails: Lambda would retry, then dead-letter
            self.note("error", f"{function} failed on {event.get('detail-type')}: {type(error).__name__}: {error}")
            return None
        if function == "ingest":
            self.counters.events_sent += 1
            if result and result.get("status") == "queued":
                self.counters.last_event_at = self.clock.monotonic()
            self.note(
                "event",
                f"{event.get('detail-type')}: {result.get('status') if result else '?'} "
                f"{result.get('reason', '') if result else ''}"[:160],
            )
        elif function == "result" and result:
            self._record_result(event, result)
        return result

    def _record_result(self, event: dict[str, Any], report: dict[str, Any]) -> None:
        if event.get("source") == "topokeeper.agent":
            self._count_head_node_result(json.dumps(event["detail"]["result"]))
        if report.get("status") != "recorded":
            return
        outcome = report.get("outcome")
        state = self.runtime.state.get(self.cluster.name)
        if outcome in (Outcome.APPLIED.value, Outcome.UNCHANGED.value) and state.applied_sha256:
            self.apply_times[state.applied_sha256] = self.clock.monotonic()
        else:
            self.counters.apply_failures += 1
        self.note("result", f"{outcome}; {report.get('audit_records', 0)} audit record(s)")

    def _drain_work(self) -> int:
        if not self._has_visible_messages(self.queue_url):
            return 0
        sqs = client("sqs")
        response = sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=43_200,  # the world decides when a failed or deferred message returns
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if not messages:
            return 0
        event = {"Records": [_sqs_record(message, self.queue_url, self.emulator.region) for message in messages]}
        self.deferred.clear()
        result = self.handlers["reconcile"](event, LambdaContext("reconcile"))
        failed = {item["itemIdentifier"] for item in result.get("batchItemFailures", [])}
        _delete(sqs, self.queue_url, [m for m in messages if m["MessageId"] not in failed])
        for message in messages:
            receipt = message["ReceiptHandle"]
            if message["MessageId"] not in failed:
                continue
            delay = self.deferred.get(receipt, FAILED_VISIBILITY_SECONDS)
            self.agenda.add(self.clock.monotonic() + delay, functools.partial(self._make_visible, receipt))
        return len(messages)

    def _make_visible(self, receipt: str) -> None:
        client("sqs").change_message_visibility(QueueUrl=self.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0)

    # ----------------------------------------------------------------- running

    def settle(self, *, until: float | None = None, quiet: bool = True) -> None:
        """Run the functions and the agenda until nothing is left to do (or until ``until``)."""
        deadline = until if until is not None else self.clock.monotonic() + self.scenario.timing.step_timeout_seconds
        while True:
            before = self.emulator.calls.total
            worked = self._drain_inbox("ingest") + self._drain_inbox("result") + self._drain_work()
            self.clock.advance((self.emulator.calls.total - before) * self.scenario.timing.api_call_seconds)
            if worked:
                continue
            if quiet and self.is_quiet():
                self.sync_head_node()
                return
            due = self.agenda.next_time()
            if due is None or due > deadline:
                self.clock.advance(max(0.0, deadline - self.clock.monotonic()) if not quiet else 0.0)
                self.sync_head_node()
                return
            self.clock.advance(max(0.0, due - self.clock.monotonic()))
            self._run_due()

    def is_quiet(self) -> bool:
        if self.agenda.has_work():
            return False
        state = self.runtime.state.get(self.cluster.name)
        return state.pending is None and state.generation == state.reconciled_generation

    def put_event(self, source: str, detail_type: str, detail: dict[str, Any]) -> None:
        """An event from an AWS service, through EventBridge and the stack's rules (as the emulator emits its own)."""
        self.emulator.events.emit(HYPERPOD, source=source, detail_type=detail_type, detail=detail)

    def desired(self) -> Any:
        state = self.runtime.state.get(self.cluster.name)
        return plan_cluster(self.cluster, state, self.runtime.facts(self.cluster))

    def now(self) -> datetime:
        return self.clock.now()


def create_state_table(dynamodb: Any, name: str) -> None:
    """The stack's single table (infra/state.py): pk/sk strings, on demand, TTL on expires_at."""
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )


def _delete(sqs: Any, queue_url: str, messages: list[dict[str, Any]]) -> None:
    """What Lambda's event source does with the messages a batch handled."""
    if messages:
        entries = [{"Id": str(index), "ReceiptHandle": m["ReceiptHandle"]} for index, m in enumerate(messages)]
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)


def _queue_arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return arn


def _sqs_record(message: dict[str, Any], queue_url: str, region: str) -> dict[str, Any]:
    """A received message as Lambda's SQS event source hands it to the function."""
    attributes = message.get("Attributes", {})
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": {
            "ApproximateReceiveCount": attributes.get("ApproximateReceiveCount", "1"),
            "SentTimestamp": attributes.get("SentTimestamp", "0"),
            "SenderId": attributes.get("SenderId", "simulator"),
            "ApproximateFirstReceiveTimestamp": attributes.get("ApproximateFirstReceiveTimestamp", "0"),
            "MessageGroupId": attributes.get("MessageGroupId"),
            "MessageDeduplicationId": attributes.get("MessageDeduplicationId"),
            "SequenceNumber": attributes.get("SequenceNumber"),
        },
        "messageAttributes": {},
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{region}:123456789012:{queue_url.rsplit('/', 1)[-1]}",
        "awsRegion": region,
    }


@contextmanager
def running(scenario: Scenario, **options: Any) -> Iterator[World]:
    world = World(scenario, **options)
    world.start()
    try:
        yield world
    finally:
        world.stop()
