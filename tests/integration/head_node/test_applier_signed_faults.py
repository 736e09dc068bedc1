"""A signed apply cut at its new step, recording the generation: a full disk while generation.json is written
writes nothing, and a kill after it is recorded leaves the very same bundle free to apply again (and an older
one refused)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import head_node_program, p5_nodes
from tests.integration.head_node.test_applier_run import FakeHeadNode, _bundle, _cluster
from tests.integration.head_node.test_applier_transaction import _config_files, _serve_loading
from tests.signing_support import sign, write_trusted_key
from topokeeper.headnode.config_dir import BACKUP_DIR
from topokeeper.headnode.signature import GENERATION_FILE


@pytest.fixture
def head_node(tmp_path: Path) -> FakeHeadNode:
    head_node = FakeHeadNode(tmp_path)
    before = _bundle(_cluster())
    head_node.serve(before)
    _serve_loading(head_node, before, _bundle(_cluster(gpu=p5_nodes(4))))  # what the apply below loads
    return head_node


def _apply(head_node: FakeHeadNode, bundle: dict[str, Any], **env: str) -> subprocess.CompletedProcess[str]:
    path = head_node.root / "bundle.json"
    path.write_text(json.dumps(bundle))
    key = write_trusted_key(head_node.root / "trusted-key.json", bundle["cluster_name"])
    return subprocess.run(
        [sys.executable, "-I", "-S", str(head_node_program()), "apply", str(path), "--trusted-key", str(key)],
        env={**head_node.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _recorded(head_node: FakeHeadNode) -> Path:
    return head_node.etc / BACKUP_DIR / GENERATION_FILE


def _backup_root_names(head_node: FakeHeadNode) -> list[str]:
    return sorted(p.name for p in (head_node.etc / BACKUP_DIR).iterdir())


def test_a_full_disk_while_recording_the_generation_writes_nothing(head_node: FakeHeadNode) -> None:
    before = _config_files(head_node)
    bundle = sign(_bundle(_cluster(gpu=p5_nodes(4))), 7)

    full = _apply(head_node, bundle, TOPOKEEPER_APPLIER_FAULT_AT="generation=ENOSPC")

    document = json.loads(full.stdout)
    assert document["outcome"] == "failed" and "No space left" in document["error"]
    assert _config_files(head_node) == before and _backup_root_names(head_node) == []  # no temp file left
    again = json.loads(_apply(head_node, bundle).stdout)
    assert again["outcome"] == "applied" and _config_files(head_node) != before
    assert json.loads(_recorded(head_node).read_text()) == {"generation": 7, "plan_sha256": bundle["plan_sha256"]}


def test_a_kill_after_the_generation_is_recorded_lets_the_same_bundle_apply_and_no_older(
    head_node: FakeHeadNode,
) -> None:
    bundle = sign(_bundle(_cluster(gpu=p5_nodes(4))), 7)

    killed = _apply(head_node, bundle, TOPOKEEPER_APPLIER_CRASH_AT="after-journal")

    assert killed.returncode < 0 and killed.stdout == ""
    assert json.loads(_recorded(head_node).read_text())["generation"] == 7
    older = json.loads(_apply(head_node, sign(_bundle(_cluster(gpu=p5_nodes(4, per_leaf=2))), 6)).stdout)
    assert older["outcome"] == "replayed", older["error"]
    retried = json.loads(_apply(head_node, bundle).stdout)
    assert retried["outcome"] in ("applied", "unchanged"), retried
    other_plan = json.loads(_apply(head_node, sign(_bundle(_cluster(gpu=p5_nodes(4, per_leaf=2))), 7)).stdout)
    assert other_plan["outcome"] == "replayed"  # the same generation only as the very same bundle
