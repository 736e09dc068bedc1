"""The head-node applier against a real, daemonized slurmctld, run inside the chroot with its python3.

slurm.conf starts without any Topology= and without topology.yaml (26.05 starts flat): the applier
sets them, as on a first apply on a HyperPod head node.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import APPLIER_RESULT_KEYS, gb200_nodes, head_node_program, node, p5_nodes, snapshot
from topokeeper.contract.head_node_program import PROGRAM_NAME
from topokeeper.domain.models import Node, PartitionSettings
from topokeeper.engine.planner import plan
from topokeeper.headnode.proof import proof_dir_prefix
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.sim.slurm_chroot import SlurmController, installed_slurm_series, installed_slurm_version
from topokeeper.wire import MAX_STDOUT_CHARS, content_sha256, parse_show_topology, sha256_text

pytestmark = pytest.mark.slurm

REQUIRED_KEYS = APPLIER_RESULT_KEYS
_bundle_numbers = itertools.count()


def _cluster(**changes: list[Node]) -> dict[str, list[Node]]:
    partitions = {
        "gpu": p5_nodes(8),
        "gb": gb200_nodes(2),
        "cpu": [node("cpu-001", "c5.xlarge", partition="cpu"), node("cpu-002", "c5.xlarge", partition="cpu")],
    }
    partitions.update(changes)
    return partitions


def _plan(partitions: dict[str, list[Node]], version: str = "26.05", **settings: PartitionSettings) -> RenderedPlan:
    return render(plan(snapshot(partitions, version=version, settings=settings)))


def _start(
    controller: SlurmController,
    rendered: RenderedPlan,
    nodes: list[str] | None = None,
    edit_conf: Callable[[str], str] | None = None,
) -> None:
    """slurm.conf with the plan's partitions and no Topology= (the applier sets it), then slurmctld."""
    nodes = list(rendered.plan.nodes) if nodes is None else nodes
    partitions = {p.partition: ([n for n in p.nodes if n in nodes], None) for p in rendered.plan.partitions}
    controller.prepare(nodes, partitions)
    if edit_conf:
        conf = controller.etc / "slurm.conf"
        conf.write_text(edit_conf(conf.read_text()))
    controller.start()


def _bundle(rendered: RenderedPlan) -> dict[str, Any]:
    return rendered.bundle.document()


def _with_content(bundle: dict[str, Any], content: str) -> dict[str, Any]:
    """The bundle with another topology file, consistently rehashed: valid by hash, whatever Slurm thinks."""
    changed = json.loads(json.dumps(bundle))
    (name,) = changed["files"]
    changed["files"][name] = {"content": content, "sha256": sha256_text(content)}
    changed["plan_sha256"] = content_sha256(
        changed["slurm_format"], changed["topology_plugin"], {name: content}, changed["partitions"]
    )
    return changed


def _applier_command(controller: SlurmController, mode: str, bundle: dict[str, Any] | None, *args: str) -> list[str]:
    """Copy the head-node program (and the bundle, unless it comes on stdin) into the chroot; the command to run
    it with the chroot's python3."""
    base = controller.root / controller.inner_dir.lstrip("/")
    shutil.copy(head_node_program(), base / PROGRAM_NAME)
    source = "-"
    if bundle is not None:
        name = f"bundle-{next(_bundle_numbers)}.json"
        (base / name).write_text(json.dumps(bundle))
        source = f"{controller.inner_dir}/{name}"
    return controller.command("python3", f"{controller.inner_dir}/{PROGRAM_NAME}", mode, source, *args)


