"""The canonical facts (Node, Partition, ClusterSnapshot) and the planned topologies.

Inputs are strict: every name that can reach a Slurm file is validated here, so the engine and the
renderers only ever see safe values.
"""

from __future__ import annotations

import functools
import re
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from topokeeper.contract.constants import INSTANCE_ID, INSTANCE_ID_PATTERN
from topokeeper.domain.catalog import ec2_instance_type
from topokeeper.domain.names import SlurmName, all_plain_slurm_names, each_line_matches, is_plain_slurm_name
from topokeeper.wire import format_for_version

PLAN_SCHEMA = "topokeeper.plan/1"
FLAT_DEFAULT = "flat-default"
ROOT_SWITCH = "root"
NO_TOPOLOGY_SWITCH = "no-topology"
NO_ULTRASERVER_BLOCK = "no-ultraserver"
# Where nodes with no known place are put: no job placed in one is placed near each other.
PLACEHOLDER_UNITS = frozenset({NO_TOPOLOGY_SWITCH, NO_ULTRASERVER_BLOCK})
MAX_NETWORK_LAYERS = 4
MAX_BLOCK_LEVELS = 16  # Slurm rejects block_level > 15
# Slurm's block plugin keeps the base block size in 16 bits (bblock_node_cnt) and parses each size with atoi: a
# base up to 65,535 with levels up to base x 2^15 stays below 2^31.
MAX_BLOCK_BASE = 65_535

_INSTANCE_TYPE = re.compile(r"[a-z0-9-]+\.[a-z0-9-]+")
_SLURM_VERSION = re.compile(r"(\d{2})\.(\d{2})(?:\.\d+)?")
_CLUSTER_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
# Node states in which slurmctld still lists the node; the others are gone or going.
PRESENT_STATUSES = frozenset({"Running", "Pending", "SystemUpdating", "DeepHealthCheckInProgress"})


def _instance_id(value: str) -> str:
    if not INSTANCE_ID.fullmatch(value):
        raise ValueError(f"not an EC2 instance id (i- and 8 or 17 hex digits): {value!r}")
    return value


def _instance_type(value: str) -> str:
    value = ec2_instance_type(value)
    if not _INSTANCE_TYPE.fullmatch(value):
        raise ValueError(f"not an instance type: {value!r}")
    return value


def _cluster_name(value: str) -> str:
    if not _CLUSTER_NAME.fullmatch(value):
        raise ValueError(f"not a HyperPod cluster name: {value!r}")
    return value


InstanceId = Annotated[str, AfterValidator(_instance_id)]
InstanceType = Annotated[str, AfterValidator(_instance_type)]
ClusterName = Annotated[str, AfterValidator(_cluster_name)]


_Model = TypeVar("_Model", bound=BaseModel)


# Default factories for pydantic fields, in place of the builtins ``list`` and ``dict``: pydantic reads every
# factory's signature when it builds a model, which for a builtin means parsing its text signature (~0.2 ms each
# under Python 3.14, some 30 fields on a function's cold start); a plain function's is read from its code.
def empty_list() -> list[Any]:
    return []


def empty_dict() -> dict[Any, Any]:
    return {}


def assemble(cls: type[_Model], values: dict[str, Any]) -> _Model:
    """``cls.model_construct(**values)`` for values that set every field and already meet the model's rules (taken
    from validated models, or passed a stricter test); it keeps ``values`` as the model's own dict. What
    model_construct ends with, without its per-field alias and default lookups: 4x faster, and a plan of 100,000
    nodes builds that many objects."""
    if values.keys() != cls.__pydantic_fields__.keys():
        raise TypeError(f"{cls.__name__} needs every field: {sorted(cls.__pydantic_fields__)}")
    return _assembled(cls, values)


def _assembled(cls: type[_Model], values: dict[str, Any]) -> _Model:
    model = cls.__new__(cls)
    _set(model, "__dict__", values)
    # Every field is set, so every such model has the same fields set: one, shared (a 9-field set is 0.7 kB a
    # node). Safe for frozen models, which never change theirs; copying a model copies it.
    _set(model, "__pydantic_fields_set__", _all_fields(cls))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


