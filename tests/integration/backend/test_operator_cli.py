"""The operator CLI against a deployment on the emulator: snapshot, plan, diff, apply, drift, audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.backend.conftest import small_scenario
from topokeeper.adapters.ec2 import LocalRateLimiter
from topokeeper.cli.main import main
from topokeeper.sim.world import World

pytestmark = pytest.mark.slurm


def _deployment(world: World, tmp_path: Path) -> str:
    path = tmp_path / "deployment.json"
    path.write_text(world.stack.deployment.model_dump_json())
    world.ssm_synchronous = True  # the CLI waits in real time, outside the world's simulated time
    return str(path)


def _json(capsys: pytest.CaptureFixture[str]) -> object:
    return json.loads(capsys.readouterr().out)


def test_snapshot_then_plan_gives_the_plan_the_backend_applied(
    world_factory, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = world_factory()
    world.settle()
    # The CLI paces DescribeInstanceTopology pages one second apart; here the emulator's bucket refills in the
    # world's simulated time, so the CLI waits on that clock.
    monkeypatch.setattr(
        "topokeeper.cli.operator_commands.LocalRateLimiter",
        lambda: LocalRateLimiter(now=world.clock.monotonic, sleep=world.clock.advance),
    )
    snapshot = tmp_path / "snapshot.json"
    assert main(["snapshot", "--cluster", world.cluster.name, "--out", str(snapshot)]) == 0
    assert main(["plan", "--snapshot", str(snapshot), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    planned = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert planned["sha256"] == world.runtime.state.get(world.cluster.name).applied_sha256


def test_diff_drift_and_audit(world_factory, tmp_path: Path, capsys) -> None:
    world = world_factory()
    world.settle()
    deployment = _deployment(world, tmp_path)
    name = world.cluster.name

    assert main(["diff", "--cluster", name, "--deployment", deployment, "--json"]) == 0
    document = _json(capsys)
    assert document["desired_sha256"] == document["applied_sha256"] and document["diff"] == []
    assert document["live"]["outcome"] == "in_sync"

    world.head.tamper()
    assert main(["drift", "--cluster", name, "--deployment", deployment, "--json"]) == 3
    report = _json(capsys)
    assert (report["live"], report["aws"], report["drift"], report["action"]) == (
        "drift",
        "current",
        1,
        "reconcile-requested",
    )

    assert main(["audit", "--cluster", name, "--deployment", deployment, "--json"]) == 0
    records = _json(capsys)
    assert isinstance(records, list) and len(records) == 3
    assert records == sorted(records, key=lambda r: r["completed_at"], reverse=True)
    assert main(["audit", "--cluster", name, "--deployment", deployment]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:3] == ["COMPLETED", "PARTITION", "KIND"]


def test_apply_reconciles_now_and_dry_run_changes_nothing(world_factory, tmp_path: Path, capsys) -> None:
    world = world_factory()
    world.settle()
    deployment = _deployment(world, tmp_path)
    name = world.cluster.name
    world.scale("p5", 10)
    world.sync_head_node()

    assert main(["apply", "--cluster", name, "--deployment", deployment, "--dry-run", "--json"]) == 0
    dry = _json(capsys)
    assert dry["outcome"] == "would_apply" and "+" in str(dry["diff"])
    assert world.head.verify(world.desired().bundle)["outcome"] == "drift"  # nothing written

    assert main(["apply", "--cluster", name, "--deployment", deployment, "--json"]) == 0
    report = _json(capsys)
    assert report["action"] == "delivered"
    world.settle()
    assert world.head.verify(world.desired().bundle)["outcome"] == "in_sync"


def test_apply_refuses_a_cluster_in_verify_mode(world_factory, tmp_path: Path, capsys) -> None:
    world = world_factory(small_scenario(mode="verify"))
    world.settle()
    assert main(["apply", "--cluster", world.cluster.name, "--deployment", _deployment(world, tmp_path)]) == 2
    assert "verify mode" in capsys.readouterr().err
