"""``topokeeper placement --cluster``: the head node's ``placement-facts`` over SSM Run Command (emulated AWS, a real
slurmctld in a chroot), the same figures as offline; a large answer through the plan bucket's full-result path; for
an agent cluster, the newest facts its agent put in the plan bucket, with their age."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from tests.helpers import head_node_program
from tests.integration.backend.conftest import small_scenario
from topokeeper.adapters.aws import client
from topokeeper.cli.main import main
from topokeeper.contract.constants import ssm_result_key
from topokeeper.contract.head_node_program import PROGRAM_NAME
from topokeeper.sim.world import World
from topokeeper.wiring.runtime import SystemClock

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


def _emitted(world: World) -> dict[tuple[str, str], float]:
    return {(partition, metric): value for _, _, partition, metric, value in world.metrics.partition_points}


def _failures(world: World) -> list[float]:
    return [value for _, _, metric, value in world.metrics.points if metric == "PlacementFactsFailures"]


def _interval_passed(world: World) -> None:
    """The agent keeps its cadence by the head node's clock, which simulated time does not move: its interval
    passes as a real one would, by setting its last put back in its state file."""
    path = world.head.root / "var" / "lib" / "topokeeper" / world.head.controller.name / "state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "last_facts_at": 0.0}))


def test_an_agent_cluster_s_facts_reach_the_drift_metrics_and_placement_with_their_age(
    world_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HyperPod's head node takes no Run Command: its agent runs placement-facts once per drift period and puts
    them in the plan bucket under its own policy (the emulator enforces it and the bucket's), where the drift check
    and ``topokeeper placement --cluster`` read the newest, with their age."""
    world = world_factory(small_scenario(channel="agent", placement_metrics=True))
    world.settle()
    deployment = _deployment(world, tmp_path)
    controller, timing = world.head.controller, world.scenario.timing
    held = controller.submit("ml-p5", 2, "--hold", f"--job-name={HOSTILE}")
    world.advance(timing.agent_poll_seconds)  # the first cycle applied; the next puts the facts, the job in them

    world.metrics.partition_points.clear()
    world.functions.invoke("drift", {})
    shown = _offline(world, tmp_path, capsys)["partitions"]
    emitted = _emitted(world)
    assert _failures(world)[-1] == 0 and shown and emitted, (shown, emitted)
    assert {p: v for (p, m), v in emitted.items() if m == "LargestPlaceableJobNodes"} == {
        item["partition"]: item["largest_placeable"] for item in shown
    }
    assert {p: v for (p, m), v in emitted.items() if m == "JobsSpreadBeyondNeed"} == {
        item["partition"]: item["jobs_spread_beyond_need"] for item in shown
    }

    # The operator's clock, as AWS's (S3 stamps LastModified with it), is the world's.
    monkeypatch.setattr(SystemClock, "now", lambda self: world.clock.now())
    live = _placement(capsys, "--cluster", world.cluster.name, "--deployment", deployment)
    origin = live.pop("facts")
    assert (origin["source"], origin["stale"], origin["max_age_seconds"]) == ("agent", False, 1800)
    assert 0 <= origin["age_seconds"] <= timing.drift_interval_seconds + timing.agent_poll_seconds
    assert live == _offline(world, tmp_path, capsys)
    job = _placement(capsys, "--cluster", world.cluster.name, "--deployment", deployment, "--job", held)
    assert (job["job"], job["state"], job["nodes"]) == (held, "PENDING", 2)
    assert main(["placement", "--cluster", world.cluster.name, "--deployment", deployment]) == 0
    assert capsys.readouterr().out.startswith(f"placement facts put by the agent {origin['age_seconds']} s ago\n")
    assert not (controller.root / "tmp" / "pwned").exists()

    # Facts older than the bound on the agent's reports are shown as stale, never as current.
    later = world.clock.now() + timedelta(seconds=1801)
    monkeypatch.setattr(SystemClock, "now", lambda self: later)
    assert main(["placement", "--cluster", world.cluster.name, "--deployment", deployment]) == 0
    assert capsys.readouterr().out.startswith("STALE: the agent's placement facts are ")

    # slurmctld down: the agent puts why there are no facts; the drift check counts a failure and goes on.
    controller.stop()
    _interval_passed(world)
    world.advance(timing.agent_poll_seconds)
    world.functions.invoke("drift", {})
    assert _failures(world)[-1] == 1
    capsys.readouterr()  # the functions' own log lines
    monkeypatch.setattr(SystemClock, "now", lambda self: world.clock.now())
    assert main(["placement", "--cluster", world.cluster.name, "--deployment", deployment]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "could not read slurmctld" in error, error
