"""The demo's jobs (topokeeper.sim.placement_view) on a real slurmctld 26.05: a job name is a cluster user's text,
so the simulator hands it to sbatch as one argv element and never asks it back. slurmctld holds the name exactly
as written (no shell expanded it), the placement facts the figures come from do not carry it, and the timeline
line that shows it is the scenario's text."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from topokeeper.domain.models import SlurmFormat
from topokeeper.sim.head_node import ChrootHeadNode
from topokeeper.sim.placement_view import StoryJobs
from topokeeper.sim.scenario import JobRequest

pytestmark = pytest.mark.slurm


def test_a_hostile_job_name_reaches_slurmctld_as_written_and_nothing_runs_it(sid_root: Path) -> None:
    marker = f"/tmp/tk-{os.getpid()}"
    name = f"-x $(touch {marker}) `touch {marker}`; <b>\"'"
    head = ChrootHeadNode(SlurmFormat.YAML, f"demo-jobs-{os.getpid()}", root=sid_root)
    notes: list[tuple[str, str]] = []
    world = SimpleNamespace(head=head, note=lambda kind, text: notes.append((kind, text)))
    head.start({"p5": [f"p5-{i:03d}" for i in range(4)]})
    try:
        jobs = StoryJobs(world)  # type: ignore[arg-type]
        jobs.submit([JobRequest(partition="p5", nodes=2, name=name)])
        (job_id,) = jobs.names
        held = head.controller.run("squeue", "-h", "-j", job_id, "-o", "%j|%T", check=True).stdout.strip()
        assert held == f"{name}|CONFIGURING"
        facts = head.placement_facts()
        assert name not in json.dumps(facts) and "<b>" not in json.dumps(facts)
        placement = jobs.observe()
        assert placement is not None and [job["name"] for job in placement["jobs"]] == [name]
        (line,) = [text for kind, text in notes if kind == "jobs"]
        assert line.startswith(f"job {job_id} '{name}' p5 2 nodes: configuring")
    finally:
        head.stop()
    assert not (sid_root / marker.lstrip("/")).exists() and not Path(marker).exists()
