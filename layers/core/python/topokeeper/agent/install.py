"""``topokeeper agent install-script``: the lifecycle-script snippet that installs the pull agent on a
HyperPod controller node.

Two choices, and why:

- The snippet embeds agent.py and applier.py (base64, each checked against its sha256 on the node) rather
  than fetching them from S3. It is built from this package's own files when printed, so it cannot drift
  from the CLI that printed it; the node needs no read access to code and no aws CLI; the whole install is
  one reviewable file.
- A systemd timer starts ``agent.py --once`` as a oneshot service, rather than a service with its own
  loop. Every cycle starts from the state file, so a restart is the normal path and not a special one;
  systemd never starts a cycle while the last one runs and stops one that outlives TimeoutStartSec; nothing
  long-lived can leak or wedge. The price is one interpreter start and one IMDS credential fetch per poll,
  both local and cheap.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from topokeeper.adapters.aws import aws_setup_errors, client
from topokeeper.adapters.kms import KmsBundleSigner
from topokeeper.agent.agent import DEFAULT_PREFIX, MODES, object_key
from topokeeper.applier.applier import CHANNEL_TIMEOUT_SECONDS, TERMINATE_GRACE_SECONDS
from topokeeper.contract.deployment import read_deployment
from topokeeper.contract.errors import InputError
from topokeeper.service.signing import trusted_key_document

PACKAGE = Path(__file__).resolve().parents[1]
SHIPPED_FILES = {"agent.py": PACKAGE / "agent" / "agent.py", "applier.py": PACKAGE / "applier" / "applier.py"}
UNIT = "topokeeper-agent"
APPLIER_TIMEOUT_SECONDS = CHANNEL_TIMEOUT_SECONDS
# systemd stops a cycle that outlives the applier's bound, its SIGTERM grace and the requests around it.
CYCLE_TIMEOUT_SECONDS = int(APPLIER_TIMEOUT_SECONDS + TERMINATE_GRACE_SECONDS) + 120
HEREDOC_END = "TOPOKEEPER_EOF"
TRUSTED_KEY_FILE = "bundle-key.json"

# Every value baked into the snippet matches one of these in full (fullmatch: ``$`` would let a trailing
# newline through, which ends a comment line), so none can carry shell syntax or a line break.
_SEGMENT = r"(?!\.\.?(?:/|$))[A-Za-z0-9._-]+"  # no "." or "..": a prefix names keys under itself only
_VALID = {
    "cluster": (re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"), "HyperPod cluster name"),
    "bucket": (re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"), "S3 bucket name"),
    "region": (re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+"), "AWS region"),
    "prefix": (re.compile(rf"({_SEGMENT}(/{_SEGMENT})*)?"), "S3 key prefix"),
    "event_bus": (re.compile(r"[A-Za-z0-9._/:-]{1,1600}"), "event bus name or ARN"),
}


@dataclass(frozen=True)
class AgentSettings:
    cluster: str
    bucket: str
    region: str
    prefix: str = DEFAULT_PREFIX
    mode: str = "enforce"
    event_bus: str = "default"
    poll_seconds: int = 60
    verify_seconds: int = 900
    trusted_key: dict[str, str] | None = None  # the stack's public key (service.signing.trusted_key_document)

    def __post_init__(self) -> None:
        for name, (pattern, what) in _VALID.items():
            value = getattr(self, name)
            if not pattern.fullmatch(value):
                raise InputError(f"--{name.replace('_', '-')}", f"not a valid {what}: {value!r}")
        for name in ("poll_seconds", "verify_seconds"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')}", "must be at least 1")


def _agent_config(settings: AgentSettings) -> str:
    """The agent's config; ``${root}`` is expanded by the snippet's shell."""
    return json.dumps(
        {
            "cluster": settings.cluster,
            "bucket": settings.bucket,
            "prefix": settings.prefix,
            "mode": settings.mode,
            "region": settings.region,
            "event_bus": settings.event_bus,
            "poll_interval_seconds": settings.poll_seconds,
            "verify_interval_seconds": settings.verify_seconds,
            "applier_timeout_seconds": APPLIER_TIMEOUT_SECONDS,
            "applier": "${root}/opt/topokeeper/applier.py",
            "state_dir": "${root}/var/lib/topokeeper",
            **({"trusted_key": "${root}/etc/topokeeper/" + TRUSTED_KEY_FILE} if settings.trusted_key else {}),
        },
        indent=2,
    )


def _service_unit() -> str:
    return f"""[Unit]
