"""The applier trusts nothing in a bundle it has not checked; version gate; its diff; its portability."""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topokeeper.cli.planning import plan_from_files
from topokeeper.contract.head_node_program import PACKAGE_DIR, source_paths
from topokeeper.contract.ports import Outcome
from topokeeper.headnode.bundle import parse_bundle
from topokeeper.headnode.diff import line_diff, unified_diff
from topokeeper.headnode.failures import Failed, Refused
from topokeeper.headnode.scontrol import slurm_version
from topokeeper.wire import EXIT_CODES, content_sha256, format_for_version, parse_slurm_version, sha256_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The head-node program's sources (the agent's, which needs urllib throughout, are checked with the agent).
PROGRAM_SOURCES = [PACKAGE_DIR / path for path in source_paths() if not path.startswith("agent/")]


def _document(version: str | None = None) -> dict[str, Any]:
    return plan_from_files(EXAMPLES / "mixed-cluster.json", None, version).bundle.document()


def _rehashed(document: dict[str, Any]) -> dict[str, Any]:
    """Recompute every hash, so that only the check under test can refuse the bundle."""
    for entry in document["files"].values():
        entry["sha256"] = sha256_text(entry["content"])
    document["plan_sha256"] = content_sha256(
        document["slurm_format"],
        document["topology_plugin"],
        {name: entry["content"] for name, entry in document["files"].items()},
        document["partitions"],
    )
    return document


def test_a_planner_bundle_parses() -> None:
    document = _document()
    bundle = parse_bundle(json.dumps(document))
    assert bundle.plan_sha256 == document["plan_sha256"]
    assert bundle.files == {"topology.yaml": document["files"]["topology.yaml"]["content"]}
    assert bundle.partitions == {"ml-p5": "tree-ml-p5", "ml-p6e": "block-ml-p6e", "preprocess": None}
    assert {unit.kind for unit in bundle.topologies["block-ml-p6e"].values()} == {"block"}
    assert bundle.topologies["tree-ml-p5"]["root"].switches == ["nn-fcf1c9b87318b1eb5", "no-topology"]
    assert len(bundle.nodes) == 57


def _set(path: str, value: Any, rehash: bool = True) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(document: dict[str, Any]) -> dict[str, Any]:
        *parents, last = path.split("/")
        target = document
        for key in parents:
            target = target[key]
        target[last] = value(target[last]) if callable(value) else value
        return _rehashed(document) if rehash else document

    return change


def _rename_partition(document: dict[str, Any]) -> dict[str, Any]:
    document["partitions"]["ml-p5;reboot"] = document["partitions"].pop("ml-p5")
    return _rehashed(document)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            _set("files/topology.yaml/content", lambda c: c + "# x\n", rehash=False),
            "bundle.files.topology.yaml: content",
        ),
        (
            lambda d: _set("plan_sha256", d["plan_sha256"], rehash=False)(_set("files/topology.yaml/content", "x")(d)),
            "bundle.plan_sha256: does not match",
        ),
        (_set("partitions/preprocess", "tree-ml-p5", rehash=False), "bundle.plan_sha256: does not match"),
        (_set("plan_sha256", "0" * 63 + "g", rehash=False), "bundle.plan_sha256: expected 64"),
        (_rename_partition, "bundle.partitions: not a safe Slurm name"),
        (_set("partitions/ml-p5", "tree x"), "bundle.partitions.ml-p5: not a safe Slurm name"),
        # nodes are not in plan_sha256, so the name check alone has to catch them
        (_set("nodes", lambda n: [*n, "ip-$(reboot)"], rehash=False), "bundle.nodes: not a safe Slurm name"),
        # registering is not in plan_sha256 either (the signature covers it)
        (_set("registering", ["p5-001", "x;reboot"], rehash=False), "bundle.registering: not a safe Slurm name"),
        (
            _set("topologies/tree-ml-p5/root/switches", ["a=b"], rehash=False),
            "bundle.topologies.tree-ml-p5.root.switches: not a safe",
        ),
        (_set("topologies/tree-ml-p5/root/kind", "ring", rehash=False), "bundle.topologies.tree-ml-p5.root: expected"),
        (_set("files", lambda f: {"../slurm.conf": f["topology.yaml"]}), "bundle.files: expected exactly one file"),
        (_set("files/topology.yaml/content", ""), "bundle.files.topology.yaml: empty"),
        (_set("files/topology.yaml/content", "\ud800", rehash=False), "bundle.files.topology.yaml: not valid Unicode"),
        (_set("schema", "topokeeper.bundle/1"), "bundle.schema: expected topokeeper.bundle/2"),
        (_set("extra", 1), "bundle: missing keys [], unknown keys ['extra']"),
        (_set("slurm_format", "topology.json"), "bundle.slurm_format"),
        (_set("topology_plugin", "topology/tree"), "bundle.topology_plugin: must be null"),
        (_set("cluster_name", 5, rehash=False), "bundle.cluster_name"),
    ],
)
def test_a_bad_bundle_is_refused_naming_the_field(
    change: Callable[[dict[str, Any]], dict[str, Any]], message: str
) -> None:
    with pytest.raises(Refused) as refused:
        parse_bundle(json.dumps(change(_document())))
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (json.dumps(_document())[:-100], "bundle is not valid JSON (truncated?)"),
        ('{"schema": "topokeeper.bundle/2", "schema": "x"}', "bundle is not valid JSON (truncated?): duplicate key"),
        ("[]", "bundle: expected an object"),
    ],
)
def test_unreadable_json_is_refused(text: str, message: str) -> None:
    with pytest.raises(Refused, match=re.escape(message)):
        parse_bundle(text)