def _document(stdout: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(stdout)  # exactly one JSON document, nothing else
    assert set(document) >= REQUIRED_KEYS, REQUIRED_KEYS - set(document)
    assert len(stdout) < MAX_STDOUT_CHARS
    return document


def _run(
    controller: SlurmController,
    mode: str,
    bundle: dict[str, Any] | None,
    *args: str,
    stdin: str | None = None,
    timeout: float = 300,
) -> tuple[int, dict[str, Any]]:
    """The program's exit code and document; a run still going after ``timeout`` s is killed and fails the test."""
    command = _applier_command(controller, mode, bundle, *args)
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.stderr == ""
    return result.returncode, _document(result.stdout)


def _etc_files(controller: SlurmController) -> dict[str, bytes | None]:
    """Every entry of the config dir (directories as None): to prove that nothing was written."""
    return {p.name: None if p.is_dir() else p.read_bytes() for p in sorted(controller.etc.iterdir())}


def _assert_applied(code: int, document: dict[str, Any]) -> None:
    assert (code, document["outcome"], document["error"]) == (0, "applied", None)
    assert document["after_sha256"] == document["plan_sha256"] != document["before_sha256"]
    assert document["reconfigured"] and document["reconfigure_exit_code"] == 0
    assert document["drift"] == []
    assert all(entry["matches"] for entry in document["readback"].values())


def test_first_apply_loads_and_reapply_changes_nothing(yaml_root: Path, controllers) -> None:
    rendered = _plan(_cluster(), version=installed_slurm_series(yaml_root))
    bundle = _bundle(rendered)
    controller = controllers(yaml_root)
    _start(controller, rendered)
    conf = controller.etc / "slurm.conf"
    os.chown(conf, 64030, 64030)  # like HyperPod's slurm:slurm 0600
    conf.chmod(0o600)
    conf_before = conf.read_text()
    assert not (controller.etc / "topology.yaml").exists()

    code, document = _run(controller, "apply", bundle)

    _assert_applied(code, document)
    assert (document["slurm_version"], document["slurm_format"]) == (
        installed_slurm_version(yaml_root),
        "topology.yaml",
    )
    assert document["config_dir"] == f"{controller.inner_dir}/etc"
    assert document["readback"] == {
        name: {"units": len(units), "matches": True, "mismatches": [], "mismatches_dropped": 0}
        for name, units in bundle["topologies"].items()
    }
    assert set(bundle["topologies"]) == {"tree-gpu", "block-gb"}
    assert document["partitions_changed"] == ["gb", "gpu"]
    assert document["partition_topologies"] == {"gb": "block-gb", "gpu": "tree-gpu", "cpu": None, "dev": None}
    topology = controller.etc / "topology.yaml"
    assert topology.read_text() == rendered.topology_text
    written = topology.stat()
    assert (written.st_uid, written.st_gid, written.st_mode & 0o7777) == (64030, 64030, 0o600)
    # slurm.conf: the two partition lines gained Topology=, every other byte is as it was.
    expected = [
        line + {"gpu": " Topology=tree-gpu", "gb": " Topology=block-gb"}.get(line.split()[0].split("=")[1], "")
        if line.startswith("PartitionName=")
        else line
        for line in conf_before.split("\n")
    ]
    assert conf.read_text() == "\n".join(expected)
    assert (conf.stat().st_uid, conf.stat().st_mode & 0o7777) == (64030, 0o600)
    # Independent of the applier's own read-back: slurmctld serves the planned tree.
    live = parse_show_topology(controller.show_topology("tree-gpu"))
    assert live["nn-leaf000"]["nodes"] == ["p5-001", "p5-002", "p5-003"]
    backups = list((controller.etc / ".topokeeper-backup").iterdir())
    assert len(backups) == 1
    manifest = json.loads((backups[0] / "manifest.json").read_text())
    assert {Path(f["path"]).name: f["existed"] for f in manifest["files"]} == {
        "topology.yaml": False,
        "slurm.conf": True,
    }
    assert (backups[0] / "slurm.conf").read_text() == conf_before

    pid = controller.current_pid()
    files = _etc_files(controller)
    code, again = _run(controller, "apply", bundle)
    assert (code, again["outcome"]) == (0, "unchanged")
    assert again["before_sha256"] == again["after_sha256"] == again["plan_sha256"]
    assert (again["reconfigured"], again["reconfigure_exit_code"], again["partitions_changed"]) == (False, None, [])
    assert controller.current_pid() == pid
    assert _etc_files(controller) == files


def test_change_rewrites_only_what_changed(sid_root: Path, controllers) -> None:
    first = _plan(_cluster())
    # p5-008 moves to leaf001 (its old leaf and aggregation switch disappear); gb becomes flat.
    moved = node("p5-008", path=("nn-spine0", "nn-agg0", "nn-leaf001"), partition="gpu")
    second = _plan(_cluster(gpu=[*p5_nodes(7), moved]), gb=PartitionSettings(kind="flat"))
    controller = controllers(sid_root)
    _start(controller, first)
    _assert_applied(*_run(controller, "apply", _bundle(first)))
    conf = controller.etc / "slurm.conf"
    conf_after_first = conf.read_text()
    files = _etc_files(controller)

    code, dry = _run(controller, "dry-run", _bundle(second))
    assert (code, dry["outcome"], dry["partitions_changed"]) == (0, "would_apply", ["gb"])
    assert _etc_files(controller) == files  # a dry-run writes nothing
    diff_lines = [line for line in dry["diff"].splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert "-      - switch: nn-leaf002" in diff_lines
    assert "-- topology: block-gb" in diff_lines
    assert any(line.startswith("-PartitionName=gb") and "Topology=block-gb" in line for line in diff_lines)
    assert any(line.startswith("+PartitionName=gb") and "Topology" not in line for line in diff_lines)

    code, document = _run(controller, "apply", _bundle(second))
    _assert_applied(code, document)
    assert document["partitions_changed"] == ["gb"]
    assert (controller.etc / "topology.yaml").read_text() == second.topology_text
    assert conf.read_text() == conf_after_first.replace(" Topology=block-gb", "")
    assert controller.partition_topologies()["gb"] is None
    assert "nn-leaf002" not in parse_show_topology(controller.show_topology("tree-gpu"))


_INVALID_BLOCK_SIZES = (
    lambda text: text.replace("    block_sizes:\n      - 18\n", "    block_sizes:\n      - 18\n      - 54\n"),
    "fatal: Invalid BlockSizes value in topology block-gb",
)
_DUPLICATE_SWITCH = (
    lambda text: text + "      - switch: nn-leaf000\n        nodes: p5-001\n",
    "fatal: Switch (nn-leaf000) has already been defined",
)


@pytest.mark.parametrize(
    ("yaml_root", "breakage", "logged"),
    [
        # 26.05.3+ validates topology.yaml block_sizes (base x 2^k); 25.11.7 loads 18 and 54 (seen here).
        ("26.05", *_INVALID_BLOCK_SIZES),
        ("26.05", *_DUPLICATE_SWITCH),
        ("25.11", *_DUPLICATE_SWITCH),
    ],
    ids=["26.05-invalid-block-sizes", "26.05-duplicate-switch", "25.11-duplicate-switch"],
    indirect=["yaml_root"],
)
def test_plan_slurmctld_rejects_is_refused_before_any_file_is_replaced(
    yaml_root: Path, controllers, breakage: Callable[[str], str], logged: str
) -> None:
    good = _plan(_cluster(), version=installed_slurm_series(yaml_root))
    moved = node("p5-008", path=("nn-spine0", "nn-agg0", "nn-leaf001"), partition="gpu")
    changed = _plan(_cluster(gpu=[*p5_nodes(7), moved]), version=installed_slurm_series(yaml_root))
    broken_text = breakage(changed.topology_text)
    assert broken_text != changed.topology_text
    broken = _with_content(_bundle(changed), broken_text)
    controller = controllers(yaml_root)
    _start(controller, good)
    _assert_applied(*_run(controller, "apply", _bundle(good)))
    files = _etc_files(controller)
    pid = controller.current_pid()

    code, document = _run(controller, "apply", broken)

    # A throw-away slurmctld refused it before any file was replaced: the production one was never reloaded.
    assert (code, document["outcome"]) == (1, "rolled_back")
    assert (document["reconfigured"], document["reconfigure_exit_code"]) == (False, None)
    assert document["error"].startswith("slurmctld rejected the new config (a throw-away slurmctld refused it")
    assert logged in document["error"] and "nothing was changed" in document["error"]
    assert document["after_sha256"] == document["before_sha256"] == _bundle(good)["plan_sha256"]
    assert _etc_files(controller) == files
    assert controller.current_pid() == pid
    assert "is UP" in controller.run("scontrol", "ping").stdout
    code, verified = _run(controller, "verify", _bundle(good))
    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])
    assert "nn-leaf002" in parse_show_topology(controller.show_topology("tree-gpu"))


