"""EC2: network topology (DescribeInstanceTopology) and plain-EC2 clusters found by tags.

DescribeInstanceTopology has an account-wide bucket of one call per second (every page counts), takes
at most 100 ids, answers them in pages (20 by default) and must not combine ``InstanceIds`` with
``MaxResults`` (botocore checks none of this). A running instance never moves, so complete answers are
cached per instance id; an empty ``NetworkNodes`` or a null ``CapacityBlockId`` on an UltraServer type
means "not yet" and is asked again next time.

Discovery is resumable: each batch's complete answers are cached as soon as it is answered, and a read
with a ``deadline`` starts no batch after it. The ids it did not ask for are ``undescribed`` (the snapshot
says so); the next read finds the answered ones in the cache and goes on with the rest. At 1 call/s and 20
instances a page, one 180 s reconcile describes about 2,800 new instances. An instance asked but not
answered completely is cached as "asked at": the next read asks the never-asked ones first, then these,
oldest first, so instances whose topology stays "not yet reported" do not starve the rest.

A large gap is swept instead: without ids the call takes ``MaxResults`` 100 and an ``instance-type``
filter, so one type's sweep costs a page per 100 of the account's instances of that type, against a page
per 20 new ids. A type is swept when that is cheaper (counting at least the cluster's own instances of the
type; the account may hold more) and the sweep fits the time left; a sweep that runs over the id path's
cost stops and the rest go by ids. A sweep cut short is not resumed by ``NextToken``: the next read starts
the type's sweep again, which is why only a sweep that fits is started (a token's lifetime is not
documented, it is bound to its filter, and a resumed sweep misses instances launched meanwhile on pages
already read); the answers it paid for are cached either way.

Instances the account does not own (HyperPod may run its nodes in a SageMaker service account) fail a
whole request with ``InvalidInstanceID.NotFound``, or are left out of the answer: either way they are
``not_visible`` and planned without network topology, and the rest of the batch is kept.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors, error_code
from topokeeper.contract.config import Ec2Discovery
from topokeeper.contract.constants import INSTANCE_ID
from topokeeper.contract.errors import InputError, TopokeeperError
from topokeeper.contract.ports import NodeFactsCache, RateLimiter
from topokeeper.domain.catalog import Capability, ec2_instance_type, lookup

if TYPE_CHECKING:  # ingest and the login sync use this module but never read a cluster's facts
    from topokeeper.engine.snapshot import AwsSnapshot

MAX_IDS_PER_CALL = 100
PAGE_WITH_IDS = 20  # the documented default page, which ids cannot change (no MaxResults with them)
SWEEP_PAGE = 100  # MaxResults' maximum, allowed only without ids
LAUNCH_KEY = "topokeeper:launched"  # kept with a cached answer: which launch of the instance it describes
ASKED_KEY = "topokeeper:asked"  # kept for an instance asked but not answered completely: when
_NAMED_ID = re.compile(r"\bi-[0-9a-f]{17}\b|\bi-[0-9a-f]{8}\b")
# EC2 instance state -> the HyperPod-style status the planner understands.
EC2_STATUS = {
    "pending": "Pending",
    "running": "Running",
    "stopping": "ShuttingDown",
    "stopped": "ShuttingDown",
    "shutting-down": "ShuttingDown",
    "terminated": "NotFound",
}


def checked_ids(instance_ids: Iterable[str]) -> list[str]:
    """Sorted, de-duplicated ids; a malformed one is refused before it reaches any AWS call."""
    ids = sorted(set(instance_ids))
    for instance_id in ids:
        if not INSTANCE_ID.fullmatch(instance_id):
            raise InputError("instance_ids", f"not an EC2 instance id: {instance_id!r}")
    return ids


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def not_visible_warning(instance_ids: list[str]) -> list[str]:
    """What the planner did about instances DescribeInstanceTopology did not answer for (in the plan and
    in every audit record of it)."""
    if not instance_ids:
        return []
    shown = ", ".join(instance_ids[:5]) + (f" and {len(instance_ids) - 5} more" if len(instance_ids) > 5 else "")
    return [
        f"DescribeInstanceTopology does not see {len(instance_ids)} instance(s) of this cluster ({shown}): "
        "not in this account's answer (HyperPod may run its nodes in a service account). They are planned "
        "without network topology (tree: under no-topology); UltraServer blocks still come from UltraServerInfo"
    ]


def undescribed_warning(instance_ids: list[str], total: int) -> list[str]:
    """What a read cut short by its deadline left for the next one."""
    if not instance_ids:
        return []
    return [
        f"discovery continues: {len(instance_ids)} of {total} instance(s) not described yet (DescribeInstanceTopology "
        "runs at 1 call/s and this invocation's time is up); planned without topology for now, the next reconcile "
        "goes on from the cache"
    ]


def is_complete(item: dict[str, Any]) -> bool:
    if not item.get("NetworkNodes"):
        return False
    ultraserver = lookup(str(item.get("InstanceType", ""))).capability is Capability.ULTRASERVER
    return not ultraserver or bool(item.get("CapacityBlockId"))


class InstanceTopologyReader:
    def __init__(
        self,
        ec2: Any,
        cache: NodeFactsCache,
        limiter: RateLimiter,
        now: Callable[[], datetime],
        deadline: datetime | None = None,
    ) -> None:
        self._ec2 = ec2
        self._cache = cache
        self._limiter = limiter
        self._now = now
        self.calls = 0
        self.not_visible: list[str] = []  # of the last read: asked for, but not in the account's answer
        self.undescribed: list[str] = []  # of the last read: not asked for before the deadline
        self.deadline = deadline  # no batch starts after this (the invocation's time is up)

    @aws_errors()
    def read(
        self,
        cluster: str,
        instance_ids: Iterable[str],
        launched: Mapping[str, str] | None = None,
        instance_types: Mapping[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Topology of running instances. ``launched`` (id -> launch time) keeps a cached answer only for
        the same launch: a stopped and started EC2 instance keeps its id but may land on another host.
        ``instance_types`` (id -> type) allows sweeping a large gap without ids."""
        wanted = checked_ids(instance_ids)  # before the cache lookup: the ids become DynamoDB keys
        launched = launched or {}
        known: dict[str, dict[str, Any]] = {}
        asked_at: dict[str, str] = {}
        for instance_id, facts in self._cache.get_many(cluster, wanted).items():
            if facts.get(LAUNCH_KEY, "") != launched.get(instance_id, ""):
                continue
            if is_complete(facts):
                known[instance_id] = {k: v for k, v in facts.items() if k != LAUNCH_KEY}
            else:
                asked_at[instance_id] = str(facts.get(ASKED_KEY, ""))
        # Never asked first, then the longest ago: "not yet reported" instances cannot starve the rest.
        missing = sorted((i for i in wanted if i not in known), key=lambda i: (i in asked_at, asked_at.get(i, ""), i))
        fresh: dict[str, dict[str, Any]] = {}
        asked: list[str] = []

        def keep(answered: dict[str, dict[str, Any]], ids: list[str]) -> None:
            """Cache what this call paid for: complete answers, and "asked at" for the rest of ``ids``."""
            now = self._now()
            items: dict[str, dict[str, object]] = {}
            for instance_id in ids:
                item = answered.get(instance_id)
                launch = launched.get(instance_id, "")
                if item is not None and is_complete(item):
                    items[instance_id] = {**item, LAUNCH_KEY: launch}
                else:
                    items[instance_id] = {"InstanceId": instance_id, ASKED_KEY: now.isoformat(), LAUNCH_KEY: launch}
            if items:
                self._cache.put_many(cluster, items, now)
            fresh.update(answered)
            asked.extend(ids)

        types = {i: ec2_instance_type(t) for i, t in (instance_types or {}).items()}
        swept = self._sweep_gap(wanted, missing, types, keep)
        for batch in _chunks([i for i in missing if i not in swept], MAX_IDS_PER_CALL):
            if self.deadline is not None and self._now() >= self.deadline:
                break
            keep({item["InstanceId"]: item for item in self._describe_owned(batch)}, batch)
        done = set(asked)
        self.not_visible = sorted(i for i in done if i not in fresh)
        self.undescribed = [instance_id for instance_id in missing if instance_id not in done]
        merged = {**fresh, **known}
        return [merged[instance_id] for instance_id in wanted if instance_id in merged]

    def _sweep_gap(
        self,
        wanted: list[str],
        missing: list[str],
        types: Mapping[str, str],
        keep: Callable[[dict[str, dict[str, Any]], list[str]], None],
    ) -> set[str]:
        """Sweep each instance type whose gap is cheaper to sweep than to ask by ids, while the sweeps fit
        the time left. Returns the ids the sweeps found (answered, complete or not)."""
        found: set[str] = set()
        left = None if self.deadline is None else (self.deadline - self._now()).total_seconds()
        for instance_type in sorted({types[i] for i in missing if i in types}):
            gap = [i for i in missing if types.get(i) == instance_type]
            by_ids = sum(-(-len(batch) // PAGE_WITH_IDS) for batch in _chunks(gap, MAX_IDS_PER_CALL))
            # At 1 call/s a page is a second; the account holds at least the cluster's instances of the type.
            sweep = -(-sum(1 for i in wanted if types.get(i) == instance_type) // SWEEP_PAGE)
            if sweep >= by_ids or (left is not None and sweep > left):
                continue
            if left is not None:
                left -= sweep
            found |= self._sweep(instance_type, set(gap), by_ids, keep)
        return found

    def _sweep(
        self,
        instance_type: str,
        gap: set[str],
        max_pages: int,
        keep: Callable[[dict[str, dict[str, Any]], list[str]], None],
    ) -> set[str]:
        """Every page of one type's instances in the account (the cluster's kept), until the sweep ends, the
        deadline passes or it has cost what asking by ids would have (the account holds more of the type)."""
        found: set[str] = set()
        token: str | None = None
        for _ in range(max_pages):
            if self.deadline is not None and self._now() >= self.deadline:
                break
            self._limiter.acquire()
            kwargs: dict[str, Any] = {
                "Filters": [{"Name": "instance-type", "Values": [instance_type]}],
                "MaxResults": SWEEP_PAGE,  # never with InstanceIds
            }
            if token:
                kwargs["NextToken"] = token
            self.calls += 1
            response = self._ec2.describe_instance_topology(**kwargs)
            answered = {
                str(item["InstanceId"]): {key: value for key, value in item.items() if value is not None}
                for item in response.get("Instances", [])
                if item.get("InstanceId") in gap
            }
            keep(answered, sorted(answered))
            found |= set(answered)
            token = response.get("NextToken")
            if not token:
                break
        return found

    def _describe_owned(self, batch: list[str]) -> list[dict[str, Any]]:
        """The batch's answer without the ids an ``InvalidInstanceID.*`` error names (or, when it names none
        of the batch, without the half that fails, down to single ids)."""
        try:
            return list(self._describe(batch))
        except ClientError as error:
            if not error_code(error).startswith("InvalidInstanceID."):
                raise
            message = str(error.response.get("Error", {}).get("Message", ""))
            named = set(_NAMED_ID.findall(message)) & set(batch)
            if len(batch) == 1 or named == set(batch):
                return []
            if named:
                return self._describe_owned([i for i in batch if i not in named])
            half = len(batch) // 2
            return self._describe_owned(batch[:half]) + self._describe_owned(batch[half:])

    def _describe(self, batch: list[str]) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            self._limiter.acquire()
            kwargs: dict[str, Any] = {"InstanceIds": batch}  # never with MaxResults
            if token:
                kwargs["NextToken"] = token
            self.calls += 1  # refused calls spend the bucket's token too
            response = self._ec2.describe_instance_topology(**kwargs)
            for item in response.get("Instances", []):
                yield {key: value for key, value in item.items() if value is not None}
            token = response.get("NextToken")
            if not token:
                return


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}


class Ec2ClusterFacts:
    """A Slurm cluster on plain EC2 (ParallelCluster or self-managed), found by its tags.

    The result has the same shape as a HyperPod snapshot, so one planner serves both.
    """

    def __init__(self, ec2: Any, topology: InstanceTopologyReader, discovery: Ec2Discovery) -> None:
        self._ec2 = ec2
        self._topology = topology
        self._discovery = discovery

    @aws_errors()
    def read(self, cluster: str) -> AwsSnapshot:
        discovery = self._discovery
        instances: list[dict[str, Any]] = []
        paginator = self._ec2.get_paginator("describe_instances")
        pages = paginator.paginate(Filters=[{"Name": f"tag:{discovery.cluster_tag}", "Values": [cluster]}])
        for page in pages:
            for reservation in page.get("Reservations", []):
                instances.extend(reservation.get("Instances", []))
        groups: dict[str, set[str]] = {}
        nodes = []
        for instance in sorted(instances, key=lambda i: str(i["InstanceId"])):
            tags = _tags(instance)
            partition = tags.get(discovery.partition_tag)
            group = partition or "unpartitioned"
            groups.setdefault(group, set()).add(instance["InstanceType"])
            name = tags.get(discovery.node_name_tag) if discovery.node_name_tag else None
            dns = instance.get("PrivateDnsName") or ""
            nodes.append(
                {
                    "InstanceGroupName": group,
                    "InstanceId": instance["InstanceId"],
                    "InstanceType": instance["InstanceType"],
                    "InstanceStatus": {"Status": EC2_STATUS.get(instance.get("State", {}).get("Name", ""), "NotFound")},
                    "PrivateDnsHostname": name or dns or None,
                    "PrivatePrimaryIp": instance.get("PrivateIpAddress"),
                    "Placement": {"AvailabilityZone": instance.get("Placement", {}).get("AvailabilityZone")},
                }
            )
        instance_groups = [
            {
                "InstanceGroupName": group,
                "InstanceType": sorted(types)[0],
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": [group]}
                if group != "unpartitioned"
                else {"NodeType": "Login"},
            }
            for group, types in sorted(groups.items())
        ]
        launched = {str(i["InstanceId"]): str(i.get("LaunchTime", "")) for i in instances}
        running = {n["InstanceId"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"}
        capable = [n["InstanceId"] for n in nodes if n["InstanceId"] in running and _capable(n["InstanceType"])]
        types = {n["InstanceId"]: n["InstanceType"] for n in nodes}
        topology = self._topology.read(cluster, capable, launched, types)
        from topokeeper.engine.snapshot import AwsSnapshot  # noqa: PLC0415 - loaded at init by the functions that read facts

        return AwsSnapshot.model_validate(
            {
                "describe_cluster": {"ClusterName": cluster, "InstanceGroups": instance_groups},
                "nodes": nodes,
                "instance_topology": topology,
                "warnings": not_visible_warning(self._topology.not_visible)
                + undescribed_warning(self._topology.undescribed, len(capable)),
                "undescribed": len(self._topology.undescribed),
            }
        )


@aws_errors()
def instance_tags(ec2: Any, instance_id: str) -> dict[str, str]:
    """An instance's tags (EC2 state-change events carry only its id); none for an instance DescribeInstances
    does not know yet (eventually consistent while pending). Access errors are ``Permanent``."""
    instance = described_instance(ec2, instance_id)
    return _tags(instance) if instance is not None else {}


@aws_errors()
def described_instance(ec2: Any, instance_id: str) -> dict[str, Any] | None:
    """DescribeInstances of one instance; None while DescribeInstances does not know it yet."""
    try:
        with aws_errors():
            response = ec2.describe_instances(InstanceIds=[checked_ids([instance_id])[0]])
    except TopokeeperError as error:
        if getattr(error, "code", None) == "InvalidInstanceID.NotFound":
            return None
        raise
    for reservation in response.get("Reservations", []):
        for instance in reservation.get("Instances", []):
            return dict(instance)
    return None


def _capable(instance_type: str) -> bool:
    return lookup(instance_type).capability is not Capability.NONE


class LocalRateLimiter:
    """One DescribeInstanceTopology call per second from this process (the CLI has no shared table)."""

    def __init__(
        self,
        interval: float = 1.0,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._interval = interval
        self._now = now
        self._sleep = sleep
        self._next = 0.0

    def acquire(self) -> None:
        wait = self._next - self._now()
        if wait > 0:
            self._sleep(wait)
        self._next = max(self._now(), self._next) + self._interval


class MemoryNodeFactsCache:
    def __init__(self) -> None:
        self._facts: dict[tuple[str, str], dict[str, object]] = {}

    def get_many(self, cluster: str, instance_ids: Iterable[str]) -> dict[str, dict[str, object]]:
        return {i: self._facts[(cluster, i)] for i in instance_ids if (cluster, i) in self._facts}

    def put_many(self, cluster: str, items: dict[str, dict[str, object]], now: datetime) -> None:
        self._facts.update({(cluster, instance_id): facts for instance_id, facts in items.items()})