def test_a_topology_conf_bundle_never_sets_topology_on_partitions() -> None:
    document = _document("24.11")
    assert parse_bundle(json.dumps(document)).topology_plugin == "topology/tree"
    document["partitions"]["ml-p5"] = "tree-ml-p5"
    with pytest.raises(Refused, match="fatal before Slurm 25.05"):
        parse_bundle(json.dumps(_rehashed(document)))
    document["partitions"]["ml-p5"] = None
    document["topology_plugin"] = "topology/tree;reboot"
    with pytest.raises(Refused, match="bundle.topology_plugin: expected topology/<name>"):
        parse_bundle(json.dumps(_rehashed(document)))


@pytest.mark.parametrize(
    ("output", "version", "slurm_format"),
    [
        ("slurm 26.05.5\n", (26, 5, 5), "topology.yaml"),
        ("slurm-wlm 24.11.5\n", (24, 11, 5), "topology.conf"),
        ("slurm 25.05.0", (25, 5, 0), "topology.yaml"),
        ("slurm 24.05.8", (24, 5, 8), "topology.conf"),
        ("slurm 25.11.0-0rc1", (25, 11, 0), "topology.yaml"),
        ("slurm 23.11", (23, 11, 0), "topology.conf"),
    ],
)
def test_the_version_chooses_the_format(output: str, version: tuple[int, int, int], slurm_format: str) -> None:
    assert parse_slurm_version(output) == version
    assert format_for_version(version) == slurm_format


def test_an_unreadable_version_fails() -> None:
    with pytest.raises(Failed, match="cannot read a Slurm version"):
        slurm_version("slurm-wlm\n")


def test_the_outcomes_are_the_ports_outcomes() -> None:
    channel = {Outcome.PENDING, Outcome.TIMED_OUT, Outcome.CANCELLED, Outcome.UNDELIVERABLE, Outcome.AGENT_OUTDATED}
    assert set(EXIT_CODES) == {outcome.value for outcome in Outcome if outcome not in channel}


_lines = st.lists(st.sampled_from(["a", "b", "c", "- switch: s1", "  nodes: n[1-2]", ""]), max_size=25)


@given(_lines, _lines)
def test_line_diff_rebuilds_both_files(old: list[str], new: list[str]) -> None:
    edits = line_diff(old, new)
    assert [line for op, line in edits if op != "+"] == old
    assert [line for op, line in edits if op != "-"] == new


def test_unified_diff_marks_only_the_changed_lines() -> None:
    old = "".join(f"line {i}\n" for i in range(1, 21))
    new = old.replace("line 4\n", "line four\n").replace("line 18\n", "").replace("line 20\n", "line 20\nline 21\n")
    assert unified_diff(old, new, "/etc/x") == (
        "--- /etc/x\n+++ /etc/x\n"
        "@@ -1,7 +1,7 @@\n line 1\n line 2\n line 3\n-line 4\n+line four\n line 5\n line 6\n line 7\n"
        "@@ -15,6 +15,6 @@\n line 15\n line 16\n line 17\n-line 18\n line 19\n line 20\n+line 21\n"
    )
    assert unified_diff(None, "a\n", "/etc/new") == "--- /dev/null\n+++ /etc/new\n@@ -0,0 +1,1 @@\n+a\n"
    assert unified_diff(old, old, "/etc/x") == ""


# Python 3.9+ methods that vermin cannot see on an object of unknown type.
_NEWER_ATTRIBUTES = {"removeprefix", "removesuffix", "is_relative_to", "with_stem", "readlink", "bit_count"}
# Debian's python3-minimal (the chroots, minimal head-node images) lacks these stdlib modules.
_NOT_IN_PYTHON3_MINIMAL = {"difflib", "shutil", "tempfile", "email", "html", "http", "urllib", "xml", "zipfile"}


def _imported(tree: ast.AST) -> set[str]:
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    return imported | {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }


def test_the_applier_uses_only_modules_python3_minimal_ships_and_no_newer_methods() -> None:
    """Only ``put_object`` (the optional upload of a document too large for stdout) imports urllib, inside the
    function: ``publish`` records an ImportError there as the upload's error (test_applier_full_result.py)."""
    tree = ast.Module(body=[node for path in PROGRAM_SOURCES for node in ast.parse(path.read_text()).body])
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    put = next(node for node in functions if node.name == "put_object")
    imported = _imported(tree)
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "topokeeper"}
    assert imported & _NOT_IN_PYTHON3_MINIMAL == {"urllib"} == _imported(put) & _NOT_IN_PYTHON3_MINIMAL
    others = [node for node in functions if node is not put]
    assert not set().union(*(_imported(node) for node in others)) & _NOT_IN_PYTHON3_MINIMAL
    top_level = ast.Module(body=[node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)])
    assert not _imported(top_level) & _NOT_IN_PYTHON3_MINIMAL
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not attributes & _NEWER_ATTRIBUTES