def test_the_proof_runs_as_the_slurm_user_and_leaves_nothing_behind(sid_root: Path, controllers) -> None:
    """SlurmUser=slurm and slurm.conf slurm:slurm 0600, as on HyperPod: the throw-away slurmctld drops to that
    user too and reads its copy of the new files; a set it refuses is refused with its reason, and no proof
    directory or process is left."""
    rendered = _plan(_cluster())
    controller = controllers(sid_root)

    def as_slurm(conf: str) -> str:
        for path in (controller.etc.parent / "state", controller.etc.parent / "log", controller.etc / "slurm.key"):
            os.chown(path, 64030, 64030)  # a reconfigure re-executes slurmctld as SlurmUser: it reads the key
        return conf.replace("SlurmUser=root", "SlurmUser=slurm")

    _start(controller, rendered, edit_conf=as_slurm)
    conf = controller.etc / "slurm.conf"
    os.chown(conf, 64030, 64030)
    conf.chmod(0o600)
    code, document = _run(controller, "apply", _bundle(rendered))
    assert document["error"] is None, document["error"]
    # nn-leaf002 re-parented under nn-agg0: a change only the whole-file path (reconfigure) loads.
    moved = node("p5-008", path=("nn-spine0", "nn-agg0", "nn-leaf002"), partition="gpu")
    changed = _plan(_cluster(gpu=[*p5_nodes(7), moved]))
    duplicate = "      - switch: nn-leaf000\n        nodes: p5-001\n"
    broken = _with_content(_bundle(changed), changed.topology_text + duplicate)

    code, document = _run(controller, "apply", broken)

    assert (code, document["outcome"], document["reconfigured"]) == (1, "rolled_back", False)
    assert "fatal: Switch (nn-leaf000) has already been defined" in document["error"]
    _assert_applied(*_run(controller, "apply", _bundle(changed)))
    assert not list((controller.root / "tmp").glob(proof_dir_prefix(controller.config_dir_inner) + "*"))
    marker = proof_dir_prefix(controller.config_dir_inner).encode()
    running = [p for p in Path("/proc").glob("[0-9]*") if marker in _cmdline(p)]
    assert running == []


