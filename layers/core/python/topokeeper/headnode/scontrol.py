"""scontrol: finding it and slurm.conf, asking it, and what slurmctld knows."""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import (
    Dict,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from topokeeper.headnode.bundle import Bundle
from topokeeper.headnode.config_dir import open_regular
from topokeeper.headnode.failures import Failed, Refused
from topokeeper.headnode.slurm_conf import SlurmConf
from topokeeper.wire import (
    APPLIER_BUDGET_SECONDS,
    RECONFIGURE_TIMEOUT,
    SCONTROL_TIMEOUT,
    one_line,
    parse_show_topology,
    parse_slurm_version,
    partition_topologies,
    sample,
)

DEFAULT_SLURM_CONF = "/opt/slurm/etc/slurm.conf"  # HyperPod: /opt/slurm links to the active version
OPT_SLURM_SCONTROL = "/opt/slurm/bin/scontrol"  # HyperPod, ParallelCluster: on PATH in login shells only


class Scontrol:
    deadline: Optional[float] = None  # the run's Budget: no call outlives it

    def __init__(self, environ: Mapping[str, str], path: str) -> None:
        self.env = dict(environ)
        self.path = path

    def run(self, *args: str, timeout: float = SCONTROL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        timeout = _within_deadline(timeout, self.deadline, args)
        try:
            return subprocess.run(
                [self.path, *args],
                capture_output=True,
                encoding="utf-8",
                errors="replace",
                timeout=timeout,
                env=self.env,
                check=False,
            )
        except OSError as error:
            raise Failed("cannot run %s: %s" % (self.path, error.strerror)) from None
        except subprocess.TimeoutExpired:
            raise Failed("scontrol %s did not finish within %.0f s" % (" ".join(args), timeout)) from None

    def output(self, *args: str) -> str:
        result = self.run(*args)
        if result.returncode != 0:
            message = one_line(result.stderr or result.stdout) or "no output"
            raise Failed("scontrol %s exited %d: %s" % (" ".join(args), result.returncode, message))
        return result.stdout


def slurmctld_up(scontrol: Scontrol) -> bool:
    """Whether a slurmctld answers ``scontrol ping`` (a failed reconfigure is a refusal only if one does)."""
    return "is UP" in scontrol.run("ping").stdout


def _within_deadline(timeout: float, deadline: Optional[float], args: Sequence[str]) -> float:
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise Failed(
            "the applier's %.0f s time budget is spent (before scontrol %s)" % (APPLIER_BUDGET_SECONDS, " ".join(args))
        )
    return min(timeout, left)


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_scontrol(explicit: Optional[str], slurm_conf: Optional[str], environ: Mapping[str, str]) -> str:
    """``--scontrol``, else ``../bin/scontrol`` from slurm.conf's directory, else /opt/slurm/bin, else PATH."""
    if explicit is not None:
        if not _executable(explicit):
            raise Failed("--scontrol %s: not an executable file" % explicit)
        return explicit
    candidates = []
    if slurm_conf:
        config_dir = os.path.dirname(os.path.abspath(slurm_conf))
        candidates.append(os.path.normpath(os.path.join(config_dir, os.pardir, "bin", "scontrol")))
    if OPT_SLURM_SCONTROL not in candidates:
        candidates.append(OPT_SLURM_SCONTROL)
    path = environ.get("PATH", os.defpath)
    on_path = [os.path.join(directory, "scontrol") for directory in path.split(os.pathsep) if directory]
    for candidate in candidates + on_path:
        if _executable(candidate):
            return candidate
    raise Failed(
        "scontrol not found: not %s, nor on PATH (%s); give it with --scontrol" % (" or ".join(candidates), path)
    )


def configured_slurm_conf(environ: Mapping[str, str]) -> Optional[str]:
    """SLURM_CONF, else /opt/slurm/etc/slurm.conf if it exists: what is found without asking scontrol."""
    configured = environ.get("SLURM_CONF")
    if configured:
        return configured
    return DEFAULT_SLURM_CONF if os.path.isfile(DEFAULT_SLURM_CONF) else None


def find_slurm_conf(environ: Mapping[str, str], scontrol: Scontrol) -> str:
    configured = configured_slurm_conf(environ)
    if configured:
        return configured
    match = re.search(r"^SLURM_CONF\s*=\s*(\S+)", scontrol.output("show", "config"), re.MULTILINE)
    if not match:
        raise Failed(
            "cannot find slurm.conf: SLURM_CONF is unset, %s is missing, and scontrol does not say"
            % (DEFAULT_SLURM_CONF)
        )
    return match.group(1)


def show_partitions(scontrol: Scontrol) -> str:
    return scontrol.output("-a", "-o", "show", "partition")  # -a: hidden ones too


def live_partitions(scontrol: Scontrol) -> Dict[str, Optional[str]]:
    return partition_topologies(show_partitions(scontrol))


def check_cluster_knows(conf: SlurmConf, bundle: Bundle, live_nodes: Set[str]) -> None:
    unknown_partitions = sorted(set(bundle.partitions) - conf.partition_names())
    if unknown_partitions:
        note = (" (Include lines not followed: %s)" % sample(conf.not_followed)) if conf.not_followed else ""
        raise Refused("partitions not in slurm.conf: %s%s" % (sample(unknown_partitions), note))
    wanted = set(bundle.nodes)
    for units in bundle.topologies.values():
        for unit in units.values():
            wanted.update(unit.nodes)
    unknown_nodes = sorted(wanted - live_nodes)
    if unknown_nodes:
        raise Refused("%d node(s) unknown to slurmctld: %s" % (len(unknown_nodes), sample(unknown_nodes)))


class LiveTopology(NamedTuple):
    units: Dict[str, Dict[str, object]]  # as parse_show_topology returns them
    error: str  # why scontrol could not show it; "" when it could


class LiveTopologies:
    """``scontrol show topology [NAME]``, asked once per name: the name and the grouping checks share it."""

    def __init__(self, scontrol: Scontrol) -> None:
        self.scontrol = scontrol
        self.shown_value: Dict[Optional[str], LiveTopology] = {}

    def get(self, name: Optional[str]) -> LiveTopology:
        """The named topology, or without a name the cluster default (the one topology before 25.05)."""
        if name not in self.shown_value:
            self.shown_value[name] = self._read(name)
        return self.shown_value[name]

    def _read(self, name: Optional[str]) -> LiveTopology:
        args = ("show", "topology") + ((name,) if name else ())
        result = self.scontrol.run(*args)
        error = one_line(result.stderr)
        try:
            units = parse_show_topology(result.stdout)
        except ValueError as parse_error:
            units, error = {}, "unreadable output: %s" % parse_error
        if not units and (error or result.returncode != 0):
            # `scontrol show topology NAME` exits 0 even when NAME is not available.
            return LiveTopology({}, "scontrol %s: %s" % (" ".join(args), error or "exit %d" % result.returncode))
        return LiveTopology(units, "")


def log_errors_since(log_path: Optional[str], offset: int) -> str:
    """The error and fatal lines slurmctld logged since ``offset``: why it refused a config."""
    if not log_path:
        return ""
    try:
        with open(open_regular(log_path, follow=True), "rb") as handle:
            handle.seek(max(offset, os.path.getsize(log_path) - 256 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [re.sub(r"^\[[^\]]*\]\s*", "", line) for line in text.splitlines() if re.search(r"\b(fatal|error)\b", line)]
    return " | ".join(lines[-4:])


def reconfigure(scontrol: Scontrol, log_path: Optional[str], timeout: float = RECONFIGURE_TIMEOUT) -> Tuple[int, str]:
    """Run ``scontrol reconfigure`` for at most ``timeout`` s: (exit code, -1 when it did not finish; why it failed)."""
    try:
        offset = os.path.getsize(log_path) if log_path else 0
    except OSError:
        offset = 0
    try:
        result = scontrol.run("reconfigure", timeout=min(max(timeout, 1.0), RECONFIGURE_TIMEOUT))
    except Failed as error:
        return -1, str(error)
    if result.returncode == 0:
        return 0, ""
    message = "scontrol reconfigure exited %d: %s" % (result.returncode, one_line(result.stderr + result.stdout))
    logged = log_errors_since(log_path, offset)
    return result.returncode, message + ("; slurmctld log: %s" % logged if logged else "")


def slurm_version(text: str) -> Tuple[int, int, int]:
    """``scontrol version``'s output -> (major, minor, patch); Failed when it names none."""
    try:
        return parse_slurm_version(text)
    except ValueError as error:
        raise Failed(str(error)) from None
