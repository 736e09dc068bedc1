"""``topokeeper simulate``: play a scenario's story against the world and measure every step.

Each step reports the events sent, the AWS calls by operation, the reconciles, the head-node writes
and reconfigures, the applied plan, whether the live topology converged to the desired one and how
long that took in simulated time, the audit records, the drift metric, and the live topology.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from topokeeper.adapters.aws import client
from topokeeper.contract.config import Mode, Orchestrator
from topokeeper.contract.ports import Metric, Outcome
from topokeeper.render.bundle import RenderedPlan
from topokeeper.render.mermaid import render_partition_mermaid
from topokeeper.sim.aws.alarms import AlarmState
from topokeeper.sim.eks import KueueStep, final_view, step_view
from topokeeper.sim.latency import NodeLatency, summarize
from topokeeper.sim.login_endpoint import LoginStep
from topokeeper.sim.placement_view import StoryJobs
from topokeeper.sim.scenario import Scenario, Step
from topokeeper.sim.slurm_chroot import HarnessError

if TYPE_CHECKING:
    from topokeeper.sim.parallelcluster import ParallelCluster
    from topokeeper.sim.world import Baseline, World

# BatchReplaceClusterNodes and BatchRebootClusterNodes take at most 25 node ids (botocore's model; AWS refuses
# more): a step that replaces more sends several calls, as an operator's script would.
NODE_ACTION_BATCH = 25


def _in_batches(action: Callable[..., object], cluster: str, ids: list[str]) -> None:
    for start in range(0, len(ids), NODE_ACTION_BATCH):
        action(ClusterName=cluster, NodeIds=ids[start : start + NODE_ACTION_BATCH])


class StepResult(BaseModel):
    step: str
    started_at: float
    ended_at: float
    events_sent: int
    events_lost: int = 0
    events_duplicated: int = 0
    aws_calls: dict[str, int]
    reconciles: int
    head_node_writes: int
    reconfigures: int
    apply_failures: int
    applied_sha256: str | None
    desired_sha256: str
    converged: bool | None
    convergence_seconds: float | None
    audit_records: list[dict[str, Any]]
    drift: int | None  # the highest TopologyDrift seen during the step
    alarm: str  # the drift alarm's state when the step ended
    alarm_raised: bool  # whether it went to ALARM during the step
    live_topology: dict[str, str]
    nodes: int
    timeline: list[dict[str, Any]] = Field(default_factory=list)
    kueue: KueueStep | None = None  # an EKS cluster's published Kueue objects (it has no head node)
    login: LoginStep | None = None  # the login endpoint's targets, when the scenario has one
    # Launch to the live topology, for the nodes launched during the step (see topokeeper.sim.latency).
    node_latency_seconds: NodeLatency | None = None
    node_latencies: dict[str, float] = Field(default_factory=dict)  # node name -> seconds
    # Where the story's jobs landed and the figures per partition after the step (sim/placement_view), once a
    # step submitted jobs to a real slurmctld.
    placement: dict[str, Any] | None = None


class SimulationResult(BaseModel):
    scenario: dict[str, Any]
    head_node: str  # what answered scontrol: the real slurmctld, or the file-only stand-in
    steps: list[StepResult]
    totals: dict[str, Any]
    desired: dict[str, Any]  # the final plan.json
    mermaid: dict[str, str]  # partition -> Mermaid flowchart of the final plan


class Story:
    """Runs steps on a started world; ``modifier`` steps change how the next step's events arrive."""

    def __init__(self, world: World, progress: Callable[[str], None]) -> None:
        self.world = world
        self.progress = progress
        self._pending_filter: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
        self.jobs = StoryJobs(world)

    def play(self, index: int, step: Step) -> StepResult | None:
        world = self.world
        action = step.action
        if action in ("duplicate_events", "lose_events"):
            self._pending_filter = self._filter(step)
            world.note("step", f"{action}: applies to the next step")
            return None
        world.event_filter = self._pending_filter or (lambda event: [event])
        self._pending_filter = None
        started = world.clock.monotonic()
        from topokeeper.sim.world import Counters  # noqa: PLC0415 (see simulate)

        world.counters = Counters()
        world.emulator.calls.reset()
        timeline_start = len(world.timeline)
        world.note("step", f"{index}: {action} {getattr(step, action).model_dump(exclude_defaults=False)}")
        self.progress(f"step {index}: {action}")
        with world.emulator.calls.uncounted():  # the operator's (or HyperPod's) actions, not topokeeper's calls
            self._act(step)
        if step.wait is not None:
            world.settle(until=started + step.wait.seconds, quiet=False)
        else:
            world.settle()
        return self.measure(action, started, timeline_start)

    def _filter(self, step: Step) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
        world = self.world
        randomness = world.random
        if step.lose_events is not None:
            fraction = step.lose_events.fraction

            def lose(event: dict[str, Any]) -> list[dict[str, Any]]:
                if randomness.random() < fraction:
                    world.counters.events_lost += 1
                    return []
                return [event]

            return lose
        factor = step.duplicate_events.factor if step.duplicate_events is not None else 2

        def duplicate(event: dict[str, Any]) -> list[dict[str, Any]]:
            # SageMaker "may send multiple events for each state change", each with its own id.
            copies = [{**event, "id": str(uuid.UUID(int=randomness.getrandbits(128)))} for _ in range(factor - 1)]
            world.counters.events_duplicated += len(copies)
            return [event, *copies]

        return duplicate

    def _act(self, step: Step) -> None:
        world, cluster = self.world, self.world.cluster.name
        hyperpod = world.emulator.hyperpod
        sagemaker = client("sagemaker")
        if step.scale is not None:
            group, target = step.scale.group, step.scale.to
            current = len(world.cluster_nodes(group))
            counts = range(current + 1, target + 1) if target > current else range(current - 1, target - 1, -1)
            spacing = step.scale.over_seconds / max(len(counts), 1)
            for number, count in enumerate(counts):
                world.agenda.add(
                    world.clock.monotonic() + number * spacing, functools.partial(world.scale, group, count)
                )
        elif step.submit is not None:
            self.jobs.submit(step.submit.jobs)
        elif world.parallelcluster is not None and step.tamper is None:
            self._act_parallelcluster(step, world.parallelcluster)
        elif step.replace is not None:
            ids = self._pick(step.replace.group, step.replace.count)
            hyperpod.replace_new_ip = step.replace.new_ip
            try:
                _in_batches(sagemaker.batch_replace_cluster_nodes, cluster, ids)
            finally:
                hyperpod.replace_new_ip = False
        elif step.reboot is not None:
            ids = self._pick(step.reboot.group, step.reboot.count)
            _in_batches(sagemaker.batch_reboot_cluster_nodes, cluster, ids)
        elif step.delete is not None:
            ids = self._pick(step.delete.group, step.delete.count, newest=True)
            sagemaker.batch_delete_cluster_nodes(ClusterName=cluster, NodeIds=ids)
        elif step.fail_node is not None:
            ids = self._pick(step.fail_node.group, step.fail_node.count)
            for node_id in ids:
                hyperpod.set_status(node_id, "Failure", "HMA detected NvidiaErrorTerminate")
            # HyperPod's automatic node recovery replaces the node a minute later.
            world.agenda.add(
                world.clock.monotonic() + 60,
                functools.partial(_in_batches, sagemaker.batch_replace_cluster_nodes, cluster, ids),
            )
        elif step.hyperpod_misplace is not None:
            ids = self._pick(step.hyperpod_misplace.group, step.hyperpod_misplace.count)
            hyperpod.managed_topology.misplace(cluster, ids)
            world.note(
                "bug", f"HyperPod's next topology puts {len(ids)} {step.hyperpod_misplace.group} node(s) elsewhere"
            )
        elif step.tamper is not None:
            edited = world.head.tamper()
            world.note("tamper", f"hand edit of {edited} on the head node, then scontrol reconfigure")

    def _act_parallelcluster(self, step: Step, cluster: ParallelCluster) -> None:
        """What ParallelCluster does (the scenario refuses the steps only HyperPod has)."""
        if step.replace is not None:
            names = cluster.replace(step.replace.group, step.replace.count)
            self.world.note("parallelcluster", f"clustermgtd replaced the instances of {', '.join(names)}")
        elif step.delete is not None:
            names = cluster.power_down(step.delete.group, step.delete.count)
            self.world.note("parallelcluster", f"powered down {', '.join(names) or 'nothing'}")

    def _pick(self, group: str, count: int, *, newest: bool = False) -> list[str]:
        nodes = sorted(self.world.emulator.hyperpod.nodes(self.world.cluster.name, group), key=lambda n: n.slurm_name)
        chosen = nodes[-count:] if newest else nodes[:count]
        return [node.instance_id for node in chosen]

    def measure(self, action: str, started: float, timeline_start: int) -> StepResult:
        world = self.world
        placement = self.jobs.observe()  # its timeline lines belong to the step
        counters = world.counters
        state = world.runtime.state.get(world.cluster.name)
        kueue, seconds = None, None
        if world.cluster.orchestrator is Orchestrator.EKS:
            desired_sha256, node_count, published, kueue = step_view(world, started, lambda r, t: _after(r, world, t))
            converged: bool | None = published
            alarm = AlarmState(kueue.alarm)
        else:
            desired = world.desired()
            desired_sha256, node_count = desired.sha256, len(desired.plan.nodes)
            converged, seconds = self._convergence(desired, started)
            alarm = world.metrics.state(world.cluster.name, Metric.TOPOLOGY_DRIFT)
        with world.emulator.calls.uncounted():
            history = world.runtime.audit.history(world.cluster.name, 1000)
        records = [r for r in history if _after(r, world, started)]
        drift = world.metrics.peak(world.cluster.name, Metric.TOPOLOGY_DRIFT, started)
        world.observe_latency()
        latencies, unplaced = world.latency.between(started, world.clock.monotonic())
        latency = summarize(latencies, unplaced) if latencies or unplaced else None
        if latency is not None and latency.slowest is not None:
            world.note(
                "latency", f"slowest node {latency.slowest}: {latency.max:.1f}s from launch to the live topology"
            )
        return StepResult(
            step=action,
            started_at=round(started, 3),
            ended_at=round(world.clock.monotonic(), 3),
            events_sent=counters.events_sent,
            events_lost=counters.events_lost,
            events_duplicated=counters.events_duplicated,
            aws_calls=world.emulator.calls.by_operation(),
            reconciles=counters.reconciles,
            head_node_writes=counters.head_node_writes,
            reconfigures=counters.reconfigures,
            apply_failures=counters.apply_failures,
            applied_sha256=state.applied_sha256,
            desired_sha256=desired_sha256,
            converged=converged,
            convergence_seconds=seconds,
            audit_records=sorted(records, key=lambda r: (r["completed_at"], r["partition"])),
            drift=None if drift is None else int(drift),
            alarm=alarm.value,
            alarm_raised=world.metrics.alarmed_since(started),
            live_topology=world.head.live_topology(),
            nodes=node_count,
            timeline=world.timeline[timeline_start:],
            kueue=kueue,
            login=world.login.step(started, lambda r, t: _after(r, world, t)) if world.login else None,
            node_latency_seconds=latency,
            node_latencies=latencies,
            placement=placement,
        )

    def _convergence(self, desired: RenderedPlan, started: float) -> tuple[bool | None, float | None]:
        """Does the live topology match the desired plan, and how long after the step's last event did it?"""
        world = self.world
        if world.cluster.effective_mode is Mode.VERIFY:
            return None, None  # topokeeper does not write in verify mode
        live = world.head.verify(desired.bundle)
        if live.get("outcome") != Outcome.IN_SYNC.value:
            return False, None
        confirmed = world.apply_times.get(desired.sha256)
        last_event = world.counters.last_event_at if world.counters.last_event_at is not None else started
        if confirmed is None or confirmed < last_event:
            return True, 0.0
        return True, round(confirmed - last_event, 3)


