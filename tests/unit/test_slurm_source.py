"""Slurm 25.11 from source and per-node slurmd: where the source is looked for, what keys the cached build, what a
slurmd is started with, and that a machine without the source says the 25.11 tier did not run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from topokeeper.sim.slurm_chroot import HarnessError
from topokeeper.sim.slurm_source import SOURCE_DIR_ENV, SOURCE_TARBALL, build_key, chroot_name, source_tarball
from topokeeper.sim.slurmd_nodes import slurmd_argv

ROOT = Path(__file__).resolve().parents[2]


def test_the_source_is_found_where_named_and_its_absence_names_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCE_DIR_ENV, str(tmp_path))
    tarball, reason = source_tarball()
    assert tarball is None
    assert reason == (
        f"no Slurm 25.11 source: {tmp_path / SOURCE_TARBALL} does not exist (set {SOURCE_DIR_ENV} to its directory)"
    )
    (tmp_path / SOURCE_TARBALL).write_bytes(b"source")
    assert source_tarball() == (tmp_path / SOURCE_TARBALL, "")


def test_the_cached_build_is_keyed_by_the_tarballs_sha256() -> None:
    one, other = build_key("a" * 64), build_key("b" * 64)
    assert one == build_key("a" * 64) and one != other
    assert chroot_name(one) == f"trixie-slurm-25.11-{one[:16]}" != chroot_name(other)


def test_a_slurmd_is_started_as_a_booting_cloud_node_with_its_topology() -> None:
    assert slurmd_argv("c5") == ["slurmd", "-b", "-N", "c5"]
    assert slurmd_argv("q1-dy-p5-1", "tt:spine1:leafD") == [
        "slurmd",
        "-b",
        "-N",
        "q1-dy-p5-1",
        "--conf",
        "topology=tt:spine1:leafD",
    ]


@pytest.mark.parametrize("topology", ["tt:spine1;leafD", "tt:$(id)", "tt:a b", "tt:a\nb", "", "tt:a,NodeName=x"])
def test_a_topology_slurm_would_not_name_never_reaches_slurmd(topology: str) -> None:
    with pytest.raises(HarnessError, match="only letters, digits and '_.:-' are accepted"):
        slurmd_argv("c5", topology)


def _run_25_11_tier(source: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/integration/slurm/test_registration_on_slurmd.py",
            "-k",
            "25_11",
        ],
        cwd=ROOT,
        env={**os.environ, SOURCE_DIR_ENV: str(source), **extra},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_without_the_source_the_25_11_tier_fails_naming_where_it_looked(tmp_path: Path) -> None:
    # A skipped test proves nothing: only a run that asks for the skip gets one (CI never does).
    result = _run_25_11_tier(tmp_path)
    assert result.returncode != 0, result.stdout + result.stderr
    assert f"{tmp_path / SOURCE_TARBALL} does not exist" in result.stdout
    assert "set TOPOKEEPER_ALLOW_MISSING_SLURM_SOURCE=1 to skip the 25.11 tier instead" in result.stdout


def test_without_the_source_and_asked_to_skip_the_summary_says_the_25_11_tier_did_not_run(tmp_path: Path) -> None:
    result = _run_25_11_tier(tmp_path, TOPOKEEPER_ALLOW_MISSING_SLURM_SOURCE="1")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert (
        f"Slurm 25.11 tier did not run: no Slurm 25.11 source: {tmp_path / SOURCE_TARBALL} does not exist"
        in "\n".join(lines)
    )
    assert "1 skipped" in lines[-1] and "passed" not in lines[-1]
