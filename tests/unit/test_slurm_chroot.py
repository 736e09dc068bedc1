"""The slurmctld harness's pure parts: the debootstrap command it builds and what it counts as a log problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from topokeeper.sim.slurm_chroot import (
    DEBIAN_MIRROR_ENV,
    SlurmController,
    built_once,
    debootstrap_argv,
    unexpected_log_lines,
)

TARGET = Path("/var/cache/topokeeper/chroots/sid.building")


def test_debootstrap_uses_its_own_default_mirror_unless_one_is_named() -> None:
    default = ["debootstrap", "--variant=minbase", "sid", str(TARGET)]
    assert debootstrap_argv("sid", TARGET, {}) == default
    assert debootstrap_argv("sid", TARGET, {DEBIAN_MIRROR_ENV: "  "}) == default
    named = debootstrap_argv("trixie", TARGET, {DEBIAN_MIRROR_ENV: "http://mirror.internal/debian"})
    assert named == ["debootstrap", "--variant=minbase", "trixie", str(TARGET), "http://mirror.internal/debian"]


# As slurmctld 26.05 and 24.11 write them (SlurmctldLogFile, default timestamps).
BUSY_MACHINE_LOG = """\
[2025-12-04T09:41:02.118] slurmctld version 26.05.5 started on cluster topokeeper
[2025-12-04T09:41:02.121] error: High latency for 1000 calls to gettimeofday(): 2213 microseconds
[2025-12-04T09:41:03.402] Warning: Note very large processing time from _slurm_rpc_reconfigure_controller: \
usec=3184412 began=09:41:00.217
[2025-12-04T09:41:03.403] Note large processing time from read_slurm_conf: usec=1203311 began=09:41:02.200
[2025-12-04T09:41:03.500] Running as primary controller
"""
REAL_PROBLEMS = [
    "[2025-12-04T09:41:04.001] error: Node p5-009 appears to have a different slurm.conf than the slurmctld.",
    "[2025-12-04T09:41:04.002] fatal: Invalid BlockSizes value in topology block-gb",
    "[2025-12-04T09:41:04.003] warning: Waiting for heartbeat file to exist...",
    "[2025-12-04T09:41:04.004] warning: TOPOLOGY: no switch can reach all nodes through its descendants.",
]


def test_a_busy_machines_timing_messages_are_not_problems() -> None:
    assert unexpected_log_lines(BUSY_MACHINE_LOG) == []


def test_real_errors_stay_problems_beside_timing_messages() -> None:
    log = BUSY_MACHINE_LOG + "\n".join(REAL_PROBLEMS) + "\n"
    assert unexpected_log_lines(log) == REAL_PROBLEMS
    # What a test expects is left out only where it appears.
    assert unexpected_log_lines(log, ("TOPOLOGY: no switch can reach all nodes",)) == REAL_PROBLEMS[:3]


def test_a_chroot_is_built_once_and_a_failed_build_leaves_nothing_half_built(tmp_path: Path) -> None:
    builds: list[Path] = []

    def failing(building: Path) -> None:
        building.mkdir()
        (building / "half").write_text("")
        raise RuntimeError("the mirror went away")

    def build(building: Path) -> None:
        builds.append(building)
        building.mkdir()
        (building / "ready").write_text("")

    def ready(root: Path) -> bool:
        return (root / "ready").exists()

    with pytest.raises(RuntimeError, match="mirror"):
        built_once(tmp_path, "sid", ready, failing)
    assert not (tmp_path / "sid").exists()
    root = built_once(tmp_path, "sid", ready, build)
    assert root == tmp_path / "sid" and (root / "ready").exists() and not (tmp_path / "sid.building").exists()
    assert built_once(tmp_path, "sid", ready, build) == root
    assert builds == [tmp_path / "sid.building"]


def test_config_files_are_replaced_whole_so_a_client_never_reads_half_of_one(tmp_path: Path) -> None:
    """HyperPod's stand-in rewrites slurm.conf (and partitions.conf) as the membership changes, while Slurm's
    clients read it: written in place, the bench's probe read "slurm.conf is empty" and a cut hostlist line. A
    reader that opened the file before keeps reading the old one whole."""
    controller = SlurmController(root=tmp_path, name="x", style="hyperpod")
    controller.etc.mkdir(parents=True)
    controller.write_slurm_conf(["n1"], {"p": (["n1"], None)})
    files = [controller.etc / name for name in ("slurm.conf", "partitions.conf")]
    before = [path.read_text() for path in files]
    with files[0].open() as conf, files[1].open() as partitions:
        controller.write_slurm_conf(["n1", "n2"], {"p": (["n1", "n2"], None)})
        assert [conf.read(), partitions.read()] == before
    assert [path.read_text() for path in files] != before
