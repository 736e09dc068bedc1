"""Access errors are permanent however AWS spells them; throttling and outages stay retryable."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from topokeeper.adapters.ec2 import instance_tags
from topokeeper.errors import Permanent, Retryable

INSTANCE = "i-0123456789abcdef0"


def _ec2() -> Any:
    return botocore.session.get_session().create_client(
        "ec2",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - a dummy credential; the Stubber answers every call
        config=Config(retries={"total_max_attempts": 1}),
    )


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("UnauthorizedOperation", Permanent),
        ("AuthFailure", Permanent),
        ("OptInRequired", Permanent),
        ("AccessDenied", Permanent),
        ("AccessDeniedException", Permanent),
        ("UnauthorizedAccess", Permanent),
        ("RequestLimitExceeded", Retryable),
        ("InternalError", Retryable),
        ("Unavailable", Retryable),
    ],
)
def test_describe_instances_errors_keep_their_code_and_kind(code: str, kind: type[Exception]) -> None:
    ec2 = _ec2()
    with Stubber(ec2) as stubber:
        stubber.add_client_error("describe_instances", service_error_code=code, http_status_code=403)
        with pytest.raises(kind) as raised:
            instance_tags(ec2, INSTANCE)
    assert raised.value.code == code  # type: ignore[attr-defined]


def test_an_instance_describe_instances_does_not_know_yet_has_no_tags() -> None:
    ec2 = _ec2()
    with Stubber(ec2) as stubber:
        message = f"The instance ID '{INSTANCE}' does not exist"
        stubber.add_client_error(
            "describe_instances", service_error_code="InvalidInstanceID.NotFound", service_message=message
        )
        assert instance_tags(ec2, INSTANCE) == {}
