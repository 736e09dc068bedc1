"""The transaction: backup, journal, new files, renames, reconfigure, and the recovery of a cut-off one."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import time
from typing import (
    Any,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from topokeeper.headnode import APPLIER_VERSION
from topokeeper.headnode.config_dir import (
    BACKUP_DIR,
    BACKUP_NAME,
    JOURNAL,
    MANIFEST,
    O_DIRECTORY,
    O_NOFOLLOW,
    Budget,
    ConfigDir,
    Faults,
    exists_at,
    link_or_copy,
    os_error,
    prune_backups,
    read_json,
    write_json,
    write_new_file,
)
from topokeeper.headnode.failures import Failed
from topokeeper.headnode.scontrol import Scontrol, reconfigure, slurmctld_up
from topokeeper.headnode.steps import Step
from topokeeper.wire import APPLIER_BUDGET_SECONDS, MIN_RECONFIGURE_SECONDS, RECONFIGURE_TIMEOUT, one_line


class Context(NamedTuple):
    """What an apply or a recovery needs besides the bundle."""

    scontrol: "Scontrol"
    budget: "Budget"
    faults: Faults
    lock_timeout: float
    signed: bool = False  # the signature was checked: the apply records the bundle's generation


class Transaction:
    """Backup, journal, new files, renames, reconfigure; roll back what was replaced when slurmctld refuses."""

    def __init__(self, config: ConfigDir, backup_fd: int, context: Context, log_path: Optional[str]) -> None:
        self.config, self.backup_fd, self.log_path = config, backup_fd, log_path
        self.scontrol, self.budget, self.faults = context.scontrol, context.budget, context.faults

    # -- the journal ------------------------------------------------------------------------------

    def journal(self) -> Optional[Dict[str, Any]]:
        """The journal a cut-off run left; one this applier did not write is refused, never acted on (root
        would otherwise restore from, or delete, whatever its names point at)."""
        where = os.path.join(self.config.path, BACKUP_DIR, JOURNAL)
        try:
            journal = read_json(self.backup_fd, JOURNAL, where)
            problem = None if journal is None else _journal_problem(journal)
        except (ValueError, Failed) as error:
            problem = "not readable JSON: %s" % error
        if problem:
            raise Failed(
                "%s is not a journal this applier wrote (%s); nothing done: check the config files against the"
                " backups beside it, then remove it" % (where, problem)
            )
        return journal

    def _set_phase(self, journal: Dict[str, Any], phase: str) -> None:
        journal["phase"] = phase
        write_json(self.backup_fd, JOURNAL, journal, self.faults, "journal", crash_step="journal-temp:" + phase)

    def _mark_rolling_back(self, journal: Dict[str, Any]) -> None:
        # Best effort (a full disk refuses it): recovery also sees from the files that a roll-forward is impossible.
        if journal.get("phase") == "rolling_back":
            return  # recorded already: a rewrite would need a free block for nothing
        with contextlib.suppress(OSError):
            self._set_phase(journal, "rolling_back")

    def _end(self, journal: Dict[str, Any]) -> None:
        # A journal that cannot be removed only makes the next run roll forward what is already in place.
        with contextlib.suppress(OSError):
            os.unlink(JOURNAL, dir_fd=self.backup_fd)
            os.fsync(self.backup_fd)
            prune_backups(self.backup_fd, keep=[journal["backup"]])

    # -- backup -----------------------------------------------------------------------------------

    def _backup(self, steps: Sequence[Step], plan_sha256: str) -> Tuple[str, List[Dict[str, Any]]]:
        """Keep each file about to be replaced in a new backup directory: a hard link (no space needed, and
        restoring it needs none), or a copy where links are impossible."""
        name = time.strftime("%Y%m%dT%H%M%SZ-", time.gmtime()) + os.urandom(4).hex()
        os.mkdir(name, 0o700, dir_fd=self.backup_fd)
        target = os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW, dir_fd=self.backup_fd)
        files: List[Dict[str, Any]] = []
        try:
            for path in dict.fromkeys(step.path for step in steps):
                new_sha256 = [
                    hashlib.sha256(s.text.encode("utf-8", "surrogateescape")).hexdigest()
                    for s in steps
                    if s.path == path
                ]
                entry: Dict[str, Any] = {
                    "path": path,
                    "existed": False,
                    "copy": None,
                    "sha256": None,
                    "new_sha256": new_sha256,
                }
                parent, base = self.config.parent(path)
                try:
                    found = os.stat(base, dir_fd=parent, follow_symlinks=False) if exists_at(parent, base) else None
                    if found is not None:
                        taken = {entry["copy"] for entry in files}
                        copy = base if base not in taken else "%03d-%s" % (len(files), base)
                        self.faults.check("backup", path)
                        link_or_copy(parent, base, target, copy)
                        entry.update(existed=True, copy=copy, sha256=self.config.sha256(path))
                finally:
                    os.close(parent)
                files.append(entry)
            os.fsync(target)
            manifest = {
                "applier_version": APPLIER_VERSION,
                "plan_sha256": plan_sha256,
                "config_dir": self.config.path,
                "files": files,
            }
            write_json(target, MANIFEST, manifest, self.faults, "backup")
        finally:
            os.close(target)
        os.fsync(self.backup_fd)
        return name, files

    # -- forward ----------------------------------------------------------------------------------

    def run(
        self,
        steps: Sequence[Step],
        plan_sha256: str,
        result: Dict[str, Any],
        live_update: Optional[Callable[[], bool]] = None,
    ) -> bool:
        """Write ``steps`` and have slurmctld load them (True); on refusal, put back what was replaced (False).

        ``live_update``: brings slurmctld to the new files without a reconfigure (True), else the reconfigure
        runs as without it. Until it returns the journal stays: a kill meanwhile is rolled forward (reconfigure).
        """
        if self.budget.left() - RECONFIGURE_TIMEOUT < MIN_RECONFIGURE_SECONDS:
            raise Failed(
                "only %.0f s of the applier's %.0f s budget left, too little to reconfigure and roll back;"
                " nothing written" % (self.budget.left(), APPLIER_BUDGET_SECONDS)
            )
        try:
            backup, files = self._backup(steps, plan_sha256)
        except OSError as error:
            raise Failed("could not back up the current files (%s); nothing was changed" % os_error(error)) from None
        result["backup_dir"] = os.path.join(self.config.path, BACKUP_DIR, backup)
        journal: Dict[str, Any] = {
            "applier_version": APPLIER_VERSION,
            "plan_sha256": plan_sha256,
            "backup": backup,
            "files": files,
            "steps": [
                {
                    "label": s.label,
                    "path": s.path,
                    "temp": s.temp,
                    "sha256": hashlib.sha256(s.text.encode("utf-8", "surrogateescape")).hexdigest(),
                }
                for s in steps
            ],
        }
        try:
            self._set_phase(journal, "prepared")
        except OSError as error:
            raise Failed("could not write the journal (%s); nothing was changed" % os_error(error)) from None
        self.faults.crash("after-journal")
        try:
            for step in steps:
                parent, name = self.config.parent(step.temp)
                try:
                    self.faults.check("temp:" + step.label, step.temp)
                    write_new_file(parent, name, step.text.encode("utf-8", "surrogateescape"), step.like)
                    os.fsync(parent)
                finally:
                    os.close(parent)
                self.faults.crash("after-temp:" + step.label)
            self._set_phase(journal, "renaming")
        except (OSError, Failed) as error:
            errors = self._discard(journal)
            raise Failed(
                "could not write the new files (%s); nothing was replaced%s" % (os_error(error), _listed(errors))
            ) from None
        renamed = self._rename(journal)
        if renamed:
            self._mark_rolling_back(journal)
            errors = self._restore(journal)
            raise Failed("could not replace %s; %s" % (renamed, restored_message(errors)))
        if live_update is not None and live_update():
            self._end(journal)
            return True
        code, message = self.faults.crash_during(
            "during-reconfigure",
            lambda: reconfigure(self.scontrol, self.log_path, self.budget.left() - RECONFIGURE_TIMEOUT),
        )
        self.faults.crash("after-reconfigure")
        result["reconfigured"], result["reconfigure_exit_code"] = True, code
        if code == 0:
            self._end(journal)
            return True
        self._rejected(journal, message, result)
        return False

    def _rejected(self, journal: Dict[str, Any], message: str, result: Dict[str, Any]) -> None:
        """slurmctld refused the new files. A daemonized slurmctld keeps the old config, but the bad files would
        break `scontrol show topology` and the next restart: put the old ones back and reload them."""
        errors, again, again_message = self.roll_back(journal)
        result["outcome"] = "failed" if again or errors else "rolled_back"
        if errors:
            result["error"] = "slurmctld rejected the new config (%s); %s" % (message, restored_message(errors))
        elif again:
            result["error"] = "slurmctld rejected the new config (%s); the previous files are restored but %s" % (
                message,
                again_message,
            )
        else:
            result["error"] = "slurmctld rejected the new config; the previous one is restored and live: %s" % message

    def _rename(self, journal: Dict[str, Any]) -> str:
        """Rename the remaining temp files over their targets in order: "" when all are in place, else what failed."""
        for entry in journal["steps"]:
            parent, temp = self.config.parent(entry["temp"])
            try:
                if not exists_at(parent, temp):
                    continue  # renamed before a crash
                self.faults.check("rename:" + entry["label"], entry["path"])
                os.rename(temp, os.path.basename(entry["path"]), src_dir_fd=parent, dst_dir_fd=parent)
                os.fsync(parent)
            except OSError as error:
                return "%s (%s)" % (entry["path"], os_error(error))
            finally:
                os.close(parent)
            self.faults.crash("after-rename:" + entry["label"])
        return ""

    # -- backward ---------------------------------------------------------------------------------

    def roll_back(self, journal: Dict[str, Any]) -> Tuple[List[str], int, str]:
        """Restore what was replaced, then reload it: (restore errors, reconfigure exit code, its message)."""
        self._mark_rolling_back(journal)
        errors = self._restore(journal)
        again, again_message = self.faults.crash_during(
            "during-rollback-reconfigure",
            lambda: reconfigure(self.scontrol, self.log_path, self.budget.left()),
        )
        return errors, again, again_message

    def _restore(self, journal: Dict[str, Any]) -> List[str]:
        """Put back each file this transaction replaced, continuing past errors; the journal stays while one is left."""
        errors = self._discard_temps(journal)
        ours: Dict[str, Set[str]] = {entry["path"]: set(entry["new_sha256"]) for entry in journal["files"]}
        backup: Optional[int] = None
        try:
            backup = os.open(journal["backup"], os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW, dir_fd=self.backup_fd)
        except OSError as error:
            errors.append("backup %s: %s" % (journal["backup"], os_error(error)))
        restored = 0
        for entry in journal["files"]:
            path = entry["path"]
            try:
                current = self.config.sha256(path)
                if current == entry["sha256"] or (current is None and not entry["existed"]):
                    continue  # never replaced
                if current not in ours[path] and current is not None:
                    errors.append("%s: changed by someone else since; left as it is" % path)
                    continue
                self.faults.check("restore:" + os.path.basename(path), path)
                parent, name = self.config.parent(path)
                try:
                    if entry["existed"]:
                        if backup is None:
                            raise OSError(errno.ENOENT, "no backup to restore from", path)
                        temp = ".%s.%s.topokeeper-old" % (name, os.urandom(4).hex())
                        link_or_copy(backup, entry["copy"], parent, temp)
                        try:
                            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
                        except OSError:
                            with contextlib.suppress(OSError):
                                os.unlink(temp, dir_fd=parent)
                            raise
                    else:
                        os.unlink(name, dir_fd=parent)
                    os.fsync(parent)
                finally:
                    os.close(parent)
                restored += 1
                if restored == 1:
                    self.faults.crash("during-rollback")
            except (OSError, Failed) as error:
                errors.append("%s: %s" % (path, os_error(error)))
        if backup is not None:
            os.close(backup)
        if not errors:
            self._end(journal)
        return errors

    def _discard_temps(self, journal: Dict[str, Any]) -> List[str]:
        errors = []
        for entry in journal["steps"]:
            try:
                parent, temp = self.config.parent(entry["temp"])
                try:
                    os.unlink(temp, dir_fd=parent)
                except FileNotFoundError:
                    pass
                finally:
                    os.close(parent)
            except OSError as error:
                errors.append("%s: %s" % (entry["temp"], os_error(error)))
        return errors

    def _discard(self, journal: Dict[str, Any]) -> List[str]:
        """Nothing was renamed yet: drop the temp files and the journal."""
        errors = self._discard_temps(journal)
        if not errors:
            self._end(journal)
        return errors

    # -- recovery ---------------------------------------------------------------------------------

    def recover(self, result: Dict[str, Any]) -> None:
        """Finish or undo a transaction that a kill cut off, before anything else runs.

        Before every new file was written and fsynced (phase prepared): undo, nothing was replaced. After
        (renaming): roll forward, rename the rest and reconfigure, rolling back if slurmctld refuses (not when
        none runs: the new set was proved before the first rename, and a starting slurmctld loads it). A cut-off
        rollback (rolling_back) is finished. The phase on disk is the direction, and a recovery keeps it
        without writing: rolling forward leaves "renaming" as it is, so a kill in the recovery's own
        reconfigure rolls forward again, and a full disk cannot stop it (renames and reconfigure need no block).
        """
        journal = self.journal()
        if journal is None:
            return
        phase = journal.get("phase")
        record: Dict[str, Any] = {"phase": phase, "plan_sha256": journal.get("plan_sha256"), "errors": []}
        result["recovery"] = record
        if phase == "prepared":
            record["action"] = "rolled_back"
            record["errors"] = _short(self._discard(journal))
            return
        # "reconfiguring": written by earlier appliers as their recovery reconfigured; forward as well.
        if phase in ("renaming", "reconfiguring") and self._can_finish(journal):
            failed = self._rename(journal)
            if not failed:
                code, message = self.faults.crash_during(
                    "during-recovery-reconfigure",
                    lambda: reconfigure(self.scontrol, self.log_path, self.budget.left() - RECONFIGURE_TIMEOUT),
                )
                result["reconfigured"], result["reconfigure_exit_code"] = True, code
                if code == 0 or (phase == "renaming" and not slurmctld_up(self.scontrol)):
                    # No slurmctld to refuse them: a throw-away one loaded these files before the first rename,
                    # and slurmctld loads them when it starts. Rolling back would undo an accepted set.
                    record["action"] = "rolled_forward"
                    self._end(journal)
                    return
                record["refused"] = one_line(message)[:300]
        errors, again, again_message = self.roll_back(journal)
        record["action"] = "rolled_back"
        record["errors"] = _short(errors + ([again_message] if again else []))
        result["reconfigured"], result["reconfigure_exit_code"] = True, again
        if errors:
            raise Failed("a previous apply was cut off and could not be rolled back: %s" % "; ".join(errors))

    def _can_finish(self, journal: Dict[str, Any]) -> bool:
        """Whether renaming the temp files still there yields exactly the planned files: every temp file
        left is complete, and each file whose last temp is gone holds its planned content already."""
        last: Dict[str, Dict[str, Any]] = {}
        for entry in journal["steps"]:
            found = self.config.sha256(entry["temp"])
            if found is not None and found != entry["sha256"]:
                return False
            last[entry["path"]] = entry
        for path, entry in last.items():
            if self.config.sha256(entry["temp"]) is None and self.config.sha256(path) != entry["sha256"]:
                return False
        return True


def _plain_path(value: Any) -> bool:
    parts = value.split(os.sep) if isinstance(value, str) else [""]
    return not any(part in ("", os.curdir, os.pardir) for part in parts)


def files_problem(files: Any) -> Optional[str]:
    """What makes a journal's or manifest's file list other than one ``_backup`` wrote, or None."""
    if not isinstance(files, list) or not all(isinstance(entry, dict) for entry in files):
        return "files: expected a list of objects"
    for entry in files:
        copy = entry.get("copy")
        if not _plain_path(entry.get("path")):
            return "files: path %r" % str(entry.get("path"))[:80]
        if not (copy is None or (_plain_path(copy) and os.sep not in copy)):
            return "files: copy %r" % str(copy)[:80]
        if not isinstance(entry.get("new_sha256"), list) or not isinstance(entry.get("existed"), bool):
            return "files: %s lacks new_sha256 or existed" % entry["path"]
    return None


def _journal_problem(journal: Dict[str, Any]) -> Optional[str]:
    if not isinstance(journal.get("backup"), str) or not BACKUP_NAME.match(journal["backup"]):
        return "backup %r" % str(journal.get("backup"))[:80]
    steps = journal.get("steps")
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        return "steps: expected a list of objects"
    for step in steps:
        path, temp = step.get("path"), step.get("temp")
        if not (_plain_path(path) and _plain_path(temp) and isinstance(step.get("label"), str)):
            return "steps: path %r, temp %r" % (str(path)[:80], str(temp)[:80])
        directory, name = os.path.split(path)
        expected = re.compile(r"\.%s\.[0-9a-f]{8}\.topokeeper-new\Z" % re.escape(name))
        if os.path.dirname(temp) != directory or not expected.match(os.path.basename(temp)):
            return "steps: %r is not a temp file of %r" % (str(temp)[:80], path)
    return files_problem(journal.get("files"))


def _short(errors: Sequence[str], limit: int = 10) -> List[str]:
    return [one_line(error)[:300] for error in errors[:limit]]


def _listed(errors: Sequence[str]) -> str:
    return "" if not errors else " (cleanup errors: %s)" % "; ".join(errors)


def restored_message(errors: Sequence[str]) -> str:
    if not errors:
        return "the previous files are restored"
    return "the previous files could NOT all be restored (%s); the journal stays and the next run retries" % "; ".join(
        errors
    )
