"""`topokeeper verify` before anything is deployed: snapshot -> plan -> the head node's dry-run diff and live
verify, over SSM (an EC2-style head node) or by the printed commands (HyperPod), and nothing written anywhere
on the head node. Emulated AWS, a real slurmctld in a chroot; the stack the world builds is never used."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.backend.conftest import small_scenario
from topokeeper.adapters.ec2 import LocalRateLimiter
from topokeeper.cli.main import main
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes, program_sha256
from topokeeper.sim.stack import BUCKET
from topokeeper.sim.world import World

pytestmark = pytest.mark.slurm


def _files(world: World) -> dict[str, bytes]:
    etc = world.head.controller.etc
    return {p.name: p.read_bytes() for p in sorted(etc.rglob("*")) if p.is_file()}


def _snapshot(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(
        "topokeeper.cli.operator_commands.LocalRateLimiter",
        lambda: LocalRateLimiter(now=world.clock.monotonic, sleep=world.clock.advance),
    )
    world.clock.advance(1)  # the backend's own DescribeInstanceTopology just took the account's one token
    snapshot = tmp_path / "snapshot.json"
    assert main(["snapshot", "--cluster", world.cluster.name, "--out", str(snapshot)]) == 0
    return snapshot


def test_verify_shows_the_diff_and_the_live_state_and_writes_nothing(
    world_factory, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A HyperPod-style head node with HyperPod's own topology, registered with SSM (mi-) for the SSM path.
    world = world_factory(small_scenario(mode="verify", head_node_style="hyperpod", managed_topology=True))
    world.settle()
    world.ssm_synchronous = True  # the CLI waits in real time, outside the world's simulated time
    snapshot = _snapshot(world, tmp_path, monkeypatch)
    before = _files(world)
    capsys.readouterr()

    # Over SSM Run Command (an EC2 or hybrid-registered head node). The applier does not fit an inline command:
    # without a bucket to fetch it from, one error naming --bucket and nothing sent.
    assert main(["verify", "--snapshot", str(snapshot), "--head-node", world.head_node_id]) == 2
    assert "--bucket" in capsys.readouterr().err
    via = ["--head-node", world.head_node_id, "--bucket", BUCKET]
    code = main(["verify", "--snapshot", str(snapshot), *via])
    printed = capsys.readouterr().out
    assert code == 3  # live differs from the plan by name: drift (HyperPod names things its own way)
    assert "dry-run: would_apply" in printed and "verify: drift" in printed
    assert "+++ " in printed and "partitions.conf" in printed and "topology.yaml" in printed  # every file's diff
    assert "naming partition ml-p5: slurmctld has Topology=tree, the plan tree-ml-p5" in printed
    assert main(["verify", "--snapshot", str(snapshot), *via, "--json"]) == 3
    document = json.loads(capsys.readouterr().out)
    assert (document["dry-run"]["outcome"], document["verify"]["outcome"]) == ("would_apply", "drift")
    assert (
        document["verify"]["grouping_drift"] is False and document["dry-run"]["plan_sha256"] == document["plan_sha256"]
    )

    # Without Run Command (HyperPod): the bundle and the program in a directory, and the commands to run there.
    inner = f"{world.head.controller.inner_dir}/readonly"
    out = world.head.root / inner.lstrip("/")
    assert main(["verify", "--snapshot", str(snapshot), "--bundle-out", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    commands = shown["commands"]
    assert [c.split("#")[0].split() for c in commands] == [
        ["sudo", "python3", PROGRAM_NAME, "dry-run", "bundle.json"],
        ["sudo", "python3", PROGRAM_NAME, "verify", "bundle.json"],
    ]
    # How to check the program before running it as root: its sha256 (the stack's output), its sources.
    assert (out / PROGRAM_NAME).read_bytes() == program_bytes()
    assert shown["inspect"][0].startswith(f"sha256sum {PROGRAM_NAME}   # {program_sha256()}")
    for command in shown["inspect"][:2]:
        argv = command.split("#")[0].split()
        listed = subprocess.run(argv, cwd=out, capture_output=True, text=True, timeout=60, check=False)
        assert listed.returncode == 0 and (program_sha256() in listed.stdout or "topokeeper/wire.py" in listed.stdout)
    results = {}
    for command in commands:  # as printed, on the head node (as root already: without sudo), no login shell
        argv = command.split("#")[0].split()[1:]
        run = world.head.controller.command("sh", "-c", f"cd {inner} && {' '.join(argv)}", login=False)
        completed = subprocess.run(run, capture_output=True, text=True, timeout=300, check=False)
        results[argv[2]] = json.loads(completed.stdout.strip().splitlines()[-1])
    assert results["dry-run"]["outcome"] == "would_apply"
    assert results["verify"]["outcome"] == "drift" and results["verify"]["grouping_drift"] is False

    assert _files(world) == before and world.counters.head_node_writes == 0
