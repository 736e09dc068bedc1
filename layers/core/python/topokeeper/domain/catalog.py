"""Every per-instance-type fact, in one table: whether a type reports network topology and how many layers,
whether it forms UltraServers (how many instances, SageMaker's name for the UltraServer type), its accelerators,
and whether HyperPod offers it. The planner, the Kueue objects, the emulator and scenario validation all read
``CATALOG``; adding an instance type is one entry there.

Every entry names its source. Types not listed are treated as not topology-capable (g5, g6, inf2,
c7i, m5, ...): ``DescribeInstanceTopology`` returns no network nodes for them, so a partition that
holds one is flat, as HyperPod resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

EC2_TOPOLOGY_PREREQUISITES = (
    "EC2 User Guide, 'Prerequisites for Amazon EC2 topology' (docs.aws.amazon.com/AWSEC2/latest/UserGuide/"
    "ec2-instance-topology-prerequisites.html)"
)
P6E_ULTRASERVER = (
    "SageMaker DG / EC2 UG: 'An UltraServer contains up to 18 p6e-gb200.36xlarge instances' (NVL72, 72 GPUs); "
    "HyperPod topology guide: 'BlockSizes=18 (or 17 if one node is spare)'; UltraServerInfo.Type "
    "'ml.u-p6e-gb200x72' is the SageMaker model's documented UltraServerType example"
)
TRN2U_ULTRASERVER = (
    "EC2 UG 'Amazon EC2 UltraServers': a Trn2 UltraServer connects 4 trn2u.48xlarge instances (64 Trainium2 chips) "
    "over NeuronLink; DescribeInstances: 'For Trn2u instances, a capacity block ID refers to an EC2 UltraServer'; "
    "UltraServerInfo.Type 'ml.u-trn2x64' is an assumption (undocumented)"
)
ACCELERATOR_SPECS = "EC2 accelerated-computing instance specs (accelerators per instance)"
HYPERPOD_INSTANCE_TYPES = "SageMaker ClusterInstanceType (botocore's SageMaker model) lists it with the ml. prefix"

# HyperPod (SageMaker) names an EC2 instance type with this prefix: ml.p5.48xlarge is EC2's p5.48xlarge.
HYPERPOD_PREFIX = "ml."
NVIDIA_GPU = "nvidia.com/gpu"  # the Kubernetes extended resources the device plugins advertise
AWS_NEURON = "aws.amazon.com/neuron"


class Capability(StrEnum):
    ULTRASERVER = "ultraserver"  # reports network nodes and belongs to an UltraServer (block)
    TREE = "tree"  # reports network nodes (tree)
    NONE = "none"  # no topology data (flat)


class UltraServer(NamedTuple):
    size: int  # instances per UltraServer: the block size
    type: str  # SageMaker's UltraServerInfo.Type for it


class Accelerator(NamedTuple):
    resource: str  # the Kubernetes extended resource
    per_instance: int  # a pod that asks for all of them takes one whole node


@dataclass(frozen=True)
class InstanceTypeInfo:
    """One instance type's facts. ``capability`` follows from them (no layers: none; an UltraServer: block)."""

    network_layers: int = 0  # how many NetworkNodes DescribeInstanceTopology reports; 0 for none
    ultraserver: UltraServer | None = None
    accelerator: Accelerator | None = None
    hyperpod: bool = False  # HyperPod offers it (as ml.<type>)
    source: str = ""
    # Derived once, not per read: the planner and the snapshot look types up per node.
    capability: Capability = field(init=False)
    ultraserver_size: int | None = field(init=False)

    def __post_init__(self) -> None:
        if self.ultraserver is not None and not self.network_layers:
            raise ValueError("an UltraServer type reports network layers: give network_layers")
        capability = Capability.NONE if not self.network_layers else Capability.TREE
        if self.ultraserver is not None:
            capability = Capability.ULTRASERVER
        object.__setattr__(self, "capability", capability)
        object.__setattr__(self, "ultraserver_size", self.ultraserver.size if self.ultraserver else None)


