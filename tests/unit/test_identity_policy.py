"""The emulator's identity-policy check (sim/aws/identity_policy.py): IAM's rules for the statements it understands,
and an error for any it does not, so an emulator test never passes on a condition it silently ignored."""

from __future__ import annotations

import pytest

from topokeeper.sim.aws.identity_policy import allows

INSTANCE = "arn:aws:ec2:us-east-1:123456789012:instance/i-0123456789abcdef0"
TAGGED = {
    "Effect": "Allow",
    "Action": "ssm:SendCommand",
    "Resource": "arn:aws:ec2:us-east-1:123456789012:instance/*",
    "Condition": {"StringEquals": {"ssm:resourceTag/topokeeper:login": ["cfd"]}},
}


def test_a_tag_condition_admits_only_the_tagged_value() -> None:
    assert allows([TAGGED], "ssm:SendCommand", INSTANCE, {"topokeeper:login": "cfd"})
    assert not allows([TAGGED], "ssm:SendCommand", INSTANCE, {"topokeeper:login": "cfd2"})
    assert not allows([TAGGED], "ssm:SendCommand", INSTANCE, {})  # a missing tag fails the condition
    assert not allows(
        [TAGGED], "ssm:SendCommand", INSTANCE.replace("us-east-1", "us-west-2"), {"topokeeper:login": "cfd"}
    )
    assert not allows([TAGGED], "ssm:StartSession", INSTANCE, {"topokeeper:login": "cfd"})


def test_a_matching_deny_wins_and_wildcards_match_as_iam_does() -> None:
    deny = {"Effect": "Deny", "Action": "ssm:*", "Resource": "arn:aws:ec2:*:*:instance/i-0123456789abcdef?"}
    assert not allows([TAGGED, deny], "ssm:SendCommand", INSTANCE, {"topokeeper:login": "cfd"})
    assert allows([TAGGED, deny], "SSM:SendCommand", INSTANCE[:-1] + "10", {"topokeeper:login": "cfd"})


@pytest.mark.parametrize(
    "condition",
    [{"StringNotEquals": {"ssm:resourceTag/k": "v"}}, {"StringEquals": {"aws:PrincipalArn": "arn:aws:iam::1:role/r"}}],
)
def test_a_condition_the_emulator_cannot_evaluate_is_an_error(condition: dict[str, dict[str, str]]) -> None:
    with pytest.raises(ValueError, match="does not evaluate"):
        allows([{**TAGGED, "Condition": condition}], "ssm:SendCommand", INSTANCE, {"k": "v"})
