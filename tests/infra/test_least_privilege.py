"""Least privilege, read from the synthesized template: identity policies, the per-cluster agent policies and
the plan bucket's policy.

moto evaluates neither resource policies (the bucket policy) nor condition keys (events:source,
kms:ViaService, s3:ResourceAccount, aws:PrincipalArn), so what they deny cannot be shown by a call that
fails in the emulator. These are static checks of the statements CloudFormation will create; AWS's
policy evaluation is taken as documented.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from infra.agent import agent_policy_output
from infra.registration import registration_policy_output
from tests.infra.conftest import Synthesized, example_config, synthesize
from topokeeper.contract.constants import ENV_SIGNING_KEY
from topokeeper.wire import AGENT_SOURCE, agent_source

pytestmark = pytest.mark.infra

# The only actions an identity policy may grant on Resource "*" without a condition, each with AWS's reason.
UNSCOPED_ACTIONS = {
    "ec2:DescribeInstances": "EC2 Describe* actions support no resource-level permissions "
    "(Service Authorization Reference: no resource types)",
    "ec2:DescribeInstanceTopology": "no resource-level permissions (Service Authorization Reference: no resource "
    "types; the EC2 user guide's topology page grants it on *)",
    "ssm:GetCommandInvocation": "the Service Authorization Reference lists no resource types for it",
}
OPERATOR_ROLE = "arn:aws:iam::111122223333:role/TopokeeperOperator"
HYBRID_HEAD_NODE = "mi-0123456789abcdef0"


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """Two agent clusters (verify, and enforce with placement metrics), an EC2 and a hybrid (mi-) SSM head node, an
    operator role."""
    config = example_config()
    config["clusters"] += [
        {
            "name": "vision",
            "orchestrator": "hyperpod",
            "mode": "enforce",
            "channel": "agent",
            "placement_metrics": True,
        },
        {"name": "hp-hybrid", "orchestrator": "hyperpod", "channel": "ssm", "head_node": HYBRID_HEAD_NODE},
    ]
    config["operator_role_arn"] = OPERATOR_ROLE
    return synthesize(tmp_path_factory.mktemp("least-privilege"), config)


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def identity_statements(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every statement of every identity policy: inline, default and managed policies, and roles' inline
    policies. Resource policies (key, bucket, queue, topic) and trust policies are not identity policies."""
    for name, resource in template["Resources"].items():
        if not resource["Type"].startswith("AWS::IAM::"):
            continue
        properties = resource.get("Properties", {})
        documents = [properties["PolicyDocument"]] if "PolicyDocument" in properties else []
        documents += [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
        for document in documents:
            for statement in document["Statement"]:
                yield name, statement


def violations(template: dict[str, Any]) -> list[str]:
    found = []
    for name, statement in identity_statements(template):
        actions = listed(statement.get("Action", []))
        if "NotAction" in statement or "NotResource" in statement:
            found.append(f"{name}: NotAction/NotResource")
        found += [f"{name}: wildcard action {action}" for action in actions if "*" in action]
        unscoped = "*" in listed(statement.get("Resource", []))
        if unscoped and "Condition" not in statement and not set(actions) <= set(UNSCOPED_ACTIONS):
            found.append(f"{name}: {sorted(set(actions) - set(UNSCOPED_ACTIONS))} on every resource")
    return found


@pytest.mark.parametrize("which", ["example", "variant"])
def test_no_identity_statement_allows_a_wildcard_action_or_every_resource_unconditionally(
    which: str, request: pytest.FixtureRequest
) -> None:
    template = request.getfixturevalue(which).template.to_json()

    assert violations(template) == []
    assert len(list(identity_statements(template))) > 30  # the walk reached the policies
    unscoped = {
        action
        for _, statement in identity_statements(template)
        if "*" in listed(statement["Resource"])
        for action in listed(statement["Action"])
    }
    assert unscoped == set(UNSCOPED_ACTIONS)  # the allow-list holds nothing unused


def test_the_walk_finds_what_it_forbids() -> None:
    def policy(*statements: dict[str, Any]) -> dict[str, Any]:
        return {"Type": "AWS::IAM::Policy", "Properties": {"PolicyDocument": {"Statement": list(statements)}}}

    template = {
        "Resources": {
            "Star": policy({"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::b/*"}),
            "Open": policy(
                {"Effect": "Allow", "Action": ["ec2:DescribeInstances", "ec2:RunInstances"], "Resource": "*"}
            ),
            "Inline": {
                "Type": "AWS::IAM::Role",
                "Properties": {
                    "Policies": [{"PolicyDocument": {"Statement": [{"NotAction": "iam:*", "Resource": "*"}]}}]
                },
            },
            "Fine": policy(
                {"Effect": "Allow", "Action": "ec2:DescribeInstanceTopology", "Resource": "*"},
                {"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*", "Condition": {"StringEquals": {}}},
            ),
            "KeyPolicy": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Statement": [{"Action": "kms:*"}]}}},
        }
    }

    assert violations(template) == [
        "Star: wildcard action s3:*",
        "Open: ['ec2:RunInstances'] on every resource",
        "Inline: NotAction/NotResource",
    ]


def role_statements(synthesized: Synthesized, role: Any) -> list[dict[str, Any]]:
    attached = {"Ref": synthesized.logical_id(role)}
    return [
        statement
        for resource in synthesized.resources.values()
        if resource["Type"] == "AWS::IAM::Policy" and attached in resource["Properties"]["Roles"]
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
    ]


def partition_arn(*parts: Any) -> dict[str, Any]:
    return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, *parts]]}


