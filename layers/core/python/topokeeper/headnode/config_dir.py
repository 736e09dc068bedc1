"""The config directory: files reached without following links, the backup root, the lock and the time budget."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import signal
import stat
import time
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    Mapping,
    Optional,
    Tuple,
)

from topokeeper.headnode.failures import Failed, NotRegularFile, Refused

LOCK_FILE = ".topokeeper.lock"
BACKUP_DIR = ".topokeeper-backup"
BACKUPS_KEPT = 5


#
# Nothing outside the config directory is written, and no link is followed: every file is reached from
# the directory's fd, component by component, with O_NOFOLLOW. The backup root holds the backups and
# the journal and must be a real directory owned by this user (root on a head node) with mode 0700.

JOURNAL = "journal.json"
MANIFEST = "manifest.json"
CRASH_ENV = "TOPOKEEPER_APPLIER_CRASH_AT"  # a step name: the applier SIGKILLs itself there (tests)
FAULT_ENV = "TOPOKEEPER_APPLIER_FAULT_AT"  # "point=ERRNO": that write fails with that errno (tests)
# "1": every apply takes the whole-file path (reconfigure), as before live updates: the bench's baseline
WHOLE_FILE_ENV = "TOPOKEEPER_APPLIER_WHOLE_FILE"
BACKUP_NAME = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}\Z")
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_LINK_UNSUPPORTED = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


class Faults:
    """Deterministic crash points and injected write errors, named by the environment (tests only)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.crash_at = environ.get(CRASH_ENV, "")
        point, _, name = environ.get(FAULT_ENV, "").partition("=")
        self.fault_at, self.fault_errno = point, getattr(errno, name, 0) if name.isupper() else 0
        self.whole_file_only = environ.get(WHOLE_FILE_ENV) == "1"

    def crash(self, step: str) -> None:
        if step and step == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def crash_during(self, step: str, action: Any) -> Any:
        """Run ``action``; at this crash point, in a forked child while this process dies: a SIGKILL mid-way."""
        if step != self.crash_at:
            return action()
        if os.fork() == 0:
            try:
                action()
            finally:
                os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)

    def check(self, point: str, path: str) -> None:
        if point == self.fault_at and self.fault_errno:
            raise OSError(self.fault_errno, os.strerror(self.fault_errno), path)


def _is_link(st: Optional[os.stat_result]) -> bool:
    return st is not None and stat.S_ISLNK(st.st_mode)


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "of an unknown type")


def open_regular(
    path: str,
    dir_fd: Optional[int] = None,
    *,
    where: str = "",
    flags: int = os.O_RDONLY,
    follow: bool = False,
    mode: int = 0o600,
) -> int:
    """An fd of the regular file at ``path``, the one way the head node opens a file it reads or locks.

    O_NONBLOCK: a FIFO planted there would otherwise block the open until a writer comes (an apply holds the
    lock all the while), and the run budget cannot cut an open short. Then fstat, before anything is read: a
    FIFO, a directory or a device is refused as NotRegularFile naming ``where`` (``path`` when not given) and
    what was found. Links are not followed unless ``follow`` (reading what an operator linked, never writing
    through it).
    """
    open_flags = flags | O_NONBLOCK | (0 if follow else O_NOFOLLOW)
    try:
        fd = os.open(path, open_flags, mode, dir_fd=dir_fd)
    except OSError:
        # O_NOFOLLOW at a link fails with ELOOP, a write open of a directory with EISDIR: name what is there.
        found = _stat_or_none(path, dir_fd, follow)
        if found is None or stat.S_ISREG(found.st_mode):
            raise
        raise NotRegularFile(where or path, _kind(found.st_mode)) from None
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        os.close(fd)
        raise NotRegularFile(where or path, _kind(found.st_mode))
    return fd


def _stat_or_none(path: str, dir_fd: Optional[int], follow: bool) -> Optional[os.stat_result]:
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError:
        return None


