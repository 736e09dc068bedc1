"""The network behind EC2 ``DescribeInstanceTopology``: where each instance sits, and what AWS answers.

Every topology-capable instance type has its own fabric per Availability Zone, a row of slots filled
lowest first. A slot's bottom network node ("leaf") holds ``nodes_per_leaf`` instances, ``leaves_per_spine``
leaves share the node above, and each further layer up joins ``spines_per_core`` nodes (3 layers, 4 for
p6-b200/p6-b300, as the catalog says). UltraServer types fill whole UltraServers instead: one
UltraServer (18 p6e-gb200, 4 trn2u) per leaf by default, all its members sharing the same network nodes
and ``CapacityBlockId``. Types that are not topology-capable get no network nodes.

``DescribeInstanceTopology`` behaves like AWS where botocore does not check: at most 100 ids,
``InstanceIds`` and ``MaxResults`` exclusive, ``MaxResults`` 1..100 (default 20), ``NextToken`` pages of
20 even when ids are given (as the public generator expects); throttling is the emulator's rate limiter
(1 token, 1/s, every page counts). An id the account does not own (a HyperPod node in SageMaker's
service account when ``expose_hyperpod_nodes`` is off, a terminated instance) fails the whole request
with ``InvalidInstanceID.NotFound`` naming the ids, or, with ``unknown_ids = "omit"``, is left out of
the answer silently: which of the two AWS does for DescribeInstanceTopology awaits a live account.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Literal

from topokeeper.contract.constants import INSTANCE_ID
from topokeeper.domain.catalog import Capability, ec2_instance_type, lookup
from topokeeper.sim.aws.clock import Clock
from topokeeper.sim.aws.ids import IdFactory
from topokeeper.sim.aws.moto_ec2 import ec2_backends
from topokeeper.sim.aws.protocol import ApiError, ApiRequest, decode_token, ec2_params, encode_token, operation_model

MAX_IDS = 100
DEFAULT_PAGE = 20
_DIRECTIONS = {
    "north": "n",
    "south": "s",
    "east": "e",
    "west": "w",
    "central": "c",
    "northeast": "ne",
    "northwest": "nw",
    "southeast": "se",
    "southwest": "sw",
}


def zone_id(availability_zone: str) -> str:
    """``us-east-1a`` -> ``use1-az1`` (the AZ-name to AZ-id mapping is per account on AWS; this one is fixed)."""
    match = re.fullmatch(r"([a-z]{2})-([a-z]+)-(\d+)([a-z])", availability_zone)
    if not match:
        return availability_zone
    area, direction, number, letter = match.groups()
    return f"{area}{_DIRECTIONS.get(direction, direction[:1])}{number}-az{ord(letter) - ord('a') + 1}"


@dataclass(frozen=True)
class NetworkLayout:
    """How instances fill a fabric. ``ultraserver_size`` overrides the catalog's (18 for p6e-gb200)."""

    nodes_per_leaf: int = 8
    leaves_per_spine: int = 4
    spines_per_core: int = 4
    ultraserver_size: int | None = None
    ultraservers_per_leaf: int = 1

    def __post_init__(self) -> None:
        values = (self.nodes_per_leaf, self.leaves_per_spine, self.spines_per_core, self.ultraservers_per_leaf)
        if min(values) < 1 or (self.ultraserver_size is not None and self.ultraserver_size < 1):
            raise ValueError(f"every NetworkLayout count must be at least 1: {self}")


@dataclass(frozen=True)
class Placement:
    """Where one instance sits. ``unit`` is its leaf, or its UltraServer for UltraServer types."""

    instance_id: str
    instance_type: str
    availability_zone: str
    slot: int | None
    unit: int | None
    network_nodes: tuple[str, ...]
    ultraserver_id: str | None
    capacity_block_id: str | None
    source: str
    group_name: str | None = None

    @property
    def zone_id(self) -> str:
        return zone_id(self.availability_zone)


@dataclass
class _Hold:
    until: float | None
    calls: int


