"""``topokeeper-head-node.pyz node-start --cluster NAME --bucket BUCKET --region REGION``: a ParallelCluster queue's
``OnNodeStart`` custom action that hands this node's topology to slurmd before slurmd first starts.

Why OnNodeStart: ParallelCluster runs it before any bootstrap step, and the cookbook's finalize step starts slurmd
(``finalize_compute``: ``service 'slurmd' action [:enable, :start]``) before ``OnNodeConfigured`` runs; a slurmd
restart after the first registration does not re-apply a topology, so OnNodeConfigured is too late. The cookbook
rewrites ``/etc/sysconfig/slurmd`` (``SLURMD_OPTIONS='-N <node>'``) and ``slurmd.service`` in its config step, and
leaves drop-ins alone (it writes its own NVIDIA one beside them): the value goes into a drop-in,
``slurmd.service.d/topokeeper-topology.conf``, that restates the cookbook's ExecStart with
``--conf topology=<value>`` (Slurm 25.11 places a CLOUD node there when it registers).

It reads its instance id (IMDSv2), then its entry ``<prefix>/<cluster>/registration/<instance-id>.json`` with the
instance role's credentials, waiting at most ``--wait-seconds`` (60) for the backend to publish it: a missing
object (404, the policy grants s3:ListBucket on the prefix) is asked again every ``--poll-seconds``; a denied read
(403) ends the wait at once. It checks the entry is this cluster's and this instance's and holds only Slurm name
characters (``topokeeper.wire.parse_registration``). It never blocks past its bound and never fails the bootstrap:
it always exits 0, with one log line (JSON, stderr) saying what it did or why it wrote nothing; slurmd then starts
without a topology and the head node's ``scontrol update`` places the node.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import time
from typing import Callable, List, Optional

from topokeeper.agent.aws import Aws, _s3_error_code
from topokeeper.agent.credentials import CredentialProvider, fetch_instance_id
from topokeeper.agent.errors import AgentError
from topokeeper.agent.log import log
from topokeeper.wire import (
    AGENT_KEY_PREFIX,
    MAX_REGISTRATION_BYTES,
    AgentConfig,
    Registration,
    RegistrationError,
    check_topology_value,
    parse_registration,
    registration_key,
)

DROP_IN_DIR = "/etc/systemd/system/slurmd.service.d"
DROP_IN_NAME = "topokeeper-topology.conf"
SLURMD = "/opt/slurm/sbin/slurmd"  # ParallelCluster's install_dir
WAIT_SECONDS = 60.0
POLL_SECONDS = 2.0
REQUEST_SECONDS = 5.0  # one request at most, and never past the bound
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,255}")  # the slurmd path is written into the unit too

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class Refused(Exception):
    """No topology for slurmd this boot; the message says why in one line."""


def drop_in_text(slurmd: str, topology: str) -> str:
    """The drop-in: the cookbook's ExecStart (``slurmd -D $SLURMD_OPTIONS``) with the topology added."""
    check_topology_value(topology)  # again where it enters the unit: no space, quote, '%', '$' or newline
    if not _SAFE_PATH.fullmatch(slurmd):
        raise RegistrationError("--slurmd: not an absolute path of safe characters: %s" % repr(slurmd)[:80])
    return (
        "# topokeeper node-start: this node's topology, read before slurmd's first start (Slurm 25.11 places a\n"
        "# CLOUD node at registration). Restates ParallelCluster's ExecStart with --conf topology=...\n"
        "[Service]\n"
        "ExecStart=\n"
        "ExecStart=%s -D $SLURMD_OPTIONS --conf topology=%s\n" % (slurmd, topology)
    )


