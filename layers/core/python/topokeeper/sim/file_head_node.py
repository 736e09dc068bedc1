"""The file-only head node: where the real one (``ChrootHeadNode``) cannot run, for example without root.

A temporary directory holds slurm.conf, the topology files, the agent and its state; a stand-in
``scontrol`` (``topokeeper.sim.standin_scontrol``) comes first on PATH and answers the applier, the agent
and the simulator from those files, as slurmctld 26.05 or 24.11 would for what they ask. Scripts run
with ``sh`` on this machine, as the SSM agent runs them, with that PATH and ``SLURM_CONF``. Their ``python3``
is this machine's, found once on PATH when the head node starts (a version manager's shim, such as pyenv's,
costs a quarter second on every call otherwise), without its site-packages. The simulator's own ``scontrol``
calls run the same stand-in in this process: no shell or script of topokeeper's is in between.

It is a stand-in, not Slurm: no slurmctld runs, nothing is scheduled or placed, and only the
``scontrol`` answers listed in ``standin_scontrol`` exist. It lets the demo and the simulator tell their
story anywhere; what they show of Slurm itself is proven only with the real head node
(tests/integration/slurm, tests/e2e/test_demo_story.py), never with this one.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

import topokeeper
from topokeeper.contract.head_node_program import PROGRAM_NAME, write_program
from topokeeper.domain.models import SlurmVersion
from topokeeper.render.bundle import Bundle
from topokeeper.sim import standin_reads, standin_scontrol
from topokeeper.sim.head_node import HeadNode
from topokeeper.wire import compress, partition_topologies


@dataclass
class StandInController:
    """The file-only head node's config directory and commands: ``SlurmController``'s part, without slurmctld."""

    root: Path
    name: str

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def log(self) -> Path:
        return self.root / "log" / "slurmctld.log"

    def prepare(
        self,
        slurm_version: SlurmVersion,
        nodes: Iterable[str],
        partitions: Mapping[str, tuple[Iterable[str], str | None]],
    ) -> None:
        """The directories, the stand-in scontrol in ``bin`` and slurm.conf (see ``write_slurm_conf``)."""
        for sub in ("etc", "log", "state", "bin"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.log.touch()  # slurmctld opens its log when it starts
        state = self.root / "state"
        standin_scontrol.write_state(
            str(state),
            slurm_version=str(slurm_version),
            slurm_conf=str(self.etc / "slurm.conf"),
            log_file=str(self.log),
        )
        scontrol = self.root / "bin" / "scontrol"
        scontrol.write_text(
            "#!/bin/sh\n"
            "# topokeeper's file-only head node: a stand-in for scontrol, NOT Slurm.\n"
            f'exec {shlex.join(_standin_command())} {shlex.quote(str(state))} "$@"\n'
        )
        scontrol.chmod(0o755)
        # Beside scontrol, where the applier looks for the slurmctld that proves a new config before it is written.
        slurmctld = self.root / "bin" / "slurmctld"
        slurmctld.write_text(
            "#!/bin/sh\n"
            "# topokeeper's file-only head node: a stand-in for slurmctld loading a config, NOT Slurm.\n"
            f'exec {shlex.join(_standin_command("slurmctld_main"))} {shlex.quote(str(state))} "$@"\n'
        )
        slurmctld.chmod(0o755)
        python = _machine_python3(os.environ.get("PATH", os.defpath))
        if python is not None:
            _write_head_node_python(self.root, python)
        self.write_slurm_conf(nodes, partitions)

    def write_slurm_conf(
        self,
        nodes: Iterable[str],
        partitions: Mapping[str, tuple[Iterable[str], str | None]],
        extra: Iterable[str] = (),
    ) -> None:
        """Node and partition lines as ``SlurmController`` writes them; of the daemon's keys only the log,
        which the applier reads when slurmctld refuses a config."""
        node_list = sorted(set(nodes))
        lines = [
            "# A file-only head node: read by topokeeper's stand-in scontrol, not by slurmctld.",
            f"SlurmctldLogFile={self.log}",
            *extra,
        ]
        if node_list:
            lines.append(f"NodeName={compress(node_list)} State=CLOUD")
        for partition, (members, topology) in sorted(partitions.items()):
            line = f"PartitionName={partition} Nodes={compress(members)} State=UP"
            lines.append(line + (f" Topology={topology}" if topology else ""))
        if node_list:
            lines.append("PartitionName=dev Nodes=ALL Default=YES State=UP")
        (self.etc / "slurm.conf").write_text("\n".join(lines) + "\n")

    def command(self, *argv: str) -> list[str]:
        """argv run on this machine with the stand-in scontrol first on PATH and this head node's SLURM_CONF."""
        path = f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
        return ["env", f"PATH={path}", f"SLURM_CONF={self.etc / 'slurm.conf'}", *argv]

    def run(self, *argv: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        if argv[:1] == ("scontrol",):
            result = self._scontrol(list(argv))
        else:
            result = subprocess.run(self.command(*argv), capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stdout}{result.stderr}")
        return result

    def _scontrol(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """What ``bin/scontrol`` answers, from the same stand-in's ``main`` run in this process."""
        stdout, stderr = io.StringIO(), io.StringIO()
        code = standin_reads.main(
            [str(self.root / "state"), *argv[1:]], stdout=stdout, stderr=stderr, slurm_conf=str(self.etc / "slurm.conf")
        )
        return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())

    def show_topology(self, name: str | None = None) -> str:
        result = self.run("scontrol", "show", "topology", *([name] if name else []))
        return (result.stdout + result.stderr).strip()

    def partition_topologies(self) -> dict[str, str | None]:
        return partition_topologies(self.run("scontrol", "-o", "show", "partition", check=True).stdout)


class FileHeadNode(HeadNode):
    controller: StandInController

    def __init__(self, slurm_version: SlurmVersion, name: str) -> None:
        self.slurm_version = slurm_version
        self.controller = StandInController(root=Path(tempfile.mkdtemp(prefix=f"topokeeper-{name}-")), name=name)
        self.partitions: dict[str, list[str]] = {}
        self.description = f"file-only stand-in for Slurm {slurm_version} (no slurmctld)"

    def start(self, partitions: Mapping[str, Iterable[str]]) -> None:
        self.partitions = {name: sorted(nodes) for name, nodes in partitions.items()}
        nodes = [node for members in self.partitions.values() for node in members]
        self.controller.prepare(
            self.slurm_version, nodes, {name: (members, None) for name, members in self.partitions.items()}
        )
        self.controller.run("scontrol", "reconfigure", check=True)  # what slurmctld loads when it starts

    def stop(self) -> None:
        shutil.rmtree(self.controller.root, ignore_errors=True)

    def install_agent(self, config: Mapping[str, object]) -> str:
        opt = self.controller.root / "opt" / "topokeeper"
        opt.mkdir(parents=True, exist_ok=True)
        program = write_program(opt / PROGRAM_NAME)
        state = self.controller.root / "var" / "lib" / "topokeeper"
        document = {**config, "applier": str(program), "state_dir": str(state)}
        path = opt / "agent.json"
        path.write_text(json.dumps(document, indent=2))
        return str(path)

    def run_agent_once(self, config_path: str, environment: Mapping[str, str]) -> tuple[int, str]:
        program = str(Path(config_path).with_name(PROGRAM_NAME))
        variables = [f"{key}={value}" for key, value in sorted(environment.items())]
        result = subprocess.run(
            self.controller.command(*variables, "python3", program, "agent", "--config", config_path, "--once"),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        return result.returncode, result.stderr

    def verify(self, bundle: Bundle) -> dict[str, object]:
        probe = self.controller.root / "probe-bundle.json"
        probe.write_text(json.dumps(bundle.document()))
        program = write_program(self.controller.root / PROGRAM_NAME)
        result = self.controller.run("python3", str(program), "verify", str(probe), timeout=300)
        document: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
        return document


def _standin_command(entry: str = "main") -> list[str]:
    """This interpreter running the stand-in's front door (``standin_reads.main``), isolated (-I) and without
    ``site`` (-S): the applier runs one for every scontrol it asks, and setting up the environment's site-packages
    cost more than most answers. After the standard library, its path holds the stand-in's packages: topokeeper and
    PyYAML."""
    paths = [str(Path(topokeeper.__file__).parent.parent), str(Path(yaml.__file__).parent.parent)]
    module = standin_reads.__name__ if entry == "main" else standin_scontrol.__name__  # slurmctld_main: the loader
    code = f"import sys; sys.path += {paths!r}; from {module} import {entry}; sys.exit({entry}())"
    return [sys.executable, "-I", "-S", "-c", code]


def _write_head_node_python(root: Path, interpreter: str) -> None:
    """``bin/python3``: ``interpreter`` as a virtual environment of its own (``pyvenv.cfg`` beside ``bin``) with no
    packages. The applier and the agent are standard library only, as a head node's python3 serves them; this
    machine's site-packages add nothing they may use, and their ``.pth`` files cost more than the applier's own
    start (~50 ms of every run here). ``sys.executable`` stays ``bin/python3``, so the applier the bootstrap
    execs, and the one the agent starts, run the same way."""
    (root / "pyvenv.cfg").write_text(f"home = {Path(interpreter).parent}\ninclude-system-site-packages = false\n")
    link = root / "bin" / "python3"
    link.unlink(missing_ok=True)
    link.symlink_to(interpreter)


@functools.cache
def _machine_python3(path: str) -> str | None:
    """The interpreter ``python3`` on ``path`` runs, resolved through any shim and out of any virtual environment
    (its base interpreter); None without one."""
    try:
        result = subprocess.run(
            ["python3", "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"],
            env={**os.environ, "PATH": path},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    # The last line: a shim or a sitecustomize may print before the interpreter answers.
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines and os.access(lines[-1], os.X_OK) else None