class NetworkModel:
    """Placement of every instance the emulator knows, and the ``DescribeInstanceTopology`` handler."""

    def __init__(
        self,
        *,
        ids: IdFactory,
        clock: Clock,
        lock: threading.RLock,
        account_id: str,
        region: str,
        layout: NetworkLayout | None = None,
    ) -> None:
        self.layout = layout or NetworkLayout()
        self.layouts: dict[str, NetworkLayout] = {}  # per EC2 instance type, over ``layout``
        self.new_instance_delay_seconds = 0.0  # topology "not yet available" after launch, in clock seconds
        self.new_instance_delay_calls = 0  # ... or for this many DescribeInstanceTopology answers
        self.expose_hyperpod_nodes = True  # False: HyperPod nodes are invisible to EC2 (another account)
        self.unknown_ids: Literal["error", "omit"] = "error"  # how an id the account does not own is answered
        self._ids = ids
        self._clock = clock
        self._lock = lock
        self._account_id = account_id
        self._region = region
        self._placements: dict[str, Placement] = {}
        self._slots: dict[tuple[str, str], dict[int, str]] = {}
        self._holds: dict[str, _Hold] = {}
        self._ec2_instances: Callable[[str], list[Any]] = _moto_instances(account_id)

    # ------------------------------------------------------------ control

    def layout_for(self, instance_type: str) -> NetworkLayout:
        return self.layouts.get(ec2_instance_type(instance_type), self.layout)

    def ultraserver_size(self, instance_type: str) -> int | None:
        info = lookup(instance_type)
        if info.capability is not Capability.ULTRASERVER:
            return None
        return self.layout_for(instance_type).ultraserver_size or info.ultraserver_size or 1

    def place(
        self,
        instance_id: str,
        instance_type: str,
        availability_zone: str,
        *,
        source: str = "hyperpod",
        move_from: Placement | None = None,
        same_as: Placement | None = None,
        group_name: str | None = None,
        age_seconds: float = 0.0,
    ) -> Placement:
        """Give an instance the lowest free slot: outside ``move_from``'s leaf or UltraServer if given, or
        ``same_as``'s own slot if that is free (a replacement on the same spot). ``age_seconds``: how long ago
        it launched (the topology report delay runs from then)."""
        ec2_type = ec2_instance_type(instance_type)
        info = lookup(ec2_type)
        with self._lock:
            if info.capability is Capability.NONE:
                placement = Placement(
                    instance_id, ec2_type, availability_zone, None, None, (), None, None, source, group_name
                )
            else:
                slots = self._slots.setdefault((availability_zone, ec2_type), {})
                avoid = move_from.unit if move_from is not None and move_from.instance_type == ec2_type else None
                slot = 0
                if same_as is not None and same_as.slot is not None and same_as.slot not in slots:
                    slot = same_as.slot
                while slot in slots or (avoid is not None and self._unit(ec2_type, slot) == avoid):
                    slot += 1
                slots[slot] = instance_id
                placement = self._placement(
                    instance_id, ec2_type, availability_zone, slot=slot, source=source, group_name=group_name
                )
            self._placements[instance_id] = placement
            held = self.new_instance_delay_seconds - age_seconds
            if held > 0 or self.new_instance_delay_calls > 0:
                self.hold(instance_id, seconds=max(held, 0.0), calls=self.new_instance_delay_calls)
            return placement

    def release(self, instance_id: str) -> None:
        with self._lock:
            placement = self._placements.pop(instance_id, None)
            self._holds.pop(instance_id, None)
            if placement is not None and placement.slot is not None:
                self._slots[(placement.availability_zone, placement.instance_type)].pop(placement.slot, None)

    def placement(self, instance_id: str) -> Placement | None:
        with self._lock:
            return self._placements.get(instance_id)

    def placements(self) -> list[Placement]:
        with self._lock:
            return sorted(self._placements.values(), key=lambda p: p.instance_id)

    def hold(self, instance_id: str, *, seconds: float | None = None, calls: int | None = None) -> None:
        """Make the instance's topology "not yet available": no network nodes and no ``CapacityBlockId``
        for ``seconds`` of clock time and/or ``calls`` DescribeInstanceTopology answers that include it."""
        with self._lock:
            until = self._clock.monotonic() + seconds if seconds else None
            self._holds[instance_id] = _Hold(until, calls or 0)

    # ------------------------------------------------------------ internals

    def _unit(self, ec2_type: str, slot: int) -> int:
        size = self.ultraserver_size(ec2_type)
        return slot // size if size else slot // self.layout_for(ec2_type).nodes_per_leaf

    def _placement(
        self, instance_id: str, ec2_type: str, zone: str, *, slot: int, source: str, group_name: str | None
    ) -> Placement:
        layout = self.layout_for(ec2_type)
        layers = lookup(ec2_type).network_layers
        unit = self._unit(ec2_type, slot)
        ultraserver = self.ultraserver_size(ec2_type) is not None
        leaf = unit // layout.ultraservers_per_leaf if ultraserver else unit
        indices = [leaf]
        index = leaf // layout.leaves_per_spine
        for _ in range(layers - 1):
            indices.append(index)
            index //= layout.spines_per_core
        indices.reverse()  # top layer first, the instance's own network node last
        nodes = tuple(self._ids.hex_id("nn-", zone, ec2_type, layer, i) for layer, i in enumerate(indices, start=1))
        us_id = self._ids.hex_id("us-", zone, ec2_type, unit) if ultraserver else None
        block = self._ids.hex_id("cb-", zone, ec2_type, unit) if ultraserver else None
        return Placement(instance_id, ec2_type, zone, slot, unit, nodes, us_id, block, source, group_name)

    def _available(self, instance_id: str) -> bool:
        hold = self._holds.get(instance_id)
        if hold is None:
            return True
        if (hold.until is None or self._clock.monotonic() >= hold.until) and hold.calls <= 0:
            del self._holds[instance_id]
            return True
        return False

    def _sync_ec2(self, region: str) -> dict[str, str]:
        """Place moto's EC2 instances on first sight; forget terminated ones. Returns id -> state."""
        states: dict[str, str] = {}
        for instance in self._ec2_instances(region):
            state = str(instance.state)
            if state in ("terminated", "shutting-down"):
                continue
            states[instance.id] = state
            if instance.id not in self._placements:
                zone = instance.placement.zone or f"{region}a"
                group = instance.placement.group_name or None
                # Placed on first sight, but as AWS does it: the report delay counts from the launch.
                age = (self._clock.now().astimezone(UTC).replace(tzinfo=None) - instance.launch_time).total_seconds()
                self.place(instance.id, instance.instance_type, zone, source="ec2", group_name=group, age_seconds=age)
        for instance_id, placement in list(self._placements.items()):
            if placement.source == "ec2" and instance_id not in states:
                self.release(instance_id)
        return states

    # ------------------------------------------------------------ API

    def handlers(self) -> dict[tuple[str, str], Callable[[ApiRequest], Mapping[str, Any]]]:
        return {("ec2", "DescribeInstanceTopology"): self.describe_instance_topology}

    def describe_instance_topology(self, request: ApiRequest) -> dict[str, Any]:
        params = ec2_params(request, operation_model("ec2", "DescribeInstanceTopology"))
        instance_ids: list[str] = params.get("InstanceIds") or []
        group_names: list[str] = params.get("GroupNames") or []
        max_results = params.get("MaxResults")
        if instance_ids and max_results is not None:
            raise ApiError(
                "InvalidParameterCombination", "The parameter InstanceId cannot be used with the parameter maxResults"
            )
        if len(instance_ids) > MAX_IDS:
            raise ApiError("InvalidParameterValue", f"instance-ids cannot contain over {MAX_IDS} values")
        if len(group_names) > MAX_IDS:
            raise ApiError("InvalidParameterValue", f"group-names cannot contain over {MAX_IDS} values")
        if max_results is not None and not 1 <= max_results <= MAX_IDS:
            raise ApiError(
                "InvalidParameterValue",
                f"Value ( {max_results} ) for parameter maxResults is invalid. Expecting a value between 1 and 100.",
            )
        for instance_id in instance_ids:
            if not INSTANCE_ID.fullmatch(instance_id):
                raise ApiError("InvalidInstanceID.Malformed", f'Invalid id: "{instance_id}"')
        if params.get("DryRun"):
            raise ApiError("DryRunOperation", "Request would have succeeded, but DryRun flag is set.", 412)
        matches = _filters(params.get("Filters") or [])

        with self._lock:
            states = self._sync_ec2(request.region)
            candidates = [
                p
                for p in self.placements()
                if (p.source == "ec2" and p.instance_id in states)
                or (p.source == "hyperpod" and self.expose_hyperpod_nodes and request.region == self._region)
            ]
            wanted = set(instance_ids)
            unknown = sorted(wanted - {p.instance_id for p in candidates})
            if unknown and self.unknown_ids == "error":
                raise ApiError("InvalidInstanceID.NotFound", _not_found_message(unknown))
            selected = [
                p
                for p in candidates
                if (not wanted or p.instance_id in wanted)
                and (not group_names or p.group_name in group_names)
                and matches(p)
            ]
            next_token = None
            if params.get("NextToken"):
                after = decode_token(params["NextToken"], "InvalidParameterValue")
                selected = [p for p in selected if p.instance_id > str(after)]
            page = max_results or DEFAULT_PAGE
            if len(selected) > page:
                selected = selected[:page]
                next_token = encode_token(selected[-1].instance_id)
            items = [self._item(p, states.get(p.instance_id, "running")) for p in selected]
        result: dict[str, Any] = {"Instances": items}
        if next_token:
            result["NextToken"] = next_token
        return result

    def _item(self, placement: Placement, state: str) -> dict[str, Any]:
        item: dict[str, Any] = {"InstanceId": placement.instance_id, "InstanceType": placement.instance_type}
        if placement.group_name:
            item["GroupName"] = placement.group_name
        if placement.slot is not None:
            ready = self._available(placement.instance_id)
            if not ready:
                self._holds[placement.instance_id].calls -= 1
            if ready and state == "running":
                item["NetworkNodes"] = list(placement.network_nodes)
                if placement.capacity_block_id:
                    item["CapacityBlockId"] = placement.capacity_block_id
            else:
                item["NetworkNodes"] = []
        item["AvailabilityZone"] = placement.availability_zone
        item["ZoneId"] = placement.zone_id
        return item