def _types(
    *names: str, layers: int = 3, accelerator: Accelerator | None = None, hyperpod: bool = False
) -> dict[str, InstanceTypeInfo]:
    """Entries for types that share their facts (one family's sizes)."""
    sources = [EC2_TOPOLOGY_PREREQUISITES]
    sources += [ACCELERATOR_SPECS] if accelerator else []
    sources += [HYPERPOD_INSTANCE_TYPES] if hyperpod else []
    info = InstanceTypeInfo(
        network_layers=layers, accelerator=accelerator, hyperpod=hyperpod, source="; ".join(sources)
    )
    return dict.fromkeys(names, info)


GPU_8 = Accelerator(NVIDIA_GPU, 8)
NEURON_16 = Accelerator(AWS_NEURON, 16)

CATALOG: dict[str, InstanceTypeInfo] = {
    **_types(
        *(
            f"g6e.{size}"
            for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")
        ),
        hyperpod=True,
    ),
    **_types(
        *(f"g7e.{size}" for size in ("2xlarge", "4xlarge", "8xlarge", "12xlarge", "24xlarge", "48xlarge")),
        hyperpod=True,
    ),
    **_types("hpc6a.48xlarge", "hpc6id.32xlarge", "hpc8a.96xlarge"),
    **_types(*(f"hpc7g.{size}" for size in ("4xlarge", "8xlarge", "16xlarge"))),
    **_types(*(f"hpc7a.{size}" for size in ("12xlarge", "24xlarge", "48xlarge", "96xlarge"))),
    **_types("p3dn.24xlarge"),
    **_types(
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        accelerator=GPU_8,
        hyperpod=True,
    ),
    **_types("trn1.2xlarge", accelerator=Accelerator(AWS_NEURON, 1)),
    **_types("trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", accelerator=NEURON_16, hyperpod=True),
    **_types("p6-b200.48xlarge", "p6-b300.48xlarge", layers=4, accelerator=GPU_8, hyperpod=True),
    "p6e-gb200.36xlarge": InstanceTypeInfo(
        network_layers=3,
        ultraserver=UltraServer(size=18, type="ml.u-p6e-gb200x72"),
        accelerator=Accelerator(NVIDIA_GPU, per_instance=4),
        hyperpod=True,
        source=f"{EC2_TOPOLOGY_PREREQUISITES}; {P6E_ULTRASERVER}; {ACCELERATOR_SPECS}; {HYPERPOD_INSTANCE_TYPES}",
    ),
    "trn2u.48xlarge": InstanceTypeInfo(
        network_layers=3,
        ultraserver=UltraServer(size=4, type="ml.u-trn2x64"),
        accelerator=NEURON_16,
        hyperpod=False,  # not in SageMaker's ClusterInstanceType
        source=f"{EC2_TOPOLOGY_PREREQUISITES}; {TRN2U_ULTRASERVER}; {ACCELERATOR_SPECS}",
    ),
}

NOT_CAPABLE = InstanceTypeInfo(source=f"not listed in {EC2_TOPOLOGY_PREREQUISITES}")


def ec2_instance_type(instance_type: str) -> str:
    """HyperPod types carry an ``ml.`` prefix that EC2 types do not (``ml.p5.48xlarge`` is ``p5.48xlarge``)."""
    return instance_type.removeprefix(HYPERPOD_PREFIX)


def hyperpod_instance_type(instance_type: str) -> str:
    """The SageMaker name of an EC2 instance type (``p5.48xlarge`` is ``ml.p5.48xlarge``)."""
    return HYPERPOD_PREFIX + ec2_instance_type(instance_type)


def lookup(instance_type: str) -> InstanceTypeInfo:
    return CATALOG.get(ec2_instance_type(instance_type), NOT_CAPABLE)


def hyperpod_offers(instance_type: str) -> bool:
    """Whether the catalog says HyperPod takes this SageMaker name (``ml.`` and a type it offers). Types the catalog
    does not list may still be HyperPod's: botocore's ClusterInstanceType enum lists them all."""
    return instance_type.startswith(HYPERPOD_PREFIX) and lookup(instance_type).hyperpod