SIGNING_ACTIONS = {"kms:Sign", "kms:GetPublicKey"}  # called directly: there is no service to go through


def test_every_kms_grant_goes_through_a_named_service(variant: Synthesized) -> None:
    kms = [
        (name, statement)
        for name, statement in identity_statements(variant.template.to_json())
        if any(action.startswith("kms:") for action in listed(statement["Action"]))
        and not set(listed(statement["Action"])) <= SIGNING_ACTIONS
    ]

    assert kms
    for name, statement in kms:
        assert list(statement["Condition"]) == ["StringEquals"], name
        assert list(statement["Condition"]["StringEquals"]) == ["kms:ViaService"], name
    # The reconcile function's SQS event source decrypts the work queue through SQS, not directly.
    reconcile = role_statements(variant, variant.stack.functions.reconcile.role)
    decrypt = [s for s in reconcile if "kms:Decrypt" in listed(s["Action"])]
    services = {s["Condition"]["StringEquals"]["kms:ViaService"]["Fn::Join"][1][0] for s in decrypt}
    assert services == {"dynamodb.", "s3.", "sqs."}


def test_only_reconcile_and_drift_sign_and_only_with_the_signing_key(variant: Synthesized) -> None:
    signing_key = {"Fn::GetAtt": [variant.logical_id(variant.stack.signing_key.key), "Arn"]}
    signers = {
        name: statement
        for name, statement in identity_statements(variant.template.to_json())
        if SIGNING_ACTIONS & set(listed(statement["Action"]))
    }
    functions = variant.stack.functions
    expected = {
        variant.logical_id(f.role.node.find_child("DefaultPolicy")) for f in (functions.reconcile, functions.drift)
    }
    assert set(signers) == expected
    assert all(set(s["Action"]) == SIGNING_ACTIONS and s["Resource"] == signing_key for s in signers.values())
    key = variant.resource(variant.stack.signing_key.key)["Properties"]
    assert (key["KeySpec"], key["KeyUsage"]) == ("RSA_3072", "SIGN_VERIFY")
    for function in (functions.reconcile, functions.drift):
        environment = variant.resource(function)["Properties"]["Environment"]["Variables"]
        assert environment[ENV_SIGNING_KEY] == signing_key
    for function in (functions.ingest, functions.result):
        assert ENV_SIGNING_KEY not in variant.resource(function)["Properties"]["Environment"]["Variables"]


def test_send_command_reaches_only_the_configured_head_nodes(variant: Synthesized) -> None:
    account = [{"Ref": "AWS::Region"}, ":", {"Ref": "AWS::AccountId"}]
    expected = [
        partition_arn(":ec2:", *account, ":instance/i-0a1b2c3d4e5f60718"),
        partition_arn(":ssm:", *account, f":managed-instance/{HYBRID_HEAD_NODE}"),
    ]
    for function in (variant.stack.functions.reconcile, variant.stack.functions.drift):
        send = [s for s in role_statements(variant, function.role) if s["Action"] == "ssm:SendCommand"]
        targets = [s for s in send if "document/" not in json.dumps(s["Resource"])]
        assert [s["Resource"] for s in targets] == [expected]
        assert targets[0]["Condition"] == {"StringEquals": {"ssm:resourceTag/topokeeper:head-node": "true"}}


def test_provisioning_parameters_are_read_only_from_buckets_of_this_account(example: Synthesized) -> None:
    for function in (example.stack.functions.reconcile, example.stack.functions.drift):
        reads = [
            s
            for s in role_statements(example, function.role)
            if "provisioning_parameters.json" in json.dumps(s["Resource"])
        ]
        assert [(s["Action"], s["Condition"]) for s in reads] == [
            ("s3:GetObject", {"StringEquals": {"s3:ResourceAccount": {"Ref": "AWS::AccountId"}}})
        ]


