"""Where the throw-away slurmctld of a proof (topokeeper.headnode.proof) writes, on a real slurmctld 26.05.

Its scratch (the config copy, its state, pid and log files) goes to the first temp directory with room: a full
/tmp (a real tmpfs filled to its last page, mounted in the controller's own mount namespace only) must not block
every apply, and when no temp directory has room the apply fails in one line naming each, with nothing written.
Nothing of the throw-away reaches the production daemon's log destinations: not its log files (the copy's
settings replace them) and not syslog, whatever SlurmctldSyslogDebug or DebugFlags production sets (a socket of
the test's own at the namespace's /dev/log receives what it would write).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import node, p5_nodes
from tests.integration.slurm.test_applier_on_slurmctld import (
    _applier_command,
    _assert_applied,
    _bundle,
    _cluster,
    _etc_files,
    _plan,
    _run,
    _start,
    _with_content,
)
from topokeeper.headnode.config_dir import CRASH_ENV
from topokeeper.headnode.proof import proof_dir_prefix
from topokeeper.render.bundle import RenderedPlan
from topokeeper.sim.slurm_chroot import SlurmController

pytestmark = pytest.mark.slurm

TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # in the chroot, in the namespace
# Written in the chroot: fill the file system of argv[1] until it refuses a byte (tmpfs reserves nothing).
_FILL = """
import os, sys
fd = os.open(sys.argv[1] + "/filler", os.O_WRONLY | os.O_CREAT, 0o644)
try:
    while os.write(fd, bytes(4096)):
        pass
except OSError:
    pass
"""


def _full_tmpfs(controller: SlurmController, directory: str) -> None:
    """A 64 KiB tmpfs over ``directory`` in the controller's mount namespace (the shared chroot is untouched),
    filled to its last page."""
    controller.run("mount", "-t", "tmpfs", "-o", "size=64k,mode=1777", "tmpfs", directory, check=True)
    controller.run("python3", "-c", _FILL, directory, check=True)
    free = controller.run("python3", "-c", "import os,sys; print(os.statvfs(sys.argv[1]).f_bavail)", directory)
    assert free.stdout.strip() == "0", free


def _proof_dirs(controller: SlurmController) -> list[str]:
    """Proof directories of this config dir in any temp directory, as the applier's namespace sees them."""
    prefix = proof_dir_prefix(controller.config_dir_inner)
    listing = controller.run("ls", "-a", *TEMP_DIRS).stdout.split()
    return [name for name in listing if name.startswith(prefix)]


def _moved_plan() -> RenderedPlan:
    # nn-leaf002 re-parented under nn-agg0: a change only the whole-file path (reconfigure) loads.
    moved = node("p5-008", path=("nn-spine0", "nn-agg0", "nn-leaf002"), partition="gpu")
    return _plan(_cluster(gpu=[*p5_nodes(7), moved]))


def _moved() -> dict[str, Any]:
    return _bundle(_moved_plan())


def test_a_full_tmp_does_not_block_the_proof(sid_root: Path, controllers) -> None:
    rendered = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, rendered)
    _assert_applied(*_run(controller, "apply", _bundle(rendered)))
    _full_tmpfs(controller, "/tmp")

    code, document = _run(controller, "apply", _moved())

    _assert_applied(code, document)
    assert _proof_dirs(controller) == []


def test_no_temp_directory_with_room_fails_in_one_line_naming_them_and_writes_nothing(
    sid_root: Path, controllers
) -> None:
    rendered = _plan(_cluster())
    controller = controllers(sid_root)
    _start(controller, rendered)
    _assert_applied(*_run(controller, "apply", _bundle(rendered)))
    for directory in TEMP_DIRS:
        _full_tmpfs(controller, directory)
    files = _etc_files(controller)

    code, document = _run(controller, "apply", _moved())

    assert (code, document["outcome"], document["reconfigured"]) == (1, "failed", False)
    assert "\n" not in document["error"]
    assert document["error"].startswith("cannot prove the new config: no room"), document["error"]
    assert all(directory in document["error"] for directory in TEMP_DIRS), document["error"]
    assert document["error"].endswith("nothing was changed")
    assert _etc_files(controller) == files
    assert _proof_dirs(controller) == []
    controller.run("umount", "/var/tmp", check=True)  # room again: the chroot's own /var/tmp
    _assert_applied(*_run(controller, "apply", _moved()))


def _own_dev_log(controller: SlurmController, receiver: socket.socket) -> None:
    dev = controller.root / controller.inner_dir.lstrip("/") / "dev"
    dev.mkdir()
    for name, (major, minor) in {"null": (1, 3), "zero": (1, 5), "random": (1, 8), "urandom": (1, 9)}.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        (dev / name).chmod(0o666)
    receiver.bind(str(dev / "log"))
    (dev / "log").chmod(0o666)
    controller.run("mount", "--bind", f"{controller.inner_dir}/dev", "/dev", check=True)


@contextlib.contextmanager
def _draining(receiver: socket.socket) -> Iterator[list[str]]:
    """Every datagram the socket gets while the block runs (read as they come: a full socket would block
    the sender)."""
    messages: list[str] = []
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                messages.append(receiver.recv(65536).decode("utf-8", "replace"))

    receiver.settimeout(0.2)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield messages
    finally:
        stop.set()
        reader.join()


@pytest.mark.parametrize("proof", ["accepted", "refused"])
def test_the_proof_writes_nothing_to_the_production_syslog(sid_root: Path, controllers, proof: str) -> None:
    """Production logs to syslog at debug5 with every DebugFlag it has; slurm.conf says so only on disk (the
    running daemon started without it, and is never reconfigured here: the apply is killed right after an
    accepted proof, and a refused one ends the apply), so any datagram is the throw-away's."""
    controller = controllers(sid_root)
    rendered = _plan(_cluster())
    _start(controller, rendered)
    _assert_applied(*_run(controller, "apply", _bundle(rendered)))
    conf = controller.etc / "slurm.conf"
    conf.write_text(conf.read_text() + "SlurmctldSyslogDebug=debug5\nDebugFlags=Route,TraceJobs\n")
    moved = _moved_plan()
    bundle = _bundle(moved)
    if proof == "refused":  # a switch defined twice: the throw-away's fatal is what syslog would get
        bundle = _with_content(bundle, moved.topology_text + _DUPLICATE_SWITCH)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        _own_dev_log(controller, receiver)

        command = _applier_command(controller, "apply", bundle)
        environment = {**os.environ, CRASH_ENV: "after-journal"}
        with _draining(receiver) as received:
            run = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)

    assert received == []
    if proof == "accepted":
        assert (run.returncode, run.stdout) == (-signal.SIGKILL, ""), run.stderr
    else:
        assert "already been defined" in run.stdout, run.stdout


_DUPLICATE_SWITCH = "      - switch: nn-leaf000\n        nodes: p5-001\n"
