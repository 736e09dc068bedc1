"""Discovery that cannot finish in one invocation: DescribeInstanceTopology at 1 call/s, 20 instances a page.

The real ``InstanceTopologyReader`` runs against a paged EC2 stand-in whose every call costs one second of
the fake clock; the reconcile use case runs on the in-memory ports.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.fakes import FakeClock, FakeFacts, MemoryNodeFactsCache
from tests.helpers import p5_nodes, snapshot
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.adapters.ec2 import InstanceTopologyReader
from topokeeper.adapters.hyperpod import HyperPodFacts
from topokeeper.contract.config import Settings
from topokeeper.contract.ports import ApplyResult, Outcome
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import AwsSnapshot
from topokeeper.render.bundle import render
from topokeeper.service.controller import reconcile
from topokeeper.service.reconcile import MAX_TOPOLOGY_RETRIES
from topokeeper.service.result import record_result
from topokeeper.wiring import runtime as runtime_module
from topokeeper.wiring.runtime import (
    AFTER_DISCOVERY_SECONDS,
    AFTER_READ_SECONDS,
    DRIFT_DISCOVERY_SECONDS,
    LambdaEnvironment,
    Runtime,
)

PAGE = 20  # DescribeInstanceTopology's page when instance ids are given


class PagedEc2:
    """DescribeInstanceTopology with ids: pages of 20 in id order, the token naming the last id answered."""

    def __init__(self, not_yet: set[str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.not_yet = not_yet or set()  # answered without network nodes ("not yet reported")

    def describe_instance_topology(self, InstanceIds: list[str], NextToken: str = "") -> dict[str, Any]:
        assert len(InstanceIds) <= 100
        self.calls.append(InstanceIds)
        remaining = [i for i in sorted(InstanceIds) if i > NextToken]
        page = remaining[:PAGE]
        items = [
            {
                "InstanceId": i,
                "InstanceType": "p5.48xlarge",
                "NetworkNodes": [] if i in self.not_yet else ["nn-s", "nn-b", f"nn-l{int(i[2:], 16) // 4}"],
            }
            for i in page
        ]
        return {"Instances": items, **({"NextToken": page[-1]} if len(remaining) > PAGE else {})}


class OneCallPerSecond:
    """The account's bucket: each call waits a second of the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def acquire(self) -> None:
        self.clock.advance(1)


def _reader(clock: FakeClock, ec2: PagedEc2, cache: MemoryNodeFactsCache) -> InstanceTopologyReader:
    return InstanceTopologyReader(ec2, cache, OneCallPerSecond(clock), clock.now)


IDS = [f"i-{n:017x}" for n in range(1, 1001)]


def test_a_read_cut_short_by_its_deadline_keeps_what_it_asked_and_the_next_goes_on() -> None:
    clock, ec2, cache = FakeClock(), PagedEc2(), MemoryNodeFactsCache()
    reader = _reader(clock, ec2, cache)
    reader.deadline = clock.now() + timedelta(seconds=22)  # batches of 100 take 5 calls: 5 batches start in time

    first = reader.read(CLUSTER, IDS)

    assert [item["InstanceId"] for item in first] == IDS[:500]
    assert reader.undescribed == IDS[500:] and reader.not_visible == []
    assert len(cache.get_many(CLUSTER, IDS)) == 500  # cached per batch, before the read returned

    reader.deadline = None
    second = reader.read(CLUSTER, IDS)

    assert [item["InstanceId"] for item in second] == IDS
    assert reader.undescribed == []
    assert len(ec2.calls) == 50  # 1,000 instances at 20 a page, each asked once over the two reads
    assert {i for call in ec2.calls[25:] for i in call} == set(IDS[500:])


