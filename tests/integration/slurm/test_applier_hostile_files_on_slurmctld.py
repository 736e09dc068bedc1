"""Something other than a regular file where the applier reads, locks or cleans up, on a real slurmctld.

A FIFO with no writer blocks a plain open until someone kills the applier (an apply holds the lock all that
time); a link or a directory at the journal or the lock must be refused with one line naming it, never an
internal error; a kill between a journal's temp file and its rename leaves that temp file, which the next
run removes, and nothing it did not name.
"""

from __future__ import annotations

import os
import re
import signal
import stat
from pathlib import Path

import pytest

from tests.helpers import node, p5_nodes
from tests.integration.slurm.test_applier_crash_matrix import _DUPLICATE_SWITCH, _crash
from tests.integration.slurm.test_applier_on_slurmctld import (
    _assert_applied,
    _bundle,
    _cluster,
    _plan,
    _run,
    _start,
    _with_content,
)
from tests.integration.slurm.test_applier_signed_bundles_on_slurmctld import _key_option
from tests.signing_support import sign
from topokeeper.domain.models import PartitionSettings
from topokeeper.headnode.config_dir import BACKUP_DIR, JOURNAL, LOCK_FILE, MANIFEST
from topokeeper.headnode.signature import GENERATION_FILE

pytestmark = pytest.mark.slurm

# Not a time limit on the applier: a run still going this long is waiting on a FIFO; killing it keeps the
# suite from hanging and fails the test.
HANG_GUARD_SECONDS = 120
_JOURNAL_TEMP = re.compile(r"\.journal\.json\.[0-9a-f]{8}\.tmp\Z")


def test_a_fifo_where_the_applier_reads_is_refused_without_waiting_on_it(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    document = rendered.bundle.document()
    controller = controllers(sid_root)
    _start(controller, rendered)
    option = _key_option(controller)
    _assert_applied(*_run(controller, "apply", sign(document, 1), *option))
    conf = controller.etc / "slurm.conf"
    conf_before = conf.read_bytes()
    unsigned = [("verify", document, ()), ("dry-run", document, ()), ("apply", document, ())]
    # Only an apply reads generation.json (verify and dry-run compare no generation): a signed verify beside
    # the FIFO must answer without touching it.
    signed = [("apply", sign(document, 1), option)]
    cases = [
        ("topology.yaml", unsigned),
        (f"{BACKUP_DIR}/{JOURNAL}", [unsigned[0], unsigned[2]]),
        (f"{BACKUP_DIR}/{GENERATION_FILE}", signed),
    ]
    for name, runs in cases:
        path = controller.etc / name
        kept = path.read_bytes() if path.exists() else None
        path.unlink(missing_ok=True)
        os.mkfifo(path, 0o600)
        for mode, bundle, args in runs:
            code, result = _run(controller, mode, bundle, *args, timeout=HANG_GUARD_SECONDS)
            assert (code, result["outcome"]) == (2, "refused"), (name, mode, result["error"])
            expected = f"{controller.inner_dir}/etc/{name} is a FIFO, not a regular file"
            assert result["error"].startswith(expected), (name, mode, result["error"])
            assert result["reconfigured"] is False
        if name.endswith(GENERATION_FILE):
            code, result = _run(
                controller, "verify", sign(document, 1, purpose="verify"), *option, timeout=HANG_GUARD_SECONDS
            )
            assert (code, result["outcome"]) == (0, "in_sync"), result["error"]
        assert stat.S_ISFIFO(path.lstat().st_mode)
        assert conf.read_bytes() == conf_before
        path.unlink()
        if kept is not None:
            path.write_bytes(kept)
    code, result = _run(controller, "verify", sign(document, 1, purpose="verify"), *option)
    assert (code, result["outcome"]) == (0, "in_sync")


def test_a_fifo_at_a_backup_manifest_is_skipped_without_waiting_on_it(sid_root: Path, controllers) -> None:
    good = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, good)
    _assert_applied(*_run(controller, "apply", _bundle(good)))
    (backup,) = (controller.etc / BACKUP_DIR).glob("2*")
    (backup / MANIFEST).unlink()
    os.mkfifo(backup / MANIFEST, 0o600)
    # A plan slurmctld refuses, already on disk but never loaded: the apply reloads it, slurmctld refuses, and
    # the applier looks through the backups' manifests for the files before it.
    # nn-leaf002 re-parented under nn-agg0: slurmctld serves it under nn-agg1, a difference the read-back sees
    # (a switch that only lost its nodes would read as one an incremental apply emptied).
    moved = node("p5-008", path=("nn-spine0", "nn-agg0", "nn-leaf002"), partition="gpu")
    changed = _plan(_cluster(gpu=[*p5_nodes(7), moved]))
    broken = _with_content(_bundle(changed), changed.topology_text + _DUPLICATE_SWITCH)
    (controller.etc / "topology.yaml").write_text(broken["files"]["topology.yaml"]["content"])

    code, result = _run(controller, "apply", broken, timeout=HANG_GUARD_SECONDS)

    assert (code, result["outcome"]) == (1, "failed"), result["error"]
    assert "no backup of the files before them is left" in result["error"]
    assert stat.S_ISFIFO((backup / MANIFEST).lstat().st_mode)