def _not_found_message(instance_ids: list[str]) -> str:
    """EC2's wording for ids it does not know (DescribeInstances answers the same way)."""
    if len(instance_ids) == 1:
        return f"The instance ID '{instance_ids[0]}' does not exist"
    return f"The instance IDs '{', '.join(instance_ids)}' do not exist"


_FILTER_FIELDS: dict[str, Callable[[Placement], str]] = {
    "availability-zone": lambda p: p.availability_zone,
    "zone-id": lambda p: p.zone_id,
    "instance-type": lambda p: p.instance_type,
}


def _filters(filters: list[dict[str, Any]]) -> Callable[[Placement], bool]:
    """EC2 filters: any value of a filter matches (wildcards ``*`` and ``?``); every filter must match."""
    tests: list[tuple[Callable[[Placement], str], list[str]]] = []
    for entry in filters:
        name = str(entry.get("Name", ""))
        if name not in _FILTER_FIELDS:
            raise ApiError("InvalidParameterValue", f"The filter '{name}' is invalid")
        tests.append((_FILTER_FIELDS[name], [str(v) for v in entry.get("Values") or []]))

    @functools.cache
    def admits(index: int, value: str) -> bool:  # a sweep tests 20,000 placements with a few distinct values
        return any(fnmatch.fnmatchcase(value, pattern) for pattern in tests[index][1])

    def matches(placement: Placement) -> bool:
        return all(admits(index, value_of(placement)) for index, (value_of, _) in enumerate(tests))

    return matches


def _moto_instances(account_id: str) -> Callable[[str], list[Any]]:
    def instances(region: str) -> list[Any]:
        return list(ec2_backends[account_id][region].all_instances())

    return instances
