"""``topokeeper login rotate-host-keys`` and ``topokeeper login install-script``."""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from topokeeper.cli.options import add_endpoint_option
from topokeeper.contract.constants import login_secret_names
from topokeeper.contract.errors import InputError

# boto3, pydantic and the key generator load where a command runs, not for --help.

_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
_KMS_KEY = re.compile(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[\w/-]{1,256}")


def _cmd_rotate(args: argparse.Namespace) -> int:
    from topokeeper.adapters.aws import client  # noqa: PLC0415
    from topokeeper.adapters.secrets import SecretStore, deny_readers_policy, readers_only_policy  # noqa: PLC0415
    from topokeeper.login.host_keys import check_names, generate  # noqa: PLC0415

    check_names(args.cluster, args.name)
    if not _ROLE_ARN.fullmatch(args.login_role_arn):
        raise InputError("--login-role-arn", f"not an IAM role ARN: {args.login_role_arn!r}")
    if not _KMS_KEY.fullmatch(args.kms_key_id):
        raise InputError("--kms-key-id", f"not a KMS key or alias ARN: {args.kms_key_id!r}")
    store = SecretStore(client("secretsmanager"))
    bundle_name, ca_name = login_secret_names(args.cluster)
    ca_key = None if args.plain else store.read(ca_name)
    identity = generate(
        args.cluster, args.name, certificate=not args.plain, ca_private_key=ca_key, validity_days=args.validity_days
    )
    if identity.ca_private_key is not None and ca_key is None:
        store.write(
            ca_name,
            identity.ca_private_key,
            kms_key_id=args.kms_key_id,
            policy=deny_readers_policy([args.login_role_arn]),
            description=f"topokeeper: SSH CA that signs {args.cluster}'s login host certificates",
        )
    arn = store.write(
        bundle_name,
        identity.bundle,
        kms_key_id=args.kms_key_id,
        policy=readers_only_policy([args.login_role_arn]),
        description=f"topokeeper: host identity of {args.cluster}'s login nodes",
    )
    print(f"host identity: {arn}")
    print("run `topokeeper login install-script` on every login node (lifecycle script), then give users:")
    print(identity.known_hosts_line)
    return 0


def _cmd_install_script(args: argparse.Namespace) -> int:
    from topokeeper.login.install import install_script  # noqa: PLC0415

    print(install_script(args.secret_arn, args.secret_region), end="")
    return 0


def _cmd_install_run_command(args: argparse.Namespace) -> int:
    """EC2 login nodes (plain-EC2 Slurm): the installer through Run Command to the running instances with the tag."""
    from pydantic import TypeAdapter, ValidationError  # noqa: PLC0415

    from topokeeper.adapters.aws import client  # noqa: PLC0415
    from topokeeper.adapters.login_run_command import RunCommandInstaller, tagged_login_instances  # noqa: PLC0415
    from topokeeper.contract.config import TagKey  # noqa: PLC0415
    from topokeeper.login.install import install_script  # noqa: PLC0415

    key, _, value = args.tag.partition("=")
    try:
        TypeAdapter(TagKey).validate_python(key)
    except ValidationError:
        raise InputError("--tag", f"expected KEY=VALUE with an EC2 tag key: {args.tag!r}") from None
    if not value or len(value) > 256:
        raise InputError("--tag", f"expected KEY=VALUE with a value of 1 to 256 characters: {args.tag!r}")
    if set(value) & {"*", "?"}:  # EC2 filter wildcards: "*" would reach every instance with the tag key
        raise InputError("--tag", f"the value may not contain * or ? (EC2 filter wildcards): {args.tag!r}")
    script = install_script(args.secret_arn, args.secret_region)
    instances = tagged_login_instances(client("ec2"), key, value)
    if not instances:
        print(f"no running instance has the tag {key}={value}: nothing sent")
        return 0
    installer = RunCommandInstaller(client("ssm"), time.sleep)
    command_ids = installer.send(instances, script, args.cluster)
    print(f"sent to {len(instances)} login node(s): {', '.join(command_ids)}")
    if args.no_wait:
        return 0
    statuses = installer.wait(command_ids, len(instances))
    for instance_id in instances:
        print(f"{instance_id}: {statuses.get(instance_id, 'no answer')}")
    return 0 if all(statuses.get(i) == "Success" for i in instances) else 1


def register(commands: Any) -> None:
    login = commands.add_parser("login", help="the login endpoint's single SSH host identity")
    actions = login.add_subparsers(dest="login_command", required=True)
    rotate = actions.add_parser("rotate-host-keys", help="new host keys (CA-signed by default) in Secrets Manager")
    rotate.add_argument("--cluster", required=True)
    rotate.add_argument("--name", action="append", default=[], help="host name users connect to (repeatable)")
    rotate.add_argument("--login-role-arn", required=True, help="the login instance group's execution role")
    rotate.add_argument("--kms-key-id", required=True, help="the stack's KMS key ARN")
    rotate.add_argument("--plain", action="store_true", help="shared host keys without a CA")
    rotate.add_argument("--validity-days", type=int, default=365, help="host certificate validity (default 365)")
    rotate.set_defaults(run=_cmd_rotate)
    add_endpoint_option(rotate, argparse.SUPPRESS)  # also after the subcommand
    script = actions.add_parser("install-script", help="print the login-node installer (lifecycle-script snippet)")
    script.add_argument("--secret-arn", required=True, help="the ARN rotate-host-keys printed")
    script.add_argument("--secret-region", required=True, help="the secret's region")
    script.set_defaults(run=_cmd_install_script)
    run = actions.add_parser(
        "install-run-command",
        help="install the host identity on EC2 login nodes (by tag) through SSM Run Command",
    )
    run.add_argument("--cluster", required=True)
    run.add_argument("--tag", required=True, help="KEY=VALUE: the tag only the cluster's login nodes carry")
    run.add_argument("--secret-arn", required=True, help="the ARN rotate-host-keys printed")
    run.add_argument("--secret-region", required=True, help="the secret's region")
    run.add_argument("--no-wait", action="store_true", help="send and return; do not wait for the results")
    run.set_defaults(run=_cmd_install_run_command)
    add_endpoint_option(run, argparse.SUPPRESS)