def test_a_link_or_a_directory_at_the_journal_or_the_lock_is_refused_naming_it(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    bundle = _bundle(rendered)
    controller = controllers(sid_root)
    _start(controller, rendered)
    _assert_applied(*_run(controller, "apply", bundle))
    precious = controller.root / controller.inner_dir.lstrip("/") / "precious"
    precious.write_text("precious\n")
    for name, modes in ((f"{BACKUP_DIR}/{JOURNAL}", ("verify", "apply")), (LOCK_FILE, ("apply",))):
        path = controller.etc / name
        for found in ("a symbolic link", "a directory"):
            path.unlink(missing_ok=True)  # an apply leaves its lock file
            if found == "a directory":
                path.mkdir()
            else:
                path.symlink_to(f"{controller.inner_dir}/precious")  # the target as the applier sees it
            for mode in modes:
                code, result = _run(controller, mode, bundle)
                assert (code, result["outcome"]) == (2, "refused"), (name, found, mode, result["error"])
                expected = f"{controller.inner_dir}/etc/{name} is {found}, not a regular file"
                assert result["error"].startswith(expected), (name, found, mode, result["error"])
            assert path.is_symlink() == (found == "a symbolic link")
            if found == "a directory":
                path.rmdir()
            else:
                path.unlink()
    assert precious.read_text() == "precious\n"
    code, result = _run(controller, "apply", bundle)
    assert (code, result["outcome"]) == (0, "unchanged")


def test_a_journal_temp_file_a_kill_left_is_removed_by_the_next_run_and_nothing_else(
    sid_root: Path, controllers
) -> None:
    old_plan, new_plan = _plan(_cluster()), _plan(_cluster(), gb=PartitionSettings(kind="flat"))
    controller = controllers(sid_root)
    _start(controller, old_plan)
    _assert_applied(*_run(controller, "apply", _bundle(old_plan)))
    # Killed with the journal at "prepared" and the "renaming" one written but not yet renamed over it.
    killed = _crash(controller, _bundle(new_plan), "journal-temp:renaming")
    assert (killed.returncode, killed.stdout) == (-signal.SIGKILL, ""), killed.stderr
    root = controller.etc / BACKUP_DIR
    assert (root / JOURNAL).exists()
    assert len([p for p in root.iterdir() if _JOURNAL_TEMP.match(p.name)]) == 1
    # Names close to the applier's own but not its own: someone else's files, left alone.
    others = [".journal.json.tmp", ".journal.json.0123ABCD.tmp", ".journal.json.0123abcd.tmp.keep", "journal.tmp"]
    for name in others:
        (root / name).write_text(f"{name}\n")

    code, verified = _run(controller, "verify", _bundle(new_plan))

    assert (verified["recovery"] or {}).get("action") == "rolled_back", verified["error"]
    assert (code, verified["outcome"]) == (3, "drift")
    assert not (root / JOURNAL).exists()
    assert [p.name for p in root.iterdir() if _JOURNAL_TEMP.match(p.name)] == []
    assert [(root / name).read_text() for name in others] == [f"{name}\n" for name in others]
    assert [p.name for p in controller.etc.iterdir() if p.name.endswith(".topokeeper-new")] == []
    _assert_applied(*_run(controller, "apply", _bundle(new_plan)))