_set = object.__setattr__


@functools.cache
def _all_fields(cls: type[BaseModel]) -> set[str]:
    if not cls.model_config.get("frozen"):
        raise TypeError(f"{cls.__name__} is not frozen: its fields set cannot be shared")
    return set(cls.__pydantic_fields__)


class TopologyKind(StrEnum):
    TREE = "tree"
    BLOCK = "block"
    FLAT = "flat"


class SlurmFormat(StrEnum):
    YAML = "topology.yaml"  # Slurm >= 25.05: one named topology per partition
    CONF = "topology.conf"  # Slurm < 25.05: one cluster-wide topology


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SlurmVersion(_Frozen):
    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        match = _SLURM_VERSION.fullmatch(text.strip())
        if not match:
            raise ValueError(f"not a Slurm version like 25.11: {text!r}")
        return cls(major=int(match.group(1)), minor=int(match.group(2)))

    @property
    def format(self) -> SlurmFormat:
        return SlurmFormat(format_for_version((self.major, self.minor)))

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}"


class SlurmNodeRecord(BaseModel):
    """One item of ``scontrol show nodes --json``'s ``nodes``: what binds a Slurm node to an instance.

    The snapshot reads it, and the cluster state (``topokeeper.contract.ports``) keeps it: it lives here so that ingest,
    which never plans, does not load the engine for it."""

    # Frozen: the state store shares one table's records between the states it reads (topokeeper.adapters.dynamodb).
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    name: str
    address: str | None = None  # NodeAddr: the private IP once bound; the node's own name while powered down
    hostname: str | None = None
    partitions: list[str] = Field(default_factory=empty_list)


class Node(_Frozen):
    """One cluster instance as Slurm and AWS both see it; or a Slurm node with no instance behind it (no
    id, no type: a powered-down ParallelCluster dynamic node), which is still written, without topology."""

    name: SlurmName
    instance_id: InstanceId | None = None
    instance_type: InstanceType | None = None
    instance_group: str | None = None
    partition: SlurmName | None = None
    status: str = "Running"
    network_nodes: tuple[SlurmName, ...] = Field(default=(), max_length=MAX_NETWORK_LAYERS)
    ultraserver_id: SlurmName | None = None
    availability_zone: str | None = None

    @property
    def present(self) -> bool:
        return self.status in PRESENT_STATUSES

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Node:
        """``Node.model_validate(fields)`` for a dict of every field: assembled directly when each value passes a
        test stricter than the model's (the usual case), else validated, so a bad value fails exactly as before.
        The dict becomes the node's own: build it for this call."""
        if fields.keys() != cls.__pydantic_fields__.keys():
            return cls.model_validate(fields)
        instance_id, instance_type = fields["instance_id"], fields["instance_type"]
        partition, ultraserver_id = fields["partition"], fields["ultraserver_id"]
        try:
            plain_type = instance_type is None or (type(instance_type) is str and _plain_instance_type(instance_type))
            plain = (
                plain_type
                and is_plain_slurm_name(fields["name"])
                and (instance_id is None or (type(instance_id) is str and INSTANCE_ID.fullmatch(instance_id)))
                and type(fields["instance_group"]) in _TEXT
                and (partition is None or _plain_name(partition))
                and type(fields["status"]) is str
                and type(fields["network_nodes"]) is tuple
                and _plain_network_nodes(fields["network_nodes"])
                and (ultraserver_id is None or _plain_name(ultraserver_id))
                and type(fields["availability_zone"]) in _TEXT
            )
        except TypeError:  # an unhashable value, not for these caches: the model says what it is
            plain = False
        if not plain:
            return cls.model_validate(fields)
        if instance_type is not None:
            fields["instance_type"] = ec2_instance_type(instance_type)
        return _assembled(cls, fields)

    @classmethod
    def from_plain_rows(cls, rows: list[dict[str, Any]]) -> list[Node] | None:
        """``[Node.from_fields(fields) for fields in rows]`` when every value of every row passes from_fields'
        stricter test, checked a field at a time (one regex over all names, each repeated value once); None
        when one does not (the rows are left as they were): build them one by one, for the errors."""
        try:
            plain, instance_types = _plain_rows(cls, rows)
        except TypeError:  # an unhashable value, where values are counted: the model says what it is
            return None
        if not plain:
            return None
        nodes = []
        for fields in rows:
            if fields["instance_type"] is not None:
                fields["instance_type"] = instance_types[fields["instance_type"]]
            nodes.append(_assembled(cls, fields))
        return nodes


