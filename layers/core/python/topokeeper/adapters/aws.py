"""boto3 clients: one place that sets retries, timeouts and the user agent."""

from __future__ import annotations

from functools import cache
from typing import Any

import boto3
from botocore.config import Config

# Adaptive retries back off on throttling (DescribeInstanceTopology's bucket is 1 call per second).
CLIENT_CONFIG = Config(
    retries={"mode": "adaptive", "max_attempts": 8},
    connect_timeout=5,
    read_timeout=30,
    user_agent_extra="topokeeper/0.1",
)


@cache
def client(service: str, region: str | None = None) -> Any:
    """A cached client per service and region (boto3 honours AWS_ENDPOINT_URL for emulators)."""
    return boto3.session.Session().client(service, region_name=region, config=CLIENT_CONFIG)
