"""``topokeeper placement --cluster``: the head node's ``placement-facts`` over SSM Run Command (emulated AWS, a real
slurmctld in a chroot), the same figures as offline; a large answer through the plan bucket's full-result path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import head_node_program
from tests.integration.backend.conftest import small_scenario
from topokeeper.adapters.aws import client
from topokeeper.cli.main import main
from topokeeper.contract.constants import ssm_result_key
from topokeeper.contract.head_node_program import PROGRAM_NAME
from topokeeper.sim.world import World

pytestmark = pytest.mark.slurm
HOSTILE = "$(touch /tmp/pwned)\x1b[31m"  # a job name: never asked for, never in a shell


def _deployment(world: World, tmp_path: Path) -> str:
    path = tmp_path / "deployment.json"
    path.write_text(world.stack.deployment.model_dump_json())
    world.ssm_synchronous = True  # the CLI waits in real time, outside the world's simulated time
    return str(path)


def _results(world: World) -> list[str]:
    prefix = ssm_result_key(world.cluster.name, "").removesuffix(".json")
    listed = client("s3").list_objects_v2(Bucket=world.stack.deployment.bucket, Prefix=prefix)
    return [item["Key"] for item in listed.get("Contents", [])]


def _offline(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """The same figures from the program run on the head node by hand (``--facts``); the wait, which grows with
    the clock, left out."""
    controller = world.head.controller
    shutil.copy(head_node_program(), controller.root / controller.inner_dir.lstrip("/") / PROGRAM_NAME)
    result = controller.run("python3", f"{controller.inner_dir}/{PROGRAM_NAME}", "placement-facts", check=True)
    (tmp_path / "facts.json").write_text(result.stdout)
    return _placement(capsys, "--facts", str(tmp_path / "facts.json"))


def _placement(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    capsys.readouterr()
    assert main(["placement", *argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    for item in document.get("partitions", ()):
        item.pop("topology_pending_seconds")
    document.pop("pending_seconds", None)
    return document


def test_live_placement_equals_the_offline_figures_small_and_large(
    world_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = world_factory(small_scenario())
    world.settle()
    deployment = _deployment(world, tmp_path)
    name = world.cluster.name
    controller = world.head.controller
    held = controller.submit("ml-p5", 2, "--hold", f"--job-name={HOSTILE}")

    before = _results(world)  # the applier's, from the apply
    live = _placement(capsys, "--cluster", name, "--deployment", deployment)
    assert _results(world) == before  # small: the facts came on stdout
    assert live == _offline(world, tmp_path, capsys)
    assert not (controller.root / "tmp" / "pwned").exists()

    # Enough held jobs that the facts exceed SSM's 24,000 characters of stdout: the whole document is PUT to the
    # command's result key and read back from there, checked by size and sha256.
    controller.run("sh", "-c", "for i in $(seq 450); do sbatch -H -p ml-p5 -N 1 --wrap true >/dev/null; done")
    large = _placement(capsys, "--cluster", name, "--deployment", deployment)
    assert len(set(_results(world)) - set(before)) == 1
    assert large == _offline(world, tmp_path, capsys)
    job = _placement(capsys, "--cluster", name, "--deployment", deployment, "--job", held)
    assert (job["job"], job["state"], job["nodes"]) == (held, "PENDING", 2)


def test_live_placement_errors_in_one_line(world_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    world = world_factory(small_scenario())
    world.settle()
    deployment = _deployment(world, tmp_path)
    capsys.readouterr()
    assert main(["placement", "--cluster", "no-such", "--deployment", deployment]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no-such is not managed by this deployment" in error, error
    world.head.controller.stop()  # slurmctld down: the head node answers, without facts
    assert main(["placement", "--cluster", world.cluster.name, "--deployment", deployment]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "could not read slurmctld" in error, error
    # A head node SSM does not manage: one line naming it.
    settings = json.loads(Path(deployment).read_text())
    text = json.dumps(settings).replace(world.cluster.head_node, "mi-0123456789abcdef0")
    Path(deployment).write_text(text)
    assert main(["placement", "--cluster", world.cluster.name, "--deployment", deployment]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "mi-0123456789abcdef0" in error, error


def test_the_drift_check_emits_the_figures_placement_shows(
    world_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``placement_metrics``: the drift function reads the same facts over SSM and emits, per partition, what
    ``topokeeper placement`` shows for them."""
    world = world_factory(small_scenario(placement_metrics=True))
    world.settle()
    world.head.controller.submit("ml-p5", 2, "--hold", f"--job-name={HOSTILE}")
    world.metrics.partition_points.clear()
    world.functions.invoke("drift", {})
    emitted = {(partition, metric): value for _, _, partition, metric, value in world.metrics.partition_points}
    shown = _offline(world, tmp_path, capsys)["partitions"]
    assert shown and emitted, (shown, emitted)
    assert {p: v for (p, m), v in emitted.items() if m == "LargestPlaceableJobNodes"} == {
        item["partition"]: item["largest_placeable"] for item in shown
    }
    assert {p: v for (p, m), v in emitted.items() if m == "JobsSpreadBeyondNeed"} == {
        item["partition"]: item["jobs_spread_beyond_need"] for item in shown
    }
    assert [v for (p, m), v in emitted.items() if m == "TopologyPendingSeconds"] == [0] * len(shown)
    assert not (world.head.controller.root / "tmp" / "pwned").exists()
