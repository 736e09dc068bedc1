"""The boto3 adapters against the emulator: real clients, moto in server mode, the project's AWS models.

Each test pins one adapter behaviour the functions rely on: which calls are made (counted by the
emulator), in what shape (AWS's limits are enforced by the emulator), and what comes back.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.helpers import gb200_nodes, p5_nodes, snapshot
from tests.integration.aws.support import cluster_request, drain, group, subscribe
from topokeeper.adapters import ssm_channel
from topokeeper.adapters.agent_channel import AgentChannel
from topokeeper.adapters.audit_trail import PUT_EVENTS_MAX_BYTES, AuditTrail, put_events_entry_size
from topokeeper.adapters.aws import PRESIGN_CONFIG, SEND_COMMAND_CONFIG, clear_clients, client, presigning_s3
from topokeeper.adapters.dynamodb import (
    NODE_TABLE_ATTRIBUTE,
    DynamoNodeFactsCache,
    DynamoRateLimiter,
    DynamoStateStore,
    cluster_key,
)
from topokeeper.adapters.ec2 import (
    ASKED_KEY,
    LAUNCH_KEY,
    InstanceTopologyReader,
    LocalRateLimiter,
    is_complete,
)
from topokeeper.adapters.hyperpod import HyperPodFacts
from topokeeper.adapters.plans import S3PlanStore
from topokeeper.adapters.queue import SqsWorkQueue
from topokeeper.adapters.ssm_channel import SsmChannel
from topokeeper.contract.errors import ConcurrentUpdate, InputError, Permanent, Retryable
from topokeeper.contract.event_schemas import RUN_SHELL_DOCUMENT
from topokeeper.contract.head_node_program import program_bytes
from topokeeper.contract.ports import (
    MAX_TRIGGERS,
    ApplyResult,
    AuditRecord,
    Channel,
    ClusterState,
    Outcome,
    PendingDelivery,
    ReconcileRequest,
    Trigger,
)
from topokeeper.domain.catalog import Capability, lookup
from topokeeper.domain.models import BlockTopology, PlannerConfig, SlurmNodeRecord, TopologyKind
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import build_snapshot
from topokeeper.render.bundle import Bundle, RenderedPlan, render
from topokeeper.service.audit import build_records
from topokeeper.service.state import save_fields
from topokeeper.sim.aws.s3 import KMS_DEFAULT_ENCRYPTION
from topokeeper.sim.aws_emulator import AwsEmulator, CommandInvocationRequest, CommandOutcome, ManualClock
from topokeeper.sim.stack import create_state_table
from topokeeper.wire import agent_bundle_key, agent_verify_key, agent_verify_request_key, registration_key

TABLE = "topokeeper-state"
BUCKET = "topokeeper-plans"
HEAD_NODE = "mi-0123456789abcdef0"
NO_RETRIES = Config(retries={"total_max_attempts": 1})  # a throttled or refused call surfaces at once


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def table(aws: AwsEmulator) -> str:
    """The stack's table: pk/sk strings, on demand, TTL on expires_at."""
    create_state_table(aws.client("dynamodb"), TABLE)
    return TABLE


@pytest.fixture
def bucket(aws: AwsEmulator) -> str:
    """The stack's bucket: versioned."""
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return BUCKET


def _paced(clock: ManualClock) -> LocalRateLimiter:
    """One DescribeInstanceTopology call per second of the emulator's clock: waiting advances it."""
    return LocalRateLimiter(now=clock.monotonic, sleep=clock.advance)


def _reader(aws: AwsEmulator, clock: ManualClock, table: str, ec2: Any | None = None) -> InstanceTopologyReader:
    cache = DynamoNodeFactsCache(aws.client("dynamodb"), table)
    return InstanceTopologyReader(ec2 or aws.client("ec2", config=NO_RETRIES), cache, _paced(clock), clock.now)


def _event(name: str, client: Any, operation: str) -> str:
    return f"{name}.{client.meta.service_model.service_id.hyphenize()}.{operation}"


def _requests(client: Any, operation: str) -> list[dict[str, Any]]:
    """The parameters of every ``operation`` call this client makes, as the adapter passed them."""
    seen: list[dict[str, Any]] = []

    def keep(params: dict[str, Any], **_: Any) -> None:
        seen.append(copy.deepcopy(params))

    client.meta.events.register(_event("provide-client-params", client, operation), keep)
    return seen