def _plain_rows(cls: type[Node], rows: list[dict[str, Any]]) -> tuple[bool, dict[str, str]]:
    """Whether each row passes Node.from_fields' test, and the EC2 name of each instance type."""
    keys = cls.__pydantic_fields__.keys()
    if any(fields.keys() != keys for fields in rows):
        return False, {}
    column = {key: [fields[key] for fields in rows] for key in keys}
    instance_ids = [value for value in column["instance_id"] if value is not None]
    instance_types = {value for value in column["instance_type"] if value is not None}
    repeated_names = {value for key in ("partition", "ultraserver_id") for value in column[key] if value is not None}
    network_nodes = set(column["network_nodes"])
    plain = (
        all_plain_slurm_names(column["name"])
        and each_line_matches(_INSTANCE_ID_LINES, instance_ids)
        and all(type(value) is str and _plain_instance_type(value) for value in instance_types)
        and {*map(type, column["instance_group"])} <= _TEXT
        and all(map(_plain_name, repeated_names))
        and {*map(type, column["status"])} <= _STR
        and {*map(type, network_nodes)} <= {tuple}
        and all(map(_plain_network_nodes, network_nodes))
        and {*map(type, column["availability_zone"])} <= _TEXT
    )
    return plain, {value: ec2_instance_type(value) for value in instance_types} if plain else {}


_INSTANCE_ID_LINES = re.compile(rf"(?:{INSTANCE_ID_PATTERN}\n)*")

# Values that repeat across a cluster's nodes (a partition, a leaf's network nodes, an UltraServer, a type) are
# checked once each.
_plain_name = functools.lru_cache(maxsize=4096, typed=True)(is_plain_slurm_name)


def _plain_network_nodes(names: tuple[object, ...]) -> bool:
    return len(names) <= MAX_NETWORK_LAYERS and {*map(type, names)} <= _STR and _plain_names(names)


@functools.lru_cache(maxsize=16_384)
def _plain_names(names: tuple[str, ...]) -> bool:
    return all(map(is_plain_slurm_name, names))


@functools.lru_cache(maxsize=1024, typed=True)
def _plain_instance_type(value: str) -> bool:
    return _INSTANCE_TYPE.fullmatch(ec2_instance_type(value)) is not None


_TEXT = frozenset({str, type(None)})  # the types a ``str | None`` field takes unchanged
_STR = frozenset({str})


