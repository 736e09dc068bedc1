"""``topokeeper agent install-script``: the lifecycle-script snippet that installs the pull agent on a
HyperPod controller node.

Two choices, and why:

- The snippet embeds the head-node program, topokeeper-head-node.pyz (the agent and the applier in one
  file, base64, checked against its sha256 on the node), rather than fetching it from S3. It is built from
  this package's own files when printed, so it cannot drift from the CLI that printed it; the node needs no
  read access to code and no aws CLI; the whole install is one reviewable file.
- A systemd timer starts ``topokeeper-head-node.pyz agent --once`` as a oneshot service, rather than a
  service with its own loop. Every cycle starts from the state file, so a restart is the normal path and not
  a special one; systemd never starts a cycle while the last one runs and stops one that outlives
  TimeoutStartSec; nothing long-lived can leak or wedge. The price is one interpreter start and one IMDS
  credential fetch per poll, both local and cheap.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from topokeeper.contract.errors import InputError
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes
from topokeeper.wire import (
    AGENT_KEY_PREFIX,
    AGENT_MODES,
    CHANNEL_TIMEOUT_SECONDS,
    TERMINATE_GRACE_SECONDS,
    AgentConfig,
    AgentConfigError,
    agent_config_document,
    agent_config_from_document,
)

UNIT = "topokeeper-agent"
# systemd stops a cycle that outlives the applier's bound, its SIGTERM grace and the requests around it.
CYCLE_TIMEOUT_SECONDS = int(CHANNEL_TIMEOUT_SECONDS + TERMINATE_GRACE_SECONDS) + 120
HEREDOC_END = "TOPOKEEPER_EOF"
DEFAULT_PLACEMENT_SECONDS = 900  # a cron drift schedule has no period: the default rate's
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


# The timer's intervals, by config key and the flag that sets them: a timer needs at least a second.
_INTERVAL_FLAGS = {"poll_interval_seconds": "--poll-seconds", "verify_interval_seconds": "--verify-seconds"}


def install_config(values: dict[str, Any], *, trusted_key: bool) -> AgentConfig:
    """The agent's config (``topokeeper.wire.AgentConfig``, the schema the agent reads) for the command's
    ``values`` by config key, installed under ``${root}``, which the snippet's shell expands. Each value is
    checked by the stricter rules for text written into a shell script first, naming its flag."""
    for name, (pattern, what) in _VALID.items():
        value = values[name]
        if not pattern.fullmatch(value):
            raise InputError(f"--{name.replace('_', '-')}", f"not a valid {what}: {value!r}")
    for name, flag in _INTERVAL_FLAGS.items():
        if values[name] < 1:
            raise InputError(flag, "must be at least 1")
    document = {
        **values,
        "applier_timeout_seconds": CHANNEL_TIMEOUT_SECONDS,
        "applier": "${root}/opt/topokeeper/" + PROGRAM_NAME,
        "state_dir": "${root}/var/lib/topokeeper",
        **({"trusted_key": "${root}/etc/topokeeper/" + TRUSTED_KEY_FILE} if trusted_key else {}),
    }
    try:
        return agent_config_from_document(document)
    except AgentConfigError as error:
        raise InputError("agent config", str(error)) from error


def _service_unit() -> str:
    program = f"${{root}}/opt/topokeeper/{PROGRAM_NAME}"
    return f"""[Unit]
Description=topokeeper pull agent: one cycle (poll the desired topology bundle, apply, verify, report)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
# HyperPod and ParallelCluster install Slurm in /opt/slurm; only login shells put it on PATH.
Environment=PATH=/opt/slurm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=/usr/bin/python3 {program} agent --config ${{root}}/etc/topokeeper/agent.json --once
TimeoutStartSec={CYCLE_TIMEOUT_SECONDS}"""


def _timer_unit(config: AgentConfig) -> str:
    return f"""[Unit]
Description=Run the topokeeper pull agent every {config.poll_interval_seconds:g} s

[Timer]
OnActiveSec=10s
OnUnitActiveSec={config.poll_interval_seconds:g}s
AccuracySec=1s