def object_arn(synthesized: Synthesized, key: str) -> dict[str, Any]:
    return {"Fn::Join": ["", [{"Fn::GetAtt": [synthesized.logical_id(synthesized.stack.plans.bucket), "Arn"]}, key]]}


def test_drift_writes_only_verify_requests_payloads_and_results(variant: Synthesized) -> None:
    writes = [
        s for s in role_statements(variant, variant.stack.functions.drift.role) if "s3:PutObject" in listed(s["Action"])
    ]

    # llm-train verifies through its agent; vision (enforce) verifies what it applied; SSM clusters need payloads,
    # and their head nodes PUT a result too large for stdout by a URL drift presigns (so drift's own s3:PutObject).
    assert [s["Action"] for s in writes] == ["s3:PutObject"]
    assert sorted(json.dumps(arn) for arn in writes[0]["Resource"]) == sorted(
        json.dumps(object_arn(variant, key))
        for key in (
            "/clusters/llm-train/verify.json",
            "/payloads/cfd-pcluster/*.json",
            "/payloads/cfd-pcluster/program-*.pyz",
            "/results/cfd-pcluster/*.json",
            "/payloads/hp-hybrid/*.json",
            "/payloads/hp-hybrid/program-*.pyz",
            "/results/hp-hybrid/*.json",
        )
    )
    for function in (variant.stack.functions.ingest, variant.stack.functions.result):
        assert not [s for s in role_statements(variant, function.role) if "s3:PutObject" in listed(s["Action"])]


def test_one_agent_policy_per_cluster_reaching_only_its_own_objects_and_event_source(variant: Synthesized) -> None:
    policies = variant.stack.agent.policies
    outputs = variant.template.to_json()["Outputs"]

    assert sorted(policies) == ["llm-train", "vision"]
    for cluster, policy in policies.items():
        document = variant.resource(policy)["Properties"]["PolicyDocument"]
        by_sid = {statement["Sid"]: statement for statement in document["Statement"]}
        # Only a cluster with placement_metrics puts anything: its one facts object, encrypted with the bucket's key.
        facts = ["EncryptPlacementFacts", "PutPlacementFacts"] if cluster == "vision" else []
        assert sorted(by_sid) == sorted(["DecryptBundles", "FetchBundles", "ReportResults", *facts])
        if facts:
            put, encrypt = by_sid["PutPlacementFacts"], by_sid["EncryptPlacementFacts"]
            assert (put["Action"], put["Resource"]) == (
                "s3:PutObject",
                object_arn(variant, f"/clusters/{cluster}/placement-facts.json"),
            )
            assert (encrypt["Action"], list(encrypt["Condition"]["StringEquals"])) == (
                "kms:GenerateDataKey",
                ["kms:ViaService"],
            )
        assert by_sid["FetchBundles"]["Resource"] == [
            object_arn(variant, f"/clusters/{cluster}/{name}")
            for name in ("bundle.json", "verify-request.json", "verify.json")
        ]
        sources = by_sid["ReportResults"]["Condition"]["StringEquals"]["events:source"]
        assert sources == [agent_source(cluster), AGENT_SOURCE]
        (other,) = set(policies) - {cluster}
        assert other not in json.dumps(document)
        assert outputs[agent_policy_output(cluster)]["Value"] == {"Ref": variant.logical_id(policy)}


def test_one_registration_policy_per_enforced_ec2_cluster_reading_only_its_entries(variant: Synthesized) -> None:
    policies = variant.stack.registration.policies
    outputs = variant.template.to_json()["Outputs"]

    assert sorted(policies) == ["cfd-pcluster"]  # the HyperPod and EKS clusters' nodes read none
    document = variant.resource(policies["cfd-pcluster"])["Properties"]["PolicyDocument"]
    by_sid = {statement["Sid"]: statement for statement in document["Statement"]}
    assert sorted(by_sid) == ["DecryptRegistration", "ListRegistration", "ReadRegistration"]
    assert (by_sid["ReadRegistration"]["Action"], by_sid["ReadRegistration"]["Resource"]) == (
        "s3:GetObject",
        object_arn(variant, "/clusters/cfd-pcluster/registration/*"),
    )
    assert by_sid["ListRegistration"]["Condition"] == {
        "StringLike": {"s3:prefix": ["clusters/cfd-pcluster/registration/*"]}
    }
    assert by_sid["DecryptRegistration"]["Action"] == "kms:Decrypt"
    assert list(by_sid["DecryptRegistration"]["Condition"]["StringEquals"]) == ["kms:ViaService"]
    assert outputs[registration_policy_output("cfd-pcluster")]["Value"] == {
        "Ref": variant.logical_id(policies["cfd-pcluster"])
    }


