"""Builders for facts in unit tests: small, explicit, and deterministic."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from topokeeper.contract.event_schemas import TopokeeperEvent
from topokeeper.contract.head_node_program import PROGRAM_NAME, write_program
from topokeeper.contract.ports import Metric
from topokeeper.domain.models import ClusterSnapshot, Node, Partition, PartitionSettings, SlurmVersion


@functools.cache
def head_node_program() -> Path:
    """The built head-node program (topokeeper-head-node.pyz), written once per test run: the file every channel
    ships, so the tests that run the applier as a process run it."""
    directory = Path(tempfile.mkdtemp(prefix="topokeeper-program-"))
    atexit.register(shutil.rmtree, directory, True)
    return write_program(directory / PROGRAM_NAME)


# The applier's result document contract (docs/reference.md "The applier"): every document carries every key.
APPLIER_RESULT_KEYS = frozenset(
    {
        "outcome",
        "mode",
        "plan_sha256",
        "before_sha256",
        "after_sha256",
        "partitions_changed",
        "reconfigured",
        "reconfigure_exit_code",
        "readback",
        "partition_topologies",
        "drift",
        "grouping_drift",
        "diff",
        "slurm_version",
        "slurm_format",
        "config_dir",
        "scontrol",
        "duration_seconds",
        "error",
        "applier_version",
        "signature",
        "generation",
        "managed_by",
        "powered_down",
        "nodes_placed_before",
        "deferred",
        "full_result",
    }
)


class RecordingMetrics:
    """The Metrics port, keeping every point as (cluster, metric name, value)."""

    def __init__(self) -> None:
        self.points: list[tuple[str, str, float]] = []

    def emit(self, cluster: str, metric: Metric, value: float, partition: str | None = None) -> None:
        self.points.append((cluster, metric.value, value))


def instance_id(seed: str) -> str:
    return "i-0" + hashlib.sha256(seed.encode()).hexdigest()[:16]


def node(
    name: str,
    instance_type: str = "p5.48xlarge",
    path: tuple[str, ...] = (),
    ultraserver: str | None = None,
    partition: str = "gpu",
    status: str = "Running",
) -> Node:
    return Node(
        name=name,
        instance_id=instance_id(name),
        instance_type=instance_type,
        instance_group=partition,
        partition=partition,
        status=status,
        network_nodes=path,
        ultraserver_id=ultraserver,
    )


def p5_nodes(count: int, per_leaf: int = 4, prefix: str = "p5-", partition: str = "gpu") -> list[Node]:
    """``count`` p5 nodes, ``per_leaf`` to a leaf, two leaves to an aggregation switch, one spine."""
    return [
        node(
            f"{prefix}{i:03d}",
            path=("nn-spine0", f"nn-agg{i // (per_leaf * 2)}", f"nn-leaf{i // per_leaf:03d}"),
            partition=partition,
        )
        for i in range(1, count + 1)
    ]


def gb200_nodes(ultraservers: int, size: int = 18, prefix: str = "gb-", partition: str = "gb") -> list[Node]:
    return [
        node(
            f"{prefix}{u * size + i + 1:03d}",
            instance_type="p6e-gb200.36xlarge",
            path=("nn-gbspine", f"nn-gbagg{u}", f"nn-gbleaf{u}"),
            ultraserver=f"us-{u:04d}",
            partition=partition,
        )
        for u in range(ultraservers)
        for i in range(size)
    ]


def snapshot(
    partitions: dict[str, list[Node]],
    version: str = "26.05",
    settings: dict[str, PartitionSettings] | None = None,
) -> ClusterSnapshot:
    settings = settings or {}
    return ClusterSnapshot(
        cluster_name="test-cluster",
        cluster_arn="arn:aws:sagemaker:us-east-1:111122223333:cluster/abcdefabcdef",
        slurm_version=SlurmVersion.parse(version),
        partitions=tuple(
            Partition(name=name, nodes=tuple(nodes), settings=settings.get(name, PartitionSettings()))
            for name, nodes in sorted(partitions.items())
        ),
    )


def event_envelope(source: str, detail_type: str, detail: dict[str, object], event_id: str = "r-1") -> TopokeeperEvent:
    """An EventBridge event as the functions receive it, around ``detail``."""
    return TopokeeperEvent.model_validate(
        {
            "version": "0",
            "id": event_id,
            "detail-type": detail_type,
            "source": source,
            "account": "111122223333",
            "time": "2026-01-05T09:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": detail,
        }
    )


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def powered_down_pcluster() -> dict[str, object]:
    """examples/pcluster-p5-cluster.json with 8 more powered-down dynamic nodes: q1's no-topology placeholder
    (q1-dy-p5-[3-12], 10 nodes) outnumbers its real leaves (at most 4)."""
    example = json.loads((EXAMPLES / "pcluster-p5-cluster.json").read_text())
    example["slurm"]["nodes"] += [
        {"name": f"q1-dy-p5-{n}", "address": f"q1-dy-p5-{n}", "hostname": f"q1-dy-p5-{n}", "partitions": ["q1"]}
        for n in range(5, 13)
    ]
    return dict(example)