[Install]
WantedBy=timers.target"""


def _embedded_file(name: str, content: bytes) -> str:
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


def render_install_script(config: AgentConfig, trusted_key: dict[str, str] | None) -> str:
    """The snippet; with ``trusted_key`` (the stack's public key, service.signing.trusted_key_document) it
    installs the key ``config.trusted_key`` names."""
    files = _embedded_file(PROGRAM_NAME, program_bytes())
    if trusted_key is not None:
        files += "\n" + _embedded_trusted_key(trusted_key)
    return f"""# --- topokeeper head-node agent: generated by `topokeeper agent install-script`, do not edit ---
# Run on the Slurm controller node only, e.g. from the controller branch of HyperPod's lifecycle scripts.
# Installs {PROGRAM_NAME} (the agent and the applier) in /opt/topokeeper, the config in
# /etc/topokeeper/agent.json, and enables {UNIT}.timer, which polls
# s3://{config.bucket}/{config.key} every {config.poll_interval_seconds:g} s.
# The instance role needs s3:GetObject on that object and events:PutEvents on the event bus {config.event_bus}.
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
rm -f "$dir/agent.py" "$dir/applier.py"  # the files of earlier installs: the units no longer name them
cat > "$root/etc/topokeeper/agent.json" <<{HEREDOC_END}
{json.dumps(agent_config_document(config), indent=2)}
{HEREDOC_END}
cat > "$root/etc/systemd/system/{UNIT}.service" <<{HEREDOC_END}
{_service_unit()}
{HEREDOC_END}
cat > "$root/etc/systemd/system/{UNIT}.timer" <<{HEREDOC_END}
{_timer_unit(config)}
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
    from topokeeper.contract.deployment import read_deployment  # noqa: PLC0415 (pydantic: not for --help)

    cluster = read_deployment(args.deployment).settings.cluster(args.cluster)
    if cluster is None:
        raise InputError("--cluster", f"{args.cluster} is not in the deployment {args.deployment}")
    return cluster.effective_mode.value


def _placement_seconds(args: argparse.Namespace) -> int:
    """How often the agent puts placement facts: the flag's, else each drift period (at most half the age at which
    the backend calls them stale) when --deployment's cluster has placement_metrics, else never (0)."""
    if args.placement_seconds is not None:
        if args.placement_seconds < 0:
            raise InputError("--placement-seconds", "must be 0 (never) or more")
        return int(args.placement_seconds)
    if args.deployment is None:
        return 0
    from topokeeper.contract.deployment import read_deployment  # noqa: PLC0415 (pydantic: not for --help)
    from topokeeper.contract.stack_spec import schedule_rate_seconds  # noqa: PLC0415

    settings = read_deployment(args.deployment).settings
    cluster = settings.cluster(args.cluster)
    if cluster is None or not cluster.placement_metrics:
        return 0
    period = schedule_rate_seconds(settings.drift_schedule) or DEFAULT_PLACEMENT_SECONDS
    return min(period, settings.agent_verify_max_age_seconds // 2)


def _trusted_key(args: argparse.Namespace) -> dict[str, str] | None:
    """The stack's public key (KMS GetPublicKey with the operator's credentials), for ``--signing-key`` or the
    deployment's; None installs an agent that checks no signature."""
    from topokeeper.adapters.aws import aws_setup_errors, client  # noqa: PLC0415 (boto3: not for --help)
    from topokeeper.adapters.kms import KmsBundleSigner  # noqa: PLC0415
    from topokeeper.contract.deployment import read_deployment  # noqa: PLC0415
    from topokeeper.service.signing import trusted_key_document  # noqa: PLC0415

    key_id = args.signing_key
    if key_id is None and args.deployment is not None:
        key_id = read_deployment(args.deployment).signing_key_id
    if key_id is None:
        return None
    with aws_setup_errors():
        return trusted_key_document(args.cluster, KmsBundleSigner(client("kms", args.region), key_id))


def _cmd_install_script(args: argparse.Namespace) -> int:
    values = {
        "cluster": args.cluster,
        "bucket": args.bucket,
        "region": args.region,
        "prefix": args.prefix.strip("/"),
        "mode": _mode(args),
        "event_bus": args.event_bus,
        "poll_interval_seconds": args.poll_seconds,
        "verify_interval_seconds": args.verify_seconds,
        "placement_facts_interval_seconds": _placement_seconds(args),
    }
    trusted_key = _trusted_key(args)
    if trusted_key is None and values["mode"] == "enforce" and not args.unsigned:
        raise InputError(
            "--signing-key",
            "an enforce-mode agent applies what it fetches: pass --signing-key (the stack's SigningKeyArn output) "
            "or --deployment FILE so it applies only bundles the stack signed, or --unsigned to accept any",
        )
    config = install_config(values, trusted_key=trusted_key is not None)
    print(render_install_script(config, trusted_key), end="")
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
    script.add_argument("--prefix", default=AGENT_KEY_PREFIX, help=f"key prefix (default: {AGENT_KEY_PREFIX})")
    script.add_argument(
        "--mode",
        choices=AGENT_MODES,
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
    script.add_argument(
        "--unsigned",
        action="store_true",
        help="install an enforce-mode agent without a signing key: it applies bundles nobody signed (tests)",
    )
    script.add_argument("--poll-seconds", type=int, default=60, help="how often to poll S3 (default: 60)")
    script.add_argument("--verify-seconds", type=int, default=900, help="how often to verify (default: 900)")
    script.add_argument(
        "--placement-seconds",
        type=int,
        help="how often to put the placement facts the drift check and `topokeeper placement --cluster` read; 0: "
        "never (default: each drift period if the --deployment's cluster has placement_metrics, else 0)",
    )
    script.set_defaults(run=_cmd_install_script)
