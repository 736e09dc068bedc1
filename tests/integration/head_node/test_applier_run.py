"""The applier's CLI end to end against a fake ``scontrol`` (the real one: tests/integration/slurm).

The fake answers from a JSON state file and logs its calls, so a test can stage what slurmctld says:
its version, nodes, partitions, topologies, and the exit codes of ``scontrol reconfigure``.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import APPLIER_RESULT_KEYS, gb200_nodes, head_node_program, node, p5_nodes, snapshot
from topokeeper.cli.main import main as topokeeper_main
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes, program_sha256
from topokeeper.domain.models import Node
from topokeeper.engine.planner import plan
from topokeeper.headnode import scontrol
from topokeeper.headnode.config_dir import BACKUPS_KEPT, LOCK_FILE
from topokeeper.headnode.main import main
from topokeeper.render.bundle import render
from topokeeper.wire import MAX_STDOUT_CHARS

FAKE_SCONTROL = """\
import json, os, sys
state_path = os.environ["FAKE_SCONTROL_STATE"]
with open(state_path) as handle:
    state = json.load(handle)
args = sys.argv[1:]
with open(state_path + ".calls", "a") as handle:
    handle.write(" ".join(args) + "\\n")
if args == ["version"]:
    print(state["version"])
elif args == ["show", "config"]:
    print("SLURM_CONF              = %s" % state["slurm_conf"])
elif args == ["-o", "--future", "show", "nodes"]:
    for name in state["nodes"]:
        address = state.get("addresses", {}).get(name, name)
        print("NodeName=%s Arch=x86_64 NodeAddr=%s State=IDLE+CLOUD+POWERED_DOWN" % (name, address))
elif args == ["-a", "-o", "show", "partition"]:
    for name, topology in state["partitions"].items():
        nodes = ",".join(state.get("partition_nodes", {}).get(name, []))
        print("PartitionName=%s Nodes=%s State=UP%s" % (name, nodes, " Topology=" + topology if topology else ""))
elif args[:2] == ["show", "topology"]:
    text = state["topologies"].get(args[2] if len(args) > 2 else "")
    if text is None:
        sys.stderr.write(" slurm_load_topo error: Requested topology configuration is not available\\n")
    else:
        sys.stdout.write(text)
elif args == ["reconfigure"]:
    code = state["reconfigure"].pop(0) if len(state["reconfigure"]) > 1 else state["reconfigure"][0]
    if code == 0 and state.get("loads"):  # what slurmctld serves once it loads the files on disk
        state.update(state.pop("loads"))
    with open(state_path, "w") as handle:
        json.dump(state, handle)
    if code:
        sys.stderr.write("slurm_reconfigure error: Unspecified error\\n")
    sys.exit(code)
else:
    sys.stderr.write("fake scontrol: unexpected %s\\n" % args)
    sys.exit(99)
"""

# The throw-away slurmctld the applier proves a new config on: loads it, or refuses it with the state's
# "proof_refuses" lines; it logs as slurmctld does, to the SlurmctldLogFile of the config it is given.
FAKE_SLURMCTLD = """\
import json, sys
with open(sys.argv[-1], errors="replace") as handle:
    logs = [line.split("=", 1)[1].strip() for line in handle if line.lower().startswith("slurmctldlogfile=")]
with open(STATE_PATH) as handle:
    refuses = json.load(handle).get("proof_refuses", [])
with open(logs[-1], "a") as log:
    log.write("".join(line + "\\n" for line in refuses) or "Running as primary controller\\n")
