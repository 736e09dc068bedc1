"""The state table rebuilt (dropped and made anew, restored from an older backup, the stack redeployed) while the
head node keeps the generation of its last apply: a drift check, an operator's diff and dry-run are never refused
as replays, and the next apply is signed above what the head node recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.backend.conftest import small_scenario
from topokeeper.cli.main import main
from topokeeper.contract.config import Mode
from topokeeper.contract.ports import Metric
from topokeeper.headnode.config_dir import BACKUP_DIR
from topokeeper.headnode.signature import GENERATION_FILE
from topokeeper.sim.world import World

pytestmark = pytest.mark.slurm


def _recorded(world: World) -> dict[str, object]:
    recorded: dict[str, object] = json.loads((world.head.controller.etc / BACKUP_DIR / GENERATION_FILE).read_text())
    return recorded


def _refusals(world: World) -> list[float]:
    return [v for _, _, m, v in world.metrics.points if m == Metric.BUNDLE_REFUSALS.value]


def test_a_verify_mode_cluster_verifies_at_the_first_drift_check_after_its_table_is_rebuilt(world_factory) -> None:
    """Applied once in enforce mode, then redeployed in verify mode (HyperPod's default, which never applies) over
    an empty table: the drift check plans and verifies, the head node answers in_sync, nothing is refused."""
    world = world_factory()
    world.settle()
    before = _recorded(world)

    world.rebuild_state_table(Mode.VERIFY)
    world.advance(60)
    (first,) = world.functions.invoke("drift", {})
    assert (first["live"], first["action"]) == ("unknown", "reconcile-requested")  # no desired plan yet
    world.settle()
    (report,) = world.functions.invoke("drift", {})

    assert (report["live"], report["drift"], report["error"]) == ("in_sync", 0, None), report
    assert _refusals(world) == [] and _recorded(world) == before  # verify records nothing


def test_after_the_table_is_rebuilt_diff_and_dry_run_answer_and_the_next_apply_is_signed_above(
    world_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = world_factory(small_scenario())
    world.settle()
    before = _recorded(world)
    deployment = tmp_path / "deployment.json"
    world.rebuild_state_table()
    world.desired()  # read the instances again in simulated time: the CLI's reads hit the node-facts cache
    deployment.write_text(world.stack.deployment.model_dump_json())
    world.ssm_synchronous = True  # the CLI waits in real time, outside the world's simulated time
    name = world.cluster.name
    capsys.readouterr()  # the world's own log lines

    # The table forgot what was applied (diff shows the whole plan, exit 3); the head node still answers.
    assert main(["diff", "--cluster", name, "--deployment", str(deployment), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["live"]["outcome"] == "in_sync"
    assert main(["apply", "--cluster", name, "--deployment", str(deployment), "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "unchanged"

    world.ssm_synchronous = False
    world.scale("p5", 10)
    world.settle()
    after = _recorded(world)
    assert int(after["generation"]) > int(before["generation"])  # type: ignore[call-overload]
    assert after["plan_sha256"] == world.runtime.state.get(name).applied_sha256 == world.desired().sha256
    assert _refusals(world) == []
