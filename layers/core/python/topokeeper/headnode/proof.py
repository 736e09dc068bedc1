"""The new config proved on a throw-away slurmctld before any file is replaced.

slurmctld has no config-test option, and ``scontrol reconfigure`` can only load files already in place, where a
restart also reads them: a kill between the renames and the end of the reconfigure would leave files that slurmctld
refuses for the next restart. So the new set is first loaded by a slurmctld of its own: a copy of the config
directory with the new files in a temporary directory (the first of $TMPDIR, /tmp, /var/tmp and /dev/shm with room:
a full /tmp does not block every apply), started ``-D -c -i -f <copy>/slurm.conf`` with its own state directory,
port, pid and log files, nothing sent to syslog, this host as its only controller (no HA peer is told to shut down),
no accounting or job completion plugin (nothing registers with slurmdbd), no primary-on/off programs and no SACK
socket (it would replace the production daemon's in /run/slurmctld). It runs until it logs that it runs as the
primary controller (Slurm's src/slurmctld/controller.c, after ``read_slurm_conf``), or exits refusing the config,
and is then killed with its process group. It runs under ``timeout -s KILL``, so a proof whose applier is killed
ends anyway; the next proof of the same directory also stops and removes what a killed one left.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

from topokeeper.headnode.config_dir import BACKUP_DIR, LOCK_FILE, Faults, os_error, read_text
from topokeeper.headnode.failures import Failed
from topokeeper.headnode.scontrol import log_errors_since
from topokeeper.headnode.slurm_conf import SlurmConf, line_entries, set_key
from topokeeper.headnode.steps import Step
from topokeeper.wire import one_line

LOADED_MARKER = "Running as primary controller"  # logged once read_slurm_conf accepted the config
PROOF_SECONDS = 60  # loading a 10,000-node config takes a few seconds; the proof never outlives this
_GUARD = "leader.pid"  # the process group to kill: written before anything can be killed
_MAX_COPY_BYTES = 64 * 1024 * 1024  # the config directory, backups aside: a few files
_INCLUDE = re.compile(r"^(\s*include\s+)(\S+)(.*)$", re.IGNORECASE)
_MAX_INCLUDE_DEPTH = 8  # as deep as slurmctld itself follows Includes
# Keys the throw-away sets itself (the production values would reach the production daemon's files and peers).
_OWN_KEYS = {
    key.lower()
    for key in (
        "SlurmctldHost",
        "ControlMachine",
        "ControlAddr",
        "BackupController",
        "BackupAddr",
        "SlurmctldPort",
        "SlurmctldPidFile",
        "SlurmctldLogFile",
        "SlurmSchedLogFile",
        "StateSaveLocation",
        "AccountingStorageType",
        "AccountingStorageHost",
        "AccountingStorageBackupHost",
        "AccountingStorageEnforce",
        "JobCompType",
        "JobCompLoc",
        "SlurmctldPrimaryOnProg",
        "SlurmctldPrimaryOffProg",
        "AuthInfo",
        "SlurmctldParameters",
        "SlurmctldDebug",
        "SlurmctldSyslogDebug",  # set quiet: the production level would send the throw-away's lines to syslog
        "SlurmSchedLogLevel",
        "DebugFlags",  # only more lines in the throw-away's log, which must stay small (see _RESERVE_BYTES)
    )
}
# Where the proof's scratch may go, in order: the first with room (a full /tmp must not block every apply).
_TEMP_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 -- python3-minimal has no tempfile module
_RESERVE_BYTES = 1024 * 1024  # free after the copy: the throw-away's log, pid and state files take a few KiB


def proof_dir_prefix(config_path: str) -> str:
    """The name every proof directory of this config dir starts with (the next run finds a killed one's)."""
    return "topokeeper-proof-%s-" % hashlib.sha256(os.path.realpath(config_path).encode()).hexdigest()[:16]


def find_slurmctld(scontrol_path: str) -> str:
    """slurmctld beside scontrol: the same installation (``../sbin``, as Debian, HyperPod and ParallelCluster
    install it, or the same directory)."""
    directory = os.path.dirname(os.path.abspath(scontrol_path))
    candidates = [os.path.normpath(os.path.join(directory, os.pardir, "sbin", "slurmctld"))]
    candidates.append(os.path.join(directory, "slurmctld"))
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise Failed(
        "cannot prove the new config: no slurmctld beside %s (%s); nothing was changed"
        % (scontrol_path, " or ".join(candidates))
    )


def prove(conf: SlurmConf, steps: Sequence[Step], scontrol_path: str, faults: Faults, seconds: float) -> str:
    """Load the config with ``steps`` applied on a throw-away slurmctld: "" when it loads, else why it refused.
    Failed when the proof itself cannot run (nothing was changed)."""
    slurmctld = find_slurmctld(scontrol_path)
    prefix = proof_dir_prefix(conf.directory)
    stop_leftovers(prefix)
    directory, conf_copy = _scratch(conf, steps, prefix)
    try:
        refused = _run(slurmctld, conf_copy, directory, faults, min(seconds, PROOF_SECONDS))
        if refused and _filled(directory):
            # A throw-away whose log or state could not be written is no verdict on the config.
            raise Failed(
                "cannot prove the new config: %s filled up while a throw-away slurmctld ran; nothing was changed"
                % os.path.dirname(directory)
            )
        return refused
    finally:
        _remove(directory)


def _scratch(conf: SlurmConf, steps: Sequence[Step], prefix: str) -> Tuple[str, str]:
    """A new proof directory holding the config's copy, in the first temp directory with room for it and
    _RESERVE_BYTES more: (the directory, the copy's slurm.conf). Nothing is left in one that lacks room."""
    lacking = []
    for root in temp_roots():
        try:
            free = _free_bytes(root)
            if free < _RESERVE_BYTES:
                lacking.append("%s (%d KiB free)" % (root, free // 1024))
                continue
            directory = os.path.join(root, prefix + os.urandom(8).hex())
            os.mkdir(directory, 0o700)  # a new name: never an existing directory or link someone else placed
        except OSError as error:
            lacking.append("%s (%s)" % (root, os_error(error)))
            continue
        try:
            conf_copy = _copy_config(conf, steps, directory)
            free = _free_bytes(directory)
            if free >= _RESERVE_BYTES:
                return directory, conf_copy
            lacking.append("%s (%d KiB free after the copy)" % (root, free // 1024))
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                _remove(directory)
                message = "cannot prove the new config: copying it to %s: %s; nothing was changed"
                raise Failed(message % (directory, os_error(error))) from None
            lacking.append("%s (%s)" % (root, error.strerror))
        except BaseException:
            _remove(directory)
            raise
        _remove(directory)
    raise Failed(
        "cannot prove the new config: no room for a throw-away slurmctld's copy of it and %d KiB more in %s;"
        " nothing was changed" % (_RESERVE_BYTES // 1024, ", ".join(lacking))
    )


def _filled(directory: str) -> bool:
    try:
        return _free_bytes(directory) < _RESERVE_BYTES // 2
    except OSError:
        return False


def _free_bytes(path: str) -> int:
    found = os.statvfs(path)
    return int(found.f_bavail * found.f_frsize)


def _run(slurmctld: str, conf_copy: str, directory: str, faults: Faults, seconds: float) -> str:
    log_path = os.path.join(directory, "slurmctld.log")
    argv = [slurmctld, "-D", "-c", "-i", "-f", conf_copy]
    guard = next((path for path in ("/usr/bin/timeout", "/bin/timeout") if os.access(path, os.X_OK)), None)
    if guard:  # ends the throw-away even when this process is killed first
        argv = [guard, "-s", "KILL", "%d" % max(int(seconds), 1), *argv]
    environment = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}  # no SLURM_CONF, NOTIFY_SOCKET, ...
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=environment,
            cwd=directory,
            start_new_session=True,
        )
    except OSError as error:
        raise Failed("cannot start %s: %s; nothing was changed" % (slurmctld, os_error(error))) from None
    try:
        with open(os.path.join(directory, _GUARD), "w") as handle:
            handle.write("%d\n" % process.pid)
        faults.crash("during-proof")
        while process.poll() is None and time.monotonic() - started < seconds:
            if LOADED_MARKER in _read(log_path):
                return ""
            time.sleep(0.05)
        if LOADED_MARKER in _read(log_path):
            return ""
        if process.poll() is None:
            raise Failed(
                "cannot prove the new config: a throw-away slurmctld did not load it within %.0f s; nothing was"
                " changed" % seconds
            )
        logged = log_errors_since(log_path, 0)
        return logged or "a throw-away slurmctld exited %d before loading it" % process.returncode
    finally:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _copy_config(conf: SlurmConf, steps: Sequence[Step], directory: str) -> str:
    """The config directory copied into ``directory`` with the steps' final texts, and its slurm.conf and
    Includes made the throw-away's own: the path of the copy's slurm.conf."""
    source = os.path.realpath(conf.directory)
    os.chmod(directory, 0o711)  # noqa: S103 -- SlurmUser reads the topology file after slurmctld drops root
    _copy_tree(source, directory, [0])
    final: Dict[str, Step] = {step.path: step for step in steps}  # the last step of each path is its new text
    for relative, step in final.items():
        target = os.path.join(directory, relative)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        _write(target, step.text, step.like)
    uid, gid = _slurm_user(conf)
    state = os.path.join(directory, "state")
    os.mkdir(state, 0o700)
    os.chown(state, uid, gid)
    main = os.path.join(directory, os.path.relpath(conf.main, source))
    for path in conf.texts:
        copy = os.path.join(directory, os.path.relpath(path, source))
        with open(copy, encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
        text = _own_lines(text, (conf.directory, source), directory)
        if copy == main:
            text += _own_settings(conf, directory)
        with open(copy, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(text)
    return main


def _copy_tree(source: str, target: str, copied: List[int]) -> None:
    """Regular files and directories, owners and modes kept; the backups, the lock, temp files and anything
    else (a FIFO, a socket, a device) left out."""
    for name in sorted(os.listdir(source)):
        if name in (BACKUP_DIR, LOCK_FILE) or name.endswith((".topokeeper-new", ".topokeeper-old")):
            continue
        path, copy = os.path.join(source, name), os.path.join(target, name)
        found = os.stat(path)
        if stat.S_ISDIR(found.st_mode) and not os.path.islink(path):
            os.mkdir(copy, 0o700)
            _copy_tree(path, copy, copied)
        elif stat.S_ISREG(found.st_mode):
            copied[0] += found.st_size
            if copied[0] > _MAX_COPY_BYTES:
                raise OSError(errno.EFBIG, "the config directory holds more than 64 MiB", source)
            with open(path, "rb") as handle:
                data = handle.read(found.st_size + 1)
            _write_bytes(copy, data)
        else:
            continue
        os.chown(copy, found.st_uid, found.st_gid, follow_symlinks=False)
        os.chmod(copy, stat.S_IMODE(found.st_mode))


def _write(path: str, text: str, like: Optional[os.stat_result]) -> None:
    _write_bytes(path, text.encode("utf-8", "surrogateescape"))
    if like is not None:
        os.chown(path, like.st_uid, like.st_gid)
        os.chmod(path, stat.S_IMODE(like.st_mode))


def _write_bytes(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _own_lines(text: str, production: Tuple[str, ...], directory: str, depth: int = 0) -> str:
    """Settings of a key the throw-away sets itself removed; Includes of the production directory pointed at
    the copy, and a file an Include names outside it copied in too (made the throw-away's own the same way)."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        include = _INCLUDE.match(line)
        if include:
            target = include.group(2)
            for prefix in production:
                if target.startswith(prefix.rstrip(os.sep) + os.sep):
                    target = directory + target[len(prefix.rstrip(os.sep)) :]
                    break
            else:
                if os.path.isabs(target):
                    target = _copy_outside(target, production, directory, depth)
            lines[index] = include.group(1) + target + include.group(3)
            continue
        # Slurm reads every Key=value of a line, not only the first: each production one is removed.
        for key in {entry.key for entry in line_entries(line) if entry.key.lower() in _OWN_KEYS}:
            lines[index] = set_key(lines[index], key, None)
    return "\n".join(lines)


def _copy_outside(target: str, production: Tuple[str, ...], directory: str, depth: int) -> str:
    """The copy, inside ``directory``, of a file an Include names outside the config directory: its production
    settings (a primary-on program, more controllers) must not reach the throw-away."""
    if depth >= _MAX_INCLUDE_DEPTH or any(character in target for character in "*?[%"):
        raise Failed(
            "cannot prove the new config: Include %s outside the config directory; nothing was changed"
            % one_line(target)
        )
    try:
        text = read_text(target)
    except OSError as error:
        raise Failed(
            "cannot prove the new config: Include %s: %s; nothing was changed" % (one_line(target), os_error(error))
        ) from None
    copy = os.path.join(directory, "include-%s.conf" % hashlib.sha256(target.encode()).hexdigest()[:12])
    if not os.path.exists(copy):
        _write(copy, _own_lines(text, production, directory, depth + 1), None)
        os.chmod(copy, 0o644)  # SlurmUser reads it after slurmctld drops root
    return copy


def _own_settings(conf: SlurmConf, directory: str) -> str:
    auth_info = [part for part in (conf.last_value("AuthInfo") or "").split(",") if part]
    if "slurm" in (conf.last_value("AuthType") or "auth/slurm"):
        auth_info.append("disable_sack")  # else it takes over /run/slurmctld/sack.socket from the production one
    parameters = [p for p in (conf.last_value("SlurmctldParameters") or "").split(",") if p]
    parameters = [p for p in parameters if p.lower() != "reconfig_on_restart"]  # no reconfigure pushed to nodes
    settings = [
        "SlurmctldHost=%s(127.0.0.1)" % socket.gethostname().split(".")[0],  # this host, the only one
        "SlurmctldPort=%d" % _free_port(),
        "SlurmctldPidFile=%s/slurmctld.pid" % directory,
        "SlurmctldLogFile=%s/slurmctld.log" % directory,
        "StateSaveLocation=%s/state" % directory,
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SlurmctldDebug=info",  # LOADED_MARKER is logged at info: a quieter production level would hide it
        "SlurmctldSyslogDebug=quiet",  # nothing to the production's syslog (its own log file has it all)
    ]
    if auth_info:
        settings.append("AuthInfo=%s" % ",".join(auth_info))
    if parameters:
        settings.append("SlurmctldParameters=%s" % ",".join(parameters))
    return "\n# topokeeper: a throw-away slurmctld proving this config\n" + "\n".join(settings) + "\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))  # every address, as slurmctld listens: a port taken on any of them is not free
        port = probe.getsockname()[1]
    return int(port)


def _slurm_user(conf: SlurmConf) -> Tuple[int, int]:
    name = conf.last_value("SlurmUser") or "root"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        message = "cannot prove the new config: SlurmUser %s is not a user here; nothing was changed" % name
        raise Failed(message) from None
    return entry.pw_uid, entry.pw_gid


def stop_leftovers(prefix: str) -> None:
    """Stop the throw-aways a killed proof of this config dir left running, and remove their directories."""
    for parent in temp_roots():
        with contextlib.suppress(OSError):  # a temp directory missing here is one no proof used
            _stop_leftovers_in(parent, prefix)


def _stop_leftovers_in(parent: str, prefix: str) -> None:
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if not name.startswith(prefix) or os.path.islink(path) or not os.path.isdir(path):
            continue
        found = os.stat(path)
        if found.st_uid != os.geteuid():
            continue  # not one this user made
        try:
            with open(os.path.join(path, _GUARD)) as handle:
                leader = int(handle.read().strip() or 0)
        except (OSError, ValueError):
            leader = 0
        if leader > 0 and _runs_from(leader, path):
            with contextlib.suppress(OSError):
                os.killpg(leader, signal.SIGKILL)
        _remove(path)


def _runs_from(pid: int, directory: str) -> bool:
    """Whether ``pid`` is a process started on this proof directory (a recycled pid is left alone)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return (directory + os.sep).encode() in handle.read()
    except OSError:
        return False


def temp_roots() -> List[str]:
    """$TMPDIR (when set, an absolute path), then _TEMP_ROOTS: where a proof directory may be."""
    configured = os.environ.get("TMPDIR") or ""
    first = [configured.rstrip(os.sep) or os.sep] if os.path.isabs(configured) else []
    return list(dict.fromkeys(first + list(_TEMP_ROOTS)))


def _remove(directory: str) -> None:
    """Delete a proof directory (python3-minimal has no shutil); links are removed, never followed."""
    with contextlib.suppress(OSError):
        for parent, directories, files in os.walk(directory, topdown=False):
            for name in files:
                os.unlink(os.path.join(parent, name))
            for name in directories:
                path = os.path.join(parent, name)
                os.unlink(path) if os.path.islink(path) else os.rmdir(path)
        os.rmdir(directory)


def refused_message(logged: str) -> str:
    return one_line(
        "slurmctld rejected the new config (a throw-away slurmctld refused it before any file was replaced: %s);"
        " nothing was changed, the previous config stays live" % logged
    )
