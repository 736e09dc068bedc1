"""The emulator's policy evaluation (sim/aws/policy.py): IAM's rules for the statements it understands, and an
error for any it does not, so an emulator test never passes on a condition it silently ignored. One test per rule."""

from __future__ import annotations

import pytest

from topokeeper.sim.aws.policy import Decision, Request, allows, decide

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
    [
        {"NumericLessThan": {"ssm:resourceTag/k": "1"}},
        {"StringEquals": {"aws:userid": "AROA"}},
        {"NullIfExists": {"aws:SourceArn": "true"}},
        {"ForAnyValue:StringEquals": {"aws:SourceArn": "x"}},
    ],
)
def test_a_condition_the_emulator_cannot_evaluate_is_an_error(condition: dict[str, dict[str, str]]) -> None:
    with pytest.raises(ValueError, match="does not evaluate"):
        allows([{**TAGGED, "Condition": condition}], "ssm:SendCommand", INSTANCE, {"k": "v"})


ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/reconcile"
OTHER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/ingest"
BUCKET_ARN = "arn:aws:s3:::plans"
OBJECT = f"{BUCKET_ARN}/clusters/a/bundle.json"
KEY = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234"
ROOT = {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}


def request(action: str, resource: str, principal: str = ROLE, **context: str) -> Request:
    return Request(principal, action, resource, context, ACCOUNT)


def allow(action: str | list[str], resource: str | list[str] = "*", **extra: object) -> dict[str, object]:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def test_an_explicit_deny_in_a_resource_policy_beats_an_identity_allow() -> None:
    only_writers = {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": ["s3:PutObject", "s3:DeleteObject"],
        "Resource": f"{BUCKET_ARN}/*",
        "Condition": {"ArnNotEquals": {"aws:PrincipalArn": [ROLE]}},
    }
    identity = [allow("s3:PutObject", f"{BUCKET_ARN}/*")]
    context = {"aws:PrincipalArn": OTHER_ROLE}
    refused = decide(request("s3:PutObject", OBJECT, OTHER_ROLE, **context), identity, [only_writers])
    assert refused == Decision(False, "with an explicit deny in a resource-based policy")
    assert decide(request("s3:PutObject", OBJECT, **{"aws:PrincipalArn": ROLE}), identity, [only_writers]).allowed


def test_same_account_identity_or_resource_allow_suffices_and_neither_refuses() -> None:
    by_bucket = {"Effect": "Allow", "Principal": {"AWS": ROLE}, "Action": "s3:GetObject", "Resource": f"{BUCKET_ARN}/*"}
    assert decide(request("s3:GetObject", OBJECT), [], [by_bucket]).allowed
    assert decide(request("s3:GetObject", OBJECT), [allow("s3:GetObject", f"{BUCKET_ARN}/*")], []).allowed
    neither = decide(request("s3:GetObject", OBJECT, OTHER_ROLE), [], [by_bucket])
    assert not neither.allowed
    assert neither.reason == "no identity-based policy allows the s3:GetObject action"
    # the account root in a resource policy delegates to IAM: it grants nothing by itself
    delegating = {**by_bucket, "Principal": ROOT}
    assert not decide(request("s3:GetObject", OBJECT), [], [delegating]).allowed