class PartitionSettings(_Frozen):
    """A per-partition override from the config file."""

    kind: Literal["auto", "tree", "block", "flat"] = "auto"
    block_sizes: tuple[int, ...] | None = None
    instance_groups: tuple[str, ...] = ()

    @field_validator("block_sizes")
    @classmethod
    def _valid_block_sizes(cls, sizes: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if sizes is not None:
            check_block_sizes(sizes)
        return sizes


class PlannerConfig(_Frozen):
    """The optional config file: ``partitions: {NAME: {kind, block_sizes, instance_groups}}``."""

    partitions: dict[SlurmName, PartitionSettings] = Field(default_factory=empty_dict)


def check_block_sizes(sizes: tuple[int, ...]) -> None:
    """Slurm's rule: a base size, then each level a power-of-two multiple larger than the one before."""
    if not sizes:
        raise ValueError("block_sizes must not be empty")
    if len(sizes) > MAX_BLOCK_LEVELS:
        raise ValueError(f"block_sizes has {len(sizes)} levels; Slurm allows {MAX_BLOCK_LEVELS}")
    base = sizes[0]
    if not 1 <= base <= MAX_BLOCK_BASE:
        raise ValueError(
            f"block_sizes base {base}: must be positive and at most {MAX_BLOCK_BASE} (Slurm keeps it in 16 bits)"
        )
    previous = 0
    for size in sizes:
        ratio, remainder = divmod(size, base)
        if remainder or ratio & (ratio - 1) or size <= previous:
            raise ValueError(f"block_sizes {list(sizes)}: {size} is not base x 2^k larger than {previous or 'nothing'}")
        if ratio > 2 ** (MAX_BLOCK_LEVELS - 1):
            top = MAX_BLOCK_LEVELS - 1
            raise ValueError(f"block_sizes {list(sizes)}: {size} is past base x 2^{top}, the top level Slurm takes")
        previous = size


class Partition(_Frozen):
    name: SlurmName
    nodes: tuple[Node, ...]
    settings: PartitionSettings = PartitionSettings()
    instance_types: tuple[InstanceType, ...] = ()  # from the instance groups, known even with no node up


class ClusterSnapshot(_Frozen):
    """Everything the planner needs, already joined: no AWS shapes past this point."""

    cluster_name: ClusterName
    cluster_arn: str | None = None
    slurm_version: SlurmVersion
    partitions: tuple[Partition, ...]
    warnings: tuple[str, ...] = ()
    # NodeName -> NodeAddr of each planned node named from the head node's node table (ParallelCluster);
    # empty when nodes are named by host name. The bundle carries them so the applier can tell a stale plan.
    bindings: dict[SlurmName, str] = Field(default_factory=empty_dict)


class Switch(_Frozen):
    name: SlurmName
    switches: tuple[SlurmName, ...] = ()
    nodes: tuple[SlurmName, ...] = ()


class Block(_Frozen):
    name: SlurmName
    nodes: tuple[SlurmName, ...]


class TreeTopology(_Frozen):
    kind: Literal[TopologyKind.TREE] = TopologyKind.TREE
    name: SlurmName
    switches: tuple[Switch, ...]


class BlockTopology(_Frozen):
    kind: Literal[TopologyKind.BLOCK] = TopologyKind.BLOCK
    name: SlurmName
    block_sizes: tuple[int, ...]
    blocks: tuple[Block, ...]


class FlatTopology(_Frozen):
    kind: Literal[TopologyKind.FLAT] = TopologyKind.FLAT
    name: SlurmName


Topology = Annotated[TreeTopology | BlockTopology | FlatTopology, Field(discriminator="kind")]


class PartitionPlan(_Frozen):
    partition: SlurmName
    kind: TopologyKind
    topology: Topology
    assignment: SlurmName | None  # the partition's Topology= value; None for flat (inherits cluster_default)
    nodes: tuple[SlurmName, ...]
    nodes_without_topology: tuple[SlurmName, ...] = ()  # instances EC2 has not reported topology for (yet)
    # Slurm nodes no instance backs (powered down): written with the nodes without topology, never asked about.
    nodes_without_instance: tuple[SlurmName, ...] = ()
    warnings: tuple[str, ...] = ()


class Plan(_Frozen):
    cluster_name: ClusterName
    cluster_arn: str | None
    slurm_version: SlurmVersion
    slurm_format: SlurmFormat
    partitions: tuple[PartitionPlan, ...]
    # Slurm < 25.05 has one topology for the whole cluster and picks it with TopologyPlugin=.
    cluster_topology: Topology | None = None
    topology_plugin: str | None = None
    warnings: tuple[str, ...] = ()
    bindings: dict[SlurmName, str] = Field(default_factory=empty_dict)  # as ClusterSnapshot.bindings

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({node for partition in self.partitions for node in partition.nodes}))