def _questions(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first page of each DescribeInstanceTopology question (later pages repeat it with a NextToken)."""
    return [request for request in requests if "NextToken" not in request]


def _rewrite_responses(client: Any, operation: str, rewrite: Callable[[dict[str, Any]], None]) -> Callable[..., None]:
    """Change what the client returns for ``operation`` (an AWS answer the emulator does not produce)."""

    def handler(parsed: dict[str, Any], **_: Any) -> None:
        rewrite(parsed)

    client.meta.events.register(_event("after-call", client, operation), handler)
    return handler


def _rendered(p5_count: int = 8) -> RenderedPlan:
    return render(plan(snapshot({"p5": p5_nodes(p5_count, partition="p5"), "gb": gb200_nodes(2)})))


def _trigger(number: int, clock: ManualClock) -> Trigger:
    return Trigger(
        source="aws.sagemaker",
        detail_type="SageMaker HyperPod Cluster State Change",
        event_id=f"event-{number}",
        time=clock.now(),
        summary=f"change {number}",
    )


def _capable_ids(aws: AwsEmulator, cluster: str) -> list[str]:
    return [
        n.instance_id for n in aws.hyperpod.nodes(cluster) if lookup(n.instance_type).capability is not Capability.NONE
    ]


# ---------------------------------------------------------------- HyperPodFacts


def test_hyperpod_facts_read_a_250_node_cluster_with_the_fewest_calls(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    # Given a 250-node cluster created through CreateCluster, with a few nodes not running
    aws.client("sagemaker").create_cluster(
        **cluster_request(
            "big",
            group("p5", "ml.p5.48xlarge", 192, partition="ml-p5"),
            group("gb200", "ml.p6e-gb200.36xlarge", 36, partition="ml-p6e"),
            group("cpu", "ml.c7i.4xlarge", 20, partition="preprocess"),
            group("login", "ml.m5.xlarge", 1, node_type="Login"),
        )
    )
    p5, gb200 = aws.hyperpod.nodes("big", "p5"), aws.hyperpod.nodes("big", "gb200")
    aws.hyperpod.set_status(p5[0].instance_id, "Failure")
    aws.hyperpod.set_status(p5[1].instance_id, "Pending")
    aws.hyperpod.set_status(p5[2].instance_id, "DeepHealthCheckInProgress")
    aws.hyperpod.set_status(gb200[0].instance_id, "ShuttingDown")
    asked_for = {n.instance_id for n in p5[2:] + gb200[1:]}  # topology-capable and running (or checking)
    ec2 = aws.client("ec2", config=NO_RETRIES)
    topology_requests = _requests(ec2, "DescribeInstanceTopology")
    facts = HyperPodFacts(aws.client("sagemaker"), aws.client("s3"), _reader(aws, clock, table, ec2))
    aws.reset_counters()
    started = clock.monotonic()

    # When
    raw = facts.read("big")

    # Then every node came back from three ListClusterNodes pages, and nothing needed DescribeClusterNode
    assert len(raw.nodes) == 250
    assert len({n.InstanceId for n in raw.nodes}) == 250
    assert (aws.calls["DescribeCluster"], aws.calls["ListClusterNodes"]) == (1, 3)
    assert aws.calls["DescribeClusterNode"] == 0
    assert aws.calls["GetObject"] == 0  # every group has SlurmConfig: no legacy mapping to read
    # DescribeInstanceTopology: a cold read sweeps each type without ids, pages of 100 that each take a second
    # of the 1/s bucket (by ids, 189 p5 and 35 gb200 would take 10 + 2 pages of 20); never ids with MaxResults
    assert aws.calls["DescribeInstanceTopology"] == len(topology_requests) == 2 + 1
    assert [(r["Filters"], r["MaxResults"]) for r in _questions(topology_requests)] == [
        ([{"Name": "instance-type", "Values": ["p5.48xlarge"]}], 100),
        ([{"Name": "instance-type", "Values": ["p6e-gb200.36xlarge"]}], 100),
    ]
    assert all("InstanceIds" not in r for r in topology_requests)
    assert clock.monotonic() - started == 2.0
    assert {t.InstanceId for t in raw.instance_topology} == asked_for
    assert all(len(t.NetworkNodes or []) == 3 for t in raw.instance_topology)

    # And the snapshot plans into the expected partitions
    planned = {p.partition: p for p in plan(build_snapshot(raw, PlannerConfig())).partitions}
    assert {name: p.kind for name, p in planned.items()} == {
        "ml-p5": TopologyKind.TREE,
        "ml-p6e": TopologyKind.BLOCK,
        "preprocess": TopologyKind.FLAT,
    }
    assert len(planned["ml-p5"].nodes) == 191  # the failed node is left out
    assert planned["ml-p5"].nodes_without_topology == (p5[1].slurm_name,)  # pending: not asked yet
    assert len(planned["ml-p6e"].nodes) == 35
    assert len(planned["preprocess"].nodes) == 20


def test_hyperpod_facts_describe_only_the_nodes_the_list_lacks(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    # Given a cluster whose ListClusterNodes answer lacks two host names and one UltraServerInfo
    # (the emulator always fills both, so the client's answer is trimmed, as AWS may answer while a node joins)
    aws.client("sagemaker").create_cluster(**cluster_request())
    p5, gb200 = aws.hyperpod.nodes("llm-train", "p5-train"), aws.hyperpod.nodes("llm-train", "gb200")
    no_hostname = {p5[0].instance_id, p5[3].instance_id}
    no_ultraserver = {gb200[5].instance_id}

    def trim(parsed: dict[str, Any]) -> None:
        for summary in parsed.get("ClusterNodeSummaries", []):
            if summary["InstanceId"] in no_hostname:
                del summary["PrivateDnsHostname"]
            if summary["InstanceId"] in no_ultraserver:
                del summary["UltraServerInfo"]

    sagemaker = aws.client("sagemaker")
    _rewrite_responses(sagemaker, "ListClusterNodes", trim)
    described = _requests(sagemaker, "DescribeClusterNode")
    facts = HyperPodFacts(sagemaker, aws.client("s3"), _reader(aws, clock, table))
    aws.reset_counters()

    # When
    raw = facts.read("llm-train")

    # Then DescribeClusterNode was asked for exactly those three nodes, and filled in what they lacked
    assert aws.calls["DescribeClusterNode"] == 3
    assert {r["NodeId"] for r in described} == no_hostname | no_ultraserver
    nodes = {n.InstanceId: n for n in raw.nodes}
    for instance_id in no_hostname:
        assert nodes[instance_id].PrivateDnsHostname == aws.hyperpod.node(instance_id).hostname
    (filled,) = no_ultraserver
    placement, ultraserver = aws.network.placement(filled), nodes[filled].UltraServerInfo
    assert placement is not None and ultraserver is not None
    assert ultraserver.Id == placement.ultraserver_id
    # so all 18 land in their UltraServer's block, none in "no-ultraserver"
    gb200_plan = {p.partition: p for p in plan(build_snapshot(raw, PlannerConfig())).partitions}["ml-p6e"]
    assert isinstance(gb200_plan.topology, BlockTopology)
    assert [(b.name, len(b.nodes)) for b in gb200_plan.topology.blocks] == [(placement.ultraserver_id, 18)]


LEGACY_PARAMETERS = {
    "version": "1.0.0",
    "workload_manager": "slurm",
    "controller_group": "controller",
    "worker_groups": [
        {"instance_group_name": "p5", "partition_name": "ml-p5"},
        {"instance_group_name": "gb200", "partition_name": "ml-p6e"},
    ],
}


@pytest.mark.parametrize(
    ("source_uri", "key"),
    [
        ("s3://lifecycle-scripts/hyperpod/", "hyperpod/provisioning_parameters.json"),
        ("s3://lifecycle-scripts/hyperpod", "hyperpod/provisioning_parameters.json"),
        ("s3://lifecycle-scripts/hyperpod/provisioning_parameters.json", "hyperpod/provisioning_parameters.json"),
        ("s3://lifecycle-scripts", "provisioning_parameters.json"),
    ],
    ids=["folder", "folder-without-slash", "file", "bucket-root"],
)
def test_hyperpod_facts_read_the_legacy_partition_mapping_from_the_lifecycle_bucket(
    aws: AwsEmulator, clock: ManualClock, table: str, source_uri: str, key: str
) -> None:
    # Given a cluster configured before API-driven Slurm: no SlurmConfig, partitions in provisioning_parameters.json
    request = cluster_request(
        "legacy",
        group("p5", "ml.p5.48xlarge", 4, partition="ml-p5"),
        group("gb200", "ml.p6e-gb200.36xlarge", 18, partition="ml-p6e"),
    )
    del request["Orchestrator"]
    for spec in request["InstanceGroups"]:
        del spec["SlurmConfig"]
        spec["LifeCycleConfig"] = {"SourceS3Uri": source_uri, "OnCreate": "on_create.sh"}
    aws.client("sagemaker").create_cluster(**request)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="lifecycle-scripts")
    s3.put_object(Bucket="lifecycle-scripts", Key=key, Body=json.dumps(LEGACY_PARAMETERS).encode())
    facts = HyperPodFacts(aws.client("sagemaker"), s3, _reader(aws, clock, table))
    aws.reset_counters()

    # When
    raw = facts.read("legacy")

    # Then the mapping is read once and plans the partitions it names
    assert raw.slurm.partitions == {"p5": "ml-p5", "gb200": "ml-p6e"}
    assert aws.calls["GetObject"] == 1
    planned = {p.partition: p for p in plan(build_snapshot(raw, PlannerConfig())).partitions}
    assert {name: p.kind for name, p in planned.items()} == {"ml-p5": TopologyKind.TREE, "ml-p6e": TopologyKind.BLOCK}
    assert (len(planned["ml-p5"].nodes), len(planned["ml-p6e"].nodes)) == (4, 18)


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (b'{"worker_groups": [{"instance_group_name": "p5",', "", "not valid JSON"),
        (b'["p5", "ml-p5"]', "", "must be a JSON object"),
        (b'{"worker_groups": {"p5": "ml-p5"}}', ":worker_groups", "must be a list"),
        (b'{"worker_groups": ["p5"]}', ":worker_groups[0]", "must be an object"),
        (
            b'{"worker_groups": [{"instance_group_name": "p5", "partition_name": 5}]}',
            ":worker_groups[0].partition_name",
            "must be a string",
        ),
        (b" " * (1024 * 1024) + b"{}", "", "larger than 1048576 bytes"),
    ],
    ids=["truncated", "not-an-object", "groups-not-a-list", "group-not-an-object", "name-not-a-string", "over-1mb"],
)
def test_a_malformed_legacy_mapping_is_one_error_naming_the_s3_object(
    aws: AwsEmulator, clock: ManualClock, table: str, body: bytes, field: str, message: str
) -> None:
    request = cluster_request("legacy", group("p5", "ml.p5.48xlarge", 2, partition="ml-p5"))
    del request["Orchestrator"]
    for spec in request["InstanceGroups"]:
        del spec["SlurmConfig"]
        spec["LifeCycleConfig"] = {"SourceS3Uri": "s3://lifecycle-scripts/hyperpod/", "OnCreate": "on_create.sh"}
    aws.client("sagemaker").create_cluster(**request)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="lifecycle-scripts")
    s3.put_object(Bucket="lifecycle-scripts", Key="hyperpod/provisioning_parameters.json", Body=body)
    ec2 = aws.client("ec2", config=NO_RETRIES)
    sizes: list[int] = []
    _rewrite_responses(s3, "GetObject", lambda parsed: sizes.append(parsed["ContentLength"]))
    facts = HyperPodFacts(aws.client("sagemaker"), s3, _reader(aws, clock, table, ec2))

    with pytest.raises(InputError) as raised:
        facts.read("legacy")

    assert raised.value.field == f"s3://lifecycle-scripts/hyperpod/provisioning_parameters.json{field}"
    assert message in raised.value.message
    assert isinstance(raised.value, Permanent)  # the reconcile dead-letters it with this reason, no retries
    assert max(sizes) <= 1024 * 1024 + 1  # never more than 1 MB (and a byte) is read


# ---------------------------------------------------------------- InstanceTopologyReader


def test_topology_reader_serves_a_second_read_from_the_table(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    # Given a cluster whose topology one reader has read
    aws.client("sagemaker").create_cluster(**cluster_request())
    ids = _capable_ids(aws, "llm-train")
    reader = _reader(aws, clock, table)
    first = reader.read("llm-train", ids)
    assert aws.calls["DescribeInstanceTopology"] == 2  # 22 ids: a page of 20 and one of 2

    # When the same reader, and another one on the same table (another invocation), read again
    again = reader.read("llm-train", ids)
    elsewhere = _reader(aws, clock, table).read("llm-train", list(reversed(ids)))

    # Then both are served from the cache without a new call
    assert aws.calls["DescribeInstanceTopology"] == 2
    assert len(first) == 22
    assert again == elsewhere == first


def test_a_cached_answer_is_for_one_launch_of_the_instance(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    """A stopped and started EC2 instance keeps its id but may sit on another host: ask again."""
    aws.client("sagemaker").create_cluster(**cluster_request())
    ids = _capable_ids(aws, "llm-train")
    reader = _reader(aws, clock, table)
    first_launch = dict.fromkeys(ids, "2026-01-05T09:00:00")
    reader.read("llm-train", ids, first_launch)
    reader.read("llm-train", ids, first_launch)
    assert aws.calls["DescribeInstanceTopology"] == 2  # two pages

    restarted = {**first_launch, ids[0]: "2026-01-05T10:00:00"}
    items = reader.read("llm-train", ids, restarted)
    assert aws.calls["DescribeInstanceTopology"] == 3
    assert all("topokeeper:launched" not in item for item in items)


def test_topology_not_yet_reported_is_asked_again(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    # Given a node whose topology EC2 has not reported yet (empty NetworkNodes for 30 s)
    aws.client("sagemaker").create_cluster(**cluster_request())
    ids = _capable_ids(aws, "llm-train")
    late = ids[0]
    aws.network.hold(late, seconds=30)
    ec2 = aws.client("ec2", config=NO_RETRIES)
    asked = _requests(ec2, "DescribeInstanceTopology")
    reader = _reader(aws, clock, table, ec2)

    # When it is read: the answer says "not yet", and only the complete answers are cached (the other, when
    # it was asked)
    early = {item["InstanceId"]: item for item in reader.read("llm-train", ids)}
    assert early[late]["NetworkNodes"] == []
    cached = DynamoNodeFactsCache(aws.client("dynamodb"), table).get_many("llm-train", ids)
    assert {i for i, facts in cached.items() if is_complete(facts)} == set(ids) - {late}
    assert set(cached[late]) == {"InstanceId", ASKED_KEY, LAUNCH_KEY}

    # Then the next read asks again, for that node only
    reader.read("llm-train", ids)
    assert [r["InstanceIds"] for r in _questions(asked)] == [sorted(ids), [late]]

    # And once EC2 reports it, it is cached and never asked again
    clock.advance(30)
    ready = {item["InstanceId"]: item for item in reader.read("llm-train", ids)}
    assert len(ready[late]["NetworkNodes"]) == 3
    reader.read("llm-train", ids)
    assert [r["InstanceIds"] for r in _questions(asked)] == [sorted(ids), [late], [late]]


def test_ultraserver_answer_without_capacity_block_is_not_cached(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    # Given EC2 answers for UltraServer instances with network nodes but no CapacityBlockId yet
    # (the emulator always knows it, so the client's answer is trimmed)
    aws.client("sagemaker").create_cluster(**cluster_request())
    gb200 = sorted(n.instance_id for n in aws.hyperpod.nodes("llm-train", "gb200"))
    ec2 = aws.client("ec2", config=NO_RETRIES)

    def without_capacity_block(parsed: dict[str, Any]) -> None:
        for item in parsed.get("Instances", []):
            item.pop("CapacityBlockId", None)

    handler = _rewrite_responses(ec2, "DescribeInstanceTopology", without_capacity_block)
    reader = _reader(aws, clock, table, ec2)
    cache = DynamoNodeFactsCache(aws.client("dynamodb"), table)

    # When it is read, nothing is cached but when each was asked
    incomplete = reader.read("llm-train", gb200)
    assert all(item["NetworkNodes"] and "CapacityBlockId" not in item for item in incomplete)
    assert not any(is_complete(facts) for facts in cache.get_many("llm-train", gb200).values())

    # Then the next read asks again, and caches the complete answer
    ec2.meta.events.unregister(_event("after-call", ec2, "DescribeInstanceTopology"), handler)
    complete = reader.read("llm-train", gb200)
    assert aws.calls["DescribeInstanceTopology"] == 2
    assert all(item["CapacityBlockId"] for item in complete)
    assert set(cache.get_many("llm-train", gb200)) == set(gb200)


@pytest.mark.parametrize("unknown_ids", ["error", "omit"])
def test_topology_reader_keeps_what_the_account_owns_of_a_batch(
    aws: AwsEmulator, clock: ManualClock, table: str, unknown_ids: str
) -> None:
    """HyperPod nodes in a service account next to the account's own EC2 instances, in one batch."""
    aws.client("sagemaker").create_cluster(**cluster_request())
    aws.network.expose_hyperpod_nodes = False
    aws.network.unknown_ids = unknown_ids  # type: ignore[assignment]
    hidden = _capable_ids(aws, "llm-train")
    ec2 = aws.client("ec2", config=NO_RETRIES)
    launched = ec2.run_instances(ImageId="ami-12345678", MinCount=3, MaxCount=3, InstanceType="p5.48xlarge")
    owned = sorted(i["InstanceId"] for i in launched["Instances"])
    asked = _requests(ec2, "DescribeInstanceTopology")
    reader = _reader(aws, clock, table, ec2)

    items = reader.read("mixed", hidden + owned)

    assert [item["InstanceId"] for item in items] == owned
    assert all(len(item["NetworkNodes"]) == 3 for item in items)
    assert reader.not_visible == sorted(hidden)
    # The error names the ids it refuses: one more question, for the rest; an omitting answer needs none
    expected = [sorted(hidden + owned), owned] if unknown_ids == "error" else [sorted(hidden + owned)]
    assert [r["InstanceIds"] for r in _questions(asked)] == expected


def test_hyperpod_facts_without_ec2_topology_plan_trees_flat_and_blocks_from_ultraserver_info(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    # Given a HyperPod cluster whose nodes this account's EC2 does not know
    aws.client("sagemaker").create_cluster(**cluster_request())
    aws.network.expose_hyperpod_nodes = False
    facts = HyperPodFacts(aws.client("sagemaker"), aws.client("s3"), _reader(aws, clock, table))

    # When it is read and planned
    raw = facts.read("llm-train")
    planned = plan(build_snapshot(raw, PlannerConfig()))

    # Then p5 is a tree with every node under no-topology, the UltraServer a block from UltraServerInfo
    partitions = {p.partition: p for p in planned.partitions}
    assert raw.instance_topology == []
    assert partitions["ml-p5"].kind is TopologyKind.TREE
    assert partitions["ml-p5"].nodes_without_topology == partitions["ml-p5"].nodes
    assert partitions["ml-p6e"].kind is TopologyKind.BLOCK
    assert partitions["ml-p6e"].nodes_without_topology == ()
    block = partitions["ml-p6e"].topology
    assert isinstance(block, BlockTopology) and [len(b.nodes) for b in block.blocks] == [18]
    # And the plan says what happened, in words an operator can act on
    (warning,) = [w for w in planned.warnings if "DescribeInstanceTopology" in w]
    assert "does not see 22 instance(s)" in warning and "UltraServerInfo" in warning


@pytest.mark.parametrize(
    "hostile",
    ["i-0123456789abcdef0; reboot", "sagemaker-cluster:abc_controller-i-0123456789abcdef0", "i-" + "0" * 2000],
)
def test_topology_reader_refuses_a_hostile_id_before_any_call(
    aws: AwsEmulator, clock: ManualClock, table: str, hostile: str
) -> None:
    reader = _reader(aws, clock, table)
    aws.reset_counters()
    with pytest.raises(ValueError, match="not an EC2 instance id"):
        reader.read("llm-train", ["i-0123456789abcdef0", hostile])
    assert aws.calls.total == 0  # neither the cache nor EC2 saw it


# ---------------------------------------------------------------- DynamoRateLimiter


class _SleepRecorder:
    """An injected sleep that records each wait and moves the clock by it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)

    def now(self) -> float:
        return self.clock.now().timestamp()


def test_rate_limiter_spaces_callers_one_second_apart(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    # Given two limiters (two functions) on the same table, sharing the clock
    sleep = _SleepRecorder(clock)
    first = DynamoRateLimiter(aws.client("dynamodb"), table, now=sleep.now, sleep=sleep)
    second = DynamoRateLimiter(aws.client("dynamodb"), table, now=sleep.now, sleep=sleep)
    start = sleep.now()

    # When three calls are wanted at the same instant
    granted = []
    for limiter in (first, second, first):
        limiter.acquire()
        granted.append(sleep.now() - start)

    # Then they are granted one second apart, each caller sleeping just until its slot
    assert granted == [0.0, 1.0, 2.0]
    assert sleep.waits == [1.0, 1.0]

    # And a caller that comes after the last slot does not wait
    clock.advance(5)
    second.acquire()
    assert sleep.waits == [1.0, 1.0]


def test_rate_limiter_retries_when_another_caller_takes_the_slot(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    # Given limiter A has read the token, and limiter B takes the slot before A writes it
    sleep = _SleepRecorder(clock)
    other = DynamoRateLimiter(aws.client("dynamodb"), table, now=sleep.now, sleep=sleep)
    mine_client = aws.client("dynamodb")
    raced: list[bool] = []

    def other_goes_first(**_: Any) -> None:
        if not raced:
            raced.append(True)
            other.acquire()

    mine_client.meta.events.register("before-call.dynamodb.PutItem", other_goes_first)
    mine = DynamoRateLimiter(mine_client, table, now=sleep.now, sleep=sleep)
    start = sleep.now()
    aws.reset_counters()

    # When A acquires
    mine.acquire()

    # Then A's conditional write failed once, A read again and took the next slot
    assert aws.calls["PutItem"] == 3  # B's, A's refused one, A's retry
    assert sleep.waits == [1.0]
    token = aws.client("dynamodb").get_item(
        TableName=table, Key={"pk": {"S": "RATE#DescribeInstanceTopology"}, "sk": {"S": "RATE"}}
    )["Item"]
    assert float(token["next_at"]["N"]) == start + 2


# ---------------------------------------------------------------- DynamoStateStore and DynamoNodeFactsCache


def test_record_change_counts_atomically_across_stores(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    # Given two stores (ingest invocations) on the same table
    stores = [DynamoStateStore(aws.client("dynamodb"), table), DynamoStateStore(aws.client("dynamodb"), table)]
    first_at = clock.now()

    # When they record changes in turn
    generations = []
    for number in range(10):
        clock.advance(1)
        generations.append(
            stores[number % 2].record_change("llm-train", _trigger(number, clock), clock.now()).generation
        )

    # Then every change counted once, in order, and both see the same state
    assert generations == list(range(1, 11))
    state = stores[0].get("llm-train")
    assert state == stores[1].get("llm-train")
    assert (state.generation, state.trigger_count) == (10, 10)
    assert [t.event_id for t in state.triggers] == [f"event-{n}" for n in range(10)]
    assert state.first_pending_at == first_at + timedelta(seconds=1)
    assert state.last_event_at == clock.now()


def test_record_change_keeps_the_first_triggers_and_counts_all(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    store = DynamoStateStore(aws.client("dynamodb"), table)
    for number in range(MAX_TRIGGERS + 5):
        last = store.record_change("llm-train", _trigger(number, clock), clock.now())

    assert (last.generation, last.trigger_count, len(last.triggers)) == (25, 25, MAX_TRIGGERS)
    state = store.get("llm-train")
    assert (state.generation, state.trigger_count) == (25, 25)
    assert [t.event_id for t in state.triggers] == [f"event-{n}" for n in range(MAX_TRIGGERS)]


def test_the_registration_record_is_kept_per_instance_beside_the_state(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    store = DynamoStateStore(aws.client("dynamodb"), table)
    store.record_change("pcluster", _trigger(1, clock), clock.now())
    published = {f"i-{n:017x}": f"{n:016x}" for n in range(1, 41)}  # more than one 25-item BatchWriteItem
    store.record_registrations("pcluster", published, ())
    store.record_registrations("other", {f"i-{1:017x}": "0" * 16}, ())

    store.record_registrations("pcluster", {f"i-{1:017x}": "f" * 16}, [f"i-{2:017x}", f"i-{99:017x}"])

    expected = {**published, f"i-{1:017x}": "f" * 16}
    del expected[f"i-{2:017x}"]
    assert store.registrations("pcluster") == expected
    assert store.registrations("other") == {f"i-{1:017x}": "0" * 16}
    assert store.get("pcluster").generation == 1  # the state item is another item of the partition


def test_save_refuses_a_stale_version_and_never_clobbers_the_change_counter(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    store = DynamoStateStore(aws.client("dynamodb"), table)
    read = store.get("llm-train")
    assert read.version == 0

    # A change recorded between read and save is not a conflict, and survives the save
    store.record_change("llm-train", _trigger(1, clock), clock.now())
    saved = store.save(read.model_copy(update={"desired_sha256": "a" * 64}))
    assert saved.version == 1

    # A second save from the same (now stale) read is refused
    with pytest.raises(ConcurrentUpdate):
        store.save(read.model_copy(update={"desired_sha256": "b" * 64}))

    state = store.get("llm-train")
    assert (state.desired_sha256, state.version, state.generation, state.trigger_count) == ("a" * 64, 1, 1, 1)
    assert store.save(state.model_copy(update={"reconciled_generation": 1})).version == 2


def test_save_sends_the_node_table_only_when_the_stored_one_differs(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    """The table is written by saves alone and each save bumps the version: a save conditioned on the version
    it read need not send the same table again. Any other table, or a version moved by another store, is sent."""
    sent: list[bool] = []  # per save: did it send the table

    def saves(params: dict[str, Any], **_: Any) -> None:
        if params["UpdateExpression"].startswith("SET controller"):
            sent.append(f"{NODE_TABLE_ATTRIBUTE} =" in params["UpdateExpression"])

    def store() -> DynamoStateStore:
        db = aws.client("dynamodb")
        db.meta.events.register("provide-client-params.dynamodb.UpdateItem", saves)
        return DynamoStateStore(db, table)

    rows = [SlurmNodeRecord(name=f"n{i}", address=f"10.0.0.{i}", partitions=["p"]) for i in range(3)]
    first, second = store(), store()
    saved = first.save(first.get("pc").model_copy(update={"slurm_nodes": rows}))
    saved = first.save(saved.model_copy(update={"desired_sha256": "a" * 64}))  # the same table, as saved
    changed = first.record_change("pc", _trigger(1, clock), clock.now())  # returns the item, table and all
    saved = first.save(changed.model_copy(update={"desired_sha256": "b" * 64}))  # as the change read it
    second.save(second.get("pc").model_copy(update={"desired_sha256": "c" * 64}))  # as another store read it
    assert sent == [True, False, False, False]

    moved = [*rows[:2], rows[2].model_copy(update={"address": "10.0.0.9"})]  # one row changed, same length
    second.save(second.get("pc").model_copy(update={"slurm_nodes": moved}))
    assert second.get("pc").slurm_nodes == moved
    # The first store last saw the old table at an older version: it sends its table, and it is stored
    stale = saved.model_copy(update={"version": second.get("pc").version})
    first.save(stale)
    assert sent[-1] is True and first.get("pc").slurm_nodes == rows and second.get("pc").slurm_nodes == rows


def test_a_state_item_made_anew_gets_the_node_table_again(aws: AwsEmulator, table: str) -> None:
    """The item is deleted (a table rebuilt) and made anew without a node table while a store still remembers
    the table it saved at that version: the save that would not send the table is refused, and one read again
    sends it."""
    db = aws.client("dynamodb")
    first, second = DynamoStateStore(db, table), DynamoStateStore(db, table)
    rows = [SlurmNodeRecord(name=f"n{i}", address=f"10.0.0.{i}", partitions=["p"]) for i in range(3)]
    saved = first.save(first.get("pc").model_copy(update={"slurm_nodes": rows}))  # version 1, with the table
    db.delete_item(TableName=table, Key=cluster_key("pc"))
    second.save(second.get("pc"))  # version 1 again, no table
    # A state read before the deletion, at the version the new item has: the condition refuses a save that
    # would not send the table to an item without one
    with pytest.raises(ConcurrentUpdate):
        first.save(saved.model_copy(update={"version": 1}))
    assert first.get("pc").slurm_nodes is None
    # Read again (no table), the table learnt again is sent and stored
    first.save(first.get("pc").model_copy(update={"slurm_nodes": rows}))
    assert second.get("pc").slurm_nodes == rows


def test_consume_triggers_only_when_no_newer_change_arrived(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    store = DynamoStateStore(aws.client("dynamodb"), table)
    for number in range(3):
        store.record_change("llm-train", _trigger(number, clock), clock.now())

    # A reconcile that took generation 2 finds generation 3: the triggers stay for the next one
    store.consume_triggers("llm-train", 2)
    kept = store.get("llm-train")
    assert (len(kept.triggers), kept.trigger_count, kept.first_pending_at) == (3, 3, clock.now())

    # A reconcile that took generation 3 clears them
    store.consume_triggers("llm-train", 3)
    cleared = store.get("llm-train")
    assert (cleared.triggers, cleared.trigger_count, cleared.first_pending_at) == ([], 0, None)
    assert cleared.generation == 3


def test_an_event_is_seen_once_marked(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    stores = [DynamoStateStore(aws.client("dynamodb"), table), DynamoStateStore(aws.client("dynamodb"), table)]
    assert stores[0].seen("a1b2c3") is False
    stores[0].mark_seen("a1b2c3", clock.now())
    assert stores[1].seen("a1b2c3") is True
    assert stores[1].seen("d4e5f6") is False
    marker = aws.client("dynamodb").get_item(TableName=table, Key={"pk": {"S": "EVENT#a1b2c3"}, "sk": {"S": "EVENT"}})
    assert int(marker["Item"]["expires_at"]["N"]) == int((clock.now() + timedelta(days=1)).timestamp())


def test_node_facts_cache_round_trips_250_items_in_batches(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    cache = DynamoNodeFactsCache(aws.client("dynamodb"), table)
    facts: dict[str, dict[str, object]] = {
        f"i-{n:017x}": {
            "InstanceId": f"i-{n:017x}",
            "InstanceType": "p5.48xlarge",
            "NetworkNodes": ["nn-top", f"nn-spine{n // 32}", f"nn-leaf{n // 8}"],
            "AvailabilityZone": "us-east-1a",
        }
        for n in range(250)
    }
    aws.reset_counters()

    cache.put_many("llm-train", facts, clock.now())
    found = cache.get_many("llm-train", [*facts, "i-0000000000000ffff", "i-0000000000000fffe"])

    assert found == facts
    assert aws.calls["BatchWriteItem"] == 10  # 25 per call
    assert aws.calls["BatchGetItem"] == 3  # 100 keys per call
    assert cache.get_many("other-cluster", list(facts)[:5]) == {}


# ---------------------------------------------------------------- AuditTrail


def _records(rendered: RenderedPlan, reference: str, clock: ManualClock) -> list[AuditRecord]:
    document = json.loads(rendered.files()["plan.json"])
    handle_fields = {
        "channel": Channel.SSM,
        "cluster": "test-cluster",
        "plan_sha256": rendered.sha256,
        "reference": reference,
        "target": "i-0123456789abcdef0",
        "sent_at": clock.now(),
    }
    delivery = PendingDelivery.model_validate({"handle": handle_fields, "generation": 3})
    return build_records(
        cluster_name="test-cluster",
        previous=None,
        desired=document,
        delivery=delivery,
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=clock.now(),
    )


def test_audit_trail_publishes_and_stores_each_record_once(
    aws: AwsEmulator, clock: ManualClock, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a rule that sends UpdatePartitionTopology events to a queue, and two new records
    inbox = subscribe(aws, "audit-inbox", {"source": ["topokeeper"], "detail-type": ["UpdatePartitionTopology"]})
    trail = AuditTrail(
        dynamodb=aws.client("dynamodb"),
        table=table,
        events=aws.client("events"),
        event_bus="default",
        retention=timedelta(days=365),
        logger=logging.getLogger("tests.audit"),
    )
    records = _records(_rendered(), "cmd-1", clock)
    assert [r.partition for r in records] == ["gb", "p5"]

    # When they are published
    with caplog.at_level(logging.INFO, logger="tests.audit"):
        assert trail.publish(records) == 2

    # Then each reached EventBridge once, and was logged once
    events = drain(aws, inbox)
    assert sorted(e["detail"]["audit_id"] for e in events) == sorted(r.audit_id for r in records)
    published = {e["detail"]["audit_id"]: e["detail"] for e in events}
    assert all(published[r.audit_id] == r.document() for r in records)
    assert len([r for r in caplog.records if r.getMessage() == "UpdatePartitionTopology"]) == 2

    # When the same records are published again (a retried result), nothing new goes anywhere
    aws.reset_counters()
    assert trail.publish(records) == 0
    assert drain(aws, inbox) == []
    assert aws.calls["PutEvents"] == aws.calls["TransactWriteItems"] == 0

    # And a batch with one new record publishes only that one
    clock.advance(60)
    (newer, *_) = _records(_rendered(), "cmd-2", clock)
    assert trail.publish([*records, newer]) == 1
    assert [e["detail"]["audit_id"] for e in drain(aws, inbox)] == [newer.audit_id]


def _trail(aws: AwsEmulator, table: str, events: Any = None) -> AuditTrail:
    return AuditTrail(
        dynamodb=aws.client("dynamodb", config=NO_RETRIES),
        table=table,
        events=events or aws.client("events", config=NO_RETRIES),
        event_bus="default",
        retention=timedelta(days=365),
        logger=logging.getLogger("tests.audit"),
    )


def _large(record: AuditRecord, index: int, names: int, name_length: int) -> AuditRecord:
    added = [f"n{index:02d}-{i:04d}-".ljust(name_length, "x") for i in range(names)]
    return record.model_copy(
        update={"audit_id": f"{index:032d}", "nodes_added": added, "nodes_added_count": names, "node_count": names}
    )


def test_audit_trail_batches_put_events_by_size(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    # Given ten records of about 60 KB each: one PutEvents of ten would be 600 KB, which EventBridge refuses
    inbox = subscribe(aws, "audit-inbox", {"source": ["topokeeper"]})
    base = _records(_rendered(), "cmd-1", clock)[0]
    records = [_large(base, index, names=200, name_length=300) for index in range(10)]
    events = aws.client("events", config=NO_RETRIES)
    requests = _requests(events, "PutEvents")
    trail = _trail(aws, table, events)

    # When they are published
    assert trail.publish(records) == 10

    # Then each went out whole, in requests of at most 10 entries totalling under 256 KB
    sizes = [sum(put_events_entry_size(entry) for entry in request["Entries"]) for request in requests]
    assert len(requests) == aws.calls["PutEvents"] >= 3
    assert all(size < PUT_EVENTS_MAX_BYTES for size in sizes) and sum(sizes) > 600_000
    published = {e["detail"]["audit_id"]: e["detail"] for e in drain(aws, inbox)}
    assert published == {r.audit_id: r.document() for r in records}


def test_an_audit_record_too_large_for_eventbridge_is_trimmed_never_dropped(
    aws: AwsEmulator, clock: ManualClock, table: str
) -> None:
    # Given one record of about 300 KB (longer than any entry EventBridge takes)
    inbox = subscribe(aws, "audit-inbox", {"source": ["topokeeper"]})
    record = _large(_records(_rendered(), "cmd-1", clock)[0], 1, names=200, name_length=1500)
    assert len(json.dumps(record.document())) > 300_000

    # When it is published
    assert _trail(aws, table).publish([record]) == 1

    # Then EventBridge got it with its node list cut and everything else intact
    (event,) = drain(aws, inbox)
    detail = event["detail"]
    assert 0 < len(detail["nodes_added"]) < 200
    assert detail["nodes_added"] == record.nodes_added[: len(detail["nodes_added"])]
    assert detail == {**record.document(), "nodes_added": detail["nodes_added"]}
    assert (detail["nodes_added_count"], detail["after_sha256"]) == (200, record.after_sha256)
    # And the history keeps the whole record
    assert _trail(aws, table).history(record.cluster_name) == [record.document()]


def test_audit_history_is_newest_first(aws: AwsEmulator, clock: ManualClock, table: str) -> None:
    trail = AuditTrail(
        dynamodb=aws.client("dynamodb"),
        table=table,
        events=aws.client("events"),
        event_bus="default",
        retention=timedelta(days=365),
        logger=logging.getLogger("tests.audit"),
    )
    published: list[AuditRecord] = []
    for number in range(3):
        clock.advance(3600)
        batch = _records(_rendered(8 + number), f"cmd-{number}", clock)
        trail.publish(batch)
        published += batch

    history = trail.history("test-cluster")

    assert len(history) == 6
    completed = [entry["completed_at"] for entry in history]
    assert completed == sorted(completed, reverse=True)
    assert {entry["audit_id"] for entry in history[:2]} == {r.audit_id for r in published[-2:]}
    assert [entry["audit_id"] for entry in trail.history("test-cluster", limit=2)] == [
        entry["audit_id"] for entry in history[:2]
    ]
    assert trail.history("another-cluster") == []


# ---------------------------------------------------------------- S3PlanStore


def test_plan_store_round_trips_bundle_and_plan(aws: AwsEmulator, bucket: str) -> None:
    rendered = _rendered()
    store = S3PlanStore(aws.client("s3"), bucket)

    prefix = store.put("test-cluster", rendered.bundle, rendered.files()["plan.json"])

    assert prefix == f"plans/test-cluster/{rendered.sha256}/"
    assert store.bundle("test-cluster", rendered.sha256) == rendered.bundle
    assert store.plan_document("test-cluster", rendered.sha256) == json.loads(rendered.files()["plan.json"])
    head = aws.client("s3").head_object(Bucket=bucket, Key=prefix + "bundle.json")
    assert head["ContentType"] == "application/json"


def test_plan_store_writes_registration_entries_under_the_clusters_prefix_encrypted(
    aws: AwsEmulator, bucket: str
) -> None:
    s3 = aws.client("s3")
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration=KMS_DEFAULT_ENCRYPTION)
    entries = {f"i-{n:017x}": f'{{"n":{n}}}' for n in range(1, 12)}

    S3PlanStore(s3, bucket).put_registrations("test-cluster", entries)

    for instance, text in entries.items():
        stored = s3.get_object(Bucket=bucket, Key=registration_key("test-cluster", instance))
        assert stored["Body"].read().decode() == text
        assert stored["ServerSideEncryption"] == "aws:kms"
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="clusters/test-cluster/registration/")["KeyCount"]
    assert listed == len(entries)


def test_a_deleted_registration_entry_is_no_longer_readable(aws: AwsEmulator, bucket: str) -> None:
    # The bucket is versioned: the delete leaves a marker, and GetObject (all the node policy grants) finds nothing.
    s3 = aws.client("s3")
    store = S3PlanStore(s3, bucket)
    store.put_registrations("test-cluster", {f"i-{n:017x}": "{}" for n in (1, 2)})

    store.delete_registrations("test-cluster", [f"i-{1:017x}", f"i-{9:017x}"])  # 9: never put, no error

    with pytest.raises(ClientError, match="NoSuchKey"):
        s3.get_object(Bucket=bucket, Key=registration_key("test-cluster", f"i-{1:017x}"))
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="clusters/test-cluster/registration/")
    assert [item["Key"] for item in listed["Contents"]] == [registration_key("test-cluster", f"i-{2:017x}")]


# ---------------------------------------------------------------- SqsWorkQueue


@pytest.fixture
def queues(aws: AwsEmulator) -> tuple[str, str]:
    """The FIFO work queue and its FIFO dead-letter queue, as the stack makes them."""
    sqs = aws.client("sqs")
    fifo = {"FifoQueue": "true"}
    dead_letters = sqs.create_queue(QueueName="topokeeper-work-dlq.fifo", Attributes=fifo)["QueueUrl"]
    work = sqs.create_queue(QueueName="topokeeper-work.fifo", Attributes=fifo)["QueueUrl"]
    return str(work), str(dead_letters)


def _receive(aws: AwsEmulator, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    response = aws.client("sqs").receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=0,
        MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId"],
        MessageAttributeNames=["All"],
        **kwargs,
    )
    return list(response.get("Messages", []))


def test_work_queue_keeps_one_message_per_cluster_and_cycle(aws: AwsEmulator, queues: tuple[str, str]) -> None:
    work, _ = queues
    queue = SqsWorkQueue(aws.client("sqs"), work)

    # Given three changes of one cluster in one cycle (since=0), and one of another cluster
    for generation in (1, 2, 3):
        queue.send(ReconcileRequest(cluster="llm-train", generation=generation, since=0))
    queue.send(ReconcileRequest(cluster="cfd", generation=1, since=0))

    # When the queue is read, SQS has deduplicated them into one message per cluster
    messages = _receive(aws, work)
    by_group = {m["Attributes"]["MessageGroupId"]: m for m in messages}
    assert sorted(by_group) == ["cfd", "llm-train"]
    assert json.loads(by_group["llm-train"]["Body"])["generation"] == 1
    assert by_group["llm-train"]["Attributes"]["MessageDeduplicationId"] == "llm-train:after:0"

    # Then a change after the next reconcile (since=3) is a new message
    sqs = aws.client("sqs")
    for message in messages:
        sqs.delete_message(QueueUrl=work, ReceiptHandle=message["ReceiptHandle"])
    queue.send(ReconcileRequest(cluster="llm-train", generation=4, since=3))
    (next_cycle,) = _receive(aws, work)
    assert ReconcileRequest.model_validate_json(next_cycle["Body"]).generation == 4


def test_work_queue_defer_hides_the_message(aws: AwsEmulator, queues: tuple[str, str]) -> None:
    work, _ = queues
    sqs = aws.client("sqs")
    visibility = _requests(sqs, "ChangeMessageVisibility")
    queue = SqsWorkQueue(sqs, work)
    queue.send(ReconcileRequest(cluster="llm-train", generation=1))
    # received with no visibility timeout of its own: it would be back at once
    (message,) = _receive(aws, work, VisibilityTimeout=0)

    queue.defer(message["ReceiptHandle"], 119.6)

    assert _receive(aws, work) == []
    attributes = sqs.get_queue_attributes(QueueUrl=work, AttributeNames=["All"])["Attributes"]
    assert (attributes["ApproximateNumberOfMessages"], attributes["ApproximateNumberOfMessagesNotVisible"]) == (
        "0",
        "1",
    )
    queue.defer(message["ReceiptHandle"], 0.2)  # whole seconds, at least one
    assert [r["VisibilityTimeout"] for r in visibility] == [120, 1]


def test_work_queue_resume_brings_a_deferred_message_back_and_ignores_a_deleted_one(
    aws: AwsEmulator, queues: tuple[str, str]
) -> None:
    work, _ = queues
    sqs = aws.client("sqs")
    queue = SqsWorkQueue(sqs, work)
    queue.send(ReconcileRequest(cluster="llm-train", generation=1))
    (message,) = _receive(aws, work, VisibilityTimeout=0)
    queue.defer(message["ReceiptHandle"], 1500)
    assert _receive(aws, work) == []

    queue.resume(message["ReceiptHandle"])
    (again,) = _receive(aws, work, VisibilityTimeout=600)
    assert again["MessageId"] == message["MessageId"]

    sqs.delete_message(QueueUrl=work, ReceiptHandle=again["ReceiptHandle"])
    queue.resume(again["ReceiptHandle"])  # its delivery's result came after the message was done: no error
    with pytest.raises(Retryable):  # any other refusal is still an error
        SqsWorkQueue(sqs, work + "-missing").resume(again["ReceiptHandle"])


def test_work_queue_dead_letters_with_the_reason(aws: AwsEmulator, queues: tuple[str, str]) -> None:
    work, dead_letters = queues
    queue = SqsWorkQueue(aws.client("sqs"), work, dead_letters)
    body = '{"cluster": "llm-train", "generation": 0}'

    queue.dead_letter(body, "generation: Input should be greater than or equal to 1")
    queue.dead_letter("not json", "x" * 5000)

    parked = _receive(aws, dead_letters)
    assert [m["Body"] for m in parked] == [body, "not json"]
    reasons = [m["MessageAttributes"]["reason"] for m in parked]
    assert reasons[0] == {
        "DataType": "String",
        "StringValue": "generation: Input should be greater than or equal to 1",
    }
    assert len(reasons[1]["StringValue"]) == 1000
    assert {m["Attributes"]["MessageGroupId"] for m in parked} == {"malformed"}
    assert _receive(aws, work) == []
    with pytest.raises(Permanent, match="no dead-letter queue configured for: broken"):
        SqsWorkQueue(aws.client("sqs"), work).dead_letter(body, "broken")


# ---------------------------------------------------------------- AgentChannel


def _agent_channel(aws: AwsEmulator, clock: ManualClock, table: str, bucket: str) -> AgentChannel:
    state = DynamoStateStore(aws.client("dynamodb"), table)
    return AgentChannel(
        aws.client("s3"), bucket, state, now=clock.now, max_report_age=timedelta(minutes=30), verify_only=True
    )


def test_agent_channel_delivers_a_versioned_bundle(
    aws: AwsEmulator, clock: ManualClock, table: str, bucket: str
) -> None:
    channel = _agent_channel(aws, clock, table, bucket)
    bundle = _rendered().bundle
    s3 = aws.client("s3")

    handle = channel.deliver(bundle)

    key = agent_bundle_key("test-cluster")
    assert key == "clusters/test-cluster/bundle.json"
    head = s3.head_object(Bucket=bucket, Key=key)
    assert handle.reference == head["VersionId"]
    assert head["Metadata"] == {"plan-sha256": bundle.plan_sha256}
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert Bundle.model_validate_json(body) == bundle
    assert (handle.channel, handle.cluster, handle.plan_sha256) == (Channel.AGENT, "test-cluster", bundle.plan_sha256)
    assert (handle.target, handle.sent_at) == (f"s3://{bucket}/{key}", clock.now())
    assert channel.deliver(bundle).reference != handle.reference  # each delivery is a version of its own


def test_agent_channel_asks_for_a_fresh_verify_rather_than_answer_with_its_last_report(
    aws: AwsEmulator, clock: ManualClock, table: str, bucket: str
) -> None:
    channel = _agent_channel(aws, clock, table, bucket)
    state = DynamoStateStore(aws.client("dynamodb"), table)
    bundle = _rendered().bundle
    last = ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0", mode="verify", plan_sha256=bundle.plan_sha256)
    save_fields(state, "test-cluster", {"last_verify": last, "last_verify_at": clock.now()})
    assert channel.verify(bundle) == last  # the schedule's check takes the agent's recent report

    asked = channel.verify(bundle, request="vr-1")  # HyperPod just changed the topology: that report is stale

    assert (asked.outcome, asked.error) == (Outcome.PENDING, "asked the agent for a fresh verify (request vr-1)")
    body = aws.client("s3").get_object(Bucket=bucket, Key=agent_verify_request_key("test-cluster"))["Body"].read()
    request = json.loads(body)
    assert (request["request_id"], request["plan_sha256"]) == ("vr-1", bundle.plan_sha256)
    assert agent_verify_request_key("test-cluster") == "clusters/test-cluster/verify-request.json"


def test_agent_channel_verify_writes_once_and_waits_for_a_fresh_report(
    aws: AwsEmulator, clock: ManualClock, table: str, bucket: str
) -> None:
    channel = _agent_channel(aws, clock, table, bucket)
    state = DynamoStateStore(aws.client("dynamodb"), table)
    bundle = _rendered().bundle
    s3 = aws.client("s3")
    key = agent_verify_key("test-cluster")

    # Given no report yet: the plan is written for the agent, and the answer is PENDING
    first = channel.verify(bundle)
    assert (first.outcome, first.error) == (Outcome.PENDING, "the agent has not reported a verify result yet")
    written = s3.head_object(Bucket=bucket, Key=key)
    assert written["Metadata"] == {"plan-sha256": bundle.plan_sha256}

    # When verify is asked again for the same plan, the object is not rewritten
    assert channel.verify(bundle).outcome is Outcome.PENDING
    versions = s3.list_object_versions(Bucket=bucket, Prefix=key)["Versions"]
    assert [v["VersionId"] for v in versions] == [written["VersionId"]]

    # A report about another plan does not count
    other = ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0", mode="verify", plan_sha256="0" * 64)
    save_fields(state, "test-cluster", {"last_verify": other, "last_verify_at": clock.now()})
    assert channel.verify(bundle).error == "the agent's last verify was for another plan"

    # Then a fresh report for this plan is the answer
    report = ApplyResult(
        outcome=Outcome.DRIFT,
        applier_version="1.0.0",
        mode="verify",
        plan_sha256=bundle.plan_sha256,
        drift=[{"kind": "x"}],
    )
    save_fields(state, "test-cluster", {"last_verify": report, "last_verify_at": clock.now()})
    assert channel.verify(bundle) == report

    # And once it is older than the allowed age, it is PENDING again
    clock.advance(31 * 60)
    stale = channel.verify(bundle)
    assert stale.outcome is Outcome.PENDING
    assert stale.error is not None and "older than" in stale.error
    assert len(s3.list_object_versions(Bucket=bucket, Prefix=key)["Versions"]) == 1

    # A new plan is written as a new version
    newer = _rendered(9).bundle
    channel.verify(newer)
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == {"plan-sha256": newer.plan_sha256}
    assert len(s3.list_object_versions(Bucket=bucket, Prefix=key)["Versions"]) == 2


# ---------------------------------------------------------------- SsmChannel


def _payload(invocation: CommandInvocationRequest) -> dict[str, Any]:
    return _decode_commands(invocation.commands)


def _decode_commands(commands: list[str]) -> dict[str, Any]:
    start = commands.index("cat > \"$work/payload\" <<'TOPOKEEPER_PAYLOAD_END'") + 1
    end = commands.index("TOPOKEEPER_PAYLOAD_END")
    document: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode("".join(commands[start:end]))))
    return document


def _ssm_channel(aws: AwsEmulator, clock: ManualClock, bucket: str, sleep: Callable[[float], None]) -> SsmChannel:
    aws.ssm.register_managed_instance(HEAD_NODE)
    # The applier travels through the bucket, by a SigV4 presigned URL as the Lambda makes it.
    s3 = aws.client("s3", config=PRESIGN_CONFIG)
    return SsmChannel(
        aws.client("ssm"),
        s3,
        bucket,
        HEAD_NODE,
        cluster="test-cluster",
        now=clock.now,
        sleep=sleep,
        sender=_sender(aws),
    )


def _sender(aws: AwsEmulator) -> Any:
    return aws.client("ssm", config=SEND_COMMAND_CONFIG)


def test_ssm_channel_delivers_to_the_head_node_and_reads_the_applier_document(
    aws: AwsEmulator, clock: ManualClock, bucket: str
) -> None:
    # Given a head node that answers with the applier's document after a login banner
    bundle = _rendered().bundle
    seen: list[CommandInvocationRequest] = []
    applied = {
        "outcome": "applied",
        "applier_version": "1.0.0",
        "mode": "apply",
        "plan_sha256": bundle.plan_sha256,
        "partitions_changed": ["gb", "p5"],
        "reconfigured": True,
    }

    def head_node(invocation: CommandInvocationRequest) -> CommandOutcome:
        seen.append(invocation)
        return CommandOutcome("Success", 0, "Welcome to the head node\n" + json.dumps(applied) + "\n", "")

    aws.ssm.on_command = head_node
    channel = _ssm_channel(aws, clock, bucket, sleep=lambda _: pytest.fail("result() must not wait"))

    # When the bundle is delivered
    handle = channel.deliver(bundle)

    # Then one AWS-RunShellScript went to the head node's id, carrying this bundle in apply mode
    (invocation,) = seen
    assert (invocation.instance_id, invocation.document_name) == (HEAD_NODE, RUN_SHELL_DOCUMENT)
    assert (handle.reference, handle.target, handle.channel) == (invocation.command_id, HEAD_NODE, Channel.SSM)
    payload = _payload(invocation)
    assert payload["mode"] == "apply"
    assert Bundle.model_validate_json(payload["bundle"]) == bundle
    assert invocation.parameters["executionTimeout"] == ["600"]

    # And the result is the applier's document
    result = channel.result(handle.reference)
    assert result.outcome is Outcome.APPLIED
    assert (result.plan_sha256, result.partitions_changed, result.reconfigured) == (
        bundle.plan_sha256,
        ["gb", "p5"],
        True,
    )


@pytest.mark.parametrize("sigv4", [True, False], ids=["presigning_s3", "default-client"])
def test_ssm_channel_presigns_sigv4_urls_the_kms_bucket_serves(
    aws: AwsEmulator, clock: ManualClock, bucket: str, monkeypatch: pytest.MonkeyPatch, sigv4: bool
) -> None:
    """The program and a bundle too large to ride inline are fetched by presigned URL; S3 serves a KMS object
    only to SigV4."""
    aws.client("s3").put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration=KMS_DEFAULT_ENCRYPTION)
    # Small enough that neither rides inline: both travel through the bucket.
    monkeypatch.setattr(ssm_channel, "INLINE_LIMIT_BYTES", 3_500)
    for key, value in aws.env().items():
        monkeypatch.setenv(key, value)
    clear_clients()
    s3 = presigning_s3() if sigv4 else client("s3")
    channel = SsmChannel(
        aws.client("ssm"), s3, bucket, HEAD_NODE, cluster="test-cluster", now=clock.now, sender=_sender(aws)
    )
    bundle = _rendered(p5_count=40).bundle
    try:
        if not sigv4:
            with pytest.raises(Permanent, match="not SigV4"):
                channel.payload(bundle, "apply")
            return
        payloads = [_decode_commands(channel.payload(bundle, mode)) for mode in ("apply", "verify")]
    finally:
        clear_clients()
    expected = {"bundle": json.dumps(bundle.document(), sort_keys=True).encode(), "program": program_bytes()}
    for payload in payloads:
        for field, data in expected.items():
            url = payload[f"{field}_url"]
            assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in urllib.parse.urlsplit(url).query
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the emulator's http URL
                assert response.read() == data


def test_ssm_channel_maps_failures_and_statuses_without_a_document(
    aws: AwsEmulator, clock: ManualClock, bucket: str
) -> None:
    bundle = _rendered().bundle
    channel = _ssm_channel(aws, clock, bucket, sleep=lambda _: None)

    # A failed command without a document is FAILED, with the exit code and stderr
    aws.ssm.on_command = lambda _: CommandOutcome("Failed", 127, "", "bash: python3: command not found")
    failed = channel.result(channel.deliver(bundle).reference)
    assert failed.outcome is Outcome.FAILED
    assert failed.error is not None
    assert "exit 127" in failed.error
    assert "python3: command not found" in failed.error

    # A command still running is PENDING; one that timed out is TIMED_OUT
    aws.ssm.on_command = lambda _: None
    running = channel.deliver(bundle).reference
    assert channel.result(running).outcome is Outcome.PENDING
    aws.ssm.complete(running, status="TimedOut", response_code=124)
    timed_out = channel.result(running)
    assert timed_out.outcome is Outcome.TIMED_OUT
    assert timed_out.error is not None and "TimedOut" in timed_out.error


def test_ssm_channel_verify_polls_until_the_document_arrives(aws: AwsEmulator, clock: ManualClock, bucket: str) -> None:
    bundle = _rendered().bundle
    in_sync = {"outcome": "in_sync", "applier_version": "1.0.0", "mode": "verify", "plan_sha256": bundle.plan_sha256}
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the head node finishes while the channel waits
        waits.append(seconds)
        for pending in aws.ssm.pending():
            aws.ssm.complete(pending.command_id, stdout=json.dumps(in_sync))

    aws.ssm.on_command = lambda _: None
    channel = _ssm_channel(aws, clock, bucket, sleep=sleep)

    result = channel.verify(bundle)

    assert (result.outcome, result.mode, result.plan_sha256) == (Outcome.IN_SYNC, "verify", bundle.plan_sha256)
    assert waits == [2]
    (command,) = aws.client("ssm").list_commands()["Commands"]
    assert command["Comment"].startswith("topokeeper verify test-cluster ")


def test_ssm_channel_cannot_reach_an_unregistered_node(aws: AwsEmulator, clock: ManualClock, bucket: str) -> None:
    s3 = aws.client("s3", config=PRESIGN_CONFIG)
    channel = SsmChannel(
        aws.client("ssm"),
        s3,
        bucket,
        "mi-0fedcba9876543210",
        cluster="test-cluster",
        now=clock.now,
        sender=_sender(aws),
    )
    with pytest.raises(Retryable) as info:  # AWS answered: no command was created
        channel.deliver(_rendered().bundle)
    assert info.value.code == "InvalidInstanceId"


def test_cluster_state_defaults_for_an_unknown_cluster(aws: AwsEmulator, table: str) -> None:
    assert DynamoStateStore(aws.client("dynamodb"), table).get("never-seen") == ClusterState(cluster="never-seen")
