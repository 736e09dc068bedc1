"""Every Deny statement of the stack's resource policies, enforced (topokeeper.sim.stack_iam): each refuses the
request it is there for (TLS only on the bucket and the queues, only SSE-KMS with the stack's key, no
customer-provided keys, only topokeeper's writers change objects), and with that one statement removed the same
request goes through, so the deny is what refuses it. A Deny with no bad request here fails the test.

The caller is a writer the bucket policy names whose identity policy allows every S3, SQS and KMS action: only a
resource policy can refuse it. Plain HTTP is ``AwsEmulator.client(..., use_ssl=False)``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.backend.conftest import small_scenario
from topokeeper.sim.world import World, running

Statement = dict[str, Any]
# (what it refuses, the ARN of the policy, which of its statements, the request, acting as the intruder)
Case = tuple[str, str, Callable[[Statement], bool], Callable[[World], Any], bool]
ANYTHING = [{"Effect": "Allow", "Action": ["s3:*", "sqs:*", "kms:*"], "Resource": "*"}]


def _tls_only(statement: Statement) -> bool:
    return statement.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}


def _sid(sid: str) -> Callable[[Statement], bool]:
    return lambda statement: statement.get("Sid") == sid


def _put(world: World, key: str, **options: Any) -> Any:
    bucket = world.stack.deployment.bucket
    return world.emulator.client("s3").put_object(Bucket=bucket, Key=key, Body=b"{}", **options)


def _another_key(world: World) -> str:
    """A second KMS key of the account (made by the harness, as any other stack's key would be)."""
    with world.emulator.iam.as_harness():
        return str(world.emulator.client("kms").create_key()["KeyMetadata"]["Arn"])


def _send_plain(url: str) -> Callable[[World], Any]:
    fifo = {"MessageGroupId": "g", "MessageDeduplicationId": "plain-1"} if url.endswith(".fifo") else {}
    return lambda world: world.emulator.client("sqs", use_ssl=False).send_message(
        QueueUrl=url, MessageBody="{}", **fifo
    )


def _cases(world: World) -> list[Case]:
    bucket = f"arn:aws:s3:::{world.stack.deployment.bucket}"
    plain_put: Callable[[World], Any] = lambda w: w.emulator.client("s3", use_ssl=False).put_object(  # noqa: E731
        Bucket=w.stack.deployment.bucket, Key="clusters/x/plain.json", Body=b"{}"
    )
    cases: list[Case] = [
        ("a request over plain HTTP", bucket, _tls_only, plain_put, False),
        ("a write by a role not named", bucket, _sid("OnlyTopokeeperChangesObjects"), lambda w: _put(w, "x"), True),
        (
            "SSE-S3 asked for",
            bucket,
            _sid("OnlySseKms"),
            lambda w: _put(w, "clusters/x/s3.json", ServerSideEncryption="AES256"),
            False,
        ),
        (
            "another KMS key asked for",
            bucket,
            _sid("OnlyTheStackKey"),
            lambda w: _put(w, "clusters/x/k.json", ServerSideEncryption="aws:kms", SSEKMSKeyId=_another_key(w)),
            False,
        ),
        (
            "a customer-provided key",
            bucket,
            _sid("NoCustomerProvidedKeys"),
            lambda w: _put(w, "clusters/x/c.json", SSECustomerAlgorithm="AES256", SSECustomerKey="k" * 32),
            False,
        ),
    ]
    for url in [world.stack.queue_url, *world.stack.dead_letter_urls.values()]:
        arn = f"arn:aws:sqs:{world.emulator.region}:{world.emulator.account_id}:{url.rsplit('/', 1)[-1]}"
        cases.append(("a request over plain HTTP", arn, _tls_only, _send_plain(url), False))
    return cases


def test_each_deny_refuses_its_bad_request_and_without_it_the_request_goes_through() -> None:
    with running(small_scenario(), head_node="file") as world:
        iam = world.emulator.iam
        writer = world.iam.function_roles["reconcile"]
        intruder = f"arn:aws:iam::{world.emulator.account_id}:role/intruder"
        iam.add_role(writer, ANYTHING)  # the same key: reconcile's role, its identity allowing everything
        iam.add_role(intruder, ANYTHING)
        covered: set[str] = set()
        for what, arn, which, request, as_intruder in _cases(world):
            policy = iam.resource_policies[arn]
            (deny,) = [s for s in policy if s["Effect"] == "Deny" and which(s)]
            covered.add(arn + json.dumps(deny, sort_keys=True))
            with iam.acting_as(intruder if as_intruder else writer):
                with pytest.raises(ClientError) as refused:
                    request(world)
                error = refused.value.response["Error"]
                assert error["Code"] == "AccessDenied", (what, error)
                assert error["Message"].endswith("with an explicit deny in a resource-based policy"), (what, error)
                iam.resource_policies[arn] = [s for s in policy if s is not deny]
                try:
                    request(world)  # the same request, that deny removed: through
                finally:
                    iam.resource_policies[arn] = policy

        denies = {
            arn + json.dumps(s, sort_keys=True)
            for arn, policy in [*iam.resource_policies.items(), *iam.key_policies.items()]
            for s in policy
            if s["Effect"] == "Deny"
        }
        assert denies == covered, f"Deny statements with no bad request here: {sorted(denies - covered)}"
