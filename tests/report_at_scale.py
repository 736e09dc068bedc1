"""A synthetic simulator result of any size, for the report at 1,000 and 10,000 nodes: a real plan (the
planner and renderer on a generated snapshot), one scale event per joined node and real audit records."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.helpers import node, snapshot
from topokeeper.contract.ports import Channel, DeliveryHandle, Outcome, PendingDelivery, Trigger
from topokeeper.domain import placement
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import leaf_units, render
from topokeeper.service.audit import build_records
from topokeeper.sim.placement_view import view
from topokeeper.sim.simulator import SimulationResult, StepResult
from topokeeper.wire import compress

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ULTRASERVER = 18


def _plan_document(p5: int, gb200: int) -> dict[str, Any]:
    """p5 nodes four to a leaf, 16 leaves to an aggregation switch, 16 of those to a spine; gb200 nodes in
    UltraServers of 18."""
    nodes = {
        "ml-p5": [
            node(
                f"p5-{i:05d}", path=(f"nn-spine{i // 1024}", f"nn-agg{i // 64}", f"nn-leaf{i // 4}"), partition="ml-p5"
            )
            for i in range(p5)
        ],
        "ml-p6e": [
            node(
                f"gb-{i:05d}",
                instance_type="p6e-gb200.36xlarge",
                path=("nn-gbspine", f"nn-gbagg{i // 288}", f"nn-gbleaf{i // 72}"),
                ultraserver=f"us-{i // ULTRASERVER:04d}",
                partition="ml-p6e",
            )
            for i in range(gb200)
        ],
        "preprocess": [node(f"cpu-{i:03d}", instance_type="c6i.4xlarge", partition="preprocess") for i in range(16)],
    }
    return json.loads(render(plan(snapshot(nodes))).files()["plan.json"])


def _live(document: dict[str, Any]) -> dict[str, str]:
    """``scontrol show topology`` as Slurm prints it: upper switches list every node below them."""
    live = {}
    for partition in document["partitions"]:
        if partition.get("blocks"):
            lines = [
                f"BlockName={b['name']} BlockIndex={i} Nodes={compress(b['nodes'])} BlockSize={ULTRASERVER}"
                for i, b in enumerate(partition["blocks"])
            ]
        else:
            lines = [
                f"SwitchName={s['name']} Level=0 LinkSpeed=0 Nodes={compress(s['nodes'] or partition['nodes'])}"
                for s in partition.get("switches", [])
            ]
        live[partition["name"]] = "\n".join(lines)
    return live


def _step(name: str, started: float, timeline: list[dict[str, Any]], records: list[dict[str, Any]]) -> StepResult:
    return StepResult(
        step=name,
        started_at=started,
        ended_at=started + 300,
        events_sent=sum(1 for entry in timeline if entry["kind"] == "event"),
        aws_calls={"DescribeInstanceTopology": 40, "ListClusterNodes": 20, "SendCommand": 1},
        reconciles=1,
        head_node_writes=1,
        reconfigures=1,
        apply_failures=0,
        applied_sha256="a" * 64,
        desired_sha256="a" * 64,
        converged=True,
        convergence_seconds=12.0,
        audit_records=records,
        drift=0,
        alarm="OK",
        alarm_raised=False,
        live_topology={},
        nodes=0,
        timeline=timeline,
    )


def synthetic_placement(document: dict[str, Any], jobs: int) -> dict[str, Any]:
    """The simulator's placement view of the plan's partitions: ``jobs`` jobs of 3 nodes, one in each of the
    first leaves (blocks) of each partition with a topology, the other nodes powered down; the first job's name
    hostile."""
    nodes, topologies, running = [], {}, []
    for partition in document["partitions"]:
        name, units = partition["name"], leaf_units(partition)
        if units:
            kind = "block" if partition.get("blocks") else "tree"
            topologies[name] = placement.Topology(name, kind, tuple((unit, tuple(members)) for unit, members in units))
        allocated = set()
        for _unit, members in units[: jobs // 2]:
            job = placement.Job(str(len(running) + 1), name, "RUNNING", tuple(members[:3]), 3, switches=1)
            running.append(job)
            allocated |= set(job.nodes)
        for member in partition["nodes"]:
            state = ("ALLOCATED",) if member in allocated else ("IDLE", "CLOUD", "POWERED_DOWN")
            nodes.append(placement.Node(member, state, (name,)))
    facts = placement.Facts(jobs=tuple(running), nodes=tuple(nodes), topologies=topologies, now=0)
    names = {job.job_id: HOSTILE_JOB_NAME if job.job_id == "1" else f"job-{job.job_id}" for job in running}
    return view(facts, names, [partition["name"] for partition in document["partitions"]])


HOSTILE_JOB_NAME = "<img src=x onerror=alert(1)>; $(reboot)"


def synthetic_result(nodes: int) -> SimulationResult:
    """A cluster of ``nodes`` (about 80 % p5, 20 % gb200, 16 CPU nodes) created with half its p5 nodes, then
    scaled up one event per node."""
    gb200 = (nodes // 5) // ULTRASERVER * ULTRASERVER
    p5 = nodes - gb200 - 16
    first, final = _plan_document(p5 // 2, gb200), _plan_document(p5, gb200)
    triggers = [
        Trigger(
            source="aws.sagemaker",
            detail_type="SageMaker HyperPod Cluster State Change",
            event_id=f"e-{i}",
            time=START + timedelta(seconds=i),
            summary="cluster InService",
        )
        for i in range(50)
    ]

    def records(previous: dict[str, Any] | None, desired: dict[str, Any], count: int) -> list[dict[str, Any]]:
        handle = DeliveryHandle(
            channel=Channel.SSM,
            cluster="big",
            plan_sha256=desired["sha256"],
            reference="cmd",
            target="mi-1",
            sent_at=START,
        )
        delivery = PendingDelivery(handle=handle, generation=1, triggers=triggers, trigger_count=count)
        built = build_records(
            cluster_name="big",
            previous=previous,
            desired=desired,
            delivery=delivery,
            outcome=Outcome.APPLIED,
            error=None,
            completed_at=START,
        )
        return [record.document() for record in built]

    joined = [
        {
            "t": 300 + i * 0.3,
            "kind": "event",
            "text": f"SageMaker HyperPod Cluster State Change: queued; joined p5-{i:05d}",
        }
        for i in range(p5 // 2, p5)
    ]
    applied = [{"t": 620.0, "kind": "apply", "text": "head node: applied"}]
    steps = [
        _step("create", 0, [{"t": 0.0, "kind": "event", "text": "created"}, *applied], records(None, first, 1)),
        _step("scale", 300, [*joined, *applied], records(first, final, len(joined))),
    ]
    steps[-1].live_topology = _live(final)
    steps[-1].placement = synthetic_placement(final, jobs=60)
    return SimulationResult(
        scenario={
            "cluster": {"name": "big", "slurm_version": "26.05", "mode": "enforce", "channel": "ssm"},
            "steps": [],
        },
        head_node="synthetic",
        steps=steps,
        totals={
            "simulated_seconds": 600.0,
            "events_sent": len(joined) + 1,
            "reconciles": 2,
            "head_node_writes": 2,
            "reconfigures": 2,
            "apply_failures": 0,
            "audit_records": sum(len(step.audit_records) for step in steps),
            "aws_calls": {"DescribeInstanceTopology": 80},
            "converged": True,
        },
        desired=final,
        mermaid={},
    )
