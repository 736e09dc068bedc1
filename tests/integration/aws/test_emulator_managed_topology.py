"""The emulated HyperPod managing the Slurm topology itself: the documented per-partition rules, its own delay,
one write per burst of changes, a CloudTrail UpdatePartitionTopology record per changed partition, and the
emulated bug that puts a node under the wrong leaf."""

from __future__ import annotations

from collections.abc import Callable

from tests.integration.aws.support import cluster_request, group
from topokeeper.domain.models import SlurmFormat
from topokeeper.sim.aws.hyperpod.managed_topology import ManagedFiles
from topokeeper.sim.aws_emulator import AwsEmulator

RECORD = "AWS Service Event via CloudTrail"


class HeadNode:
    def __init__(self) -> None:
        self.written: list[ManagedFiles] = []

    def write_managed_topology(self, files: ManagedFiles) -> None:
        self.written.append(files)


class Agenda:
    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None]]] = []

    def schedule(self, seconds: float, action: Callable[[], None]) -> None:
        self.due.append((seconds, action))

    def run(self) -> list[float]:
        delays = [seconds for seconds, _ in self.due]
        due, self.due = self.due, []
        for _, action in due:
            action()
        return delays


def _cluster(aws: AwsEmulator) -> str:
    request = cluster_request(
        "managed",
        group("p5", "ml.p5.48xlarge", 8, partition="ml-p5"),
        group("gb200", "ml.p6e-gb200.36xlarge", 18, partition="ml-p6e"),
        group("mixed-p5", "ml.p5.48xlarge", 2, partition="mixed"),
        group("mixed-gb", "ml.p6e-gb200.36xlarge", 2, partition="mixed"),
        group("cpu", "ml.c7i.4xlarge", 2, partition="cpu"),
    )
    aws.client("sagemaker").create_cluster(**request)
    return "managed"


def _records(aws: AwsEmulator) -> list[dict]:
    return [e["detail"] for e in aws.events.emitted(RECORD) if e["detail"]["eventName"] == "UpdatePartitionTopology"]


def test_hyperpod_writes_the_documented_per_partition_topology_after_its_delay(aws: AwsEmulator) -> None:
    cluster = _cluster(aws)
    head, agenda = HeadNode(), Agenda()
    aws.hyperpod.managed_topology.enable(cluster, head, SlurmFormat.YAML, agenda.schedule, 90)
    assert head.written == [] and _records(aws) == []  # nothing before its own delay
    assert agenda.run() == [90]
    (files,) = head.written
    assert files.file_name == "topology.yaml"
    # all UltraServer -> block, all capable -> tree, a mix -> tree, a type without topology -> no assignment
    assert files.assignments == {"ml-p5": "tree", "ml-p6e": "block", "mixed": "tree", "cpu": None}
    assert "- topology: default\n  cluster_default: true\n  flat: true\n" in files.text
    assert "      - 18\n" in files.text and "- block: us1\n" in files.text
    assert "switch: nn-" in files.text
    details = {r["serviceEventDetails"]["partitionName"]: r["serviceEventDetails"] for r in _records(aws)}
    assert {p: (d["topologyPlugin"], d["nodeCount"], d["previousSha256"]) for p, d in details.items()} == {
        "ml-p5": ("topology/tree", 8, None),
        "ml-p6e": ("topology/block", 18, None),
        "mixed": ("topology/tree", 4, None),
        "cpu": ("topology/flat", 2, None),
    }
    assert {r["eventType"] for r in _records(aws)} == {"AwsServiceEvent"}

    # A burst of changes: one write after the delay, and a record only for the partition that changed.
    aws.hyperpod.scale(cluster, "p5", 9)
    aws.hyperpod.scale(cluster, "p5", 10)
    assert agenda.run() == [90]
    changed = _records(aws)[4:]
    assert [(r["serviceEventDetails"]["partitionName"], r["serviceEventDetails"]["nodeCount"]) for r in changed] == [
        ("ml-p5", 10)
    ]
    assert changed[0]["serviceEventDetails"]["previousSha256"] == details["ml-p5"]["newSha256"]


def test_slurm_24_gets_one_cluster_wide_topology(aws: AwsEmulator) -> None:
    cluster = _cluster(aws)
    head, agenda = HeadNode(), Agenda()
    aws.hyperpod.managed_topology.enable(cluster, head, SlurmFormat.CONF, agenda.schedule, 0)
    agenda.run()
    (files,) = head.written
    assert (files.file_name, files.plugin, files.assignments) == ("topology.conf", "topology/tree", {})
    lines = files.text.splitlines()
    # Two fabrics and the nodes without topology under one root (an assumption, labelled in the module).
    root = next(line for line in lines if line.startswith("SwitchName=root "))
    assert root.count("nn-") == 3 and "nn-none" in root
    assert any(line.startswith("SwitchName=nn-none Nodes=") for line in lines)


def test_the_emulated_bug_puts_a_node_under_another_leaf(aws: AwsEmulator) -> None:
    cluster = _cluster(aws)
    head, agenda = HeadNode(), Agenda()
    aws.hyperpod.managed_topology.enable(cluster, head, SlurmFormat.YAML, agenda.schedule, 30)
    agenda.run()
    node = min(aws.hyperpod.nodes(cluster, "p5"), key=lambda n: n.slurm_name)
    aws.hyperpod.managed_topology.misplace(cluster, [node.instance_id])
    agenda.run()
    before, after = (_leaf_of(files.text, node.slurm_name) for files in head.written)
    assert before != after and after.startswith("nn-")
    assert [r["serviceEventDetails"]["partitionName"] for r in _records(aws)][-1] == "ml-p5"


def _leaf_of(text: str, node: str) -> str:
    switch = ""
    for line in text.splitlines():
        if line.strip().startswith("- switch: "):
            switch = line.split(": ", 1)[1]
        elif line.strip().startswith("nodes: ") and node in line.split(": ", 1)[1].split(","):
            return switch
    return ""
