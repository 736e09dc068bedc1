"""Real slurmd processes for CLOUD nodes: one per node, each on its own port, in a controller's chroot.

A ParallelCluster compute node's slurmd starts once slurmctld resumed the node, and on Slurm 25.11 it can
register with a topology of its own (``slurmd --conf "topology=<topology>:<switch>..."``). ``SlurmdNodes``
gives a controller's slurm.conf what that needs (a ``Port=`` per node, spool, pid and log files per node,
a ResumeProgram that starts each resumed node's slurmd with the topology left for it) and can start a
node's slurmd itself (a node that boots while powered down). Without a cgroup file system in the chroot:
``CgroupPlugin=disabled``, ``proctrack/linuxproc`` and ``task/none`` (the controller's slurm.conf has those).

The slurmd processes run in the controller's mount namespace, so ``SlurmController.stop`` stops them with
everything else it started. Debian's chroots have no slurmd: ``ensure_slurmd_chroot`` derives one.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from topokeeper.sim.slurm_chroot import (
    LOGIN_PATH,
    HarnessError,
    SlurmController,
    built_under_opt_slurm,
    ensure_derived_chroot,
)

SLURMD_PACKAGES = ("slurmd",)
SLURMD_MARKER = ".topokeeper-slurmd-ready"
# The characters Slurm accepts in topology, switch and block names, and ':' between them.
_TOPOLOGY = re.compile(r"[A-Za-z0-9_.:-]{1,256}")
_NODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RESUME_SCRIPT = "resume-slurmd"
TOPOLOGY_DIR = "slurmd-topology"

# slurmctld runs ResumeProgram with only SLURM_CONF set; $1 is the hostlist it resumes. Each node's topology
# is read from a file the harness wrote and passed as one quoted argument, never as shell text.
_RESUME_PROGRAM = """#!/bin/sh
# Start a slurmd for each node slurmctld resumes (-b: it reports a boot), with the topology left for it.
export PATH={path}
topology_dir={topology_dir}
for node in $(scontrol show hostnames "$1"); do
    if [ -f "$topology_dir/$node" ]; then
        slurmd -b -N "$node" --conf "topology=$(cat "$topology_dir/$node")"
    else
        slurmd -b -N "$node"
    fi
done
"""


def ensure_slurmd_chroot(suite: str) -> Path:
    """A copy of a Debian suite's chroot with slurmd (the shared one has slurmctld and clients only)."""
    return ensure_derived_chroot(suite, f"{suite}-slurmd", SLURMD_PACKAGES, SLURMD_MARKER)


def has_slurmd(root: Path) -> bool:
    # Debian's /usr/sbin/slurmd is a link to /etc/alternatives: absolute, so read it as the chroot does.
    return built_under_opt_slurm(root) or (root / "usr/sbin/slurmd").is_symlink()


def slurmd_argv(node: str, topology: str | None = None) -> list[str]:
    """slurmd for ``node`` as a booting cloud node starts it: reporting a boot, with its topology if given."""
    _check(_NODE, node, "node name")
    argv = ["slurmd", "-b", "-N", node]
    if topology is not None:
        _check(_TOPOLOGY, topology, "topology")
        argv += ["--conf", f"topology={topology}"]
    return argv


