"""The ParallelCluster cluster-config snippets in docs/ load with ParallelCluster's own schema (3.16.1, offline,
in .venv-pcluster: see schema-requirements.txt), so an operator can paste them into a cluster config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.readme_examples import ROOT, Block, blocks

PCLUSTER_PYTHON = ROOT / ".venv-pcluster" / "bin" / "python"
CHECK = Path(__file__).with_name("check_schema.py")
# The first line of a yaml block that is a whole ParallelCluster cluster config.
MARKER = "# ParallelCluster cluster config"


def cluster_config_blocks() -> list[Block]:
    return [block for block in blocks() if block.lang == "yaml" and block.lines and block.lines[0].strip() == MARKER]


def schema_errors(config: dict, tmp_path: Path) -> str:
    """'' when ParallelCluster's schema loads the config, its errors otherwise."""
    assert PCLUSTER_PYTHON.exists(), f"{PCLUSTER_PYTHON} is missing: make test installs it (make install-pcluster)"
    path = tmp_path / "cluster-config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [str(PCLUSTER_PYTHON), str(CHECK), str(path), "pcluster"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.strip() if done.returncode else ""


def test_the_docs_hold_a_cluster_config_snippet() -> None:
    assert cluster_config_blocks(), f"no yaml block starting with {MARKER!r} in README.md or docs/"


@pytest.mark.parametrize("block", cluster_config_blocks(), ids=lambda block: block.where)
def test_snippet_loads_with_parallelclusters_schema(block: Block, tmp_path: Path) -> None:
    config = yaml.safe_load("\n".join(block.lines))
    assert schema_errors(config, tmp_path) == "", block.where


def test_the_schema_refuses_a_misspelled_custom_action(tmp_path: Path) -> None:
    # The check can fail: the first snippet with one key misspelled is refused, naming it.
    config = yaml.safe_load("\n".join(cluster_config_blocks()[0].lines))
    queue = config["Scheduling"]["SlurmQueues"][0]
    queue["CustomActions"]["OnNodeStartt"] = queue["CustomActions"].pop("OnNodeStart")
    assert "OnNodeStartt" in schema_errors(config, tmp_path)
