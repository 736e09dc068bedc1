"""The simulated cluster's Slurm head node: a real slurmctld in a Debian chroot, or the file-only stand-in.

It plays two parts. It is where topokeeper's applier runs (through the SSM script or the agent),
and it is HyperPod's side of the head node: when instances join or leave, ``sync_nodes`` rewrites the
node and partition lines of slurm.conf (keeping the ``Topology=`` and ``TopologyPlugin`` values the
applier set) and reconfigures, as HyperPod's own provisioning does.

``HeadNode`` does all of that through a controller (slurm.conf's directory and the commands run on the
head node); its subclasses say where the files live and what answers ``scontrol``: ``ChrootHeadNode``
(below) a real slurmctld, ``topokeeper.sim.file_head_node.FileHeadNode`` a stand-in that only reads files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

from topokeeper.contract.head_node_program import PROGRAM_NAME, write_program
from topokeeper.domain.models import SlurmFormat, SlurmNodeRecord, SlurmVersion
from topokeeper.render.bundle import Bundle
from topokeeper.sim.aws.hyperpod.managed_topology import ManagedFiles
from topokeeper.sim.slurm_chroot import (
    SUITE_FOR_FORMAT,
    HarnessError,
    SlurmController,
    can_run,
    config_texts,
    ensure_chroot,
    installed_slurm_version,
    proc_mounted,
)
from topokeeper.sim.slurm_source import SOURCE_SERIES, ensure_source_chroot
from topokeeper.sim.slurmd_nodes import ensure_slurmd_chroot
from topokeeper.wire import compress, expand, node_rows, partition_topologies

PROGRAM = f"/opt/topokeeper/{PROGRAM_NAME}"  # where the agent's install puts it on a head node
# "chroot" or "file": which head node to run, whatever this machine could run (tests force "file").
HEAD_NODE_VARIABLE = "TOPOKEEPER_HEAD_NODE"
_PLUGIN_LINE = re.compile(r"^TopologyPlugin=\S+$", re.MULTILINE)


class HeadNodeController(Protocol):
    """slurm.conf's directory on a head node, and how to run commands there (``SlurmController`` is one)."""

    name: str

    @property
    def etc(self) -> Path: ...

    def command(self, *argv: str) -> list[str]: ...

    def run(self, *argv: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]: ...

    def write_slurm_conf(
        self,
        nodes: Iterable[str],
        partitions: Mapping[str, tuple[Iterable[str], str | None]],
        extra: Iterable[str] = (),
    ) -> None: ...

    def show_topology(self, name: str | None = None) -> str: ...

    def partition_topologies(self) -> dict[str, str | None]: ...