def _listen_ports(count: int) -> list[int]:
    """``count`` ports free now, below the kernel's ephemeral range: a slurmd starts minutes after its port is
    chosen, and a port from that range (free_port's) may meanwhile be any connection's local port (seen at 600
    nodes: "Unable to bind listen port ... Address already in use")."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports: list[int] = []
    candidate = max(1024, low - 12000) + os.getpid() % 2000  # another run's slurmd: rarely the same start
    while len(ports) < count and candidate < low:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
                ports.append(candidate)
            except OSError:
                pass
        candidate += 1
    if len(ports) < count:
        raise HarnessError(f"only {len(ports)} free ports below {low} for {count} slurmd")
    return ports


def _check(pattern: re.Pattern[str], value: str, what: str) -> None:
    if not pattern.fullmatch(value):
        allowed = "_.:-" if pattern is _TOPOLOGY else "_.-"
        raise HarnessError(f"{what} {value[:80]!r}: only letters, digits and {allowed!r} are accepted")


@dataclass
class SlurmdNodes:
    """The slurmd side of ``nodes`` on ``controller``: call ``conf_lines`` for its slurm.conf (as ``extra``),
    then ``install`` once the controller is prepared."""

    controller: SlurmController
    nodes: Iterable[str]
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not has_slurmd(self.controller.root):
            raise HarnessError(f"no slurmd in {self.controller.root} (see ensure_slurmd_chroot)")
        self.nodes = sorted(set(self.nodes))
        wanted = [node for node in self.nodes if node not in self.ports]
        for node, port in zip(wanted, _listen_ports(len(wanted)), strict=True):
            _check(_NODE, node, "node name")
            self.ports[node] = port

    @property
    def _inner(self) -> str:
        return self.controller.inner_dir

    def conf_lines(self) -> list[str]:
        """slurm.conf lines: the nodes (each with its own port, on 127.0.0.1), the daemons' files per node (%n),
        and the ResumeProgram that starts them."""
        settings = self.node_settings()
        return [
            *self.daemon_lines(),
            f"ResumeProgram={self._inner}/{RESUME_SCRIPT}",
            *(f"NodeName={node} NodeAddr=127.0.0.1 {settings[node]} State=CLOUD" for node in self.nodes),
        ]

    def daemon_lines(self) -> list[str]:
        """The daemons' files per node (%n): slurm.conf lines for a controller whose ResumeProgram is another's."""
        return [
            f"SlurmdSpoolDir={self._inner}/slurmd/%n",
            f"SlurmdPidFile={self._inner}/slurmd/%n.pid",
            f"SlurmdLogFile={self._inner}/log/slurmd-%n.log",
        ]

    def node_settings(self) -> dict[str, str]:
        """Each node's line settings (``SlurmController.node_settings``): its own port, and fewer CPUs and less
        memory than this machine has (a node reporting less than its config is drained)."""
        return {node: f"Port={self.ports[node]} CPUs=1 RealMemory=100" for node in self.nodes}

    def install(self) -> None:
        """The ResumeProgram, cgroup.conf and the per-node directories, in the prepared controller's directory."""
        base = self.controller.root / self._inner.lstrip("/")
        if not self.controller.etc.is_dir():
            raise HarnessError(f"{self.controller.etc} does not exist: prepare the controller first")
        for sub in ("slurmd", TOPOLOGY_DIR, *(f"slurmd/{node}" for node in self.nodes)):  # slurmd makes no spool
            (base / sub).mkdir(exist_ok=True)
        script = base / RESUME_SCRIPT
        script.write_text(_RESUME_PROGRAM.format(path=LOGIN_PATH, topology_dir=f"{self._inner}/{TOPOLOGY_DIR}"))
        script.chmod(0o755)
        self.controller.write_file("cgroup.conf", "CgroupPlugin=disabled\n")

    def set_topology(self, node: str, topology: str | None) -> None:
        """The topology ``node``'s slurmd registers with when slurmctld resumes it (None: none)."""
        path = self.controller.root / self._inner.lstrip("/") / TOPOLOGY_DIR / node
        _check(_NODE, node, "node name")
        if topology is None:
            path.unlink(missing_ok=True)
            return
        _check(_TOPOLOGY, topology, "topology")
        path.write_text(topology)

    def start(self, node: str, topology: str | None = None) -> None:
        """Start ``node``'s slurmd now (it daemonizes, in the controller's namespace)."""
        if node not in self.ports:
            raise HarnessError(f"node {node!r} is not one of this controller's slurmd nodes")
        # SLURM_CONF: under /opt/slurm a Debian slurmd would read /etc/slurm (only the client tools default to it).
        conf = f"SLURM_CONF={self.controller.slurm_conf_inner}"
        self.controller.run("env", conf, *slurmd_argv(node, topology), check=True)

    def log(self, node: str) -> str:
        path = self.controller.root / self._inner.lstrip("/") / "log" / f"slurmd-{node}.log"
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""