def read_text(path: str) -> str:
    """A file's text with every byte kept: undecodable bytes survive a read-edit-write round trip. A link is
    followed (slurm.conf's includes, a linked topology file a verify reads); what it reaches must be a regular file."""
    with open(open_regular(path, follow=True), encoding="utf-8", errors="surrogateescape", newline="") as handle:
        return handle.read()


# Directories are opened with O_DIRECTORY, which fails on a FIFO before the open could block; every file is
# opened by open_regular.


class ConfigDir:
    """The config directory, opened once; files are named relative to it and reached without following links."""

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)
        self.fd = os.open(self.path, os.O_RDONLY | O_DIRECTORY)

    def close(self) -> None:
        os.close(self.fd)

    def relative(self, path: str) -> str:
        relative = os.path.relpath(os.path.abspath(path), self.path)
        if relative == os.curdir or relative.split(os.sep)[0] == os.pardir or os.path.isabs(relative):
            raise Refused("%s is outside the config directory %s: topokeeper writes only there" % (path, self.path))
        return relative

    def parent(self, relative: str) -> Tuple[int, str]:
        """An fd of ``relative``'s directory (the caller closes it) and its base name; no link is followed."""
        parts = relative.split(os.sep)
        if any(part in ("", os.curdir, os.pardir) for part in parts):
            raise Refused("%s: not a plain path inside the config directory" % relative)
        fd = os.dup(self.fd)
        try:
            for part in parts[:-1]:
                child = os.open(part, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def lstat(self, relative: str) -> Optional[os.stat_result]:
        fd, name = self.parent(relative)
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def sha256(self, relative: str) -> Optional[str]:
        """The content hash of a regular file, None when it is missing; a link is refused, never read."""
        fd, name = self.parent(relative)
        try:
            try:
                handle = open_regular(name, fd, where=os.path.join(self.path, relative))
            except FileNotFoundError:
                return None
            with os.fdopen(handle, "rb") as reader:
                return hashlib.sha256(reader.read()).hexdigest()
        finally:
            os.close(fd)


def refuse_links(config: ConfigDir, paths: Iterable[str]) -> None:
    """A symlinked topology file or slurm.conf is refused, not followed (a root applier would re-own its target)."""
    for path in paths:
        found = config.lstat(config.relative(path))
        if _is_link(found):
            raise Refused(
                "%s is a symbolic link: topokeeper does not write through links; replace it with a regular file" % path
            )
        if found is not None and not stat.S_ISREG(found.st_mode):
            raise Refused("%s is not a regular file" % path)


def write_new_file(dir_fd: int, name: str, data: bytes, like: Optional[os.stat_result]) -> None:
    """A new file (never an existing one, never through a link), fsynced, with ``like``'s owner and mode."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if like is not None:
            if (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
                os.fchown(fd, like.st_uid, like.st_gid)
            os.fchmod(fd, stat.S_IMODE(like.st_mode))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)


def write_json(
    dir_fd: int, name: str, document: Mapping[str, Any], faults: Faults, point: str, *, crash_step: str = ""
) -> None:
    """Replace ``name`` atomically: a fsynced temp file renamed over it, then the directory fsynced."""
    temporary = ".%s.%s.tmp" % (name, os.urandom(4).hex())
    faults.check(point, name)
    write_new_file(dir_fd, temporary, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode(), None)
    faults.crash(crash_step)  # a kill here leaves the temp file: the next run removes it
    os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def remove_own_temps(dir_fd: int, names: Iterable[str]) -> None:
    """Remove the temp files ``write_json`` names for ``names`` that a kill left before their rename (under the
    lock, so none is in use): regular files named exactly so, nothing else."""
    own = re.compile(r"\.(%s)\.[0-9a-f]{8}\.tmp\Z" % "|".join(re.escape(name) for name in names))
    for entry in os.listdir(dir_fd):
        if not own.match(entry):
            continue
        with contextlib.suppress(OSError):  # litter, never a reason to stop the run
            if stat.S_ISREG(os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                os.unlink(entry, dir_fd=dir_fd)


def read_json(dir_fd: int, name: str, where: str = "") -> Optional[Dict[str, Any]]:
    try:
        fd = open_regular(name, dir_fd, where=where)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as reader:
        document = json.loads(reader.read().decode("utf-8"))
    if not isinstance(document, dict):
        raise Failed("%s: not a JSON object" % name)
    return document


def open_backup_root(config: ConfigDir) -> int:
    """The backup root's fd; it must be a real directory owned by this user (root) with mode 0700."""
    where = os.path.join(config.path, BACKUP_DIR)
    with contextlib.suppress(FileExistsError):
        os.mkdir(BACKUP_DIR, 0o700, dir_fd=config.fd)
    found = os.stat(BACKUP_DIR, dir_fd=config.fd, follow_symlinks=False)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or stat.S_IMODE(found.st_mode) != 0o700:
        kind = "a symbolic link" if _is_link(found) else "not a directory" if not stat.S_ISDIR(found.st_mode) else None
        detail = kind or "owner uid %d, mode %04o" % (found.st_uid, stat.S_IMODE(found.st_mode))
        raise Refused(
            "backup root %s must be a directory owned by uid %d with mode 0700 (found %s); nothing written:"
            " fix or remove it" % (where, os.geteuid(), detail)
        )
    fd = os.open(BACKUP_DIR, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW, dir_fd=config.fd)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):  # swapped between the check and the open
        os.close(fd)
        raise Refused("backup root %s changed while it was opened; nothing written" % where)
    return fd


