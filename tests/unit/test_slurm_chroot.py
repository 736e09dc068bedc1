"""The slurmctld harness's pure parts: the debootstrap command it builds."""

from __future__ import annotations

from pathlib import Path

from topokeeper.sim.slurm_chroot import DEBIAN_MIRROR_ENV, debootstrap_argv

TARGET = Path("/var/cache/topokeeper/chroots/sid.building")


def test_debootstrap_uses_its_own_default_mirror_unless_one_is_named() -> None:
    default = ["debootstrap", "--variant=minbase", "sid", str(TARGET)]
    assert debootstrap_argv("sid", TARGET, {}) == default
    assert debootstrap_argv("sid", TARGET, {DEBIAN_MIRROR_ENV: "  "}) == default
    named = debootstrap_argv("trixie", TARGET, {DEBIAN_MIRROR_ENV: "http://mirror.internal/debian"})
    assert named == ["debootstrap", "--variant=minbase", "trixie", str(TARGET), "http://mirror.internal/debian"]