sys.exit(1 if refuses else 0)
"""


def _cluster(**changes: list[Node]) -> dict[str, list[Node]]:
    partitions: dict[str, list[Node]] = {"gpu": p5_nodes(8), "gb": gb200_nodes(2), "cpu": [node("cpu-1", "c5.xlarge")]}
    partitions.update(changes)
    return partitions


def _bundle(partitions: dict[str, list[Node]], version: str = "26.05") -> dict[str, Any]:
    return render(plan(snapshot(partitions, version=version))).bundle.document()


def live_topologies(bundle: dict[str, Any]) -> dict[str, str]:
    """What a slurmctld that loaded ``bundle`` prints for ``scontrol show topology [NAME]``."""
    outputs = {} if bundle["slurm_format"] == "topology.conf" else {"": ""}  # the cluster default is flat
    for name, units in bundle["topologies"].items():
        lines = []
        for unit, expected in units.items():
            if expected["kind"] == "block":
                lines.append(f"BlockName={unit} BlockIndex=0 Nodes={','.join(expected['nodes'])} BlockSize=18")
            else:
                level = 1 if expected["switches"] else 0
                lines.append(
                    f"SwitchName={unit} Level={level} LinkSpeed=0 Nodes={','.join(expected['nodes'])}"
                    + (f" Switches={','.join(expected['switches'])}" if expected["switches"] else "")
                )
        outputs["" if bundle["slurm_format"] == "topology.conf" else name] = "\n".join(lines) + "\n"
    return outputs


class FakeHeadNode:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.etc = root / "etc"
        self.etc.mkdir()
        self.conf = self.etc / "slurm.conf"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        scontrol = bin_dir / "scontrol"
        scontrol.write_text(f"#!{sys.executable} -IS\n{FAKE_SCONTROL}")
        scontrol.chmod(0o755)
        self.state_path = root / "state.json"
        slurmctld = bin_dir / "slurmctld"
        slurmctld.write_text(f"#!{sys.executable} -IS\nSTATE_PATH = {str(self.state_path)!r}\n{FAKE_SLURMCTLD}")
        slurmctld.chmod(0o755)
        self.environ = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "SLURM_CONF": str(self.conf),
            "FAKE_SCONTROL_STATE": str(self.state_path),
        }
        self.state: dict[str, Any] = {
            "version": "slurm 26.05.5",
            "slurm_conf": str(self.conf),
            "nodes": [],
            "partitions": {},
            "topologies": {},
            "reconfigure": [0],
        }

    def serve(self, bundle: dict[str, Any] | None = None, **state: Any) -> None:
        """slurm.conf with the bundle's partitions; scontrol answering as if the bundle were live."""
        if bundle is not None:
            self.conf.write_text(
                "ClusterName=fake\nSlurmctldLogFile=/nonexistent/slurmctld.log\n"
                + "".join(f"PartitionName={name} Nodes=ALL State=UP\n" for name in sorted(bundle["partitions"]))
            )
            self.state.update(
                nodes=bundle["nodes"], partitions=bundle["partitions"], topologies=live_topologies(bundle)
            )
        self.state.update(state)
        self.state_path.write_text(json.dumps(self.state))

    def calls(self) -> list[str]:
        path = Path(f"{self.state_path}.calls")
        return path.read_text().splitlines() if path.exists() else []

    def run(self, mode: str, bundle: dict[str, Any] | str, *args: str) -> tuple[int, dict[str, Any], str]:
        path = self.root / "bundle.json"
        path.write_text(bundle if isinstance(bundle, str) else json.dumps(bundle))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main([mode, str(path), *args], environ=self.environ)
        text = out.getvalue()
        assert text.count("\n") == 1  # one JSON document, one line
        document: dict[str, Any] = json.loads(text)
        assert len(text) <= MAX_STDOUT_CHARS
        return code, document, text

    def files(self) -> dict[str, bytes | None]:
        return {p.name: None if p.is_dir() else p.read_bytes() for p in sorted(self.etc.iterdir())}


@pytest.fixture
def head_node(tmp_path: Path) -> FakeHeadNode:
    return FakeHeadNode(tmp_path)