def _created_ns(backup_fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=backup_fd, follow_symlinks=False).st_mtime_ns
    except OSError:
        return 0


def prune_backups(backup_fd: int, keep: Iterable[str]) -> None:
    """Keep the newest few backups (and any in use). Only real directories named like a backup are
    removed, and only the files directly in them: a planted link is skipped, never followed."""
    # Oldest first by creation, not by name alone: two backups made in the same second sort by their random
    # suffix, and the one in use could otherwise fall among the old ones and leave one too many.
    names = sorted(
        (name for name in os.listdir(backup_fd) if BACKUP_NAME.match(name)),
        key=lambda name: (_created_ns(backup_fd, name), name),
    )
    for old in names[:-BACKUPS_KEPT]:
        if old in keep:
            continue
        try:
            fd = os.open(old, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW, dir_fd=backup_fd)
        except OSError:
            continue  # a link or a file under a backup's name: not ours, left alone
        try:
            for name in os.listdir(fd):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)  # unlink removes a link itself, never its target
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(old, dir_fd=backup_fd)


def exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def link_or_copy(src_fd: int, name: str, dst_fd: int, new_name: str) -> None:
    """``name`` as ``new_name``: a hard link (the same owner, mode and bytes, and no free space needed), or a
    copy with the same owner and mode where the filesystem has no links."""
    try:
        os.link(name, new_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
        return
    except OSError as error:
        if error.errno not in _LINK_UNSUPPORTED:
            raise
    fd = open_regular(name, src_fd)
    with os.fdopen(fd, "rb") as reader:
        write_new_file(dst_fd, new_name, reader.read(), os.fstat(reader.fileno()))


def os_error(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return "%s: %s" % (error.filename, error.strerror) if error.filename else error.strerror
    return str(error)


@contextlib.contextmanager
def exclusive_lock(directory: str, timeout: float) -> Iterator[None]:
    path = os.path.join(directory, LOCK_FILE)
    fd = open_regular(path, flags=os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise Failed(
                        "lock busy: another apply holds %s (waited %.1f s, see --lock-timeout)" % (path, timeout)
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock


class Budget:
    """The applier's whole time budget, as a deadline every wait is cut to."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)
