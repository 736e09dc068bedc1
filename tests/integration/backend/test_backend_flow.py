"""Event -> ingest -> reconcile -> delivery -> real slurmctld -> result -> UpdatePartitionTopology audit."""

from __future__ import annotations

import json

import pytest

from tests.integration.backend.conftest import AuditCapture, reconcile_batches, small_scenario
from topokeeper.adapters.aws import client
from topokeeper.contract.errors import InputError
from topokeeper.contract.event_schemas import (
    CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE,
    HYPERPOD_DETAIL_TYPES,
    MANAGED_TOPOLOGY_EVENT,
    WORK_QUEUE_MAX_RECEIVES,
)
from topokeeper.contract.head_node_program import program_sha256
from topokeeper.contract.ports import Metric
from topokeeper.headnode.config_dir import BACKUP_DIR
from topokeeper.headnode.signature import GENERATION_FILE
from topokeeper.sim.lambda_host import LambdaContext
from topokeeper.sim.simulator import Story
from topokeeper.sim.world import World

pytestmark = pytest.mark.slurm


def _in_sync(world: World) -> bool:
    return world.head.verify(world.desired().bundle)["outcome"] == "in_sync"


def _records(world: World) -> list[dict]:
    return world.runtime.audit.history(world.cluster.name, 1000)


def test_a_new_cluster_reaches_slurmctld_and_every_change_is_audited_once(world_factory) -> None:
    world = world_factory()
    capture = AuditCapture()
    world.settle()

    state = world.runtime.state.get(world.cluster.name)
    desired = world.desired()
    assert state.applied_sha256 == desired.sha256 and state.pending is None
    assert _in_sync(world)
    assert world.head.controller.partition_topologies() == {
        "cpu": None,
        "dev": None,
        "ml-p5": "tree-ml-p5",
        "ml-p6e": "block-ml-p6e",
    }
    records = _records(world)
    assert sorted(r["partition"] for r in records) == ["cpu", "ml-p5", "ml-p6e"]
    assert {r["outcome"] for r in records} == {"applied"}
    assert {r["reason"] for r in records} == {"plan-change"}
    p5 = next(r for r in records if r["partition"] == "ml-p5")
    assert (p5["kind"], p5["node_count"], p5["nodes_added_count"], p5["channel"]) == ("tree", 8, 8, "ssm")
    assert {t["detail_type"] for t in p5["triggers"]} >= {"AWS API Call via CloudTrail"}
    published = capture.events()
    assert sorted(e["detail"]["audit_id"] for e in published) == sorted(r["audit_id"] for r in records)
    assert {e["detail-type"] for e in published} == {"UpdatePartitionTopology"}
    updates = [v for _, c, m, v in world.metrics.points if m == Metric.TOPOLOGY_UPDATES.value]
    assert updates == [3]

    # The same plan again changes nothing: no write, no new audit record.
    before = world.counters.head_node_writes
    world.put_event("aws.sagemaker", HYPERPOD_DETAIL_TYPES[0], {"ClusterArn": "x", "ClusterName": world.cluster.name})
    world.settle()
    assert world.counters.head_node_writes == before
    assert len(_records(world)) == 3 and capture.events() == []


def test_the_inbox_that_stands_in_for_eventbridge_invoking_a_function_is_not_a_counted_request(world_factory) -> None:
    # EventBridge invokes ingest and result without an API call of the account; only the work queue, which
    # Lambda's event source polls in the account, is received from by request (once per reconcile batch).
    world = world_factory(head_node="file")
    world.settle()
    batches = reconcile_batches(world)
    world.emulator.calls.reset()
    for _ in range(3):
        world.put_event(
            "aws.sagemaker", HYPERPOD_DETAIL_TYPES[0], {"ClusterArn": "x", "ClusterName": world.cluster.name}
        )
    world.settle()
    assert batches and world.emulator.calls["sqs:ReceiveMessage"] == len(batches)
    assert world.emulator.calls["sqs:SendMessage"] == 3  # ingest ran for each event