def _cmdline(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes()
    except OSError:
        return b""


def test_unknown_nodes_or_partitions_are_refused_and_nothing_is_written(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, rendered, nodes=[n for n in rendered.plan.nodes if n != "p5-008"])
    files = _etc_files(controller)

    code, document = _run(controller, "apply", _bundle(rendered))
    assert (code, document["outcome"]) == (2, "refused")
    assert document["error"] == "1 node(s) unknown to slurmctld: p5-008"
    assert not document["reconfigured"]

    ghost = _plan(_cluster(ghost=[node("p5-001", partition="ghost")]))
    code, document = _run(controller, "dry-run", _bundle(ghost))
    assert (code, document["outcome"]) == (2, "refused")
    assert document["error"] == "partitions not in slurm.conf: ghost"
    assert _etc_files(controller) == files


def test_concurrent_applies_serialize_and_a_busy_lock_fails_cleanly(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, rendered)
    bundle = _bundle(rendered)

    commands = [_applier_command(controller, "apply", bundle) for _ in range(2)]
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    outputs = [process.communicate(timeout=300) for process in processes]
    documents = [_document(stdout) for stdout, _ in outputs]
    assert sorted(d["outcome"] for d in documents) == ["applied", "unchanged"]
    assert [p.returncode for p in processes] == [0, 0]
    assert [d["after_sha256"] for d in documents] == [bundle["plan_sha256"]] * 2
    code, verified = _run(controller, "verify", bundle)
    assert (code, verified["outcome"]) == (0, "in_sync")

    # Another apply holds the lock: this one waits --lock-timeout, then fails without writing.
    second = _plan(_cluster(), gb=PartitionSettings(kind="flat"))
    files = _etc_files(controller)
    with open(controller.etc / ".topokeeper.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, document = _run(controller, "apply", _bundle(second), "--lock-timeout", "0.5")
    assert (code, document["outcome"]) == (1, "failed")
    assert document["error"].startswith("lock busy")
    assert _etc_files(controller) == files


def test_tampered_or_truncated_payloads_are_refused_by_hash(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    bundle = _bundle(rendered)
    controller = controllers(sid_root)
    _start(controller, rendered)
    files = _etc_files(controller)
    text = json.dumps(bundle)
    tampered = json.loads(text)
    tampered["files"]["topology.yaml"]["content"] = rendered.topology_text.replace("p5-[001-003]", "p5-[001-002]")
    wrong_plan = _with_content(bundle, rendered.topology_text + "# extra\n")
    wrong_plan["plan_sha256"] = bundle["plan_sha256"]

    cases = [
        (text[: len(text) // 2], "bundle is not valid JSON"),
        (json.dumps(tampered), "bundle.files.topology.yaml: content does not match its sha256"),
        (json.dumps(wrong_plan), "bundle.plan_sha256: does not match"),
    ]
    for payload, message in cases:
        code, document = _run(controller, "apply", None, stdin=payload)
        assert (code, document["outcome"]) == (2, "refused"), message
        assert document["error"].startswith(message)
    assert _etc_files(controller) == files


def test_a_bundle_for_the_other_format_is_refused(sid_root: Path, trixie_root: Path, controllers) -> None:
    for root, version, reads in ((sid_root, "24.11", "topology.yaml"), (trixie_root, "26.05", "topology.conf")):
        rendered = _plan(_cluster(), version=version)
        controller = controllers(root)
        _start(controller, rendered)
        files = _etc_files(controller)
        code, document = _run(controller, "apply", _bundle(rendered))
        assert (code, document["outcome"], document["slurm_format"]) == (2, "refused", reads)
        assert f"reads {reads}" in document["error"]
        assert _etc_files(controller) == files


def test_topology_conf_bundle_on_24_11_sets_the_plugin_only(trixie_root: Path, controllers) -> None:
    rendered = _plan(_cluster(), version="24.11")
    bundle = _bundle(rendered)
    assert (bundle["slurm_format"], bundle["topology_plugin"]) == ("topology.conf", "topology/tree")
    controller = controllers(trixie_root)
    _start(controller, rendered)
    conf = controller.etc / "slurm.conf"
    conf_before = conf.read_text()

    code, document = _run(controller, "apply", bundle)

    _assert_applied(code, document)
    assert (document["slurm_version"], document["partitions_changed"]) == ("24.11.5", [])
    assert list(document["readback"]) == ["cluster"]
    assert conf.read_text() == conf_before + "TopologyPlugin=topology/tree\n"
    assert (controller.etc / "topology.conf").read_text() == rendered.topology_text
    assert "Topology=" not in conf.read_text().replace("TopologyPlugin=", "")
    live = parse_show_topology(controller.show_topology())
    assert live["nn-gbleaf1"]["nodes"] == [f"gb-{i:03d}" for i in range(19, 37)]
    code, again = _run(controller, "apply", bundle)
    assert (code, again["outcome"], again["reconfigured"]) == (0, "unchanged", False)


def test_verify_reports_file_then_topology_then_partition_drift(yaml_root: Path, controllers) -> None:
    rendered = _plan(_cluster(), version=installed_slurm_series(yaml_root))
    bundle = _bundle(rendered)
    controller = controllers(yaml_root)
    _start(controller, rendered)
    _assert_applied(*_run(controller, "apply", bundle))
    assert _run(controller, "verify", bundle)[0] == 0

    topology = controller.etc / "topology.yaml"
    topology.write_text(rendered.topology_text.replace("p5-[001-003]", "p5-[001-002]"))  # a hand edit
    code, document = _run(controller, "verify", bundle)
    assert (code, document["outcome"], document["grouping_drift"]) == (3, "drift", False)
    # Not loaded yet: slurmctld still groups the nodes as planned.
    assert document["drift"] == [
        {"what": "file", "name": "topology.yaml", "detail": "differs from the plan: -1 +1 lines", "kind": "naming"}
    ]
    assert document["before_sha256"] != document["plan_sha256"]

    controller.run("scontrol", "reconfigure", check=True)
    code, document = _run(controller, "verify", bundle)
    assert (code, document["grouping_drift"]) == (3, True)
    assert [(d["what"], d["name"], d["kind"]) for d in document["drift"]] == [
        ("grouping", "gpu", "grouping"),
        ("file", "topology.yaml", "grouping"),
        ("topology", "tree-gpu", "grouping"),
    ]
    assert document["drift"][0]["detail"] == (
        "Topology=tree-gpu: 1 planned node(s) in no live leaf (p5-003); 1 planned leaves not live:"
        " [p5-001, p5-002, p5-003]; 1 live leaves not planned: [p5-001, p5-002]"
    )
    assert document["readback"]["tree-gpu"]["mismatches"] == ["switch nn-leaf000: nodes 1 missing (p5-003)"]
    assert document["readback"]["block-gb"]["matches"]

    conf = controller.etc / "slurm.conf"
    conf.write_text(conf.read_text().replace(" Topology=block-gb", ""))
    controller.run("scontrol", "reconfigure", check=True)
    code, document = _run(controller, "verify", bundle)
    partition_drift = [d for d in document["drift"] if d["what"] == "partition"]
    assert partition_drift == [
        {
            "what": "partition",
            "name": "gb",
            "detail": "slurm.conf has Topology=(none), the plan block-gb",
            "kind": "grouping",
        },
        {
            "what": "partition",
            "name": "gb",
            "detail": "slurmctld has Topology=(none), the plan block-gb",
            "kind": "grouping",
        },
    ]
    assert {
        "what": "grouping",
        "name": "gb",
        "detail": "the cluster default: a flat topology live, a block in the plan",
        "kind": "grouping",
    } in document["drift"]

    _assert_applied(*_run(controller, "apply", bundle))
    code, document = _run(controller, "verify", bundle)
    assert (code, document["outcome"], document["drift"]) == (0, "in_sync", [])


def test_partitions_in_an_included_file_are_edited_there(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    controller = controllers(sid_root)
    included = controller.etc / "partitions.conf"

    def move_partitions(text: str) -> str:
        lines = text.split("\n")
        moved = [line for line in lines if line.startswith("PartitionName=")]
        included.write_text("\n".join(moved) + "\n")
        return "\n".join(line for line in lines if line not in moved) + "Include partitions.conf\n"

    _start(controller, rendered, edit_conf=move_partitions)
    conf = controller.etc / "slurm.conf"
    conf_before = conf.read_text()

    _assert_applied(*_run(controller, "apply", _bundle(rendered)))

    assert conf.read_text() == conf_before
    assert "PartitionName=gpu Nodes=p5-[001-008] State=UP Topology=tree-gpu" in included.read_text().split("\n")
    assert controller.partition_topologies()["gpu"] == "tree-gpu"


def test_the_proof_loads_a_config_whose_slurmctld_logs_errors_only(sid_root: Path, controllers) -> None:
    """SlurmctldDebug=error (a site that keeps its log quiet): the throw-away logs at that level too, so the
    info-level 'Running as primary controller' never comes; a config slurmctld loads must still be applied."""
    rendered = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, rendered, edit_conf=lambda conf: conf + "SlurmctldDebug=error\n")

    _assert_applied(*_run(controller, "apply", _bundle(rendered), timeout=120))
