"""A ParallelCluster head node with 5,000 Slurm nodes, end to end over SSM: the node table does not fit the
24,000 characters of stdout GetCommandInvocation keeps, so the applier PUTs its whole document to the plan bucket
by the URL the command carries, and the result handler reads it back and plans with the fresh bindings.

Real slurmctld (sid, ParallelCluster-style chroot), the real command text run by sh without a login shell, the
emulator's SSM (SendCommand, GetCommandInvocation cut at 24,000 characters) and its KMS-encrypted bucket (which
checks the presigned URLs' SigV4 signatures); the controller's other ports are in memory.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.adapters.aws import PRESIGN_CONFIG, SEND_COMMAND_CONFIG
from topokeeper.adapters.ssm_channel import SsmChannel
from topokeeper.contract.ports import ApplyResult, Outcome
from topokeeper.service.controller import reconcile
from topokeeper.service.result import record_result
from topokeeper.service.state import save_fields
from topokeeper.sim.aws.s3 import KMS_DEFAULT_ENCRYPTION
from topokeeper.sim.aws.ssm import CommandInvocationRequest, CommandOutcome
from topokeeper.sim.aws_emulator import AwsEmulator
from topokeeper.sim.slurm_chroot import SlurmController
from topokeeper.wire import MAX_STDOUT_CHARS, node_rows, parse_show_topology

pytestmark = pytest.mark.slurm

BUCKET = "topokeeper-plans"
# FakeFacts' eight instances have the private IPs 10.0.0.0-7, four to a leaf: the static nodes sit on them.
STATICS = {f"gpu-st-p5-{n}": f"10.0.0.{n - 1}" for n in range(1, 9)}
DYNAMICS = [f"gpu-dy-p5-{n}" for n in range(1, 4993)]  # powered down: NodeAddr = NodeName


@pytest.fixture
def aws() -> Iterator[AwsEmulator]:
    with AwsEmulator(seed=3) as emulator:
        s3 = emulator.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_encryption(Bucket=BUCKET, ServerSideEncryptionConfiguration=KMS_DEFAULT_ENCRYPTION)
        yield emulator


def _bind(controller: SlurmController, name: str, address: str) -> None:
    controller.run("scontrol", "update", f"nodename={name}", f"nodeaddr={address}", f"nodehostname={name}", check=True)


def test_a_5000_node_table_comes_back_whole_through_the_bucket_and_the_replan_uses_it(
    sid_root: Path, controllers: Callable[..., SlurmController], aws: AwsEmulator
) -> None:
    head_node = controllers(sid_root, style="parallelcluster")
    nodes = [*STATICS, *DYNAMICS]
    head_node.prepare(nodes, {"gpu": (nodes, None)}, addresses=STATICS)
    head_node.start()
    rows = node_rows(head_node.run("scontrol", "-o", "--future", "show", "nodes", check=True).stdout)
    assert len(rows) == 5000

    controller = Controller(orchestrator="ec2")
    table = ApplyResult(outcome=Outcome.IN_SYNC, applier_version="1.0.0", slurm_nodes=rows).node_table()
    save_fields(controller.state, CLUSTER, {"slurm_nodes": table, "slurm_version": "26.05"})
    channel = SsmChannel(
        aws.client("ssm"),
        aws.client("s3", config=PRESIGN_CONFIG),
        BUCKET,
        controller.cluster.head_node,
        cluster=CLUSTER,
        now=controller.clock.now,
        sender=aws.client("ssm", config=SEND_COMMAND_CONFIG),
    )
    stdouts: list[str] = []

    def run_on_head_node(invocation: CommandInvocationRequest) -> CommandOutcome:
        if not stdouts:  # clustermgtd replaced gpu-st-p5-1's instance after the plan was made
            _bind(head_node, "gpu-st-p5-1", "10.0.0.9")
        ran = subprocess.run(
            head_node.command("sh", "-s", login=False),
            input=invocation.script,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        stdouts.append(ran.stdout)
        return CommandOutcome("Success" if ran.returncode == 0 else "Failed", ran.returncode, ran.stdout, ran.stderr)

    aws.ssm.on_command = run_on_head_node
    aws.ssm.register_managed_instance(str(controller.cluster.head_node))  # a head node SSM reaches
    deps = dataclasses.replace(controller.deps(), channel=lambda cluster: channel)
    result_deps = dataclasses.replace(
        controller.result_deps(), ssm_result=lambda cluster, command_id: channel.result(command_id)
    )

    first = reconcile(controller.change(), deps)
    stale = channel.result(str(first.delivery_reference))
    report = record_result(ssm_event(str(first.delivery_reference)), result_deps)

    # stdout kept the cut document (200 rows) and where the whole one went; the whole one came back.
    assert len(stdouts[0]) <= MAX_STDOUT_CHARS and '"dropped": {"slurm_nodes": 4800}' in stdouts[0]
    assert stale.full_result is not None and stale.full_result["key"].startswith(
        f"results/{CLUSTER}/{controller.cluster.head_node}-"
    )
    assert stale.full_result["error"] is None and stale.full_result["bytes"] > 10 * MAX_STDOUT_CHARS
    # The re-bound node is deferred, every other node applied; the retry plans it with the table that came back.
    assert (report.outcome, stale.dropped, len(stale.slurm_nodes or [])) == (Outcome.APPLIED, {}, 5000)
    assert [row[0] for row in stale.deferred] == ["gpu-st-p5-1"]
    state = controller.now_state()
    assert len(state.slurm_nodes or []) == 5000
    assert {r.name: r.address for r in state.slurm_nodes or []}["gpu-st-p5-1"] == "10.0.0.9"
    replan = controller.queue.sent[-1]
    assert (replan.reason, state.triggers[-1].detail_type) == ("retry", "Slurm Node Bindings Changed")

    second = reconcile(replan, deps)
    applied = channel.result(str(second.delivery_reference))
    record_result(ssm_event(str(second.delivery_reference)), result_deps)

    assert (applied.outcome, applied.error, len(applied.slurm_nodes or [])) == (Outcome.APPLIED, None, 5000)
    assert controller.now_state().applied_sha256 == second.plan_sha256 != first.plan_sha256
    live = parse_show_topology(head_node.show_topology("tree-gpu"))
    # The re-bound node left its leaf (no instance at 10.0.0.9 is in the facts) and hangs under no-topology.
    assert "gpu-st-p5-1" in live["no-topology"]["nodes"] and len(live["no-topology"]["nodes"]) == 4993
    assert [key["Key"] for key in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="results/")["Contents"]]