def test_scale_up_replace_and_scale_down(world_factory) -> None:
    world = world_factory()
    world.settle()
    story = Story(world, lambda _: None)
    from topokeeper.sim.scenario import Step

    up = story.play(1, Step.model_validate({"scale": {"group": "p5", "to": 12, "over_seconds": 20}}))
    assert up is not None and up.converged and up.head_node_writes == 1
    (record,) = up.audit_records
    assert (record["partition"], record["nodes_added_count"], record["node_count"]) == ("ml-p5", 4, 12)

    gb_before = {n.slurm_name: n for n in world.emulator.hyperpod.nodes(world.cluster.name, "gb200")}
    replaced = story.play(2, Step.model_validate({"replace": {"group": "gb200", "count": 1}}))
    gb_after = {n.slurm_name: n for n in world.emulator.hyperpod.nodes(world.cluster.name, "gb200")}
    assert gb_before.keys() == gb_after.keys()  # same host names
    moved = [name for name in gb_after if gb_after[name].instance_id != gb_before[name].instance_id]
    assert len(moved) == 1
    assert replaced is not None and replaced.converged and replaced.head_node_writes == 1
    (record,) = replaced.audit_records
    assert record["partition"] == "ml-p6e" and record["nodes_added_count"] == record["nodes_removed_count"] == 0
    live_blocks = replaced.live_topology["ml-p6e"]
    assert any(
        line.startswith("BlockName=") and moved[0] in line and "Nodes=" + moved[0] + " " in line + " "
        for line in live_blocks.splitlines()
    )

    down = story.play(3, Step.model_validate({"delete": {"group": "p5", "count": 4}}))
    assert down is not None and down.converged and down.head_node_writes == 1
    (record,) = down.audit_records
    assert (record["nodes_removed_count"], record["node_count"]) == (4, 8)
    assert _in_sync(world)


def test_a_replace_step_over_25_nodes_is_sent_25_ids_a_call_as_aws_requires(world_factory) -> None:
    """BatchReplaceClusterNodes takes at most 25 node ids (the emulator refuses more, as botocore's model says)."""
    groups = small_scenario().cluster.model_dump(mode="json")["instance_groups"]
    p5 = next(group for group in groups if group["name"] == "p5")
    p5["count"] = 30
    world = world_factory(small_scenario(instance_groups=groups))
    world.settle()
    from topokeeper.sim.scenario import Step

    before = {node.instance_id for node in world.emulator.hyperpod.nodes(world.cluster.name, "p5")}
    replaced = Story(world, lambda _: None).play(1, Step.model_validate({"replace": {"group": "p5", "count": 26}}))
    after = {node.instance_id for node in world.emulator.hyperpod.nodes(world.cluster.name, "p5")}
    assert len(before - after) == 26
    assert replaced is not None and replaced.converged


