"""Which EC2 instance types report network topology, and which form UltraServers.

Every entry names its source. Types not listed are treated as not topology-capable (g5, g6, inf2,
c7i, m5, ...): ``DescribeInstanceTopology`` returns no network nodes for them, so a partition that
holds one is flat, as HyperPod resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

EC2_TOPOLOGY_PREREQUISITES = (
    "EC2 User Guide, 'Prerequisites for Amazon EC2 topology' (docs.aws.amazon.com/AWSEC2/latest/UserGuide/"
    "ec2-instance-topology-prerequisites.html)"
)
P6E_ULTRASERVER = (
    "SageMaker DG / EC2 UG: 'An UltraServer contains up to 18 p6e-gb200.36xlarge instances' (NVL72, 72 GPUs); "
    "HyperPod topology guide: 'BlockSizes=18 (or 17 if one node is spare)'"
)
TRN2U_ULTRASERVER = (
    "EC2 UG 'Amazon EC2 UltraServers': a Trn2 UltraServer connects 4 trn2u.48xlarge instances (64 Trainium2 chips) "
    "over NeuronLink; DescribeInstances: 'For Trn2u instances, a capacity block ID refers to an EC2 UltraServer'"
)


class Capability(StrEnum):
    ULTRASERVER = "ultraserver"  # reports network nodes and belongs to an UltraServer (block)
    TREE = "tree"  # reports network nodes (tree)
    NONE = "none"  # no topology data (flat)


@dataclass(frozen=True)
class InstanceTypeInfo:
    capability: Capability
    network_layers: int = 0
    ultraserver_size: int | None = None
    source: str = ""


def _tree(layers: int, *types: str) -> dict[str, InstanceTypeInfo]:
    return {name: InstanceTypeInfo(Capability.TREE, layers, None, EC2_TOPOLOGY_PREREQUISITES) for name in types}


CATALOG: dict[str, InstanceTypeInfo] = {
    **_tree(
        3,
        *(
            f"g6e.{size}"
            for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")
        ),
    ),
    **_tree(3, *(f"g7e.{size}" for size in ("2xlarge", "4xlarge", "8xlarge", "12xlarge", "24xlarge", "48xlarge"))),
    **_tree(3, "hpc6a.48xlarge", "hpc6id.32xlarge", "hpc8a.96xlarge"),
    **_tree(3, *(f"hpc7g.{size}" for size in ("4xlarge", "8xlarge", "16xlarge"))),
    **_tree(3, *(f"hpc7a.{size}" for size in ("12xlarge", "24xlarge", "48xlarge", "96xlarge"))),
    **_tree(3, "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"),
    **_tree(3, "trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge"),
    **_tree(4, "p6-b200.48xlarge", "p6-b300.48xlarge"),
    "p6e-gb200.36xlarge": InstanceTypeInfo(
        Capability.ULTRASERVER, 3, 18, f"{EC2_TOPOLOGY_PREREQUISITES}; {P6E_ULTRASERVER}"
    ),
    "trn2u.48xlarge": InstanceTypeInfo(
        Capability.ULTRASERVER, 3, 4, f"{EC2_TOPOLOGY_PREREQUISITES}; {TRN2U_ULTRASERVER}"
    ),
}

NOT_CAPABLE = InstanceTypeInfo(Capability.NONE, 0, None, f"not listed in {EC2_TOPOLOGY_PREREQUISITES}")


def ec2_instance_type(instance_type: str) -> str:
    """HyperPod types carry an ``ml.`` prefix that EC2 types do not (``ml.p5.48xlarge`` is ``p5.48xlarge``)."""
    return instance_type.removeprefix("ml.")


def lookup(instance_type: str) -> InstanceTypeInfo:
    return CATALOG.get(ec2_instance_type(instance_type), NOT_CAPABLE)