def test_a_key_policy_must_allow_directly_or_by_delegating_to_iam() -> None:
    root = {"Effect": "Allow", "Principal": ROOT, "Action": "kms:*", "Resource": "*"}
    identity = [allow("kms:Decrypt", KEY, Condition={"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}})]
    via_s3 = request("kms:Decrypt", KEY, **{"kms:ViaService": "s3.us-east-1.amazonaws.com"})
    assert decide(via_s3, identity, [root], key_policy=True).allowed
    assert not decide(request("kms:Decrypt", KEY), identity, [root], key_policy=True).allowed  # not through S3
    no_root = decide(via_s3, identity, [], key_policy=True)
    assert not no_root.allowed
    assert no_root.reason == "no resource-based policy allows the kms:Decrypt action"
    service = {
        "Effect": "Allow",
        "Principal": {"Service": "events.amazonaws.com"},
        "Action": ["kms:GenerateDataKey"],
        "Resource": "*",
        "Condition": {"StringEquals": {"aws:SourceAccount": ACCOUNT}},
    }
    events = Request("events.amazonaws.com", "kms:GenerateDataKey", KEY, {"aws:SourceAccount": ACCOUNT})
    assert decide(events, [], [root, service], key_policy=True).allowed
    assert not decide(
        Request("events.amazonaws.com", "kms:GenerateDataKey", KEY, {"aws:SourceAccount": "1"}),
        [],
        [root, service],
        key_policy=True,
    ).allowed


def test_not_action_and_not_resource_match_everything_else() -> None:
    statement = {"Effect": "Allow", "NotAction": "s3:Delete*", "NotResource": f"{BUCKET_ARN}/secret/*"}
    assert decide(request("s3:GetObject", OBJECT), [statement]).allowed
    assert not decide(request("s3:DeleteObject", OBJECT), [statement]).allowed
    assert not decide(request("s3:GetObject", f"{BUCKET_ARN}/secret/x"), [statement]).allowed


@pytest.mark.parametrize(
    ("operator", "value", "context", "holds"),
    [
        ("StringEquals", "topokeeper", {"events:source": "topokeeper"}, True),
        ("StringEquals", "topokeeper", {"events:source": "topokeeper.agent"}, False),
        ("StringEquals", "topokeeper", {}, False),  # an absent key fails a positive operator
        ("StringLike", "topokeeper.*", {"events:source": "topokeeper.agent"}, True),
        ("StringNotEquals", "aws:kms", {}, True),  # ... and satisfies a negated one
        ("StringNotEqualsIfExists", "aws:kms", {"s3:x-amz-server-side-encryption": "AES256"}, True),
        ("StringNotEqualsIfExists", "aws:kms", {"s3:x-amz-server-side-encryption": "aws:kms"}, False),
        ("StringNotEqualsIfExists", "aws:kms", {}, True),  # ...IfExists: an absent key satisfies it
        ("StringEqualsIfExists", "aws:kms", {}, True),
        ("StringEqualsIgnoreCase", "AWS:KMS", {"s3:x-amz-server-side-encryption": "aws:kms"}, True),
        ("ArnLike", "arn:aws:cloudwatch:*:1:alarm:*", {"aws:SourceArn": "arn:aws:cloudwatch:r:1:alarm:a"}, True),
        ("ArnEquals", "arn:aws:events:r:1:rule/a", {"aws:SourceArn": "arn:aws:events:r:1:rule/b"}, False),
        ("ArnNotLike", "arn:aws:events:*", {"aws:SourceArn": "arn:aws:events:r:1:rule/b"}, False),
        ("Bool", "false", {"aws:SecureTransport": "false"}, True),
        ("Bool", "false", {"aws:SecureTransport": "true"}, False),
        ("Null", "false", {"s3:x-amz-server-side-encryption-customer-algorithm": "AES256"}, True),
        ("Null", "false", {}, False),
        ("Null", "true", {}, True),
    ],
)
def test_each_condition_operator_the_stack_uses(
    operator: str, value: str, context: dict[str, str], holds: bool
) -> None:
    key = (
        next(iter(context), None)
        or {
            "StringEquals": "events:source",
            "StringNotEquals": "s3:x-amz-server-side-encryption",
            "StringNotEqualsIfExists": "s3:x-amz-server-side-encryption",
            "StringEqualsIfExists": "s3:x-amz-server-side-encryption",
            "Null": "s3:x-amz-server-side-encryption-customer-algorithm",
        }[operator]
    )
    statement = allow("events:PutEvents", Condition={operator: {key: value}})
    assert (
        decide(request("events:PutEvents", "arn:aws:events:r:1:event-bus/default", **context), [statement]).allowed
        is holds
    )


def test_values_of_one_key_are_alternatives_and_keys_must_all_hold() -> None:
    statement = allow(
        "s3:GetObject",
        Condition={"StringEquals": {"events:source": ["a", "b"], "s3:ResourceAccount": ACCOUNT}},
    )
    assert decide(
        request("s3:GetObject", OBJECT, **{"events:source": "b", "s3:ResourceAccount": ACCOUNT}), [statement]
    ).allowed
    assert not decide(
        request("s3:GetObject", OBJECT, **{"events:source": "b", "s3:ResourceAccount": "1"}), [statement]
    ).allowed
