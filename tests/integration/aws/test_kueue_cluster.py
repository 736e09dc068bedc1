"""`topokeeper labels/kueue --cluster` read an EKS-orchestrated HyperPod cluster from the emulator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.aws.support import cluster_request, group
from tests.unit.kueue.kueue_api import api_errors
from topokeeper.adapters.aws import clear_clients
from topokeeper.cli.main import main
from topokeeper.sim.aws.clock import SystemClock
from topokeeper.sim.aws_emulator import AwsEmulator


@pytest.fixture
def aws() -> Iterator[AwsEmulator]:
    """Real time: the CLI paces DescribeInstanceTopology (1 per second) on the wall clock."""
    with AwsEmulator(seed=7, clock=SystemClock()) as emulator:
        yield emulator


def eks_group(name: str, instance_type: str, count: int) -> dict[str, object]:
    without_slurm = group(name, instance_type, count)
    del without_slurm["SlurmConfig"]
    return without_slurm


@pytest.fixture
def eks_cluster(aws: AwsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    request = cluster_request("eks-train")
    request["InstanceGroups"] = [
        eks_group("p5", "ml.p5.48xlarge", 120),
        eks_group("gb200", "ml.p6e-gb200.36xlarge", 18),
    ]
    request["Orchestrator"] = {"Eks": {"ClusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/eks-train"}}
    aws.client("sagemaker").create_cluster(**request)
    for name, value in aws.env().items():
        monkeypatch.setenv(name, value)
    clear_clients()  # the CLI's cached clients must reach this emulator
    aws.reset_counters()
    yield "eks-train"
    clear_clients()


def test_labels_from_a_live_eks_cluster_use_list_calls_only(
    aws: AwsEmulator, eks_cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["labels", "--cluster", eks_cluster, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["nodes"] == 138
    assert document["warnings"] == []
    assert [len(server["nodes"]) for server in document["ultraservers"]] == [18]
    # Listing pages of 100; topology in batches of 100 ids, answered in pages of 20 (EC2's documented default
    # when ids are given, plus any throttled call the 1/s bucket answers): a call per page, never one per node.
    assert aws.calls["DescribeClusterNode"] == 0
    assert aws.calls["ListClusterNodes"] == 2
    assert aws.calls["DescribeInstanceTopology"] < 138 // 5


def test_kueue_from_a_live_eks_cluster(eks_cluster: str, tmp_path: Path) -> None:
    assert main(["kueue", "--cluster", eks_cluster, "--out", str(tmp_path)]) == 0
    documents = list(yaml.safe_load_all((tmp_path / "kueue-topology.yaml").read_text()))
    assert {
        d["metadata"]["name"]: d["spec"].get("topologyName") for d in documents if d["kind"] == "ResourceFlavor"
    } == {
        "ml-p5-48xlarge": "aws-3-layer-network",
        "ml-p6e-gb200-36xlarge": "aws-ultraserver",
    }
    assert all(api_errors(document) == [] for document in documents)