class HeadNode(ABC):
    """The head node as the world uses it: the shared parts here, where files live in the subclasses."""

    controller: HeadNodeController
    partitions: dict[str, list[str]]
    description: str  # what answers scontrol, for the result and the report

    @abstractmethod
    def start(self, partitions: Mapping[str, Iterable[str]]) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def install_agent(self, config: Mapping[str, object]) -> str:
        """Put the head-node program on the head node with the agent's config; returns the config's path."""

    @abstractmethod
    def run_agent_once(self, config_path: str, environment: Mapping[str, str]) -> tuple[int, str]:
        """One agent cycle, with the head node's own python3, as the systemd timer runs it."""

    @abstractmethod
    def verify(self, bundle: Bundle) -> dict[str, object]:
        """The applier's verify against ``bundle``: how the simulator checks convergence (changes nothing)."""

    @property
    def slurm_conf(self) -> Path:
        return self.controller.etc / "slurm.conf"

    def sync_nodes(self, partitions: Mapping[str, Iterable[str]]) -> None:
        """HyperPod's part: membership changed, so slurm.conf's node lines change; topology keys stay."""
        wanted = {name: sorted(nodes) for name, nodes in partitions.items()}
        if wanted == self.partitions:
            return
        self.partitions = wanted
        current = config_texts(self.controller.etc)  # partition lines may sit in Included files
        topologies = partition_topologies(
            "\n".join(line for line in current.splitlines() if line.startswith("PartitionName="))
        )
        extra = _PLUGIN_LINE.findall(current)
        nodes = [node for members in wanted.values() for node in members]
        self.controller.write_slurm_conf(
            nodes, {name: (members, topologies.get(name)) for name, members in wanted.items()}, extra
        )
        self.controller.run("scontrol", "reconfigure", check=True)

    def write_managed_topology(self, files: ManagedFiles) -> None:
        """HyperPod's part when it manages the topology: its topology file, the partitions' Topology= (or the
        TopologyPlugin), then reconfigure. Nothing of topokeeper's is consulted or kept."""
        (self.controller.etc / files.file_name).write_text(files.text)
        current = config_texts(self.controller.etc)
        extra = [f"TopologyPlugin={files.plugin}"] if files.plugin else _PLUGIN_LINE.findall(current)
        nodes = [node for members in self.partitions.values() for node in members]
        self.controller.write_slurm_conf(
            nodes, {name: (members, files.assignments.get(name)) for name, members in self.partitions.items()}, extra
        )
        self.controller.run("scontrol", "reconfigure", check=True)

    def run_script(self, commands: list[str], timeout: float = 600) -> tuple[int, str, str]:
        """Run an SSM RunShellScript command list as the SSM agent would: ``sh`` on the head node, as root."""
        script = "\n".join(commands) + "\n"
        result = subprocess.run(
            self.script_command(),
            input=script,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return result.returncode, result.stdout, result.stderr

    def script_command(self) -> list[str]:
        """How the SSM agent runs a script here: ``sh`` reading it from stdin."""
        return self.controller.command("sh", "-s")

    def tamper(self) -> str:
        """A hand edit of the live topology: move one node to another leaf or block, then reconfigure."""
        for name in ("topology.yaml", "topology.conf"):
            path = self.controller.etc / name
            if path.exists():
                text = path.read_text()
                edited = _move_one_node(text)
                path.write_text(edited)
                self.controller.run("scontrol", "reconfigure", check=True)
                return name
        raise RuntimeError("no topology file on the head node to tamper with")

    def live_topology(self) -> dict[str, str]:
        """Partition -> ``scontrol show topology`` of its topology (the cluster-wide one before 25.05)."""
        assignments = self.controller.partition_topologies()
        live: dict[str, str] = {}
        for partition in sorted(self.partitions):
            name = assignments.get(partition)
            live[partition] = self.controller.show_topology(name) if name else self.controller.show_topology()
        return live


def head_node_root(slurm_version: str, *, slurmd: bool = False) -> Path:
    """The chroot for a Slurm version: Debian's (sid 26.05, trixie 24.11; with slurmd when booting nodes run
    one) or 25.11 built from source (slurmd included)."""
    version = SlurmVersion.parse(slurm_version)
    if f"{version.major}.{version.minor:02d}" == SOURCE_SERIES:
        return ensure_source_chroot()
    suite = SUITE_FOR_FORMAT[version.format.value]
    return ensure_slurmd_chroot(suite) if slurmd else ensure_chroot(suite)


class ChrootHeadNode(HeadNode):
    controller: SlurmController

    def __init__(self, slurm_format: SlurmFormat, name: str, style: str = "debian", root: Path | None = None) -> None:
        self.root = root or ensure_chroot(SUITE_FOR_FORMAT[slurm_format.value])
        # The chroot is shared by every session on this machine: the pid keeps two runs of one world apart.
        self.controller = SlurmController(root=self.root, name=f"{name}-{os.getpid()}", style=style)
        self.description = f"slurmctld {installed_slurm_version(self.root)} in a Debian chroot"
        if style != "debian":
            self.description += f", laid out as a {style} head node"
        self.partitions: dict[str, list[str]] = {}
        self._mounts = contextlib.ExitStack()

    def start(
        self,
        partitions: Mapping[str, Iterable[str]],
        addresses: Mapping[str, str] | None = None,
        extra: Iterable[str] = (),
    ) -> None:
        """``addresses``: NodeAddr of the nodes slurm.conf binds (ParallelCluster's static nodes); ``extra``: more
        slurm.conf lines (see ``SlurmController.write_slurm_conf``)."""
        self.partitions = {name: sorted(nodes) for name, nodes in partitions.items()}
        nodes = [node for members in self.partitions.values() for node in members]
        self._mounts.enter_context(proc_mounted(self.root))
        self.controller.prepare(
            nodes, {name: (members, None) for name, members in self.partitions.items()}, extra, addresses
        )
        self.controller.start()

    def bind(self, name: str, address: str, hostname: str) -> None:
        """ParallelCluster's part: back a Slurm node with an instance (or, with its own name, with none)."""
        update = ("scontrol", "update", f"NodeName={name}", f"NodeAddr={address}", f"NodeHostName={hostname}")
        self.controller.run(*update, check=True)

    def node_table(self) -> list[SlurmNodeRecord]:
        """slurmctld's NodeName/NodeAddr/NodeHostName table now, read as the applier reads it."""
        rows = node_rows(self.controller.run("scontrol", "-o", "--future", "show", "nodes", check=True).stdout)
        return [
            SlurmNodeRecord(
                name=name, address=address, hostname=hostname, partitions=[p for p in parts.split(",") if p]
            )
            for name, address, hostname, parts in rows
        ]

    def script_command(self) -> list[str]:
        """Without a login shell, as SSM's AWS-RunShellScript runs (no /opt/slurm/bin on PATH)."""
        return self.controller.command("sh", "-s", login=False)

    def stop(self) -> None:
        try:
            self.controller.stop()
            self.controller.remove()
        finally:
            self._mounts.close()

    def install_agent(self, config: Mapping[str, object]) -> str:
        """Write the head-node program to /opt/topokeeper and the agent's config; returns the config's path."""
        opt = self.root / "opt" / "topokeeper"
        opt.mkdir(parents=True, exist_ok=True)
        state_dir = self.root / "var" / "lib" / "topokeeper" / self.controller.name
        if state_dir.exists():
            shutil.rmtree(state_dir)  # a new head node: no ETag or bundle from an earlier run
        write_program(opt / PROGRAM_NAME)
        state = f"/var/lib/topokeeper/{self.controller.name}"
        document = {**config, "applier": PROGRAM, "state_dir": state}
        path = opt / f"agent-{self.controller.name}.json"
        path.write_text(json.dumps(document, indent=2))
        return f"/opt/topokeeper/{path.name}"

    def run_agent_once(self, config_path: str, environment: Mapping[str, str]) -> tuple[int, str]:
        """One agent cycle, with the head node's own python3, as the systemd timer runs it."""
        variables = [f"{key}={value}" for key, value in sorted(environment.items())]
        result = subprocess.run(
            self.controller.command(
                *variables, "python3", PROGRAM, "agent", "--config", config_path, "--once", login=False
            ),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        return result.returncode, result.stderr

    def verify(self, bundle: Bundle) -> dict[str, object]:
        """The applier's verify against ``bundle``: how the simulator checks convergence (changes nothing)."""
        inner = f"{self.controller.inner_dir}/probe-bundle.json"
        (self.root / inner.lstrip("/")).write_text(json.dumps(bundle.document()))
        return self._program("verify", inner)

    def placement_facts(self) -> dict[str, object]:
        """The head-node program's ``placement-facts``: what the drift check and ``topokeeper placement`` read."""
        return self._program("placement-facts")

    def _program(self, *argv: str) -> dict[str, object]:
        """The head-node program's last stdout line (a JSON document), run with the head node's python3."""
        program = f"{self.controller.inner_dir}/{PROGRAM_NAME}"
        write_program(self.root / program.lstrip("/"))
        result = self.controller.run("python3", program, *argv, timeout=300)
        document: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
        return document

    def submit_job(self, partition: str, nodes: int, name: str, options: Iterable[str]) -> str:
        """``sbatch --exclusive`` as a cluster user submits it; its name is theirs, so it is one argv element
        (never a shell word) and ``--job-name=`` keeps a leading '-' from reading as an option."""
        return self.controller.submit(partition, nodes, "--exclusive", f"--job-name={name}", *options)

    def scheduled(self, job_id: str, timeout: float = 20) -> None:
        """Wait until slurmctld has placed the job, or given the reason it waits (not its first ``None``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.controller.run("squeue", "-h", "-j", job_id, "-o", "%T|%r").stdout.strip()
            if state and state not in ("PENDING|None", "PENDING|"):
                return
            time.sleep(0.2)
        raise HarnessError(f"slurmctld neither placed job {job_id} nor said why it waits within {timeout}s")


_NODE_LIST = re.compile(r"(nodes: |Nodes=)(\S+)")


def _move_one_node(text: str) -> str:
    """Take the last node off the first node list with several entries and add it to the next one."""
    lines = text.splitlines()
    lists = [(i, match) for i, line in enumerate(lines) if (match := _NODE_LIST.search(line))]
    for index, (first, match) in enumerate(lists):
        names = expand(match.group(2))
        if len(names) < 2 or len(lists) < 2:
            continue
        second, other = lists[(index + 1) % len(lists)]
        moved = names.pop()
        lines[first] = lines[first][: match.start(2)] + compress(names) + lines[first][match.end(2) :]
        grown = [*expand(other.group(2)), moved]
        lines[second] = lines[second][: other.start(2)] + compress(grown) + lines[second][other.end(2) :]
        return "\n".join(lines) + "\n"
    raise RuntimeError("no node list to edit")


class HeadNodeChoice(NamedTuple):
    kind: Literal["chroot", "file"]
    note: str  # for the operator, when it is the file-only head node


def choose_head_node(requested: str | None = None) -> HeadNodeChoice:
    """``requested``, else $TOPOKEEPER_HEAD_NODE, else the real slurmctld in a chroot where it can run here."""
    requested = requested or os.environ.get(HEAD_NODE_VARIABLE) or None
    if requested not in (None, "chroot", "file"):
        raise HarnessError(f"{HEAD_NODE_VARIABLE} is chroot or file, not {requested!r}")
    if requested == "file":
        return HeadNodeChoice("file", "using a file-only head node (no slurmctld), as requested")
    ok, reason = can_run()
    if not ok and requested == "chroot":
        raise HarnessError(f"the real head node cannot run here: {reason}")
    if not ok:
        return HeadNodeChoice(
            "file", f"the real head node cannot run here: {reason}; using a file-only head node (no slurmctld)"
        )
    return HeadNodeChoice("chroot", "")
