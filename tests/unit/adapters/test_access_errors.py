"""Access errors are permanent however AWS spells them; throttling and outages stay retryable."""

from __future__ import annotations

import pytest
from botocore.stub import Stubber

from tests.unit.adapters.topology_support import stubbed_ec2
from topokeeper.adapters.ec2 import instance_tags
from topokeeper.contract.errors import Permanent, Retryable

INSTANCE = "i-0123456789abcdef0"


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
    ec2 = stubbed_ec2()
    with Stubber(ec2) as stubber:
        stubber.add_client_error("describe_instances", service_error_code=code, http_status_code=403)
        with pytest.raises(kind) as raised:
            instance_tags(ec2, INSTANCE)
    assert raised.value.code == code  # type: ignore[attr-defined]


def test_an_instance_describe_instances_does_not_know_yet_has_no_tags() -> None:
    ec2 = stubbed_ec2()
    with Stubber(ec2) as stubber:
        message = f"The instance ID '{INSTANCE}' does not exist"
        stubber.add_client_error(
            "describe_instances", service_error_code="InvalidInstanceID.NotFound", service_message=message
        )
        assert instance_tags(ec2, INSTANCE) == {}