def test_a_burst_of_1000_events_makes_a_handful_of_writes(world_factory) -> None:
    world = world_factory()
    world.settle()
    writes_before = world.counters.head_node_writes
    start = world.clock.monotonic()
    for index in range(1000):
        at = start + index * 0.06  # 1,000 events in a minute, while four nodes join
        if index % 250 == 0:
            world.agenda.add(at, lambda count=9 + index // 250: world.scale("p5", count))
        world.agenda.add(
            at,
            lambda: world.put_event(
                "aws.sagemaker",
                HYPERPOD_DETAIL_TYPES[1],
                {"ClusterName": world.cluster.name, "InstanceId": "i-0123456789abcdef0", "HealthSummary": {}},
            ),
        )
    world.settle()
    writes = world.counters.head_node_writes - writes_before
    coalesced = sum(v for _, _, m, v in world.metrics.points if m == Metric.EVENTS_COALESCED.value)
    assert 1 <= writes <= 3, writes
    assert coalesced >= 900
    assert (
        world.desired().plan.nodes.count("x") == 0
        and len(world.emulator.hyperpod.nodes(world.cluster.name, "p5")) == 12
    )
    assert _in_sync(world)


def test_duplicate_and_out_of_order_events_converge_with_one_write(world_factory) -> None:
    world = world_factory()
    world.settle()
    ingest = world.functions.handlers["ingest"]
    event = {
        "version": "0",
        "id": "11111111-2222-3333-4444-555555555555",
        "detail-type": HYPERPOD_DETAIL_TYPES[0],
        "source": "aws.sagemaker",
        "account": "123456789012",
        "time": "2026-01-05T09:10:00Z",
        "region": "us-east-1",
        "resources": [],
        "detail": {"ClusterArn": "arn", "ClusterName": world.cluster.name},
    }
    world.scale("p5", 9)
    assert ingest(event, LambdaContext("ingest"))["status"] == "queued"
    assert ingest(event, LambdaContext("ingest"))["status"] == "duplicate"
    older = {**event, "id": "99999999-2222-3333-4444-555555555555", "time": "2026-01-05T08:00:00Z"}
    assert ingest(older, LambdaContext("ingest"))["status"] == "queued"  # late, but only says "look again"
    writes_before = world.counters.head_node_writes
    world.settle()
    assert world.counters.head_node_writes - writes_before == 1
    assert _in_sync(world)


def test_an_event_for_an_unknown_cluster_is_ignored(world_factory) -> None:
    world = world_factory()
    world.settle()
    result = world.functions.handlers["ingest"](
        {
            "version": "0",
            "id": "e-unknown",
            "detail-type": HYPERPOD_DETAIL_TYPES[0],
            "source": "aws.sagemaker",
            "account": "123456789012",
            "time": "2026-01-05T09:10:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": {"ClusterArn": "arn", "ClusterName": "someone-elses"},
        },
        LambdaContext("ingest"),
    )
    assert result == {
        "status": "ignored",
        "cluster": None,
        "clusters": [],
        "generation": None,
        "reason": "unmanaged cluster someone-elses",
    }
    assert world.runtime.state.get("someone-elses").generation == 0


def test_malformed_input_fails_loudly_with_the_field_or_goes_to_the_dead_letter_queue(world_factory) -> None:
    world = world_factory()
    world.settle()
    event = {
        "version": "0",
        "id": "e-bad",
        "detail-type": HYPERPOD_DETAIL_TYPES[0],
        "source": "aws.sagemaker",
        "account": "123456789012",
        "time": "2026-01-05T09:10:00Z",
        "region": "us-east-1",
        "resources": [],
        "detail": {"ClusterArn": "arn"},
    }
    # An async invocation that raises: Lambda retries it, then dead-letters it with this message.
    with pytest.raises(InputError, match="detail.ClusterName"):
        world.functions.handlers["ingest"](event, LambdaContext("ingest"))

    sqs = client("sqs")
    sqs.send_message(
        QueueUrl=world.stack.queue_url,
        MessageBody='{"cluster": "topo-test", "generation": 0}',
        MessageGroupId="topo-test",
        MessageDeduplicationId="bad-1",
    )
    world.settle()
    parked = sqs.receive_message(QueueUrl=world.stack.dead_letter_url, MessageAttributeNames=["All"])["Messages"]
    assert len(parked) == 1
    assert parked[0]["MessageAttributes"]["reason"]["StringValue"].startswith("message.generation:")
    redrive = json.loads(
        sqs.get_queue_attributes(QueueUrl=world.stack.queue_url, AttributeNames=["RedrivePolicy"])["Attributes"][
            "RedrivePolicy"
        ]
    )
    assert redrive["maxReceiveCount"] == WORK_QUEUE_MAX_RECEIVES


def test_drift_is_remediated_in_enforce_mode(world_factory) -> None:
    world = world_factory()
    world.settle()
    world.head.tamper()
    assert not _in_sync(world)
    world.settle(until=world.clock.monotonic() + 2 * world.scenario.timing.drift_interval_seconds + 1, quiet=False)
    drift = [v for _, _, m, v in world.metrics.points if m == Metric.TOPOLOGY_DRIFT.value]
    assert drift[:2] == [1, 0]
    assert world.metrics.alarmed_since(0)
    repairs = [r for r in _records(world) if r["reason"] == "drift-repair"]
    assert [r["partition"] for r in repairs] == ["ml-p5"] or [r["partition"] for r in repairs] == ["ml-p6e"]
    assert _in_sync(world)


def test_drift_is_only_reported_in_verify_mode(world_factory) -> None:
    world = world_factory(small_scenario(mode="verify"))
    world.settle()
    conf_before = world.head.slurm_conf.read_text()
    world.settle(until=world.clock.monotonic() + 2 * world.scenario.timing.drift_interval_seconds + 1, quiet=False)
    drift = [v for _, _, m, v in world.metrics.points if m == Metric.TOPOLOGY_DRIFT.value]
    assert drift and set(drift) == {1}  # the head node never got topokeeper's plan, and never will
    assert world.counters.head_node_writes == 0 and _records(world) == []
    assert world.head.slurm_conf.read_text() == conf_before
    assert not (world.head.controller.etc / "topology.yaml").exists()


def test_hyperpods_own_topology_update_is_verified_at_once_in_verify_mode(world_factory) -> None:
    world = world_factory(small_scenario(mode="verify"))
    world.settle()
    checks = len([m for _, _, m, _ in world.metrics.points if m == Metric.TOPOLOGY_DRIFT.value])
    started = world.clock.monotonic()
    detail = {
        "eventSource": "sagemaker.amazonaws.com",
        "eventName": MANAGED_TOPOLOGY_EVENT,
        "eventID": "ct-managed-1",
        "serviceEventDetails": {"clusterName": world.cluster.name},
    }
    world.put_event("aws.sagemaker", CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE, detail)
    world.settle()

    assert world.clock.monotonic() - started < world.scenario.timing.drift_interval_seconds  # not the schedule's
    drift = [v for _, _, m, v in world.metrics.points if m == Metric.TOPOLOGY_DRIFT.value]
    assert drift[checks:] == [1]  # the head node never got topokeeper's plan: reported, never written
    assert [v for _, _, m, v in world.metrics.points if m == Metric.MANAGED_TOPOLOGY_UPDATES.value] == [1]
    assert world.counters.head_node_writes == 0


def test_the_agent_channel_applies_and_reports(world_factory) -> None:
    world = world_factory(small_scenario(channel="agent"))
    world.settle()
    records = _records(world)
    assert sorted(r["partition"] for r in records) == ["cpu", "ml-p5", "ml-p6e"]
    assert {(r["channel"], r["outcome"]) for r in records} == {("agent", "applied")}
    assert _in_sync(world)


@pytest.mark.parametrize("channel", ["ssm", "agent"])
def test_a_hyperpod_style_head_node_without_scontrol_on_path(world_factory, channel: str) -> None:
    """Slurm under /opt/slurm, partitions in an Included file: both channels apply, then a scale-up follows."""
    world = world_factory(small_scenario(head_node_style="hyperpod", channel=channel))
    assert world.head.description.endswith("laid out as a hyperpod head node")
    world.settle()
    assert {(r["channel"], r["outcome"]) for r in _records(world)} == {(channel, "applied")}
    assert _in_sync(world)
    included = (world.head.controller.etc / "partitions.conf").read_text()
    assert "Topology=tree-ml-p5" in included and "Topology=" not in world.head.slurm_conf.read_text()
    story = Story(world, lambda _: None)
    from topokeeper.sim.scenario import Step

    up = story.play(1, Step.model_validate({"scale": {"group": "p5", "to": 12, "over_seconds": 20}}))
    assert up is not None and up.converged and up.head_node_writes == 1
    assert world.head.controller.partition_topologies()["ml-p5"] == "tree-ml-p5"


def test_slurm_24_11_gets_topology_conf_and_the_plugin(world_factory) -> None:
    world = world_factory(small_scenario(slurm_version="24.11"))
    world.settle()
    assert (world.head.controller.etc / "topology.conf").exists()
    assert "TopologyPlugin=topology/tree" in world.head.slurm_conf.read_text()
    assert "Topology=" not in world.head.slurm_conf.read_text()
    assert _in_sync(world)


def test_the_head_nodes_own_slurm_version_wins(world_factory) -> None:
    """Configured 26.05, the head node runs 24.11: refused once, learned, planned again, applied."""
    world = world_factory(small_scenario(slurm_version="24.11"), configured_slurm_version="26.05")
    world.settle()
    outcomes = [r["outcome"] for r in sorted(_records(world), key=lambda r: r["completed_at"])]
    assert "refused" in outcomes and outcomes[-1] == "applied"
    assert world.runtime.state.get(world.cluster.name).slurm_version.startswith("24.11")
    assert _in_sync(world)


def test_the_program_travels_through_s3_and_the_signed_bundle_is_checked_on_the_head_node(world_factory) -> None:
    """The head-node program does not fit in the command: it goes to S3, is fetched by a presigned URL and
    checked against the sha256 the command pins; the command carries the stack's public key, and the program
    on the real slurmctld verifies the KMS signature and records the generation."""
    world = world_factory()
    world.settle()
    state = world.runtime.state.get(world.cluster.name)
    stored = world.emulator.client("s3").list_objects_v2(Bucket=world.stack.deployment.bucket, Prefix="payloads/")
    keys = sorted(o["Key"] for o in stored.get("Contents", []))
    assert keys == [f"payloads/{world.cluster.name}/program-{program_sha256()}.pyz"]  # the bundle rides inline
    generation = json.loads((world.head.controller.etc / BACKUP_DIR / GENERATION_FILE).read_text())
    assert generation == {"generation": state.bundle_generation, "plan_sha256": state.applied_sha256}
    assert world.head.verify(world.desired().bundle)["outcome"] == "in_sync"


def test_a_cluster_whose_nodes_ec2_does_not_see_is_planned_and_says_so(world_factory) -> None:
    """HyperPod nodes in SageMaker's service account: no EC2 topology, UltraServer blocks from UltraServerInfo."""
    world = world_factory(small_scenario().model_copy(update={"expose_hyperpod_nodes": False}))
    world.settle()

    assert _in_sync(world)
    assert world.head.controller.partition_topologies()["ml-p5"] == "tree-ml-p5"
    assert world.head.controller.partition_topologies()["ml-p6e"] == "block-ml-p6e"
    partitions = {p.partition: p for p in world.desired().plan.partitions}
    assert len(partitions["ml-p5"].nodes_without_topology) == 8  # all under no-topology
    assert partitions["ml-p6e"].nodes_without_topology == ()  # one block of 18 from UltraServerInfo
    records = {r["partition"]: r for r in _records(world)}
    for partition in ("ml-p5", "ml-p6e"):
        (warning,) = [w for w in records[partition]["warnings"] if "DescribeInstanceTopology" in w]
        assert "does not see 26 instance(s)" in warning and "UltraServerInfo" in warning


def test_a_world_that_fails_to_start_leaves_the_next_one_free_to_start(world_factory, monkeypatch) -> None:
    # A world stops what it started when its start fails part way (here after the emulator started and the
    # environment pointed at it): the collector's thresholds, the emulator (one per process) and the environment.
    import gc
    import os

    from topokeeper.sim import world as world_module

    def refused(settings: object) -> object:
        raise RuntimeError("the stack refused")

    thresholds, environment = gc.get_threshold(), dict(os.environ)
    monkeypatch.setattr(world_module, "create_stack", refused)
    with (
        pytest.raises(RuntimeError, match="the stack refused"),
        world_module.running(small_scenario(), head_node="file"),
    ):
        pass
    monkeypatch.undo()
    assert gc.get_threshold() == thresholds
    assert dict(os.environ) == environment
    world = world_factory(head_node="file")
    world.settle()
    assert world.emulator.calls.total > 0
