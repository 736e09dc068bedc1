"""Helpers for the head-node agent's tests: the fake applier, real bundles, configs and the agent's log."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from topokeeper.cli.planning import plan_from_files
from topokeeper.contract.head_node_program import PROGRAM_NAME, write_program

FAKE_APPLIER = Path(__file__).parent / "fixtures" / "fake_applier.py"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLUSTER = "llm-train-slurm"  # examples/mixed-cluster.json
# The last agent.py before per-cluster event sources and bundle schema versions: what head nodes that
# installed it still run, since HyperPod agents never update themselves.
RELEASED_AGENT_COMMIT = "e8c8e210eb2082d272175fdaaf138491b5a74a9a"
RELEASED_AGENT_PATH = "layers/core/python/topokeeper/agent/agent.py"  # one file then, run as ``python3 agent.py``
# The last head-node program before bundle schema /3: its bundles listed `registering` under /2, so it knows /2 at
# most and an agent-pull head node that installed it refuses any bundle with that key.
RELEASED_PROGRAM_COMMIT = "c6350cc8cf956c75a46bec4ed8a728990673b04b"


def agent_program(directory: Path) -> Path:
    """The head-node program as it ships (the agent runs as ``python3 PROGRAM agent ...``), written into
    ``directory``: nothing else of the package is importable from it, as on the head node."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_program(directory / PROGRAM_NAME)


def agent_command(program: Path, *arguments: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run the agent of ``program`` as its own process."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return [sys.executable, str(program), "agent", *arguments], environment


def _from_history(*arguments: str) -> bytes:
    """``git ARGUMENTS``'s output in this repository: what a release shipped."""
    repo = Path(__file__).resolve().parents[1]
    shown = subprocess.run(["git", "-C", str(repo), *arguments], capture_output=True, check=False)
    if shown.returncode != 0:
        pytest.fail(f"a released program needs the git history (git fetch --unshallow): {shown.stderr.decode()}")
    return shown.stdout


def released_agent(directory: Path) -> Path:
    """That agent.py, from the repository's history, written to ``directory``."""
    path = directory / "released_agent.py"
    path.write_bytes(_from_history("show", f"{RELEASED_AGENT_COMMIT}:{RELEASED_AGENT_PATH}"))
    return path


def released_program(directory: Path, commit: str = RELEASED_PROGRAM_COMMIT) -> Path:
    """The head-node program of ``commit``, built by that commit's own build from its own sources, in ``directory``:
    the .pyz an agent-pull head node that installed that release still runs (its agent and its applier)."""
    sources = directory / "sources"
    archive = _from_history("archive", "--format=tar", commit, "layers/core/python/topokeeper")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(sources, filter="data")
    program = directory / PROGRAM_NAME
    build = (
        "import pathlib, sys; from topokeeper.contract.head_node_program import write_program; "
        "write_program(pathlib.Path(sys.argv[1]))"
    )
    environment = {**os.environ, "PYTHONPATH": str(sources / "layers" / "core" / "python")}  # that release's only
    subprocess.run([sys.executable, "-c", build, str(program)], env=environment, check=True)
    return program


def bundle_document(slurm_version: str | None = None) -> dict[str, Any]:
    """A real bundle from the planner; another Slurm version gives another plan_sha256."""
    return plan_from_files(EXAMPLES / "mixed-cluster.json", None, slurm_version).bundle.document()


def bundle_body(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


class FakeApplier:
    """tests/fixtures/fake_applier.py copied into ``directory`` as applier.py, with its answers."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "applier.py"
        shutil.copyfile(FAKE_APPLIER, self.path)
        self._answers: dict[str, dict[str, Any]] = {}
        self.answer("apply", "applied", 0)
        self.answer("verify", "in_sync", 0)

    def answer(self, mode: str, outcome: str, exit_code: int, **extra: Any) -> None:
        self._answers[mode] = {"outcome": outcome, "exit": exit_code, **extra}
        (self.path.parent / "fake_applier.json").write_text(json.dumps(self._answers))

    def calls(self) -> list[dict[str, Any]]:
        log = self.path.parent / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def write_config(path: Path, applier: FakeApplier, state_dir: Path, **settings: Any) -> Path:
    document = {
        "cluster": CLUSTER,
        "bucket": "topo-bundles",
        "region": "us-east-1",
        "applier": str(applier.path),
        "state_dir": str(state_dir),
        **settings,
    }
    path.write_text(json.dumps(document))
    return path


def log_records(stderr: str) -> list[dict[str, Any]]:
    """The agent's log: every line must be one JSON object with an event name."""
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert all(isinstance(record, dict) and "event" in record for record in records), stderr
    return records


def events_named(stderr: str, name: str) -> list[dict[str, Any]]:
    return [record for record in log_records(stderr) if record["event"] == name]


# ``topokeeper agent install-script`` with every required value.
# Without --mode (which the script then needs from --deployment), and with it.
INSTALL_SCRIPT_BASE_ARGS = [
    "agent", "install-script", "--cluster", "llm-train-slurm", "--bucket", "topo-bundles", "--region", "us-west-2",
]  # fmt: skip
INSTALL_SCRIPT_ARGS = [*INSTALL_SCRIPT_BASE_ARGS, "--mode", "enforce", "--unsigned"]