def _after(record: dict[str, Any], world: World, started: float) -> bool:
    """Whether an audit record was completed during the step (its time is simulated wall time)."""
    completed = datetime.fromisoformat(record["completed_at"].replace("Z", "+00:00"))
    step_start = world.clock.now().timestamp() - (world.clock.monotonic() - started)
    return completed.timestamp() >= step_start - 1e-6


def simulate(
    scenario: Scenario,
    *,
    progress: Callable[[str], None] = lambda _: None,
    head_node: str | None = None,
    on_step: Callable[[StepResult], None] = lambda _: None,
    baseline: Baseline | None = None,
) -> SimulationResult:
    """Play ``scenario``; ``head_node`` "chroot" or "file" as ``world.choose_head_node`` takes it; ``on_step``
    sees each step's result as soon as the step ends; ``baseline`` "full-rescan" plays it as the public
    generators would (``World._rescan_everything``)."""
    # Imported here: the world loads moto (seconds of CPU), which the result models and the report do not need.
    from topokeeper.sim.world import running  # noqa: PLC0415

    with running(scenario, head_node=head_node, baseline=baseline) as world:
        return play(world, scenario, progress, on_step)


def play(
    world: World,
    scenario: Scenario,
    progress: Callable[[str], None],
    on_step: Callable[[StepResult], None] = lambda _: None,
) -> SimulationResult:
    story = Story(world, progress)
    progress("creating the cluster")
    # The emulator's own setup (the stack's bucket, tables and queues, the cluster) is not topokeeper's work.
    world.emulator.calls.reset()
    started = world.clock.monotonic()
    world.settle()
    steps = [story.measure("create", started, 0)]
    on_step(steps[0])
    for index, step in enumerate(scenario.steps, start=1):
        result = story.play(index, step)
        if result is not None:
            steps.append(result)
            on_step(result)
    refused = world.emulator.iam.refused
    if refused:  # the stack's own IAM refused a request: on AWS the same run would fail there
        raise HarnessError(f"AccessDenied ({len(refused)} requests refused); the first: {refused[0]}")
    latencies, unplaced = world.latency.between(0.0, world.clock.monotonic())
    totals = {
        "simulated_seconds": round(world.clock.monotonic(), 3),
        "events_sent": sum(s.events_sent for s in steps),
        "reconciles": sum(s.reconciles for s in steps),
        "head_node_writes": sum(s.head_node_writes for s in steps),
        "reconfigures": sum(s.reconfigures for s in steps),
        "apply_failures": sum(s.apply_failures for s in steps),
        "audit_records": sum(len(s.audit_records) + len(s.kueue.audit_records if s.kueue else []) for s in steps),
        "aws_calls": _sum_calls(steps),
        "converged": steps[-1].converged,
        "node_latency_seconds": summarize(latencies, unplaced).model_dump(),
        "topology_report_delay_seconds": scenario.timing.topology_report_delay_seconds,
        "baseline": world.baseline,
    }
    return SimulationResult(
        scenario=scenario.model_dump(mode="json"),
        head_node=world.head.description,
        steps=steps,
        totals=totals,
        **_final(world),
    )


def _final(world: World) -> dict[str, Any]:
    if world.cluster.orchestrator is Orchestrator.EKS:
        desired, mermaid = final_view(world)
        return {"desired": desired, "mermaid": mermaid}
    final = world.desired()
    return {
        "desired": json.loads(final.files()["plan.json"]),
        "mermaid": {p.partition: render_partition_mermaid(p) for p in final.plan.partitions},
    }


def _sum_calls(steps: list[StepResult]) -> dict[str, int]:
    total: dict[str, int] = {}
    for step in steps:
        for operation, count in step.aws_calls.items():
            total[operation] = total.get(operation, 0) + count
    return dict(sorted(total.items()))


def write_result(result: SimulationResult, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "result.json"
    path.write_text(result.model_dump_json(indent=2) + "\n")
    return path