def test_only_reconcile_deletes_and_only_the_registration_entries_of_its_enforced_ec2_clusters(
    variant: Synthesized,
) -> None:
    # A terminated instance's entry is deleted (service/registration.py): nothing else in the bucket is.
    functions = variant.stack.functions
    deletes = {
        name: [s for s in role_statements(variant, function.role) if "s3:Delete" in json.dumps(s["Action"])]
        for name, function in functions.by_name.items()
    }
    reconcile = deletes.pop("reconcile")
    assert deletes == {name: [] for name in deletes}
    assert [(s["Action"], s["Resource"]) for s in reconcile] == [
        ("s3:DeleteObject", object_arn(variant, "/clusters/cfd-pcluster/registration/*"))
    ]


def bucket_policy(synthesized: Synthesized) -> list[dict[str, Any]]:
    (policy,) = [r for r in synthesized.resources.values() if r["Type"] == "AWS::S3::BucketPolicy"]
    statements: list[dict[str, Any]] = policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def role_arn(synthesized: Synthesized, function: Any) -> dict[str, Any]:
    return {"Fn::GetAtt": [synthesized.logical_id(function.role), "Arn"]}


@pytest.mark.parametrize("which", ["example", "variant"])
def test_only_reconcile_drift_and_the_operator_may_change_objects(which: str, request: pytest.FixtureRequest) -> None:
    synthesized: Synthesized = request.getfixturevalue(which)
    everything = object_arn(synthesized, "/*")  # clusters/*, payloads/* and plans/* alike

    (deny,) = [s for s in bucket_policy(synthesized) if s.get("Sid") == "OnlyTopokeeperChangesObjects"]

    if which == "variant":  # vision's agent puts its placement facts: that one object, under its own policy
        facts = object_arn(synthesized, "/clusters/vision/placement-facts.json")
        assert (deny["Effect"], deny["Principal"], deny["NotResource"]) == ("Deny", {"AWS": "*"}, facts)
        assert "Resource" not in deny
    else:
        assert (deny["Effect"], deny["Principal"], deny["Resource"]) == ("Deny", {"AWS": "*"}, everything)
    assert {"s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion"} <= set(deny["Action"])
    functions = synthesized.stack.functions
    writers = [role_arn(synthesized, functions.reconcile), role_arn(synthesized, functions.drift)]
    writers += [OPERATOR_ROLE] if which == "variant" else []
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": writers}}


def test_writes_cannot_ask_for_another_encryption_than_the_stack_key(example: Synthesized) -> None:
    everything = object_arn(example, "/*")
    key = {"Fn::GetAtt": [example.logical_id(example.stack.key.key), "Arn"]}
    denied = {
        json.dumps(s["Condition"], sort_keys=True)
        for s in bucket_policy(example)
        if (s["Effect"], s["Principal"], s["Action"], s["Resource"])
        == ("Deny", {"AWS": "*"}, "s3:PutObject", everything)
    }

    # Only a write that names another encryption is denied: one that asks for nothing gets the bucket's default
    # encryption, this key (...IfExists would deny it: IAM evaluates an absent key as true there).
    sse, sse_key = "s3:x-amz-server-side-encryption", "s3:x-amz-server-side-encryption-aws-kms-key-id"
    assert denied == {
        json.dumps({"Null": {sse: "false"}, "StringNotEquals": {sse: "aws:kms"}}, sort_keys=True),
        json.dumps({"Null": {sse_key: "false"}, "StringNotEquals": {sse_key: key}}, sort_keys=True),
        json.dumps({"Null": {"s3:x-amz-server-side-encryption-customer-algorithm": "false"}}),
    }
    bucket = example.resource(example.stack.plans.bucket)["Properties"]
    (default,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert default["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}


def test_plain_http_is_still_denied(example: Synthesized) -> None:
    (tls,) = [s for s in bucket_policy(example) if "aws:SecureTransport" in json.dumps(s.get("Condition", {}))]

    assert (tls["Effect"], tls["Action"], tls["Condition"]) == (
        "Deny",
        "s3:*",
        {"Bool": {"aws:SecureTransport": "false"}},
    )


def test_every_service_principal_in_a_key_policy_is_bound_to_this_account(example: Synthesized) -> None:
    """A service principal alone lets that service act for any account's resources (the confused deputy)."""
    checked = 0
    for resource in example.resources.values():
        if resource["Type"] != "AWS::KMS::Key":
            continue
        for statement in resource["Properties"]["KeyPolicy"]["Statement"]:
            if "Service" not in statement.get("Principal", {}):
                continue
            checked += 1
            condition = statement.get("Condition", {})
            assert condition.get("StringEquals", {}).get("aws:SourceAccount") == {"Ref": "AWS::AccountId"}, statement
    assert checked >= 2  # EventBridge's dead letters and CloudWatch's alarms