Description=topokeeper pull agent: one cycle (poll the desired topology bundle, apply, verify, report)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
# HyperPod and ParallelCluster install Slurm in /opt/slurm; only login shells put it on PATH.
Environment=PATH=/opt/slurm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=/usr/bin/python3 ${{root}}/opt/topokeeper/agent.py --config ${{root}}/etc/topokeeper/agent.json --once
TimeoutStartSec={CYCLE_TIMEOUT_SECONDS}"""


def _timer_unit(settings: AgentSettings) -> str:
    return f"""[Unit]
Description=Run the topokeeper pull agent every {settings.poll_seconds} s

[Timer]
OnActiveSec=10s
OnUnitActiveSec={settings.poll_seconds}s
AccuracySec=1s

[Install]
WantedBy=timers.target"""


def _embedded_file(name: str, source: Path) -> str:
    content = source.read_bytes()
    encoded = base64.encodebytes(content).decode("ascii").rstrip("\n")
    return f"""base64 -d > "$dir/{name}.new" <<'{HEREDOC_END}'
{encoded}
{HEREDOC_END}
printf '%s  %s\\n' {hashlib.sha256(content).hexdigest()} "$dir/{name}.new" | sha256sum --check --quiet
chmod 0755 "$dir/{name}.new"
mv -f "$dir/{name}.new" "$dir/{name}\""""


def _embedded_trusted_key(document: dict[str, str]) -> str:
    """The public key bundles must be signed with: root's, 0600, checked against its sha256 like the code."""
    content = json.dumps(document, sort_keys=True).encode()
    encoded = base64.encodebytes(content).decode("ascii").rstrip("\n")
    target = f'"$root/etc/topokeeper/{TRUSTED_KEY_FILE}'
    return f"""base64 -d > {target}.new" <<'{HEREDOC_END}'
{encoded}
{HEREDOC_END}
printf '%s  %s\\n' {hashlib.sha256(content).hexdigest()} {target}.new" | sha256sum --check --quiet
chmod 0600 {target}.new"
mv -f {target}.new" {target}\""""


def render_install_script(settings: AgentSettings) -> str:
    files = "\n".join(_embedded_file(name, source) for name, source in SHIPPED_FILES.items())
    if settings.trusted_key is not None:
        files += "\n" + _embedded_trusted_key(settings.trusted_key)
    key = object_key(settings.prefix, settings.cluster, settings.mode)
    return f"""# --- topokeeper head-node agent: generated by `topokeeper agent install-script`, do not edit ---
# Run on the Slurm controller node only, e.g. from the controller branch of HyperPod's lifecycle scripts.
# Installs agent.py and applier.py in /opt/topokeeper, the config in /etc/topokeeper/agent.json, and
# enables {UNIT}.timer, which polls s3://{settings.bucket}/{key} every {settings.poll_seconds} s.
# The instance role needs s3:GetObject on that object and events:PutEvents on the event bus {settings.event_bus}.
# TOPOKEEPER_ROOT=DIR installs under DIR instead of /; TOPOKEEPER_SKIP_SYSTEMCTL=1 leaves systemd alone.
(
set -euo pipefail
umask 022
root="${{TOPOKEEPER_ROOT:-}}"
case "$root" in
  *[!A-Za-z0-9._/-]*) echo "topokeeper: TOPOKEEPER_ROOT must be a plain path" >&2; exit 1 ;;
esac
dir="$root/opt/topokeeper"
install -d -m 0755 "$dir" "$root/etc/topokeeper" "$root/etc/systemd/system"
install -d -m 0700 "$root/var/lib/topokeeper"
{files}
cat > "$root/etc/topokeeper/agent.json" <<{HEREDOC_END}
{_agent_config(settings)}
{HEREDOC_END}
cat > "$root/etc/systemd/system/{UNIT}.service" <<{HEREDOC_END}
{_service_unit()}
{HEREDOC_END}
cat > "$root/etc/systemd/system/{UNIT}.timer" <<{HEREDOC_END}
{_timer_unit(settings)}
{HEREDOC_END}
if [ "${{TOPOKEEPER_SKIP_SYSTEMCTL:-}}" != 1 ]; then
  systemctl daemon-reload
  systemctl enable --now {UNIT}.timer
fi
echo "topokeeper: agent installed in $dir"
)
"""


