"""An EC2 client for botocore's Stubber (which validates every request against the EC2 model; the dummy
credentials never leave the process), and a DescribeInstanceTopology answer for one instance."""

from __future__ import annotations

from typing import Any

import botocore.session
from botocore.config import Config


def stubbed_ec2() -> Any:
    return botocore.session.get_session().create_client(
        "ec2",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - a dummy credential; the Stubber answers every call
        config=Config(retries={"total_max_attempts": 1}),
    )


def topology_item(instance_id: str) -> dict[str, Any]:
    """A complete p5 answer, its leaf named after the instance."""
    return {
        "InstanceId": instance_id,
        "InstanceType": "p5.48xlarge",
        "NetworkNodes": ["nn-1", "nn-2", f"nn-{instance_id[-4:]}"],
        "AvailabilityZone": "us-east-1a",
        "ZoneId": "use1-az1",
    }
