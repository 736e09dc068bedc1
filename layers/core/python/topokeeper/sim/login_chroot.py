"""Login nodes as real sshd processes in Debian chroots, for the host-identity tests.

``ensure_login_chroot`` derives a cached chroot with openssh-server from the slurmctld harness's cached
trixie chroot (once, under the same file lock). Each ``LoginNode`` is an overlay mount of that cache,
so a node is fresh in milliseconds and "replacing" it (new volumes, no host keys) is a new overlay.
Each sshd listens on its own loopback port; the harness stops only the sshd it started, by pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from topokeeper.sim.slurm_chroot import HarnessError, _run, ensure_derived_chroot

BASE_SUITE = "trixie"
LOGIN_PACKAGES = ("openssh-server",)
LOGIN_CHROOT = f"{BASE_SUITE}-login"
READY_MARKER = ".topokeeper-login-ready"


def ensure_login_chroot(cache: Path | None = None) -> Path:
    """A cached chroot with sshd: a copy of the slurmctld harness's trixie chroot plus openssh-server."""
    return ensure_derived_chroot(
        BASE_SUITE, LOGIN_CHROOT, LOGIN_PACKAGES, READY_MARKER, cache=cache, finish=_remove_host_keys
    )


def _remove_host_keys(root: Path) -> None:
    # Host keys come from the installer under test, never from the package's postinst.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()


@dataclass
class LoginNode:
    """One login node: an overlay of the cached login chroot, and an sshd on 127.0.0.1:``port``."""

    base: Path
    workdir: Path
    port: int
    pid: int | None = None

    @property
    def root(self) -> Path:
        return self.workdir / "merged"

    def mount(self) -> None:
        for name in ("upper", "work", "merged"):
            (self.workdir / name).mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={self.base},upperdir={self.workdir / 'upper'},workdir={self.workdir / 'work'}"
        _run(["mount", "-t", "overlay", "overlay", "-o", options, str(self.root)])
        _run(["mount", "-t", "proc", "proc", str(self.root / "proc")])
        (self.root / "run/sshd").mkdir(parents=True, exist_ok=True)

    def chroot(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["chroot", str(self.root), *argv], capture_output=True, text=True, timeout=60, check=check
        )

    def start_sshd(self) -> None:
        self.chroot("/usr/sbin/sshd", "-o", f"Port={self.port}", "-o", "ListenAddress=127.0.0.1")
        deadline = time.monotonic() + 20
        pidfile = self.root / "run/sshd.pid"
        # sshd creates the pid file, then writes it: wait for the number, not just the file.
        while not (pidfile.exists() and pidfile.read_text().strip()):
            if time.monotonic() > deadline:
                raise HarnessError(f"sshd on port {self.port} wrote no pid file")
            time.sleep(0.05)
        self.pid = int(pidfile.read_text().strip())

    def stop(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            self.pid = None
        # Children of the sshd (sessions) hold the mount: wait until nothing runs inside.
        for mount in (self.root / "proc", self.root):
            for _ in range(100):
                if subprocess.run(["umount", str(mount)], capture_output=True, check=False).returncode == 0:
                    break
                time.sleep(0.1)
        shutil.rmtree(self.workdir, ignore_errors=True)
