"""Options every command that reaches AWS takes."""

from __future__ import annotations

import argparse
import os
from typing import Any


def add_endpoint_option(parser: argparse.ArgumentParser, default: Any = None) -> None:
    parser.add_argument("--endpoint-url", default=default, help="AWS endpoint (an emulator); sets AWS_ENDPOINT_URL")
    parser.add_argument("--region", default=default, help="AWS region (default: the AWS configuration's)")


def apply_endpoint_option(args: argparse.Namespace) -> None:
    """Must run before the first client is made: boto3 reads these at client creation."""
    if getattr(args, "endpoint_url", None):
        os.environ["AWS_ENDPOINT_URL"] = args.endpoint_url
    if getattr(args, "region", None):  # over both variables, which the clients read in this order
        os.environ["AWS_REGION"] = os.environ["AWS_DEFAULT_REGION"] = args.region
