"""``topokeeper login rotate-host-keys`` and ``topokeeper login install-script``."""

from __future__ import annotations

import argparse
import re
from typing import Any

import boto3

from topokeeper.adapters.secrets import SecretStore, deny_readers_policy, readers_only_policy
from topokeeper.errors import InputError
from topokeeper.login.host_keys import check_names, generate, secret_names
from topokeeper.login.install import install_script

_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
_KMS_KEY = re.compile(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[\w/-]{1,256}")


def _cmd_rotate(args: argparse.Namespace) -> int:
    check_names(args.cluster, args.name)
    if not _ROLE_ARN.fullmatch(args.login_role_arn):
        raise InputError("--login-role-arn", f"not an IAM role ARN: {args.login_role_arn!r}")
    if not _KMS_KEY.fullmatch(args.kms_key_id):
        raise InputError("--kms-key-id", f"not a KMS key or alias ARN: {args.kms_key_id!r}")
    store = SecretStore(boto3.client("secretsmanager"))
    bundle_name, ca_name = secret_names(args.cluster)
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
    print(install_script(args.secret_arn, args.secret_region), end="")
    return 0


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
    script = actions.add_parser("install-script", help="print the login-node installer (lifecycle-script snippet)")
    script.add_argument("--secret-arn", required=True, help="the ARN rotate-host-keys printed")
    script.add_argument("--secret-region", required=True, help="the secret's region")
    script.set_defaults(run=_cmd_install_script)