def _mode(args: argparse.Namespace) -> str:
    """The agent must poll the file the cluster's mode writes: bundle.json (enforce) or verify.json (verify)."""
    if args.mode is not None:
        return str(args.mode)
    if args.deployment is None:
        raise InputError(
            "--mode",
            "required without --deployment: pass the cluster's mode (--mode verify, the HyperPod default, or "
            "--mode enforce), or --deployment FILE to read it",
        )
    cluster = read_deployment(args.deployment).settings.cluster(args.cluster)
    if cluster is None:
        raise InputError("--cluster", f"{args.cluster} is not in the deployment {args.deployment}")
    return cluster.effective_mode.value


def _trusted_key(args: argparse.Namespace) -> dict[str, str] | None:
    """The stack's public key (KMS GetPublicKey with the operator's credentials), for ``--signing-key`` or the
    deployment's; None installs an agent that checks no signature."""
    key_id = args.signing_key
    if key_id is None and args.deployment is not None:
        key_id = read_deployment(args.deployment).signing_key_id
    if key_id is None:
        return None
    with aws_setup_errors():
        return trusted_key_document(args.cluster, KmsBundleSigner(client("kms", args.region), key_id))


def _cmd_install_script(args: argparse.Namespace) -> int:
    settings = AgentSettings(
        cluster=args.cluster,
        bucket=args.bucket,
        region=args.region,
        prefix=args.prefix.strip("/"),
        mode=_mode(args),
        event_bus=args.event_bus,
        poll_seconds=args.poll_seconds,
        verify_seconds=args.verify_seconds,
        trusted_key=_trusted_key(args),
    )
    print(render_install_script(settings), end="")
    return 0


def add_agent_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``topokeeper agent install-script``."""
    agent = commands.add_parser("agent", help="the head-node pull agent (HyperPod)")
    agent_commands = agent.add_subparsers(dest="agent_command", required=True)
    script = agent_commands.add_parser(
        "install-script", help="print the lifecycle-script snippet that installs the agent on the controller"
    )
    script.add_argument("--cluster", required=True, help="cluster name: the bundle is PREFIX/CLUSTER/bundle.json")
    script.add_argument("--bucket", required=True, help="bucket holding the desired bundles")
    script.add_argument("--region", required=True, help="region of the bucket and the event bus")
    script.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"key prefix (default: {DEFAULT_PREFIX})")
    script.add_argument(
        "--mode",
        choices=MODES,
        help="enforce: apply bundle.json; verify: only verify against verify.json (default: the cluster's mode "
        "in --deployment; one of the two is required)",
    )
    script.add_argument("--deployment", type=Path, help="deployment JSON file to read the cluster's mode from")
    script.add_argument("--event-bus", default="default", help="event bus name or ARN (default: default)")
    script.add_argument(
        "--signing-key",
        metavar="KEY_ARN",
        help="the stack's bundle-signing KMS key (output SigningKeyArn; default: the --deployment's): its public "
        "key is installed and the agent applies only bundles it signed",
    )
    script.add_argument("--poll-seconds", type=int, default=60, help="how often to poll S3 (default: 60)")
    script.add_argument("--verify-seconds", type=int, default=900, help="how often to verify (default: 900)")
    script.set_defaults(run=_cmd_install_script)