def write_drop_in(directory: str, text: str) -> str:
    """Write the drop-in atomically (a crash leaves the old one or the new one, never half)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    path = os.path.join(directory, DROP_IN_NAME)
    temporary = path + ".new"
    try:
        with open(temporary, "w", encoding="ascii") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full /etc keeps no partial file beside the units
            os.unlink(temporary)
        raise
    return path


def _config(args: argparse.Namespace) -> AgentConfig:
    return AgentConfig(
        cluster=args.cluster,
        bucket=args.bucket,
        region=args.region,
        prefix=args.prefix,
        endpoint_url=args.endpoint_url,
        request_timeout_seconds=REQUEST_SECONDS,
    )


def wait_for_entry(args: argparse.Namespace, clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> Registration:
    """This instance's entry, once it is there and valid, within ``args.wait_seconds``; else Refused."""
    deadline = clock() + args.wait_seconds
    aws = Aws(_config(args), CredentialProvider(REQUEST_SECONDS, quiet=True), time.time)
    instance: Optional[str] = None
    last = "nothing asked yet"
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            raise Refused("no entry within %g s (last answer: %s)" % (args.wait_seconds, last))
        try:
            if instance is None:
                instance = fetch_instance_id(min(REQUEST_SECONDS, remaining))
            key = registration_key(args.cluster, instance, args.prefix)
            response = aws.get(key, min(REQUEST_SECONDS, remaining), MAX_REGISTRATION_BYTES + 1)
        except AgentError as error:  # IMDS or S3 unreachable, a timeout: asked again until the bound
            last = str(error)[:200]
        else:
            if response.status == 200:
                return parse_registration(response.body, args.cluster, instance)
            code = _s3_error_code(response.body)
            if response.status == 403:
                raise Refused("s3://%s/%s: HTTP 403 %s: the instance role may not read it" % (args.bucket, key, code))
            last = "s3://%s/%s: HTTP %d %s" % (args.bucket, key, response.status, code)
        sleep(max(0.0, min(args.poll_seconds, deadline - clock())))


def _daemon_reload(timeout: float) -> None:
    """systemd reads the drop-in at its next load; slurmd.service may already be loaded (a baked AMI)."""
    try:
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=timeout, capture_output=True)
    except (OSError, subprocess.SubprocessError) as error:
        raise AgentError("systemctl daemon-reload: %s" % str(error)[:200]) from error


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(prog="topokeeper-head-node.pyz node-start", description=__doc__.split("\n")[0])
    parsed.add_argument("--cluster", required=True, help="the cluster's name in topokeeper's config")
    parsed.add_argument("--bucket", required=True, help="the stack's plans bucket (output PlanBucket)")
    parsed.add_argument("--region", required=True)
    parsed.add_argument("--prefix", default=AGENT_KEY_PREFIX)
    parsed.add_argument("--endpoint-url", default=None, help="an S3 endpoint (tests, emulators)")
    parsed.add_argument("--wait-seconds", type=float, default=WAIT_SECONDS)
    parsed.add_argument("--poll-seconds", type=float, default=POLL_SECONDS)
    parsed.add_argument("--slurmd", default=SLURMD)
    parsed.add_argument("--drop-in-dir", default=DROP_IN_DIR)
    parsed.add_argument("--no-daemon-reload", action="store_true", help="tests: leave systemd alone")
    return parsed


def main(argv: Optional[List[str]] = None) -> int:
    """Always 0: a node's bootstrap never fails because of topokeeper."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as stop:  # argparse exits 2 on bad arguments, and 0 for --help
        if stop.code:
            log("node_start.refused", level="warning", reason="bad arguments (see above); slurmd starts without")
        return 0
    try:
        entry = wait_for_entry(args)
        path = write_drop_in(args.drop_in_dir, drop_in_text(args.slurmd, entry.topology))
    except (Refused, RegistrationError, AgentError, OSError) as error:
        reason = "%s; slurmd starts without a topology" % error
        try:  # an image baked from a placed node carries its drop-in: 25.11 would place this node with it
            os.unlink(os.path.join(args.drop_in_dir, DROP_IN_NAME))
            if not args.no_daemon_reload:
                _daemon_reload(REQUEST_SECONDS)
            reason += " (removed the drop-in an earlier boot left)"
        except FileNotFoundError:
            pass
        except (OSError, AgentError) as removal:
            reason = "%s; the drop-in an earlier boot left stays: %s" % (error, str(removal)[:200])
        log("node_start.refused", level="warning", reason=reason)
        return 0
    except Exception as error:  # a bug here must not fail the node either
        log("node_start.crashed", level="error", reason=repr(error)[:300])
        return 0
    reload_error = None
    if not args.no_daemon_reload:
        try:
            _daemon_reload(REQUEST_SECONDS)
        except AgentError as error:  # the drop-in is written: the cookbook's ``systemctl enable`` reloads too
            reload_error = str(error)
    log("node_start.placed", topology=entry.topology, generation=entry.generation, drop_in=path, reload=reload_error)
    return 0