def test_apply_then_unchanged_without_a_reconfigure(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    head_node.conf.chmod(0o640)
    assert not (head_node.etc / "topology.yaml").exists()

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"], document["error"]) == (0, "applied", None)
    assert document["after_sha256"] == bundle["plan_sha256"]
    assert stat.S_IMODE((head_node.etc / "topology.yaml").stat().st_mode) == 0o640
    assert head_node.calls().count("reconfigure") == 1
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"], document["reconfigured"]) == (0, "unchanged", False)
    assert head_node.calls().count("reconfigure") == 1


def test_backups_keep_the_newest_five(head_node: FakeHeadNode) -> None:
    first, second = _bundle(_cluster()), _bundle(_cluster(gpu=p5_nodes(6)))
    head_node.serve(first)
    outcomes = []
    for bundle in [first, second] * 4:
        head_node.serve(topologies=live_topologies(bundle), nodes=bundle["nodes"], partitions=bundle["partitions"])
        outcomes.append(head_node.run("apply", bundle)[1]["outcome"])
    assert outcomes == ["applied"] * 8
    backups = sorted((head_node.etc / ".topokeeper-backup").iterdir())
    assert len(backups) == BACKUPS_KEPT
    assert json.loads((backups[-1] / "manifest.json").read_text())["files"][0]["existed"] is True


def test_a_rejected_reconfigure_restores_every_byte_and_reloads(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle, reconfigure=[1, 0])
    head_node.conf.write_bytes(head_node.conf.read_bytes() + b"# caf\xe9\r\n")
    files = head_node.files()

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"], document["reconfigure_exit_code"]) == (1, "rolled_back", 1)
    assert "scontrol reconfigure exited 1: slurm_reconfigure error: Unspecified error" in document["error"]
    assert head_node.calls().count("reconfigure") == 2
    assert {k: v for k, v in head_node.files().items() if not k.startswith(".topokeeper")} == files
    assert document["after_sha256"] == document["before_sha256"] != document["plan_sha256"]


def test_a_set_the_proof_refuses_is_never_written_nor_reloaded(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle, proof_refuses=["fatal: Switch (nn-leaf000) has already been defined"])
    files = head_node.files()

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"], document["reconfigured"]) == (1, "rolled_back", False)
    assert "a throw-away slurmctld refused it before any file was replaced" in document["error"]
    assert "fatal: Switch (nn-leaf000) has already been defined" in document["error"]
    assert {k: v for k, v in head_node.files().items() if not k.startswith(".topokeeper")} == files
    assert list((head_node.etc / ".topokeeper-backup").iterdir()) == []  # not even a backup or a journal
    assert "reconfigure" not in head_node.calls()


def test_when_the_reload_of_the_old_config_fails_too_the_outcome_is_failed(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle, reconfigure=[1])
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"]) == (1, "failed")
    assert "the previous files are restored but scontrol reconfigure exited 1" in document["error"]
    assert not (head_node.etc / "topology.yaml").exists()


def test_a_read_back_mismatch_is_reported_and_not_rolled_back(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    head_node.serve(topologies={"": "", "tree-gpu": "SwitchName=root Level=1 Switches=nn-spine0\n"})

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"]) == (1, "failed")
    assert document["error"].startswith("slurmctld loaded the new config but the read-back differs from the plan")
    assert document["after_sha256"] == document["plan_sha256"]  # the plan stays on disk
    assert (head_node.etc / "topology.yaml").read_text() == bundle["files"]["topology.yaml"]["content"]
    assert document["readback"]["tree-gpu"]["matches"] is False
    assert "switch nn-spine0: missing" in document["readback"]["tree-gpu"]["mismatches"]
    assert document["readback"]["block-gb"]["mismatches"] == [
        "scontrol show topology block-gb: slurm_load_topo error: Requested topology configuration is not available"
    ]
    # Both partitions group their nodes differently now (grouping entries first), which the names show too.
    assert [(d["what"], d["name"], d["kind"]) for d in document["drift"]] == [
        ("grouping", "gb", "grouping"),
        ("grouping", "gpu", "grouping"),
        ("topology", "block-gb", "grouping"),
        ("topology", "tree-gpu", "grouping"),
    ]
    assert document["grouping_drift"] is True


def test_a_busy_lock_fails_cleanly_after_the_timeout(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    files = head_node.files()
    with open(head_node.etc / LOCK_FILE, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        code, document, _ = head_node.run("apply", bundle, "--lock-timeout", "0.3")
        waited = time.monotonic() - started
    assert (code, document["outcome"]) == (1, "failed")
    assert document["error"].startswith("lock busy: another apply holds")
    assert 0.3 <= waited < 5
    assert {k: v for k, v in head_node.files().items() if k != LOCK_FILE} == files


def test_output_stays_under_the_ssm_cap_for_20000_nodes_with_drift(head_node: FakeHeadNode) -> None:
    partitions = {f"p{i:02d}": p5_nodes(500, prefix=f"n{i:02d}-", partition=f"p{i:02d}", per_leaf=2) for i in range(40)}
    bundle = _bundle(partitions)
    assert len(bundle["nodes"]) == 20000
    head_node.serve(bundle)
    head_node.serve(topologies={}, partitions={name: None for name in partitions})

    code, document, text = head_node.run("verify", bundle)

    assert (code, document["outcome"], document["grouping_drift"]) == (3, "drift", True)
    assert len(text) <= MAX_STDOUT_CHARS
    # Per partition a grouping entry (first), then the missing file, and per partition a disk, a live
    # partition and a topology entry: capped, the rest counted.
    assert document["drift"][0] == {
        "what": "grouping",
        "name": "p00",
        "detail": "the cluster default: scontrol show topology: slurm_load_topo error: Requested topology"
        " configuration is not available",
        "kind": "grouping",
    }
    assert len(document["drift"]) + document["dropped"]["drift"] == 40 + 1 + 40 * 3
    assert len(document["readback"]) + document["dropped"].get("readback", 0) == 40
    assert all(not entry["matches"] and entry["mismatches"] for entry in document["readback"].values())

    head_node.serve(topologies=live_topologies(bundle))
    head_node.serve(topologies={"tree-p00": "SwitchName=root Level=9 Switches=x\n"})
    _, document, text = head_node.run("verify", bundle)
    first = document["readback"]["tree-p00"]
    # every switch but root is missing, and root has the wrong child
    assert first["mismatches_dropped"] + len(first["mismatches"]) == len(bundle["topologies"]["tree-p00"])
    assert len(text) <= MAX_STDOUT_CHARS

    code, document, text = head_node.run("dry-run", bundle)
    assert (code, document["outcome"]) == (0, "would_apply")
    assert document["diff"].startswith("--- /dev/null\n+++ ")
    assert document["dropped"]["diff_chars"] > 100000
    assert len(document["partitions_changed"]) + document["dropped"].get("partitions_changed", 0) == 40
    assert len(text) <= MAX_STDOUT_CHARS


def test_every_result_carries_every_key(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    required = APPLIER_RESULT_KEYS
    documents = [
        head_node.run("verify", bundle)[1],
        head_node.run("dry-run", bundle)[1],
        head_node.run("apply", "{")[1],
        head_node.run("apply", _bundle(_cluster(), version="24.11"))[1],
    ]
    assert [d["outcome"] for d in documents] == ["drift", "would_apply", "refused", "refused"]
    for document in documents:
        assert set(document) >= required


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bogus", "b.json"], "usage: argument mode: invalid choice: 'bogus'"),
        (["apply"], "usage: the following arguments are required: bundle"),
        (["apply", "b.json", "--lock-timeout", "-1"], "usage: --lock-timeout: expected a number of seconds >= 0"),
        (["apply", "/nonexistent/bundle.json"], "cannot read the bundle: [Errno 2] No such file or directory"),
    ],
)
def test_bad_arguments_still_print_one_json_document(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, environ={}) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["outcome"] == "refused"
    assert document["error"].startswith(message)


def test_scontrol_is_found_without_path_next_to_the_config_directory(head_node: FakeHeadNode) -> None:
    """/opt/slurm/etc/slurm.conf -> /opt/slurm/bin/scontrol: the fake head node is laid out the same way."""
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    head_node.environ["PATH"] = "/nonexistent"
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"]) == (0, "applied")
    assert document["scontrol"] == str(head_node.root / "bin" / "scontrol")


def test_scontrol_from_path_and_from_the_command_line(head_node: FakeHeadNode, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    monkeypatch.setattr(scontrol, "OPT_SLURM_SCONTROL", str(head_node.root / "opt" / "scontrol"))
    elsewhere = head_node.root / "elsewhere"
    elsewhere.mkdir()
    (head_node.root / "bin" / "scontrol").rename(elsewhere / "scontrol")
    head_node.environ["PATH"] = f"/nonexistent:{elsewhere}"
    code, document, _ = head_node.run("dry-run", bundle)
    assert (code, document["outcome"], document["scontrol"]) == (0, "would_apply", str(elsewhere / "scontrol"))

    head_node.environ["PATH"] = "/nonexistent"
    code, document, _ = head_node.run("dry-run", bundle, "--scontrol", str(elsewhere / "scontrol"))
    assert (code, document["outcome"], document["scontrol"]) == (0, "would_apply", str(elsewhere / "scontrol"))

    code, document, _ = head_node.run("dry-run", bundle, "--scontrol", str(head_node.conf))
    assert (code, document["outcome"], document["scontrol"]) == (1, "failed", None)
    assert document["error"] == f"--scontrol {head_node.conf}: not an executable file"


def test_without_scontrol_the_outcome_is_failed_and_names_where_it_looked(
    head_node: FakeHeadNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    monkeypatch.setattr(scontrol, "OPT_SLURM_SCONTROL", str(head_node.root / "opt" / "scontrol"))
    (head_node.root / "bin" / "scontrol").chmod(0o644)  # there, but not executable: as good as absent
    head_node.environ["PATH"] = "/nonexistent"
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"], document["scontrol"]) == (1, "failed", None)
    assert document["error"] == (
        f"scontrol not found: not {head_node.root}/bin/scontrol or {head_node.root}/opt/scontrol,"
        " nor on PATH (/nonexistent); give it with --scontrol"
    )


def test_slurm_conf_is_found_through_scontrol_without_slurm_conf(
    head_node: FakeHeadNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    del head_node.environ["SLURM_CONF"]
    monkeypatch.setattr(scontrol, "DEFAULT_SLURM_CONF", str(head_node.root / "no" / "slurm.conf"))
    code, document, _ = head_node.run("verify", bundle)
    assert (document["config_dir"], document["outcome"]) == (str(head_node.etc), "drift")
    assert code == 3
    assert head_node.calls()[0] == "show config"


def test_the_script_runs_in_a_clean_interpreter(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    (head_node.root / "bundle.json").write_text(json.dumps(bundle))
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(head_node_program()), "dry-run", "-"],
        input=json.dumps(bundle),
        env=head_node.environ,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout)["outcome"] == "would_apply"


def test_topokeeper_head_node_program_writes_the_program_and_prints_its_sha256(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / PROGRAM_NAME
    assert topokeeper_main(["head-node-program", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"{program_sha256()}  {out}\n"  # as sha256sum prints it: --check reads it
    assert out.read_bytes() == program_bytes()
    assert out.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.access(out, os.R_OK)  # run as python3 FILE: no execute bit needed


def test_the_program_runs_with_this_python_and_dispatches_its_modes(head_node: FakeHeadNode) -> None:
    """The built file, as the channels run it: apply, dry-run and verify go to the head-node program."""
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    path = head_node.root / "bundle.json"
    path.write_text(json.dumps(bundle))
    for mode, outcome, code in (("dry-run", "would_apply", 0), ("apply", "applied", 0), ("verify", "in_sync", 0)):
        result = subprocess.run(
            [sys.executable, str(head_node_program()), mode, str(path)],
            env=head_node.environ,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (result.returncode, result.stderr, json.loads(result.stdout)["outcome"]) == (code, "", outcome)