def test_instances_not_reported_yet_do_not_starve_the_ones_never_asked() -> None:
    """Each read has time for 500 instances; the first 500 (by id) stay "not yet reported": the next read asks
    the 500 never asked before asking those again."""
    clock, ec2, cache = FakeClock(), PagedEc2(not_yet=set(IDS[:500])), MemoryNodeFactsCache()
    reader = _reader(clock, ec2, cache)

    reader.deadline = clock.now() + timedelta(seconds=22)
    reader.read(CLUSTER, IDS)
    assert reader.undescribed == IDS[500:]
    assert {i for call in ec2.calls for i in call} == set(IDS[:500])

    reader.deadline = clock.now() + timedelta(seconds=22)
    second = reader.read(CLUSTER, IDS)

    assert {i for call in ec2.calls[25:] for i in call} == set(IDS[500:])
    assert {item["InstanceId"] for item in second if item.get("NetworkNodes")} == set(IDS[500:])
    assert reader.undescribed == IDS[:500]  # asked again next, oldest answer first

    ec2.not_yet.clear()
    reader.deadline = clock.now() + timedelta(seconds=22)
    third = reader.read(CLUSTER, IDS)
    assert [item["InstanceId"] for item in third] == IDS and reader.undescribed == []


def test_a_deadline_already_passed_asks_nothing() -> None:
    clock, ec2 = FakeClock(), PagedEc2()
    reader = _reader(clock, ec2, MemoryNodeFactsCache())
    reader.deadline = clock.now()
    assert reader.read(CLUSTER, IDS[:10]) == []
    assert (ec2.calls, reader.undescribed) == ([], IDS[:10])


class ResumableFacts:
    """FakeFacts' cluster, its topology read through the real reader (what HyperPodFacts does)."""

    def __init__(self, clock: FakeClock, nodes: int, budget_seconds: float) -> None:
        self.clock = clock
        self.inventory = FakeFacts(nodes)
        self.ec2 = PagedEc2()
        self.reader = _reader(clock, self.ec2, MemoryNodeFactsCache())
        self.budget = timedelta(seconds=budget_seconds)

    def read(self, cluster: str) -> AwsSnapshot:
        raw = self.inventory.read(cluster)
        self.reader.deadline = self.clock.now() + self.budget
        ids = [node.InstanceId for node in raw.nodes]
        topology = self.reader.read(cluster, ids)
        return raw.model_copy(
            update={
                "instance_topology": AwsSnapshot.model_validate(
                    {"describe_cluster": {"ClusterName": cluster}, "instance_topology": topology}
                ).instance_topology,
                "undescribed": len(self.reader.undescribed),
            }
        )


def test_reconcile_delivers_what_it_found_and_queues_the_rest_without_spending_retries() -> None:
    controller = Controller(debounce_seconds=10, min_write_interval_seconds=0)
    facts = ResumableFacts(controller.clock, nodes=1000, budget_seconds=22)
    controller.facts = facts  # type: ignore[assignment]
    request = controller.change()
    controller.clock.advance(10)

    first = reconcile(request, controller.deps())

    assert (first.action, first.undescribed, first.nodes_without_topology) == ("delivered", 500, 500)
    (continuation,) = controller.queue.sent
    assert continuation.reason == "retry"
    state = controller.now_state()
    assert state.topology_retries == 0 and state.has_unreconciled_changes
    assert "Discovery Continues" in {t.detail_type for t in state.triggers}

    reference = controller.channel.reference(1)
    controller.ssm_results[reference] = ApplyResult(outcome=Outcome.APPLIED, applier_version="1.0.0")
    record_result(ssm_event(reference), controller.result_deps())  # the first write landed
    controller.clock.advance(10)
    second = reconcile(continuation, controller.deps())

    assert (second.action, second.undescribed, second.nodes_without_topology) == ("delivered", 0, 0)
    assert len(controller.queue.sent) == 1  # finished: nothing more queued
    assert len(facts.ec2.calls) == 50
    assert len(controller.channel.delivered) == 2


