"""The whole system on one machine: emulated AWS, the stack, the real functions, a real head node.

Simulated time: one ``ManualClock`` drives the emulator (launch times, events, the DescribeInstanceTopology
token bucket), the functions (debounce, write intervals) and an agenda of timed work (SSM command
execution after ``ssm_delivery_seconds``, agent polls, the drift schedule, alarm evaluations, deferred queue
messages). Time jumps from one agenda item to the next whenever nothing is runnable, so minutes of cluster life
take seconds. Each emulated AWS request also costs ``api_call_seconds`` of simulated time, and a
function sleeping (the rate limiter, the drift function waiting for SSM) runs the agenda meanwhile.

The rooms: ``stack`` (topokeeper's stack from ``topokeeper.contract.stack_spec``), ``cluster`` (the scenario's HyperPod
cluster, or its ParallelCluster one: ``parallelcluster``), ``lambda_host`` (the handlers, fed by the stack's rules
and queue), ``monitoring`` (metrics and alarms), ``agenda`` (timed work), ``head_node`` (slurmctld in a chroot, or
the file-only stand-in). This module wires them and runs the clock.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from topokeeper.adapters.aws import clear_clients, client
from topokeeper.adapters.dynamodb import DynamoRateLimiter
from topokeeper.adapters.ec2 import InstanceTopologyReader
from topokeeper.contract import stack_spec
from topokeeper.contract.config import ClusterConfig, Mode, Orchestrator, Settings
from topokeeper.contract.constants import LOGIN_TARGET_GROUPS_ENV
from topokeeper.contract.ports import Channel, Outcome
from topokeeper.domain.catalog import Capability, lookup
from topokeeper.domain.models import SlurmVersion
from topokeeper.render.narrate import drift_text, membership_changes, record_text, written_leaves
from topokeeper.service.drift import DriftReport
from topokeeper.service.reconcile import plan_cluster
from topokeeper.sim.agenda import Agenda
from topokeeper.sim.aws.clock import ManualClock
from topokeeper.sim.aws.emulator import AwsEmulator
from topokeeper.sim.aws.events import HYPERPOD
from topokeeper.sim.aws.hyperpod.managed_topology import ManagedFiles
from topokeeper.sim.aws.ssm import CommandInvocationRequest, CommandOutcome
from topokeeper.sim.booting_nodes import BootingNodes
from topokeeper.sim.cluster import ClusterMember, create_hyperpod_cluster, set_network_layouts, slurm_partitions
from topokeeper.sim.eks import NoHeadNode
from topokeeper.sim.file_head_node import FileHeadNode
from topokeeper.sim.head_node import ChrootHeadNode, HeadNode, choose_head_node, head_node_root
from topokeeper.sim.lambda_host import FunctionTimedOut, LambdaHost
from topokeeper.sim.latency import LatencyTracker, topology_node_names
from topokeeper.sim.login_endpoint import SimLoginEndpoint
from topokeeper.sim.monitoring import SimMetrics
from topokeeper.sim.parallelcluster import DISCOVERY, HEAD_NODE_TAG, NEEDS_SLURMCTLD, ParallelCluster
from topokeeper.sim.scenario import Scenario
from topokeeper.sim.slurm_chroot import HarnessError
from topokeeper.sim.stack import BUCKET, SimStack, create_stack, create_state_table
from topokeeper.sim.stack_iam import install_stack_iam, synthesized_template
from topokeeper.sim.stop_signals import ending_signals_raise, signals_held
from topokeeper.wire import AGENT_SOURCE
from topokeeper.wiring.runtime import Runtime, install_runtime

log = logging.getLogger("topokeeper.sim")
Baseline = Literal["full-rescan"]  # what the simulator can model besides topokeeper itself


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


class World:
    def __init__(
        self,
        scenario: Scenario,
        *,
        name: str | None = None,
        configured_slurm_version: str | None = None,
        head_node: str | None = None,
        baseline: Baseline | None = None,
        template: Callable[[Settings], dict[str, Any]] = synthesized_template,
    ) -> None:
        self.scenario = scenario
        self._template = template  # the stack's synthesized template for the settings (a test may edit it)
        self.baseline = baseline
        spec = scenario.cluster
        self.clock = ManualClock()
        self.agenda = Agenda()
        self.counters = Counters()
        self.timeline: list[dict[str, Any]] = []
        # True: SSM commands run at once (for callers outside simulated time, such as the operator CLI).
        self.ssm_synchronous = False
        self.apply_times: dict[str, float] = {}  # plan sha256 -> when the head node confirmed it
        self.open_verify_requests: set[str] = set()  # fresh verifies asked of the agent, not answered yet
        self.latency = LatencyTracker()
        self._asleep = 0  # functions sleeping now (the agenda runs while they wait)
        self.event_filter: Callable[[dict[str, Any]], list[dict[str, Any]]] = lambda event: [event]
        # Deterministic simulation, not security: the same scenario and seed tell the same story.
        self.random = random.Random(spec.seed)  # noqa: S311
        self._ids = random.Random(spec.seed + 1)  # noqa: S311
        self._saved_environment: dict[str, str | None] = {}
        self.emulator = AwsEmulator(seed=spec.seed, clock=self.clock)
        self.emulator.network.expose_hyperpod_nodes = scenario.expose_hyperpod_nodes
        self.slurm_format = SlurmVersion.parse(spec.slurm_version).format
        node_name = name or f"sim-{spec.name}"
        self.head: HeadNode
        self.parallelcluster: ParallelCluster | None = None  # made in start(): its instances live in the emulator
        self._binding_head: ChrootHeadNode | None = None  # where ParallelCluster binds nodes to instances
        if spec.orchestrator == "eks":
            self.head = NoHeadNode()
        elif choose_head_node(head_node).kind == "file":
            if spec.orchestrator == "parallelcluster":
                raise HarnessError(NEEDS_SLURMCTLD)
            self.head = FileHeadNode(SlurmVersion.parse(spec.slurm_version), node_name)
        else:
            root = head_node_root(spec.slurm_version, slurmd=spec.slurmd)
            self.head = ChrootHeadNode(self.slurm_format, node_name, spec.head_node_style, root)
            self._binding_head = self.head
        self.booting: BootingNodes | None = None  # ParallelCluster's dynamic nodes with a real slurmd each
        # An SSM hybrid managed node (HyperPod); a ParallelCluster head node is an EC2 instance (see start).
        self.head_node_id = f"mi-{self._ids.getrandbits(68):017x}"[:20]
        cluster = ClusterConfig(name=spec.name, orchestrator=Orchestrator.EKS) if spec.orchestrator == "eks" else None
        parallelcluster = spec.orchestrator == "parallelcluster"
        cluster = cluster or ClusterConfig(
            name=spec.name,
            orchestrator=Orchestrator.EC2 if parallelcluster else Orchestrator.HYPERPOD,
            mode=spec.mode,
            channel=spec.channel,
            head_node=self.head_node_id if spec.channel is Channel.SSM else None,
            # What the operator configured; the head node may run another version (it reports its own).
            slurm_version=configured_slurm_version or spec.slurm_version,
            placement_metrics=spec.placement_metrics,
            **({"ec2": DISCOVERY} if parallelcluster else {}),
        )
        # The full-rescan baseline reacts to every event at once (see _rescan_everything).
        pacing = baseline is None
        self.settings = Settings(
            clusters=[cluster],
            debounce_seconds=scenario.debounce_seconds if pacing else 0,
            min_write_interval_seconds=scenario.min_write_interval_seconds if pacing else 0,
            max_wait_seconds=scenario.max_wait_seconds if pacing else 0,
            # The stack's schedule (and so its drift alarm's period) at the scenario's drift interval.
            drift_schedule=stack_spec.rate_expression(scenario.timing.drift_interval_seconds),
            drift_alarm_periods=scenario.drift_alarm_periods,
        )
        self.cluster = cluster
        self.functions = LambdaHost(self)
        # The nodes as of the last event the timeline described ({instance id: (host name, group)}).
        self._members: dict[str, tuple[str, str]] = {}
        self._partition_of = {g.name: g.partition for g in spec.instance_groups if g.partition}
        self._written_plan: dict[str, Any] | None = None  # the plan document of the last write

    # ----------------------------------------------------------------- setup and teardown

    def start(self) -> None:
        self.emulator.start()
        self._saved_environment = {key: os.environ.get(key) for key in self.emulator.env()}
        os.environ.update(self.emulator.env())
        clear_clients()
        self.login: SimLoginEndpoint | None = None
        if self.scenario.cluster.login_endpoint:
            self.login = SimLoginEndpoint(self)
            self.cluster = self.cluster.model_copy(update={"login": self.login.config})
            self.settings = self.settings.model_copy(update={"clusters": [self.cluster]})
            # The stack sets it on the ingest and drift functions; here every handler shares the process.
            self._saved_environment.setdefault(LOGIN_TARGET_GROUPS_ENV, os.environ.get(LOGIN_TARGET_GROUPS_ENV))
            os.environ[LOGIN_TARGET_GROUPS_ENV] = json.dumps({self.cluster.name: self.login.target_group_arn})
        if self.scenario.cluster.orchestrator == "parallelcluster":
            self._launch_parallelcluster_head_node()
        self.stack: SimStack = create_stack(self.settings)
        # Every request of the functions and the head node is authorized with the stack's own IAM.
        target_group = self.login.target_group_arn if self.login is not None else None
        template = self._template(self.settings)
        self.iam = install_stack_iam(self.emulator, self.stack, self.settings, template, target_group)
        self.emulator.network.new_instance_delay_seconds = self.scenario.timing.topology_report_delay_seconds
        if self.parallelcluster is not None and self._binding_head is not None:
            set_network_layouts(self.emulator, self.scenario.cluster)
            self.parallelcluster.create()
            extra = self.booting.extra_lines() if self.booting else []
            self._binding_head.start(self.partitions(), self.parallelcluster.addresses(), extra)
            if self.booting is not None:
                self.booting.install()
        else:
            create_hyperpod_cluster(self.emulator, self.scenario.cluster)
            self.head.start(self.partitions())
        if self.scenario.cluster.managed_topology:
            self._hand_topology_to_hyperpod()
        self.metrics = SimMetrics(self)
        self._deploy_functions()
        if self.baseline == "full-rescan":
            self._rescan_everything()
        install_runtime(self.runtime)
        self.emulator.ssm.on_command = self._on_command
        if self.parallelcluster is None:
            # The operator tags the head node so the stack's SendCommand statement admits it (docs/deploy.md).
            self.emulator.ssm.register_managed_instance(self.head_node_id, {HEAD_NODE_TAG: "true"})
        self.metrics.start()
        self._schedule_drift()
        if self.cluster.effective_channel is Channel.AGENT:
            self._install_agent()
        self.note("start", f"cluster {self.cluster.name}: {len(self.cluster_nodes())} nodes")

    def _deploy_functions(self) -> None:
        """The functions' runtime for the stack's deployment, as the handlers use it."""
        self.runtime = Runtime.from_environment(
            self.stack.deployment.environment(),
            clock=self.clock,
            metrics=self.metrics,
            sleep=self.sleep,
            work_queue=self.functions.work_queue(),
        )

    def rebuild_state_table(self, mode: Mode | None = None) -> None:
        """The state table dropped and made anew, empty (a restore from nothing, the stack replaced), and the stack
        deployed again, with the cluster in ``mode`` if given; the bucket, the queues and the head node keep what
        they had (the head node its generation.json)."""
        dynamodb = client("dynamodb")
        dynamodb.delete_table(TableName=self.stack.deployment.table)
        create_state_table(dynamodb, self.stack.deployment.table)
        if mode is not None:
            self.cluster = self.cluster.model_copy(update={"mode": mode})
            self.settings = self.settings.model_copy(update={"clusters": [self.cluster]})
            self.stack.deployment = self.stack.deployment.model_copy(update={"settings": self.settings})
        self._deploy_functions()
        install_runtime(self.runtime)
        self.note("start", f"state table rebuilt empty; cluster {self.cluster.name} redeployed")

    def _launch_parallelcluster_head_node(self) -> None:
        """ParallelCluster's head node is an EC2 instance: its id is the SSM target the stack's rules name."""
        assert self._binding_head is not None  # noqa: S101 - __init__ refused the file-only head node
        self.parallelcluster = ParallelCluster(self.emulator, self.scenario.cluster, self._binding_head.bind)
        if self.scenario.cluster.slurmd:
            self.booting = BootingNodes(self, self._binding_head, self.parallelcluster.dynamic_nodes())
            self.parallelcluster.resumed = self.booting.resumed
        self.head_node_id = self.parallelcluster.launch_head_node()
        if self.cluster.effective_channel is Channel.SSM:
            self.cluster = self.cluster.model_copy(update={"head_node": self.head_node_id})
            self.settings = self.settings.model_copy(update={"clusters": [self.cluster]})

    def _rescan_everything(self) -> None:
        """What the public generators do on every event (aws-samples' generator, topograph): describe every
        instance's topology again, render, write and reconfigure. Modelled with topokeeper's own pipeline
        without its pacing (no debounce, wait or write interval) and without its node-facts cache; writes
        stay one at a time, as a generator's runs do."""
        limiter = DynamoRateLimiter(
            client("dynamodb"), self.runtime.env.table, now=lambda: self.clock.now().timestamp(), sleep=self.sleep
        )
        no_cache = _NoCache()

        def reader(deadline: datetime | None = None) -> InstanceTopologyReader:
            return InstanceTopologyReader(client("ec2"), no_cache, limiter, self.clock.now, deadline)

        self.runtime.topology_reader = reader  # type: ignore[method-assign]

    def stop(self) -> None:
        install_runtime(None)
        try:
            self.head.stop()
        finally:
            self.emulator.stop()
            clear_clients()
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

    def _hand_topology_to_hyperpod(self) -> None:
        """The emulated HyperPod writes the head node's topology itself, after its own delay (agenda time)."""
        world = self

        class HyperPodsHeadNode:
            def write_managed_topology(self, files: ManagedFiles) -> None:
                world.sync_head_node()
                world.head.write_managed_topology(files)
                changed = ", ".join(
                    f"{p} {f['plugin']} ({f['node_count']} nodes)" for p, f in sorted(files.partitions.items())
                )
                world.note("hyperpod", f"HyperPod wrote {files.file_name} itself: {changed}")

        def schedule(seconds: float, action: Callable[[], None]) -> None:
            self.agenda.add(self.clock.monotonic() + seconds, action)

        self.emulator.hyperpod.managed_topology.enable(
            self.cluster.name,
            HyperPodsHeadNode(),
            self.slurm_format,
            schedule,
            self.scenario.timing.hyperpod_topology_seconds,
        )

    def scale(self, group: str, count: int) -> None:
        """One instance joins or leaves (HyperPod scaling, or ParallelCluster powering a dynamic node)."""
        if self.parallelcluster is not None:
            self.parallelcluster.scale(group, count)
        else:
            self.emulator.hyperpod.scale(self.cluster.name, group, count)

    def cluster_nodes(self, group: str | None = None) -> Sequence[ClusterMember]:
        """The running nodes (of one group), by Slurm name."""
        if self.parallelcluster is not None:
            return self.parallelcluster.nodes(group)
        return self.emulator.hyperpod.nodes(self.cluster.name, group)

    def _membership(self) -> dict[str, tuple[str, str]]:
        """Instance id -> (Slurm name, group) of the running nodes: ``cluster_nodes`` without a copy of each."""
        if self.parallelcluster is not None:
            return {n.instance_id: (n.slurm_name, n.group) for n in self.parallelcluster.nodes(None)}
        return self.emulator.hyperpod.membership(self.cluster.name)

    def sync_head_node(self) -> None:
        """HyperPod's side: bring slurm.conf's node lines up to date. Done before anything runs on the head
        node and when a step ends, rather than per instance: slurmctld only needs them when it is asked."""
        self.head.sync_nodes(self.partitions())

    def partitions(self) -> dict[str, list[str]]:
        if self.parallelcluster is not None:
            return self.parallelcluster.partitions()
        return slurm_partitions(self.emulator, self.scenario.cluster)

    # ----------------------------------------------------------------- time

    def sleep(self, seconds: float) -> None:
        """A function waits: time passes and whatever falls due meanwhile runs."""
        self._asleep += 1
        try:
            # What falls due is the world's (or another invocation, under its own role), not the sleeper's.
            with self.emulator.iam.as_harness():
                self.advance(seconds)
        finally:
            self._asleep -= 1

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
        # A table's further lines under the text's first, past the time and kind.
        log.info("[t=%8.1fs] %-8s %s", self.clock.monotonic(), kind, text.replace("\n", "\n" + " " * 22))

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
            self.observe_latency()
        if document.get("reconfigured"):
            self.counters.reconfigures += 1
        self.note("apply", _apply_text(document))

    def _install_agent(self) -> None:
        config = {
            "cluster": self.cluster.name,
            "bucket": BUCKET,
            "region": self.emulator.region,
            "endpoint_url": self.emulator.endpoint_url,
            "verify_interval_seconds": self.scenario.timing.drift_interval_seconds / 2,
            "mode": "verify" if self.cluster.effective_mode is Mode.VERIFY else "enforce",
        }
        if self.cluster.placement_metrics:  # as the install script's --placement-seconds would: each drift period
            config["placement_facts_interval_seconds"] = self.scenario.timing.drift_interval_seconds
        self._agent_config = self.head.install_agent(config)

        def poll() -> None:
            self.sync_head_node()
            environment = {
                k: v for k, v in self.emulator.env().items() if k.startswith("AWS_") and k != "AWS_ENDPOINT_URL"
            }
            # The head node's instance role, which carries the cluster's agent policy.
            credentials = self.emulator.iam.credentials(self.iam.head_node_roles[self.cluster.name])
            environment.update(AWS_ACCESS_KEY_ID=credentials.access_key, AWS_SECRET_ACCESS_KEY=credentials.secret_key)
            self.head.run_agent_once(self._agent_config, environment)
            self.agenda.add(self.clock.monotonic() + self.scenario.timing.agent_poll_seconds, poll, periodic=True)

        self.agenda.add(self.clock.monotonic() + self.scenario.timing.agent_poll_seconds, poll, periodic=True)

    def _schedule_drift(self) -> None:
        """The stack's drift schedule, ``settings.drift_schedule`` (each run starts a rate after the last ended)."""
        interval = self.scenario.timing.drift_interval_seconds  # the schedule's rate (see __init__)

        def check() -> None:
            if self._asleep:
                # Another function is waiting for its DescribeInstanceTopology slot; run this one after it, as
                # the shared rate limiter would order them (nested here, it would take that slot's token).
                self.agenda.add(self.clock.monotonic() + 1, check, periodic=True)
                return
            try:
                reports = self.functions.invoke("drift", {})
                for report in reports:
                    moved = report.get("moved") or []
                    what = f" ({drift_text(moved, self.partitions())})" if moved else ""
                    self.note(
                        "drift",
                        f"live {report['live']}{what}, AWS {report['aws']}, drift {report['drift']},"
                        f" {report['action']}" + ("" if moved else differences(report.get("detail") or [])),
                    )
            except FunctionTimedOut:
                raise
            except Exception as error:  # the Lambda would fail; the world goes on
                self.note("error", f"drift function failed: {error}")
            if self.login is not None:
                self.login.note_changes()
            self.agenda.add(self.clock.monotonic() + interval, check, periodic=True)

        self.agenda.add(self.clock.monotonic() + interval, check, periodic=True)

    # ----------------------------------------------------------------- what the functions did

    def handled(self, function: str, event: dict[str, Any], result: Any) -> None:
        """An asynchronous invocation (ingest or result) returned ``result``."""
        if self.login is not None:
            self.login.note_changes()
        if function == stack_spec.INGEST:
            self.counters.events_sent += 1
            if result and result.get("status") == "queued":
                self.counters.last_event_at = self.clock.monotonic()
            members = self._membership()
            changes = membership_changes(self._members, members, self._partition_of)
            self._members = members
            status = f"{result.get('status')} ({result.get('reason', '')})" if result else "?"
            self.note("event", f"{event.get('detail-type')}: {status}; {changes}")
        elif function == stack_spec.RESULT and result:
            self._record_result(event, result)

    def verified(self, report: DriftReport) -> None:
        """The reconcile function verified the head node at once after HyperPod's own topology update."""
        self.note("verify", describe_verify(report, self.runtime.state.get(self.cluster.name).desired_sha256))
        if report.verify_request is not None and report.live == "unknown":
            self.open_verify_requests.add(report.verify_request)  # the agent answers at its next poll

    def _note_fresh_verify(self, report: dict[str, Any]) -> None:
        """The agent's verify the backend asked for after HyperPod's own update, as the result function judged it."""
        state = self.runtime.state.get(self.cluster.name)
        request = str(report["verify_request"])
        self.open_verify_requests.discard(request)
        verdict = VERDICTS.get(report.get("live") or "", report.get("reason") or "could not tell")
        found = differences(state.last_verify.drift) if state.last_verify else ""
        self.note(
            "verify",
            f"the agent verified at once ({request}) after HyperPod's UpdatePartitionTopology: live topology on"
            f" the head node vs plan {str(state.desired_sha256)[:12]}: {verdict}; wrote nothing{found}",
        )

    def _record_result(self, event: dict[str, Any], report: dict[str, Any]) -> None:
        if str(event.get("source", "")).startswith(AGENT_SOURCE):
            self._count_head_node_result(json.dumps(event["detail"]["result"]))
        if report.get("status") == "verify-recorded" and report.get("verify_request"):
            self._note_fresh_verify(report)
        if report.get("status") != "recorded":
            return
        outcome = report.get("outcome")
        state = self.runtime.state.get(self.cluster.name)
        if outcome in (Outcome.APPLIED.value, Outcome.UNCHANGED.value) and state.applied_sha256:
            self.apply_times[state.applied_sha256] = self.clock.monotonic()
        else:
            self.counters.apply_failures += 1
        count = int(report.get("audit_records", 0) or 0)
        self.note("result", f"{outcome}; {count} audit record(s)")
        with self.emulator.calls.uncounted():  # the simulator reading the history, not topokeeper
            records = self.runtime.audit.history(self.cluster.name, count) if count else []
        for record in sorted(records, key=lambda r: str(r["partition"])):
            self.note("audit", record_text(record))
        if outcome == Outcome.APPLIED.value and records:
            with self.emulator.calls.uncounted():
                written = self.runtime.plans.plan_document(self.cluster.name, str(records[0]["plan_sha256"]))
            self.note("leaves", written_leaves(self._written_plan, written, records))
            self._written_plan = written

    def observe_latency(self) -> None:
        """Note the nodes launched so far and which of them the live topology now places."""
        now = self.clock.monotonic()
        offset = self.clock.now().timestamp() - now  # wall time of monotonic 0
        nodes = self.cluster_nodes()
        for node in nodes:
            if node.replaces is None and lookup(node.instance_type).capability is not Capability.NONE:
                self.latency.launched(node.instance_id, node.slurm_name, node.launch_time.timestamp() - offset)
        self.latency.forget_except(node.instance_id for node in nodes)
        self.latency.observe(topology_node_names(self.head.live_topology()), now)

    # ----------------------------------------------------------------- running

    def settle(self, *, until: float | None = None, quiet: bool = True) -> None:
        """Run the functions and the agenda until nothing is left to do (or until ``until``)."""
        deadline = until if until is not None else self.clock.monotonic() + self.scenario.timing.step_timeout_seconds
        while True:
            before = self.emulator.calls.total
            worked = self.functions.drain()
            calls = self.emulator.calls.total - before - self.functions.concurrent_calls
            self.functions.concurrent_calls = 0
            self.clock.advance(calls * self.scenario.timing.api_call_seconds)
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
        # A fresh verify asked of the agent is work in flight too: its answer belongs to this step.
        return (
            state.pending is None and state.generation == state.reconciled_generation and not self.open_verify_requests
        )

    def put_event(self, source: str, detail_type: str, detail: dict[str, Any]) -> None:
        """An event from an AWS service, through EventBridge and the stack's rules (as the emulator emits its own)."""
        self.emulator.events.emit(HYPERPOD, source=source, detail_type=detail_type, detail=detail)

    def desired(self) -> Any:
        """The plan AWS implies now; on ParallelCluster named by the head node's bindings as they are now, not
        as topokeeper last stored them (a node bound since is not placed until topokeeper learns it)."""
        state = self.runtime.state.get(self.cluster.name)
        if self.parallelcluster is not None and self._binding_head is not None:
            state = state.model_copy(update={"slurm_nodes": self._binding_head.node_table()})
        return plan_cluster(self.cluster, state, self.runtime.facts(self.cluster))

    def now(self) -> datetime:
        return self.clock.now()


VERDICTS = {"in_sync": "AGREES with the plan", "drift": "DRIFT: the live grouping differs from the plan"}


def describe_verify(report: DriftReport, plan_sha256: str | None) -> str:
    """One timeline line: what a verify compared, its verdict, and what differed (grouping first)."""
    # Ingest keeps the CloudTrail record's own id at the end of the trigger's summary.
    events = ", ".join(t.summary.rsplit(" ", 1)[-1] for t in report.requested_by) or "none"
    verdict = VERDICTS.get(report.live, f"not yet: {report.error or 'no answer'}")
    line = (
        f"verified at once after HyperPod's UpdatePartitionTopology (CloudTrail {events}): live topology on the"
        f" head node vs plan {str(plan_sha256 or '-')[:12]}: {verdict}; AWS {report.aws}; wrote nothing"
    )
    return line + differences(report.detail)


def differences(detail: list[dict[str, Any]]) -> str:
    """What a verify found different: the grouping entries (nodes named), else how many naming ones."""
    grouping = [item for item in detail if item.get("kind") == "grouping"]
    naming = [item for item in detail if item.get("kind") == "naming"]
    text = "".join(f"; {item.get('name')}: {item.get('detail')}" for item in grouping[:3])
    if naming and not grouping:
        text += f"; {len(naming)} naming difference(s) only (another writer's switch, block and topology names)"
    return text


def _apply_text(document: dict[str, Any]) -> str:
    """The head node's apply in one line: the plan, the file, the partitions, the reconfigure, any error."""
    sha = str(document.get("after_sha256") or document.get("plan_sha256") or "")[:12]
    file = "/".join(str(part) for part in (document.get("config_dir"), document.get("slurm_format")) if part)
    changed = document.get("partitions_changed") or []
    text = f"head node: {document.get('outcome')} plan {sha}"
    if file:
        text += f" to {file}"
    if changed:
        text += f" (slurm.conf Topology= of {', '.join(changed)})"
    if document.get("apply_path") == "incremental":
        text += f", {document.get('nodes_updated')} node(s) placed live by scontrol update, no reconfigure"
    else:
        text += ", scontrol reconfigure" if document.get("reconfigured") else ", no reconfigure"
    if document.get("error"):
        text += f"; error: {document['error']}"
    return text


class _NoCache:
    """A node-facts cache that keeps nothing: every read describes every instance again."""

    def get_many(self, cluster: str, instance_ids: Iterable[str]) -> dict[str, dict[str, object]]:
        return {}

    def put_many(self, cluster: str, items: dict[str, dict[str, object]], now: datetime) -> None:
        return None


@contextmanager
def running(scenario: Scenario, **options: Any) -> Iterator[World]:
    # The emulator's state (moto's items and messages, the cluster) only grows while a world runs: at the default
    # thresholds the collector rescans it some 2,000 times in a 1,000-node scale-up (~10% of the run's CPU).
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    world = World(scenario, **options)
    try:
        # SIGTERM and SIGHUP end the run through the finally below, as an error does, and the stop runs whole.
        with ending_signals_raise():
            try:
                world.start()
                yield world
            finally:
                with signals_held():
                    world.stop()  # also what a start that failed part way started (stop copes with a partial start)
    finally:
        gc.set_threshold(*thresholds)
