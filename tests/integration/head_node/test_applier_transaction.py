"""The applier's transaction against a fake ``scontrol``: journal, recovery, write faults, links, budget.

Defects of issue 11 (each test here failed on the applier before the journal): an apply cut off mid-way
was never repaired, a failed write could leave unvalidated files, the rollback stopped at its first error,
and the root applier followed links. The kill at every step against a real slurmctld is in
tests/integration/slurm/test_applier_crash_matrix.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import head_node_program, snapshot
from tests.integration.head_node.test_applier_run import FakeHeadNode, _bundle, _cluster, live_topologies
from topokeeper.domain.models import Node, PartitionSettings
from topokeeper.engine.planner import plan
from topokeeper.headnode import modes
from topokeeper.headnode.config_dir import (
    BACKUP_DIR,
    BACKUPS_KEPT,
    CRASH_ENV,
    FAULT_ENV,
    JOURNAL,
    LOCK_FILE,
    prune_backups,
)
from topokeeper.headnode.steps import yaml_topology_names
from topokeeper.render.bundle import render
from topokeeper.wire import (
    RECONFIGURE_TIMEOUT,
)


@pytest.fixture
def head_node(tmp_path: Path) -> FakeHeadNode:
    return FakeHeadNode(tmp_path)


def _serve_loading(head_node: FakeHeadNode, before: dict[str, Any] | None, after: dict[str, Any]) -> None:
    """slurmctld serving ``before`` (None: flat, no Topology=) until a reconfigure loads ``after``; the
    files on disk stay as they are."""
    served = (
        {"topologies": {"": ""}, "partitions": dict.fromkeys(after["partitions"])}
        if before is None
        else {"topologies": live_topologies(before), "partitions": before["partitions"]}
    )
    loads = {"topologies": live_topologies(after), "partitions": after["partitions"]}
    head_node.serve(nodes=after["nodes"], loads=loads, **served)


def _settings_bundle(partitions: dict[str, list[Node]], **settings: PartitionSettings) -> dict[str, Any]:
    return render(plan(snapshot(partitions, version="26.05", settings=settings))).bundle.document()


def _reconfigures(head_node: FakeHeadNode) -> int:
    return head_node.calls().count("reconfigure")


def _config_files(head_node: FakeHeadNode) -> dict[str, bytes | None]:
    return {k: v for k, v in head_node.files().items() if not k.startswith(".topokeeper")}


def _journal(head_node: FakeHeadNode) -> Path:
    return head_node.etc / BACKUP_DIR / JOURNAL


def _subprocess_apply(head_node: FakeHeadNode, bundle: dict[str, Any], **env: str) -> subprocess.CompletedProcess[str]:
    path = head_node.root / "bundle.json"
    path.write_text(json.dumps(bundle))
    return subprocess.run(
        [sys.executable, "-I", "-S", str(head_node_program()), "apply", str(path)],
        env={**head_node.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- defect 1: "disk equals the plan" is not enough ------------------------------------------------


def test_files_on_disk_that_slurmctld_never_loaded_are_loaded_not_called_unchanged(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    # A first apply whose read-back failed (slurmctld kept serving flat): the plan stays on disk.
    head_node.serve(bundle, topologies={"": ""}, partitions=dict.fromkeys(bundle["partitions"]))
    code, first, _ = head_node.run("apply", bundle)
    assert (code, first["outcome"]) == (1, "failed")
    assert first["after_sha256"] == bundle["plan_sha256"]

    _serve_loading(head_node, None, bundle)  # the next reconfigure loads it
    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"], document["reconfigured"]) == (0, "applied", True)
    assert head_node.calls().count("reconfigure") == 2
    assert document["drift"] == []


def test_disk_equal_to_the_plan_and_a_live_mismatch_that_persists_is_failed_not_unchanged(
    head_node: FakeHeadNode,
) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle, topologies={"": ""}, partitions=dict.fromkeys(bundle["partitions"]))
    head_node.run("apply", bundle)
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"], document["reconfigured"]) == (1, "failed", True)
    assert document["error"].startswith("slurmctld loaded the new config but the read-back differs")


def test_disk_equal_to_the_plan_that_slurmctld_refuses_is_rolled_back_to_the_files_before_it(
    head_node: FakeHeadNode,
) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle, topologies={"": ""}, partitions=dict.fromkeys(bundle["partitions"]))
    files = _config_files(head_node)
    head_node.run("apply", bundle)  # on disk, never matched live
    head_node.serve(reconfigure=[1, 0])

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"]) == (1, "rolled_back")
    assert "the files on disk equal the plan but slurmctld refuses them" in document["error"]
    assert _config_files(head_node) == files
    assert not _journal(head_node).exists()


def test_a_kill_after_the_renames_is_rolled_forward_by_the_next_run(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    _serve_loading(head_node, None, bundle)

    killed = _subprocess_apply(head_node, bundle, **{CRASH_ENV: "after-rename:slurm.conf"})
    assert (killed.returncode, killed.stdout) == (-signal.SIGKILL, "")
    assert json.loads(_journal(head_node).read_text())["phase"] == "renaming"
    assert "reconfigure" not in head_node.calls()

    code, document, _ = head_node.run("apply", bundle)

    assert document["recovery"]["action"] == "rolled_forward"
    assert (code, document["outcome"], document["drift"]) == (0, "applied", [])
    assert head_node.calls().count("reconfigure") == 1
    assert not _journal(head_node).exists()


def test_a_journal_left_reconfiguring_by_an_earlier_recovery_is_rolled_forward(head_node: FakeHeadNode) -> None:
    """Appliers before issue 26 wrote phase "reconfiguring" as their recovery reconfigured, and a kill there made
    the next run roll the complete new files back. It is the forward direction, as "renaming" is."""
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    _serve_loading(head_node, None, bundle)
    killed = _subprocess_apply(head_node, bundle, **{CRASH_ENV: "after-rename:slurm.conf"})
    assert killed.returncode == -signal.SIGKILL
    _journal(head_node).write_text(
        json.dumps({**json.loads(_journal(head_node).read_text()), "phase": "reconfiguring"})
    )

    code, document, _ = head_node.run("verify", bundle)

    assert document["recovery"]["action"] == "rolled_forward"
    assert (code, document["outcome"]) == (0, "in_sync")
    assert not _journal(head_node).exists()


@pytest.mark.parametrize("step", ["after-journal", "after-temp:topology.yaml", "after-temp:slurm.conf"])
def test_a_kill_before_every_file_is_written_is_undone_by_a_verify(head_node: FakeHeadNode, step: str) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    _serve_loading(head_node, None, bundle)
    files = _config_files(head_node)

    killed = _subprocess_apply(head_node, bundle, **{CRASH_ENV: step})
    assert killed.returncode == -signal.SIGKILL

    code, document, _ = head_node.run("verify", bundle)
    assert document["recovery"]["action"] == "rolled_back"
    assert (code, document["outcome"]) == (3, "drift")
    assert _config_files(head_node) == files  # no temp file left, nothing replaced
    assert not _journal(head_node).exists()
    assert _config_files(head_node) == files


# -- defect 2: a failed write, and a rollback that gives up ---------------------------------------


def _fail_creating(monkeypatch: pytest.MonkeyPatch, fragment: str, code: int) -> None:
    """Every new file whose name holds ``fragment`` fails to be created with ``code`` (a full disk)."""
    real_open = os.open

    def failing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and fragment in os.fspath(path) and not os.fspath(path).endswith(LOCK_FILE):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)


def test_a_full_disk_at_the_second_file_replaces_nothing(head_node: FakeHeadNode, monkeypatch) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    files = _config_files(head_node)
    _fail_creating(monkeypatch, ".slurm.conf.", errno.ENOSPC)

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"], document["reconfigured"]) == (1, "failed", False)
    assert "No space left on device" in document["error"]
    assert "nothing was replaced" in document["error"]
    assert _config_files(head_node) == files  # topology.yaml was never put in place
    assert document["after_sha256"] == document["before_sha256"]


def test_the_rollback_continues_past_an_error_and_the_next_run_finishes_it(
    head_node: FakeHeadNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle, reconfigure=[1, 0])
    files = _config_files(head_node)
    real_rename, real_replace = os.rename, os.replace
    seen: list[str] = []

    def failing_second(real: Any) -> Any:
        def rename(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
            name = os.path.basename(os.fspath(target))
            seen.append(name)
            if name == "slurm.conf" and seen.count(name) == 2:  # the restore of slurm.conf
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
            real(source, target, *args, **kwargs)

        return rename

    monkeypatch.setattr(os, "rename", failing_second(real_rename))
    monkeypatch.setattr(os, "replace", failing_second(real_replace))

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"]) == (1, "failed")
    assert "slurm.conf" in document["error"] and "No space left on device" in document["error"]
    assert not (head_node.etc / "topology.yaml").exists()  # put back (it did not exist) despite the error
    assert _journal(head_node).exists()

    monkeypatch.undo()
    head_node.serve(reconfigure=[0])
    code, document, _ = head_node.run("verify", bundle)
    assert document["recovery"]["action"] == "rolled_back"
    assert document["recovery"]["errors"] == []
    assert _config_files(head_node) == files
    assert not _journal(head_node).exists()


FAULT_POINTS = [
    "backup",
    "journal",
    "temp:topology.yaml+union",
    "temp:slurm.conf",
    "temp:topology.yaml",
    "rename:topology.yaml+union",
    "rename:slurm.conf",
    "rename:topology.yaml",
]


@pytest.mark.parametrize("error", ["ENOSPC", "EACCES"])
@pytest.mark.parametrize("point", FAULT_POINTS)
def test_a_write_error_at_each_write_keeps_the_last_good_config(
    head_node: FakeHeadNode, point: str, error: str
) -> None:
    # gb turns flat: three renames (a union of the old and new topology.yaml, slurm.conf, the new file).
    first, second = _bundle(_cluster()), _settings_bundle(_cluster(), gb=PartitionSettings(kind="flat"))
    head_node.serve(first)
    assert head_node.run("apply", first)[1]["outcome"] == "applied"
    files = _config_files(head_node)
    head_node.serve(nodes=second["nodes"])
    head_node.environ[FAULT_ENV] = f"{point}={error}"
    reconfigures = _reconfigures(head_node)

    code, document, _ = head_node.run("apply", second)

    assert (code, document["outcome"]) == (1, "failed")
    assert os.strerror(getattr(errno, error)) in document["error"]
    assert document["reconfigured"] is False
    assert _reconfigures(head_node) == reconfigures  # slurmctld never saw a half-written change
    assert _config_files(head_node) == files
    assert not _journal(head_node).exists()

    del head_node.environ[FAULT_ENV]
    _serve_loading(head_node, first, second)
    code, document, _ = head_node.run("apply", second)
    assert (code, document["outcome"]) == (0, "applied")


def test_slurmctld_down_during_apply_keeps_the_files_it_runs_and_says_so(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle, reconfigure=[1])  # "Unable to contact slurm controller" for every reconfigure
    files = _config_files(head_node)
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"]) == (1, "failed")
    assert "the previous files are restored but scontrol reconfigure exited 1" in document["error"]
    assert _config_files(head_node) == files
    assert not _journal(head_node).exists()


# -- defect 3: links and the backup root -----------------------------------------------------------


def test_a_symlinked_topology_file_is_refused_and_its_target_untouched(head_node: FakeHeadNode, tmp_path: Path) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    outside = tmp_path / "outside.yaml"
    outside.write_text("precious\n")
    outside.chmod(0o644)
    (head_node.etc / "topology.yaml").symlink_to(outside)

    for mode in ("dry-run", "apply"):
        code, document, _ = head_node.run(mode, bundle)
        assert (code, document["outcome"]) == (2, "refused")
        assert "topology.yaml is a symbolic link" in document["error"]
    assert outside.read_text() == "precious\n"
    assert (outside.stat().st_mode & 0o777) == 0o644
    assert (head_node.etc / "topology.yaml").is_symlink()


def test_a_symlinked_slurm_conf_is_refused(head_node: FakeHeadNode, tmp_path: Path) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    real = tmp_path / "real-slurm.conf"
    real.write_bytes(head_node.conf.read_bytes())
    head_node.conf.unlink()
    head_node.conf.symlink_to(real)
    before = real.read_bytes()

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"]) == (2, "refused")
    assert "slurm.conf is a symbolic link" in document["error"]
    assert real.read_bytes() == before


def test_a_planted_backup_root_link_is_refused(head_node: FakeHeadNode, tmp_path: Path) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (head_node.etc / BACKUP_DIR).symlink_to(elsewhere)
    files = head_node.files()

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"]) == (2, "refused")
    assert "must be a directory owned by uid" in document["error"] and "a symbolic link" in document["error"]
    assert list(elsewhere.iterdir()) == []
    assert {k: v for k, v in head_node.files().items() if k != LOCK_FILE} == {
        k: v for k, v in files.items() if k != LOCK_FILE
    }


def test_a_backup_root_open_to_others_is_refused(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    (head_node.etc / BACKUP_DIR).mkdir(mode=0o755)
    (head_node.etc / BACKUP_DIR).chmod(0o755)
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"]) == (2, "refused")
    assert "mode 0755" in document["error"]
    assert not (head_node.etc / "topology.yaml").exists()


def test_pruning_never_follows_a_planted_link(head_node: FakeHeadNode, tmp_path: Path) -> None:
    first, second = _bundle(_cluster()), _settings_bundle(_cluster(), gb=PartitionSettings(kind="flat"))
    head_node.serve(first)
    assert head_node.run("apply", first)[1]["outcome"] == "applied"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine\n")
    root = head_node.etc / BACKUP_DIR
    (root / "19990101T000000Z-00000000").symlink_to(victim)  # sorts oldest: first to prune
    for bundle in [second, first] * 3:
        head_node.serve(topologies=live_topologies(bundle), nodes=bundle["nodes"], partitions=bundle["partitions"])
        assert head_node.run("apply", bundle)[1]["outcome"] == "applied"
    assert (victim / "keep.txt").read_text() == "mine\n"
    assert len([p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]) == BACKUPS_KEPT


def test_pruning_keeps_the_newest_backups_when_several_share_a_second(tmp_path: Path) -> None:
    """Backups made in the same second differ only by a random suffix: the one in use, made last, may sort
    first by name. Pruning goes by creation, so exactly the newest few stay, the one in use among them."""
    root = tmp_path / "backups"
    root.mkdir()
    suffixes = ["ffffffff", "eeeeeeee", "dddddddd", "cccccccc", "bbbbbbbb", "aaaaaaaa", "00000000"]
    for age, suffix in enumerate(suffixes):  # created in this order: 00000000 is the newest
        (root / f"20261202T120000Z-{suffix}").mkdir()
        os.utime(root / f"20261202T120000Z-{suffix}", ns=(age * 10**9, age * 10**9))
    in_use = "20261202T120000Z-00000000"
    fd = os.open(root, os.O_RDONLY)
    try:
        prune_backups(fd, [in_use])
    finally:
        os.close(fd)
    assert sorted(p.name.split("-")[1] for p in root.iterdir()) == sorted(suffixes[-BACKUPS_KEPT:])


# -- the time budget and the renames' order --------------------------------------------------------


def test_a_run_without_budget_left_for_reconfigure_and_rollback_writes_nothing(
    head_node: FakeHeadNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    files = head_node.files()
    monkeypatch.setattr(modes, "APPLIER_BUDGET_SECONDS", RECONFIGURE_TIMEOUT + 5)
    code, document, _ = head_node.run("apply", bundle)
    assert (code, document["outcome"]) == (1, "failed")
    assert "too little to reconfigure and roll back; nothing written" in document["error"]
    assert {k: v for k, v in head_node.files().items() if k != LOCK_FILE} == {
        k: v for k, v in files.items() if k != LOCK_FILE
    } | ({BACKUP_DIR: None})


def test_the_budget_fits_inside_every_channel_timeout_with_margin() -> None:
    from topokeeper import wire
    from topokeeper.cli import agent_install

    waits = wire.LOCK_WAIT_SECONDS + wire.READ_SECONDS + 2 * wire.RECONFIGURE_TIMEOUT
    assert waits <= wire.APPLIER_BUDGET_SECONDS
    assert wire.SCONTROL_TIMEOUT <= wire.READ_SECONDS
    channel = wire.APPLIER_BUDGET_SECONDS + wire.TERMINATE_GRACE_SECONDS + wire.CHANNEL_MARGIN_SECONDS
    assert channel == wire.CHANNEL_TIMEOUT_SECONDS
    assert wire.CHANNEL_MARGIN_SECONDS >= 60  # the bootstrap's bundle fetch (urlopen timeout) and start-up
    assert wire.AgentConfig(cluster="c", bucket="b", region="r").applier_timeout_seconds == channel
    assert agent_install.CYCLE_TIMEOUT_SECONDS > wire.CHANNEL_TIMEOUT_SECONDS + wire.TERMINATE_GRACE_SECONDS


def test_the_agent_sends_sigterm_then_sigkill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from topokeeper.agent import applier_process
    from topokeeper.wire import AgentConfig

    stubborn = tmp_path / "applier.py"
    marker = tmp_path / "signals"
    stubborn.write_text(
        "import signal, sys, time\n"
        f"marker = {str(marker)!r}\n"
        "signal.signal(signal.SIGTERM, lambda *_: open(marker, 'a').write('TERM\\n'))\n"
        "open(marker, 'a').write('started\\n')\n"
        "while True:\n    time.sleep(0.05)\n"
    )
    monkeypatch.setattr(applier_process, "TERMINATE_GRACE_SECONDS", 0.5)
    config = AgentConfig(cluster="c", bucket="b", region="r", applier=str(stubborn), applier_timeout_seconds=2)
    result = applier_process.run_applier(config, "apply", str(tmp_path / "bundle.json"), None)
    assert result["outcome"] == "timed_out"
    assert marker.read_text().split() == ["started", "TERM"]  # asked first, then killed


def test_renames_put_a_union_of_old_and_new_topologies_first_when_slurm_conf_names_an_old_one(
    head_node: FakeHeadNode,
) -> None:
    first = _bundle(_cluster())
    # gb turns from a block into a tree: the new file lacks block-gb, which slurm.conf names until it changes.
    second = _settings_bundle(_cluster(), gb=PartitionSettings(kind="tree"))
    assert second["partitions"]["gb"] == "tree-gb" and "block-gb" in first["topologies"]
    head_node.serve(first)
    assert head_node.run("apply", first)[1]["outcome"] == "applied"
    head_node.serve(nodes=second["nodes"])

    killed = _subprocess_apply(head_node, second, **{CRASH_ENV: "after-rename:topology.yaml+union"})
    assert killed.returncode == -signal.SIGKILL
    union = (head_node.etc / "topology.yaml").read_text()
    assert yaml_topology_names(union) == {"flat-default", "tree-gpu", "tree-gb", "block-gb"}
    assert union.startswith(second["files"]["topology.yaml"]["content"])
    assert "Topology=block-gb" in head_node.conf.read_text()  # slurm.conf not renamed yet

    _serve_loading(head_node, first, second)
    code, document, _ = head_node.run("apply", second)
    assert (code, document["outcome"], document["recovery"]["action"]) == (0, "applied", "rolled_forward")
    assert (head_node.etc / "topology.yaml").read_text() == second["files"]["topology.yaml"]["content"]


# -- a journal the applier did not write -----------------------------------------------------------


def _plant_journal(head_node: FakeHeadNode, journal: dict[str, Any] | str) -> None:
    root = head_node.etc / BACKUP_DIR
    root.mkdir(mode=0o700)
    _journal(head_node).write_text(journal if isinstance(journal, str) else json.dumps(journal))


def test_a_journal_naming_a_backup_outside_the_backup_root_is_not_restored_from(
    head_node: FakeHeadNode, tmp_path: Path
) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    conf = head_node.conf.read_bytes()
    (tmp_path / "secret").write_text("not a slurm.conf\n")
    entry = {"path": "slurm.conf", "existed": True, "copy": "secret", "sha256": "1" * 64}
    _plant_journal(
        head_node,
        {
            "phase": "rolling_back",
            "plan_sha256": "0" * 64,
            "backup": "../..",  # the backup root's grandparent: tmp_path, outside the config directory
            "files": [{**entry, "new_sha256": [hashlib.sha256(conf).hexdigest()]}],
            "steps": [],
        },
    )

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"]) == (1, "failed")
    assert "journal" in document["error"] and "internal error" not in document["error"]
    assert head_node.conf.read_bytes() == conf
    assert _journal(head_node).exists()  # left for a person to look at


def test_a_journal_whose_temp_file_is_slurm_conf_does_not_delete_it(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    conf = head_node.conf.read_bytes()
    step = {"label": "slurm.conf", "path": "slurm.conf", "temp": "slurm.conf", "sha256": "0" * 64}
    _plant_journal(
        head_node,
        {"phase": "prepared", "plan_sha256": "0" * 64, "backup": "20260101T000000Z-0000abcd", "files": []}
        | {"steps": [step]},
    )

    code, document, _ = head_node.run("verify", bundle)

    assert (code, document["outcome"]) == (1, "failed") and "journal" in document["error"]
    assert head_node.conf.read_bytes() == conf


def test_a_truncated_journal_is_one_clear_error_naming_it(head_node: FakeHeadNode) -> None:
    bundle = _bundle(_cluster())
    head_node.serve(bundle)
    _plant_journal(head_node, '{"phase": "renam')

    code, document, _ = head_node.run("apply", bundle)

    assert (code, document["outcome"]) == (1, "failed")
    assert str(_journal(head_node)) in document["error"] and "internal error" not in document["error"]
