"""The scenario's cluster in the emulator: a HyperPod (Slurm) cluster created through the SageMaker API, and the
partitions HyperPod writes into the head node's slurm.conf. (A ParallelCluster world's cluster is
``topokeeper.sim.parallelcluster``.)"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Protocol

from topokeeper.adapters.aws import client
from topokeeper.domain.catalog import ec2_instance_type
from topokeeper.sim.aws.emulator import AwsEmulator
from topokeeper.sim.aws.network import NetworkLayout
from topokeeper.sim.scenario import ClusterSpec

_NODE_TYPES = {"controller": "Controller", "login": "Login", "compute": "Compute"}


class ClusterMember(Protocol):
    """A running node as the world follows it: a HyperPod node, or a ParallelCluster instance and its node."""

    @property
    def instance_id(self) -> str: ...

    @property
    def slurm_name(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def instance_type(self) -> str: ...

    @property
    def launch_time(self) -> datetime: ...

    @property
    def replaces(self) -> str | None: ...


def set_network_layouts(emulator: AwsEmulator, spec: ClusterSpec) -> None:
    """Each group's EC2 topology follows its network layout."""
    for group in spec.instance_groups:
        layout = group.network
        emulator.network.layouts[ec2_instance_type(group.type)] = NetworkLayout(
            nodes_per_leaf=layout.nodes_per_leaf,
            leaves_per_spine=layout.leaves_per_spine,
            ultraserver_size=layout.ultraserver_size,
        )


def create_hyperpod_cluster(emulator: AwsEmulator, spec: ClusterSpec) -> None:
    """CreateCluster with the scenario's instance groups; each group's EC2 topology follows its network layout."""
    groups = []
    eks = spec.orchestrator == "eks"
    for group in spec.instance_groups:
        slurm: dict[str, Any] = {"NodeType": _NODE_TYPES[group.role]}
        if group.partition:
            slurm["PartitionNames"] = [group.partition]
        groups.append(
            {
                "InstanceGroupName": group.name,
                "InstanceType": group.type,
                "InstanceCount": group.count,
                "ExecutionRole": f"arn:aws:iam::{emulator.account_id}:role/HyperPodExecution",
                "LifeCycleConfig": {"SourceS3Uri": f"s3://{_lifecycle_bucket(spec)}/src/", "OnCreate": "on_create.sh"},
                **({} if eks or spec.legacy else {"SlurmConfig": slurm}),
            }
        )
    set_network_layouts(emulator, spec)
    eks_arn = f"arn:aws:eks:{emulator.region}:{emulator.account_id}:cluster/{spec.name}"
    orchestrator = {"Eks": {"ClusterArn": eks_arn}} if eks else {"Slurm": {"SlurmConfigStrategy": "Merge"}}
    if spec.legacy:
        _provisioning_parameters(emulator, spec)
        client("sagemaker").create_cluster(ClusterName=spec.name, InstanceGroups=groups)
        return
    client("sagemaker").create_cluster(ClusterName=spec.name, InstanceGroups=groups, Orchestrator=orchestrator)


def _lifecycle_bucket(spec: ClusterSpec) -> str:
    return f"sagemaker-{spec.name}-lcs"  # HyperPod requires its lifecycle buckets to be named sagemaker-*


def _provisioning_parameters(emulator: AwsEmulator, spec: ClusterSpec) -> None:
    """A legacy cluster's provisioning_parameters.json, as the operator uploaded it with the lifecycle scripts,
    and the partitions those scripts write into slurm.conf from it."""
    mapping = {g.name: g.partition for g in spec.instance_groups if g.partition}
    parameters: dict[str, Any] = {
        "version": "1.0.0",
        "workload_manager": "slurm",
        "controller_group": next(g.name for g in spec.instance_groups if g.role == "controller"),
        "worker_groups": [{"instance_group_name": g, "partition_name": p} for g, p in mapping.items()],
    }
    login = [g.name for g in spec.instance_groups if g.role == "login"]
    if login:
        parameters["login_group"] = login[0]
    s3 = client("s3")
    s3.create_bucket(Bucket=_lifecycle_bucket(spec))
    s3.put_object(
        Bucket=_lifecycle_bucket(spec), Key="src/provisioning_parameters.json", Body=json.dumps(parameters).encode()
    )
    emulator.hyperpod.lifecycle_partitions[spec.name] = mapping


def slurm_partitions(emulator: AwsEmulator, spec: ClusterSpec) -> dict[str, list[str]]:
    """Partition -> Slurm node names of the cluster's present nodes (what HyperPod puts in slurm.conf)."""
    by_group = {g.name: g.partition for g in spec.instance_groups if g.partition}
    partitions: dict[str, list[str]] = {p: [] for p in by_group.values() if p}
    for partition, nodes in emulator.hyperpod.slurm_members(spec.name).items():
        partitions.setdefault(partition, []).extend(node.slurm_name for node in nodes)
    return partitions