def test_each_function_reads_with_its_own_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reconcile's from the invocation's time left, drift's per cluster; neither resets the other's (the
    simulator runs the drift function inside a reconcile's sleep)."""
    monkeypatch.setattr(runtime_module, "client", lambda service, region=None: object())
    settings = Settings.model_validate({"clusters": [{"name": CLUSTER}]})
    env = LambdaEnvironment(
        TOPOKEEPER_CONFIG=settings.to_env(),
        TABLE_NAME="topokeeper-state",
        BUCKET_NAME="topokeeper-plans",
        QUEUE_URL="https://sqs.us-east-1.amazonaws.com/123456789012/topokeeper-work.fifo",
    )
    clock = FakeClock()
    runtime = Runtime(env=env, settings=settings, clock=clock)
    cluster = settings.clusters[0]
    started = clock.now()

    reconcile_facts = runtime.reconcile_deps(remaining_seconds=180).facts(cluster)
    clock.advance(30)
    drift_facts = runtime.drift_deps().facts(cluster)

    assert isinstance(reconcile_facts, HyperPodFacts) and isinstance(drift_facts, HyperPodFacts)
    assert reconcile_facts._topology.deadline == started + timedelta(seconds=180 - AFTER_DISCOVERY_SECONDS)
    assert drift_facts._topology.deadline == clock.now() + timedelta(seconds=DRIFT_DISCOVERY_SECONDS)
    assert runtime.reconcile_deps().facts(cluster)._topology.deadline is None


class OneNodeNotReported(FakeFacts):
    """EC2 never reports the first node's topology."""

    def read(self, cluster: str) -> AwsSnapshot:
        raw = super().read(cluster)
        return raw.model_copy(update={"instance_topology": raw.instance_topology[1:]})


def test_topology_retries_are_counted_per_change_so_a_long_scale_up_keeps_asking() -> None:
    """Each reconcile that a change of the cluster triggered starts the count again: a scale-up of more than
    MAX_TOPOLOGY_RETRIES reconciles still asks again for the nodes EC2 has not reported yet."""
    controller = Controller(mode="verify")
    controller.facts = OneNodeNotReported(8)  # type: ignore[assignment]
    reconciles = MAX_TOPOLOGY_RETRIES + 2

    for number in range(reconciles):
        report = reconcile(controller.change(f"launch-{number}"), controller.deps())
        assert report.nodes_without_topology == 1

    assert controller.now_state().topology_retries == 1
    assert [request.reason for request in controller.queue.sent] == ["retry"] * reconciles


class HeadNodeNeverAnswers:
    """SSM as it answers for a head node whose agent is offline or hung: the invocation stays Pending."""

    def __init__(self) -> None:
        self.sent = 0

    def send_command(self, **_: Any) -> dict[str, Any]:
        self.sent += 1
        return {"Command": {"CommandId": f"{self.sent:08d}-0000-0000-0000-000000000000"}}

    def get_command_invocation(self, **_: Any) -> dict[str, Any]:
        return {"Status": "Pending", "StatusDetails": "Pending", "StandardOutputContent": ""}

    def put_object(self, **_: Any) -> dict[str, Any]:
        return {}

    def generate_presigned_url(self, operation: str, Params: dict[str, str], ExpiresIn: int) -> str:
        return f"https://bucket.s3.amazonaws.com/{Params['Key']}?X-Amz-Algorithm=AWS4-HMAC-SHA256"


def test_the_reconciles_node_table_read_ends_before_the_invocation_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ParallelCluster cluster's reconcile reads the node table through the SSM channel after discovery, which
    may run to AFTER_DISCOVERY_SECONDS before the end: a head node that never answers must not hold the read past
    the invocation's time (Lambda would kill the reconcile, losing what it learned, and SQS send it again)."""
    ssm = HeadNodeNeverAnswers()
    monkeypatch.setattr(runtime_module, "client", lambda service, region=None, config=None: ssm)
    monkeypatch.setattr(runtime_module, "presigning_s3", lambda: ssm)
    head_node = "i-0123456789abcdef0"
    settings = Settings.model_validate(
        {"clusters": [{"name": "pc", "orchestrator": "ec2", "head_node": head_node, "channel": "ssm"}]}
    )
    env = LambdaEnvironment(
        TOPOKEEPER_CONFIG=settings.to_env(),
        TABLE_NAME="topokeeper-state",
        BUCKET_NAME="topokeeper-plans",
        QUEUE_URL="https://sqs.us-east-1.amazonaws.com/123456789012/topokeeper-work.fifo",
    )
    clock = FakeClock()
    runtime = Runtime(env=env, settings=settings, clock=clock, sleep=clock.advance)
    remaining = 180
    deps = runtime.reconcile_deps(remaining_seconds=remaining)
    ends = clock.now() + timedelta(seconds=remaining)
    clock.advance(remaining - AFTER_DISCOVERY_SECONDS)  # discovery ran to its deadline

    answer = deps.channel(settings.clusters[0]).verify(render(plan(snapshot({"p5": p5_nodes(2)}))).bundle)

    assert answer.outcome is Outcome.PENDING
    assert clock.now() + timedelta(seconds=AFTER_READ_SECONDS) <= ends
