"""A real slurmctld in a Debian chroot: the head node for tests, the demo and ``simulate``.

Debian ships two of the Slurm versions we need: sid has 26.05 (topology.yaml), trixie has 24.11
(topology.conf). ``ensure_chroot`` builds one with debootstrap into a cache outside the clone and
reuses it afterwards. The third, 25.11 (ParallelCluster's), is built from source into a chroot's own
``/opt/slurm`` (``slurm_source``); a controller finds Slurm there (``built_slurm``).
``SlurmController`` runs slurmctld daemonized, as on a head node, so that
``scontrol reconfigure`` keeps the old config when a new one fails. Nodes are ``State=CLOUD`` with
``ResumeProgram=/bin/true``: no slurmd and no munge are needed, and a job's allocation (chosen by the
topology plugin) is visible while it is CONFIGURING.

A controller also looks like one of three head nodes (``HEAD_NODE_STYLES``): ``debian`` (Slurm on
PATH, ``SLURM_CONF`` set), or ``hyperpod`` and ``parallelcluster``: Slurm under ``/opt/slurm`` with
``scontrol`` only in ``/opt/slurm/bin``, as AWS's images install it. Those two are arranged inside the
controller's own mount namespace, never in the shared chroot: its directory is bound on ``/opt/slurm``
and Debian's ``/usr/bin/scontrol`` is covered by a file that is not executable. Commands then run with
a login shell's PATH (``/opt/slurm/bin`` first) or, like SSM's script and a systemd unit, without it.
HyperPod keeps its partitions in an ``Include``d file; ParallelCluster names nodes
``<queue>-st|dy-<compute resource>-<n>``, gives static nodes ``NodeAddr`` (their private IPs) and
defines each queue in ``/opt/slurm/etc/pcluster/``.

The harness stops only what it started, by pid, and unmounts /proc before any chroot is deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from topokeeper.wire import compress, expand, partition_topologies

# A Debian mirror for debootstrap (a local mirror or proxy) when set; unset, debootstrap uses its own default.
DEBIAN_MIRROR_ENV = "TOPOKEEPER_DEBIAN_MIRROR"
SUITE_FOR_FORMAT = {"topology.yaml": "sid", "topology.conf": "trixie"}
# Full python3, as head nodes have it (the agent needs urllib and hmac; the applier needs only the
# python3-minimal subset, which its own tests check).
PACKAGES = ("slurmctld", "slurm-client", "python3")
READY_MARKER = ".topokeeper-ready"
HEAD_NODE_STYLES = ("debian", "hyperpod", "parallelcluster")
# Rounds of stopping what runs in a controller's namespace: a command may enter it while the last round stops.
STOP_PASSES = 5
OPT_SLURM = "/opt/slurm"
# What a non-login shell (SSM's AWS-RunShellScript, a systemd unit) has; a login shell adds /opt/slurm/bin.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOGIN_PATH = f"{OPT_SLURM}/bin:{OPT_SLURM}/sbin:{SYSTEM_PATH}"
_CLIENT_TOOLS = ("scontrol", "sbatch", "squeue", "sinfo")
# What slurmctld logs when this machine is busy, not when a config is wrong (Slurm's src/slurmctld/controller.c
# and src/common/timers.c; the same texts in the 26.05 and 24.11 chroots): a busy machine must not fail a test.
LOAD_TIMING_MESSAGES = (
    "High latency for 1000 calls to gettimeofday()",
    "Warning: Note very large processing time from ",
    "Note large processing time from ",
)
_PROBLEM_LINE = re.compile(r"\b(error|warning|fatal)\b", re.IGNORECASE)


class HarnessError(RuntimeError):
    """The chroot or slurmctld could not be prepared."""


def unexpected_log_lines(log_text: str, expected: Iterable[str] = ()) -> list[str]:
    """The error, warning and fatal lines of a slurmctld log, less load-dependent timing messages and those
    containing any of ``expected``."""
    ignored = (*LOAD_TIMING_MESSAGES, *expected)
    return [
        line
        for line in log_text.splitlines()
        if _PROBLEM_LINE.search(line) and not any(message in line for message in ignored)
    ]


def cache_root() -> Path:
    configured = os.environ.get("TOPOKEEPER_CHROOT_CACHE")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/topokeeper/chroots")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "topokeeper" / "chroots"


def can_run() -> tuple[bool, str]:
    """Whether this machine can build and enter a chroot, and if not, why."""
    if os.geteuid() != 0:
        return False, "needs root (debootstrap, chroot and mount)"
    if shutil.which("debootstrap") is None:
        return False, "debootstrap is not installed (make install-system installs it)"
    return True, ""


def _run(argv: list[str], *, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise HarnessError(f"{' '.join(argv[:4])}... exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result


def _mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def _unmount_all(root: Path) -> None:
    """Unmount everything under ``root``, deepest first."""
    prefix = str(root.resolve())
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), reverse=True):
        _run(["umount", "-l", point], check=False)


def remove_chroot(root: Path) -> None:
    """Delete a chroot safely: never while anything (such as /proc) is mounted inside it."""
    if not root.exists():
        return
    _unmount_all(root)
    if any(_mounted(root / sub) for sub in ("proc", "sys", "dev")):
        raise HarnessError(f"refusing to delete {root}: something is still mounted inside")
    _run(["rm", "-rf", "--one-file-system", str(root)])


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_chroot(suite: str, cache: Path | None = None) -> Path:
    """Return a ready chroot for ``suite``, building it (about a minute) when it is missing."""
    ok, reason = can_run()
    if not ok:
        raise HarnessError(reason)

    def ready(root: Path) -> bool:
        marker = root / READY_MARKER
        if marker.exists() and _marker_packages(marker) != set(PACKAGES):
            apt_install(root, PACKAGES)  # the package list grew since this chroot was built
            marker.write_text(_marker_text(root))
        return marker.exists()

    def build(building: Path) -> None:
        debootstrap_into(suite, building)
        policy = building / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")  # packages must not start daemons in the chroot
        policy.chmod(0o755)
        apt_install(building, PACKAGES)
        (building / READY_MARKER).write_text(_marker_text(building))

    return built_once(cache or cache_root(), suite, ready, build)


def ensure_derived_chroot(
    suite: str,
    name: str,
    packages: Iterable[str],
    marker: str,
    *,
    cache: Path | None = None,
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """A cached copy of ``suite``'s chroot with ``packages`` added (and ``finish`` run on it), built once under
    a file lock: a chroot for one purpose that leaves the shared ones as they are."""
    cache = cache or cache_root()
    base = ensure_chroot(suite, cache)
    packages = list(packages)

    def build(building: Path) -> None:
        # --one-file-system: the base's /proc may be mounted by tests running now; its mount point is copied empty.
        _run(["cp", "-a", "--one-file-system", "--reflink=auto", str(base), str(building)])
        apt_install(building, packages)
        if finish is not None:
            finish(building)
        (building / marker).write_text(" ".join(packages) + "\n")

    return built_once(cache, name, lambda root: (root / marker).exists(), build)


def built_once(cache: Path, name: str, ready: Callable[[Path], bool], build: Callable[[Path], None]) -> Path:
    """``cache/name``, built by ``build`` into ``name.building`` and renamed when ``ready`` says it is not there,
    under a file lock, so parallel tests wait for one build and none sees a half-built chroot."""
    root = cache / name
    with _file_lock(cache / f"{name}.lock"):
        if ready(root):
            return root
        building = cache / f"{name}.building"
        remove_chroot(building)
        remove_chroot(root)
        build(building)
        building.rename(root)
    return root


def debootstrap_into(suite: str, target: Path) -> None:
    """A minimal ``suite`` in ``target``, from the mirror the environment names (Debian's default otherwise)."""
    _run(debootstrap_argv(suite, target, os.environ), timeout=1800)
    # The mirror's Release files can read as expired against this machine's clock.
    (target / "etc/apt/apt.conf.d/99novaliduntil").write_text('Acquire::Check-Valid-Until "false";\n')


def apt_install(root: Path, packages: Iterable[str]) -> None:
    install = (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        "--no-install-recommends " + " ".join(packages)
    )
    _run(["chroot", str(root), "sh", "-c", install], timeout=1800)


def debootstrap_argv(suite: str, target: Path, environ: Mapping[str, str]) -> list[str]:
    """The debootstrap command for ``suite`` into ``target``: the mirror only when ``environ`` names one."""
    argv = ["debootstrap", "--variant=minbase", suite, str(target)]
    mirror = environ.get(DEBIAN_MIRROR_ENV, "").strip()
    return [*argv, mirror] if mirror else argv


def _marker_text(root: Path) -> str:
    version = _run(["chroot", str(root), "slurmctld", "-V"]).stdout.strip()
    return f"{version}\npackages: {' '.join(PACKAGES)}\n"


def built_under_opt_slurm(root: Path) -> bool:
    """Whether the chroot's Slurm was built into /opt/slurm (``slurm_source``) rather than installed by Debian."""
    return (root / OPT_SLURM.lstrip("/") / "sbin" / "slurmctld").is_file()


def installed_slurm_version(root: Path) -> str:
    """The Slurm version in a ready chroot, as ``slurmctld -V`` said when it was built (``26.05.5``)."""
    return (root / READY_MARKER).read_text().split("\n", 1)[0].split()[-1]


def installed_slurm_series(root: Path) -> str:
    """The series of the chroot's Slurm (``25.11`` for 25.11.7): the version a plan for it is made for."""
    return ".".join(installed_slurm_version(root).split(".")[:2])


def _marker_packages(marker: Path) -> set[str]:
    for line in marker.read_text().splitlines():
        if line.startswith("packages:"):
            return set(line.split(":", 1)[1].split())
    return set()


@contextlib.contextmanager
def proc_mounted(root: Path) -> Iterator[None]:
    """Mount /proc in the chroot (slurmctld readlinks /proc/self/exe) for as long as any user needs it."""
    counter = root.parent / f"{root.name}.proc-users"
    with _file_lock(root.parent / f"{root.name}.proc.lock"):
        users = int(counter.read_text() or 0) if counter.exists() else 0
        if not _mounted(root / "proc"):
            _run(["mount", "-t", "proc", "proc", str(root / "proc")])
            users = 0
        counter.write_text(str(users + 1))
    try:
        yield
    finally:
        with _file_lock(root.parent / f"{root.name}.proc.lock"):
            users = max(int(counter.read_text() or 1) - 1, 0)
            counter.write_text(str(users))
            if users == 0 and _mounted(root / "proc"):
                _run(["umount", str(root / "proc")], check=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class SlurmController:
    """One slurmctld, its config directory inside the chroot, and the commands to drive it."""

    root: Path
    name: str
    style: str = "debian"  # one of HEAD_NODE_STYLES
    port: int = field(default_factory=free_port)
    pid: int | None = None
    # A node's own line settings instead of the default CPUs/RealMemory (a real slurmd's node: its Port=, and
    # no more CPUs or memory than this machine has). See topokeeper.sim.slurmd_nodes.
    node_settings: dict[str, str] = field(default_factory=dict)
    _anchor: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.style not in HEAD_NODE_STYLES:
            raise HarnessError(f"head-node style {self.style!r}: expected one of {', '.join(HEAD_NODE_STYLES)}")

    @property
    def inner_dir(self) -> str:
        return f"/topokeeper/{self.name}"

    @property
    def under_opt_slurm(self) -> bool:
        """Slurm under /opt/slurm (HyperPod, ParallelCluster), not on a non-login PATH."""
        return self.style != "debian"

    @property
    def built_slurm(self) -> bool:
        """Slurm built into the chroot's own /opt/slurm (25.11, see ``slurm_source``), not Debian's packages."""
        return built_under_opt_slurm(self.root)

    @property
    def _base(self) -> Path:
        return self.root / self.inner_dir.lstrip("/")

    @property
    def etc(self) -> Path:
        return self._base / "etc"

    @property
    def config_dir_inner(self) -> str:
        """slurm.conf's directory as the head node's processes see it."""
        return f"{OPT_SLURM}/etc" if self.under_opt_slurm else f"{self.inner_dir}/etc"

    @property
    def slurm_conf_inner(self) -> str:
        return f"{self.config_dir_inner}/slurm.conf"

    @property
    def log(self) -> Path:
        return self.root / self.inner_dir.lstrip("/") / "log" / "slurmctld.log"

    def prepare(
        self,
        nodes: Iterable[str],
        partitions: Mapping[str, tuple[Iterable[str], str | None]],
        extra: Iterable[str] = (),
        addresses: Mapping[str, str] | None = None,
    ) -> None:
        """A fresh config directory and slurm.conf (see ``write_slurm_conf``)."""
        base = self._base
        if base.exists():
            shutil.rmtree(base)
        for sub in ("etc", "state", "log"):
            (base / sub).mkdir(parents=True)
        key = self.etc / "slurm.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        if self.under_opt_slurm and not self.built_slurm:
            self._install_opt_slurm(base)
        self.write_slurm_conf(nodes, partitions, extra, addresses)

    def _install_opt_slurm(self, base: Path) -> None:
        """What becomes /opt/slurm/bin: client wrappers that default to /opt/slurm/etc/slurm.conf, as a
        Slurm built with --prefix=/opt/slurm does, and the file that covers Debian's /usr/bin/scontrol."""
        for sub in ("bin", "sbin", "libexec"):
            (base / sub).mkdir()
        # slurmctld in sbin beside bin, as AWS installs it: the applier proves a new config with it.
        (base / "sbin" / "slurmctld").write_text('#!/bin/sh\nexec /usr/sbin/slurmctld "$@"\n')
        (base / "sbin" / "slurmctld").chmod(0o755)
        # A link to Debian's scontrol that the covering file does not hide (same filesystem: the chroot).
        os.link(self.root / "usr/bin/scontrol", base / "libexec" / "scontrol")
        for tool in _CLIENT_TOOLS:
            target = f"{self.inner_dir}/libexec/scontrol" if tool == "scontrol" else f"/usr/bin/{tool}"
            wrapper = base / "bin" / tool
            default_conf = f'export SLURM_CONF="${{SLURM_CONF:-{OPT_SLURM}/etc/slurm.conf}}"'
            wrapper.write_text(f'#!/bin/sh\n{default_conf}\nexec {shlex.quote(target)} "$@"\n')
            wrapper.chmod(0o755)
        (base / "no-scontrol").write_text("")  # mode 0644: PATH lookups skip it, as if scontrol were absent
        (base / "no-scontrol").chmod(0o644)

    def write_slurm_conf(
        self,
        nodes: Iterable[str],
        partitions: Mapping[str, tuple[Iterable[str], str | None]],
        extra: Iterable[str] = (),
        addresses: Mapping[str, str] | None = None,
    ) -> None:
        """CLOUD nodes and one line per partition (with its Topology= if given), laid out as the style's
        head node has them. ``addresses``: NodeAddr per node (ParallelCluster's static nodes); other nodes
        get 127.0.0.1, or on ParallelCluster no NodeAddr at all (a powered-down dynamic node's address is
        its name). Debian and HyperPod add a partition ``dev`` with all nodes."""
        node_list = sorted(set(nodes))
        lines = [
            "ClusterName=topotest",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={self.port}",
            "SlurmUser=root",
            "AuthType=auth/slurm",
            "CredType=cred/slurm",
            f"StateSaveLocation={self.inner_dir}/state",
            f"SlurmctldPidFile={self.inner_dir}/slurmctld.pid",
            f"SlurmctldLogFile={self.inner_dir}/log/slurmctld.log",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "ResumeProgram=/bin/true",
            "SuspendProgram=/bin/true",
            "SuspendTime=3600",
            "ResumeTimeout=3600",
        ]
        # A key given in ``extra`` replaces the default (slurmctld logs an error for a key given twice).
        extra = list(extra)
        given = {line.split("=", 1)[0].lower() for line in extra if "=" in line}
        lines = [line for line in lines if line.split("=", 1)[0].lower() not in given]
        lines.extend(extra)
        addresses = addresses or {}
        if self.style == "parallelcluster":
            self._write_parallelcluster(lines, node_list, partitions, addresses)
            return
        lines.extend(_node_lines(node_list, addresses, "127.0.0.1", self.node_settings))
        partition_lines = [
            _partition_line(name, members, topology) for name, (members, topology) in sorted(partitions.items())
        ]
        if node_list:
            partition_lines.append("PartitionName=dev Nodes=ALL Default=YES State=UP")
        if self.style == "hyperpod":
            self.write_file("partitions.conf", "\n".join(partition_lines) + "\n")
            partition_lines = [f"Include {OPT_SLURM}/etc/partitions.conf"]
        self.write_file("slurm.conf", "\n".join(lines + partition_lines) + "\n")

    def _write_parallelcluster(
        self,
        lines: list[str],
        node_list: list[str],
        partitions: Mapping[str, tuple[Iterable[str], str | None]],
        addresses: Mapping[str, str],
    ) -> None:
        """slurm.conf includes slurm_parallelcluster.conf, which includes one file per queue from pcluster/:
        the queue's nodes, a NodeSet of them, and its partition line (ParallelCluster 3's layout)."""
        pcluster = self.etc / "pcluster"
        if pcluster.exists():
            shutil.rmtree(pcluster)
        pcluster.mkdir()
        placed: set[str] = set()
        includes = []
        for partition, (members, topology) in sorted(partitions.items()):
            own = sorted(set(members) - placed)
            placed.update(own)
            queue_lines = _node_lines(own, addresses, None, self.node_settings)
            member_list = sorted(set(members))
            if member_list:
                queue_lines.append(f"NodeSet={partition}_nodes Nodes={compress(member_list)}")
            queue_lines.append(_partition_line(partition, [f"{partition}_nodes"] if member_list else [], topology))
            name = f"slurm_parallelcluster_{partition}_partition.conf"
            (pcluster / name).write_text("\n".join(queue_lines) + "\n")
            includes.append(f"include {OPT_SLURM}/etc/pcluster/{name}")
        unplaced = [node for node in node_list if node not in placed]
        parallelcluster = [*_node_lines(unplaced, addresses, None, self.node_settings), *includes]
        self.write_file("slurm_parallelcluster.conf", "\n".join(parallelcluster) + "\n")
        self.write_file("slurm.conf", "\n".join([*lines, "include slurm_parallelcluster.conf"]) + "\n")

    def write_file(self, name: str, content: str) -> None:
        """Replaced whole (a temporary file renamed over it): the stand-ins rewrite these files while slurmctld's
        clients read them, and a file written in place reads empty or cut meanwhile."""
        path = self.etc / name
        temporary = path.with_name(f".{path.name}.writing")
        temporary.write_text(content)
        os.replace(temporary, path)

    def command(self, *argv: str, login: bool = True) -> list[str]:
        """argv run in the chroot, inside this controller's mount namespace once it has one (see ``start``).

        Debian: with SLURM_CONF set. Under /opt/slurm: with a login shell's PATH, or (``login=False``)
        the PATH of SSM's script and of a systemd unit, where no scontrol is found.
        """
        if self.under_opt_slurm:
            environment = [f"PATH={LOGIN_PATH if login else SYSTEM_PATH}"]
        else:
            environment = [f"SLURM_CONF={self.slurm_conf_inner}"]
            if self.built_slurm:  # Slurm on PATH, as Debian's head node has it
                environment.append(f"PATH={LOGIN_PATH}")
        inner = ["chroot", str(self.root), "env", *environment, *argv]
        if self._anchor is None or self._anchor.poll() is not None:
            return inner
        return ["nsenter", f"--target={self._anchor.pid}", "--mount", "--", *inner]

    def run(
        self, *argv: str, check: bool = False, timeout: float = 60, login: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = self.command(*argv, login=login)
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise HarnessError(f"{' '.join(argv)} exited {result.returncode}: {result.stdout}{result.stderr}")
        return result

    def _pidfile(self) -> Path:
        return self.root / self.inner_dir.lstrip("/") / "slurmctld.pid"

    def current_pid(self) -> int | None:
        """slurmctld re-execs on reconfigure; the pidfile names the live process."""
        try:
            pid = int(self._pidfile().read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self, timeout: float = 30) -> None:
        """slurmctld daemonized, in a mount namespace of its own with a private /run/slurmctld.

        Clients get their auth tokens from the SACK socket in /run/slurmctld; several controllers in one
        chroot would share it (and sign with each other's keys), so each gets its own. A sleeping anchor
        process holds the namespace (slurmctld changes pid on every reconfigure); ``command`` enters it.
        The paths travel as arguments, never inside the shell text.
        """
        # /run/slurm too: a slurmd listens there, and clients ask it first (src/common/sack_api.c).
        script = " && ".join(
            f'mkdir -p "$1/run/{run}" && mount -t tmpfs -o mode=0755 tmpfs "$1/run/{run}"'
            for run in ("slurmctld", "slurm")
        )
        if self.under_opt_slurm and self.built_slurm:
            # The chroot's own /opt/slurm is Slurm; this controller's config becomes its sysconfdir.
            script += f' && mount --bind "$2/etc" "$1{OPT_SLURM}/etc"'
        elif self.under_opt_slurm:
            # This controller's directory is /opt/slurm, and Debian's scontrol is not there to be found.
            script += (
                f' && mkdir -p "$1{OPT_SLURM}" && mount --bind "$2" "$1{OPT_SLURM}"'
                ' && mount --bind "$2/no-scontrol" "$1/usr/bin/scontrol"'
            )
        script += " && exec sleep infinity"
        self._anchor = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                "sh",
                str(self.root),
                str(self._base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while _command_name(self._anchor.pid) != "sleep":
            if self._anchor.poll() is not None or time.monotonic() > deadline:
                error = self._anchor.stderr.read().decode() if self._anchor.stderr else ""
                raise HarnessError(f"could not make a mount namespace for slurmctld: {error.strip()}")
            time.sleep(0.02)
        result = self.run("slurmctld", "-c", "-i", "-f", self.slurm_conf_inner)
        if result.returncode != 0:
            self.stop()
            raise HarnessError(f"slurmctld did not start: {result.stderr.strip()} {self.log_tail()}")
        while time.monotonic() < deadline:
            self.pid = self.current_pid()
            if self.pid and "is UP" in self.run("scontrol", "ping").stdout:
                return
            time.sleep(0.1)
        self.stop()
        raise HarnessError(f"slurmctld did not come up within {timeout}s: {self.log_tail()}")

    def stop(self, timeout: float = 30) -> None:
        """Stop slurmctld (by the pids it wrote) and anything else left in its namespace, then the anchor."""
        for pid in sorted({p for p in (self.current_pid(), self.pid) if p}):
            _terminate(pid, timeout)
        self.pid = None
        if self._anchor is None:
            return
        namespace = _mount_namespace(self._anchor.pid)
        # Until none is left: a command entering the namespace (an applier, the throw-away slurmctld its proof
        # starts) may begin while the first ones are stopped.
        for _ in range(STOP_PASSES):
            left = _pids_in_mount_namespace(namespace) - {self._anchor.pid}
            if not left:
                break
            for pid in sorted(left):
                _terminate(pid, timeout)
        if self._anchor.poll() is None:
            self._anchor.kill()
        self._anchor.wait(timeout=timeout)
        if self._anchor.stderr:
            self._anchor.stderr.close()
        self._anchor = None
        for pid in sorted(_pids_in_mount_namespace(namespace)):  # one that joined as the anchor went
            _terminate(pid, timeout)

    def remove(self) -> None:
        """Delete this controller's directory, once it is stopped (its namespace, and with it the binds, gone)."""
        if self._anchor is not None:
            raise HarnessError(f"controller {self.name} is still running")
        shutil.rmtree(self._base, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no slurmctld log)"

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def show_topology(self, name: str | None = None) -> str:
        result = self.run("scontrol", "show", "topology", *([name] if name else []))
        return (result.stdout + result.stderr).strip()

    def partition_topologies(self) -> dict[str, str | None]:
        """Partition -> its Topology= as slurmctld reports it (None when unset)."""
        return partition_topologies(self.run("scontrol", "-o", "show", "partition", check=True).stdout)

    def submit(self, partition: str, nodes: int, *options: str) -> str:
        out = self.run(
            "sbatch", "--parsable", "-p", partition, "-N", str(nodes), *options, "--wrap", "true", check=True
        ).stdout
        return out.strip().split(";")[0]

    def job_nodes(self, job_id: str, timeout: float = 20) -> str:
        """The job's allocated nodes, once the scheduler placed it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.run("squeue", "-h", "-j", job_id, "-o", "%T|%N").stdout.strip().split("|")
            if len(fields) == 2 and fields[1] and fields[0] != "PENDING":
                return fields[1]
            time.sleep(0.2)
        raise HarnessError(f"job {job_id} was not placed within {timeout}s")


def config_texts(etc: Path) -> str:
    """slurm.conf and every file beside or below it that ends in .conf (the applier's hidden backups aside):
    wherever Topology= may be set."""
    others = (p for p in etc.rglob("*.conf") if not any(part.startswith(".") for part in p.relative_to(etc).parts))
    paths = [etc / "slurm.conf", *sorted(p for p in others if p != etc / "slurm.conf")]
    return "\n".join(path.read_text() for path in paths if path.is_file())


def _node_lines(
    nodes: list[str], addresses: Mapping[str, str], default_address: str | None, settings: Mapping[str, str]
) -> list[str]:
    """CLOUD node lines: those with an address first (``NodeAddr=`` in hostlist order), then the rest, then one
    line for each node with its own ``settings``."""
    own = [node for node in nodes if node in settings]
    nodes = [node for node in nodes if node not in settings]
    addressed = [node for node in nodes if node in addresses]
    rest = [node for node in nodes if node not in addresses]
    lines = []
    if addressed:
        names = compress(addressed)
        listed = ",".join(addresses[node] for node in expand(names))
        lines.append(f"NodeName={names} NodeAddr={listed} CPUs=4 RealMemory=1000 State=CLOUD")
    if rest:
        address = f" NodeAddr={default_address}" if default_address else ""
        lines.append(f"NodeName={compress(rest)}{address} CPUs=4 RealMemory=1000 State=CLOUD")
    for node in own:
        node_address = addresses.get(node) or default_address
        at = f" NodeAddr={node_address}" if node_address else ""
        lines.append(f"NodeName={node}{at} {settings[node]} State=CLOUD")
    return lines


def _partition_line(partition: str, members: Iterable[str], topology: str | None) -> str:
    member_list = sorted(set(members))
    line = f"PartitionName={partition} Nodes={compress(member_list) if member_list else ''} State=UP"
    return line + (f" Topology={topology}" if topology else "")


def _terminate(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _mount_namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _pids_in_mount_namespace(namespace: str) -> set[int]:
    """Every live process in ``namespace`` (a controller's, held by its anchor): what this controller started,
    and nothing else."""
    if not namespace:
        return set()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/mnt") == namespace:
                    found.add(int(entry))
    return found


def _command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
