"""The stack's own IAM, enforced: every request of the functions and the head node in a simulation is authorized with
the synthesized template's roles, identity policies, bucket, queue and key policies (topokeeper.sim.stack_iam).

A planted missing permission fails the simulation with AccessDenied naming it. And every statement is needed: with
each Allow statement of each policy removed in turn, some request of a simulation is refused on an action the
statement grants. The sweep replays a run's recorded requests without the statement: the evaluation is a function of
the statements and the request alone, so a run without it goes as recorded up to exactly that refusal (the planted
test shows a real run failing there). ``make test`` sweeps the full-story scenario and what no step of it does (a
malformed message, a cluster named by its ARN, expired node facts, a cut result read after its object expired);
``make reliability`` (TOPOKEEPER_RELIABILITY_FULL=1) also every shipped scenario (the ParallelCluster one on 25.11
too), the agent channel, a legacy cluster and ParallelCluster on the agent channel (slow: ELSEWHERE lists what
only they prove), and requires every statement needed but those UNPROVEN names with their reasons (none).
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.backend.conftest import small_scenario
from topokeeper.adapters.aws import client
from topokeeper.contract.config import Mode, Settings
from topokeeper.contract.ports import Channel
from topokeeper.sim.aws.policy import matches
from topokeeper.sim.scenario import Scenario, load_scenario
from topokeeper.sim.simulator import play
from topokeeper.sim.slurm_chroot import HarnessError
from topokeeper.sim.slurm_source import source_tarball
from topokeeper.sim.stack_iam import synthesized_template
from topokeeper.sim.world import World, running

FULL = os.environ.get("TOPOKEEPER_RELIABILITY_FULL") == "1"
SCENARIOS = Path(__file__).resolve().parents[3] / "layers/core/python/topokeeper/sim/scenarios"
Template = dict[str, Any]
Key = tuple[str, str]  # (whose policy, the statement as JSON)

# Allow statements no simulated request needs, and why (AWS acts there without a request of the stack's roles).
NOT_EXERCISED = {
    "logs:CreateLogStream": "Lambda's runtime writes each function's logs, not the handler",
}
Brief = tuple[str, str, str]  # (whose policy, its first action, the end of its first resource)
PROVISIONING = "sagemaker-*/*provisioning_parameters.json"
# What make test's sample (the full story) leaves unproven: needed by a scenario only the full sweep plays (a
# legacy cluster; ParallelCluster; the agent channel), or in UNPROVEN.
ELSEWHERE: set[Brief] = {
    ("topokeeper-ingest", "ec2:DescribeInstances", "*"),  # ParallelCluster's instance events
    ("topokeeper-reconcile", "s3:ListBucket", "topokeeper-plans-sim"),  # ParallelCluster, agent, verify mode
    ("topokeeper-reconcile", "s3:GetObject", PROVISIONING),  # the legacy cluster
    ("topokeeper-result", "sqs:ChangeMessageVisibility", "topokeeper-work.fifo"),  # a delivery a change waits on
    ("topokeeper-drift", "s3:ListBucket", "topokeeper-plans-sim"),  # agent-verify
    ("topokeeper-drift", "s3:GetObject", PROVISIONING),  # the legacy cluster
}
# Needed only where entries are published (Slurm 25.11): the sweep plays the ParallelCluster scenario on 25.11 where
# ../shared/slurm is, and its terminated instances' entries are deleted.
DELETES_ENTRIES: Brief = (
    "topokeeper-reconcile",
    "s3:DeleteObject",
    "topokeeper-plans-sim/clusters/pcluster/registration/*",
)
# Not shown needed by any simulation (make reliability's full sweep), each with why it stays: none left.
UNPROVEN: dict[Brief, str] = {}


def _actions(statement: dict[str, Any]) -> list[str]:
    actions = statement.get("Action", [])
    return [actions] if isinstance(actions, str) else list(actions)


def _reconcile_policy(template: Template) -> list[dict[str, Any]]:
    for resource in template["Resources"].values():
        roles = resource["Properties"].get("Roles", [{}]) if resource["Type"] == "AWS::IAM::Policy" else [{}]
        if str(roles[0].get("Ref", "")).startswith("FunctionsReconcileRole"):
            statements: list[dict[str, Any]] = resource["Properties"]["PolicyDocument"]["Statement"]
            return statements
    raise AssertionError("the template has no reconcile role policy")


def test_a_planted_missing_kms_generate_data_key_fails_the_simulation_naming_it() -> None:
    """The reconcile function's kms:GenerateDataKey through S3 taken out of the synthesized template: its first
    plan write is refused, and the simulation fails saying so."""

    def planted(settings: Settings) -> Template:
        template = copy.deepcopy(synthesized_template(settings))
        (through_s3,) = [
            s
            for s in _reconcile_policy(template)
            if "kms:GenerateDataKey" in s["Action"] and "s3." in json.dumps(s.get("Condition"))
        ]
        through_s3["Action"] = [a for a in through_s3["Action"] if a != "kms:GenerateDataKey"]
        return template

    scenario = small_scenario()
    with running(scenario, head_node="file", template=planted) as world, pytest.raises(HarnessError) as refused:
        play(world, scenario, lambda _: None)

    message = str(refused.value)
    assert "AccessDenied" in message
    assert "assumed-role/topokeeper-reconcile/" in message
    assert "is not authorized to perform: kms:GenerateDataKey on resource: arn:aws:kms:" in message
    assert message.endswith("because no identity-based policy allows the kms:GenerateDataKey action")


def test_the_bucket_policy_denies_a_write_by_any_other_role_whatever_its_own_policy_allows() -> None:
    scenario = small_scenario()
    with running(scenario, head_node="file") as world:
        iam = world.emulator.iam
        intruder = f"arn:aws:iam::{world.emulator.account_id}:role/intruder"
        iam.add_role(intruder, [{"Effect": "Allow", "Action": ["s3:*", "kms:*"], "Resource": "*"}])
        with iam.acting_as(intruder), pytest.raises(ClientError) as denied:
            client("s3").put_object(Bucket=world.stack.deployment.bucket, Key="clusters/x/bundle.json", Body=b"{}")
        with iam.acting_as(world.iam.function_roles["reconcile"]):  # a writer the policy names
            client("s3").put_object(Bucket=world.stack.deployment.bucket, Key="clusters/x/bundle.json", Body=b"{}")

    error = denied.value.response["Error"]
    assert error["Code"] == "AccessDenied"
    assert error["Message"].endswith("with an explicit deny in a resource-based policy")
    assert "s3:PutObject on resource: arn:aws:s3:::topokeeper-plans-sim/clusters/x/bundle.json" in error["Message"]


Played = tuple[str, Callable[[], Scenario], dict[str, Any], Callable[[World], None]]


def _nothing_more(world: World) -> None:
    return None


def _scenarios() -> list[Played]:
    """(name, scenario, world options, what the test does after the scenario)."""
    sample: list[Played] = [
        (
            "full-story",
            lambda: load_scenario(SCENARIOS / "full-story.yaml"),
            {"head_node": "file"},
            _the_full_story_and_more,
        )
    ]
    if not FULL:
        return sample
    file_node: dict[str, Any] = {"head_node": "file"}
    for name in ["demo", "verify-mode", "login", "burst-1000"]:
        sample.append((name, lambda n=name: load_scenario(SCENARIOS / f"{n}.yaml"), file_node, _nothing_more))
    if source_tarball()[0] is not None:
        # On 25.11 (built from ../shared/slurm) the reconcile publishes registration entries, and deletes those of
        # the instances the replace and delete steps terminate.
        sample.append(
            ("parallelcluster-25.11", lambda: _on_25_11(SCENARIOS / "parallelcluster.yaml"), {}, _nothing_more)
        )
    sample += [
        ("parallelcluster", lambda: load_scenario(SCENARIOS / "parallelcluster.yaml"), {}, _nothing_more),
        ("agent-channel", lambda: small_scenario(channel="agent"), file_node, _node_facts_expired),
        # A drift check before the agent's first verify: its verify bundle is missing, which only s3:ListBucket
        # makes a 404 (read as absent) rather than a 403.
        ("agent-verify", lambda: small_scenario(channel="agent", mode="verify"), file_node, _check_drift),
        ("legacy", _legacy_cluster, file_node, _nothing_more),
        ("parallelcluster-agent-verify", _parallelcluster_agent_verify, {}, _nothing_more),
    ]
    return sample


def _legacy_cluster() -> Scenario:
    """The login scenario's cluster created before API-driven Slurm: ingest, reconcile and drift read its
    login group and partitions from provisioning_parameters.json in its sagemaker-* lifecycle bucket."""
    scenario = load_scenario(SCENARIOS / "login.yaml")
    return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"legacy": True})})


def _parallelcluster_agent_verify() -> Scenario:
    """ParallelCluster on the agent channel in verify mode, its first two steps: the reconcile reads the head
    node's node table by a verify bundle, which it looks for before writing it (a 404 only with s3:ListBucket)."""
    scenario = load_scenario(SCENARIOS / "parallelcluster.yaml")
    cluster = scenario.cluster.model_copy(update={"channel": Channel.AGENT, "mode": Mode.VERIFY})
    return scenario.model_copy(update={"cluster": cluster, "steps": scenario.steps[:2]})


def _on_25_11(path: Path) -> Scenario:
    scenario = load_scenario(path)
    return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"slurm_version": "25.11"})})


def _check_drift(world: World) -> None:
    world.functions.invoke("drift", {})


def _owner(world: World, arn: str) -> str:
    if arn == world.stack.data_key_arn:
        return "data-key"
    if arn == world.stack.deployment.signing_key_id:
        return "signing-key"
    return arn.rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def _stable(world: World, statement: dict[str, Any]) -> str:
    """The statement as JSON, the same in every run (the simulated keys' ids are random)."""
    text = json.dumps(statement, sort_keys=True)
    return text.replace(world.stack.data_key_arn, "<data-key>").replace(
        str(world.stack.deployment.signing_key_id), "<signing-key>"
    )


def _sweep(world: World) -> dict[Key, str | None]:
    """Each Allow statement for the account's principals: the action a run without it is refused first on."""
    iam = world.emulator.iam
    found: dict[Key, str | None] = {}

    def needed(statement: dict[str, Any], refused: Any) -> str | None:
        granted = refused is not None and matches(_actions(statement), refused.action, ignore_case=True)
        return refused.action if granted else None

    for role in iam.roles.values():
        for index, statement in enumerate(role.statements):
            refused = iam.replay({role.arn: role.statements[:index] + role.statements[index + 1 :]}, {})
            found[(_owner(world, role.arn), _stable(world, statement))] = needed(statement, refused)
    for arn, policy in [*iam.resource_policies.items(), *iam.key_policies.items()]:
        for index, statement in enumerate(policy):
            if statement["Effect"] != "Allow" or "Service" in statement.get("Principal", {}):
                continue  # a Deny grants nothing; a service's statement is the service's (docs/proven.md)
            refused = iam.replay({}, {id(policy): policy[:index] + policy[index + 1 :]})
            found[(_owner(world, arn), _stable(world, statement))] = needed(statement, refused)
    return found


def _fail_on_purpose(world: World) -> None:
    """What no shipped scenario does: a malformed work message (reconcile dead-letters it with its role) and an
    asynchronous result invocation that raises (Lambda sends it to the on-failure destination with the
    function's role)."""
    sqs = client("sqs")
    sqs.send_message(
        QueueUrl=world.stack.queue_url,
        MessageBody=json.dumps({"cluster": world.cluster.name, "generation": 0}),
        MessageGroupId=world.cluster.name,
        MessageDeduplicationId="malformed-1",
    )
    sqs.send_message(QueueUrl=world.stack.inboxes["result"], MessageBody=json.dumps({"detail": {}}))
    world.settle()
    for queue in world.stack.dead_letter_urls.values():
        assert len(sqs.receive_message(QueueUrl=queue).get("Messages", [])) == 1, f"nothing dead-lettered to {queue}"


def _cluster_named_by_arn(world: World) -> None:
    """An operator's call naming the cluster by its ARN (SageMaker takes either): its CloudTrail record carries
    the ARN, which ingest resolves with DescribeCluster."""
    sagemaker = client("sagemaker")
    arn = sagemaker.describe_cluster(ClusterName=world.cluster.name)["ClusterArn"]
    group = next(g.name for g in world.scenario.cluster.instance_groups if g.partition)
    sagemaker.batch_delete_cluster_nodes(ClusterName=arn, NodeIds=[world.cluster_nodes(group)[-1].instance_id])
    world.settle()


def _node_facts_expired(world: World) -> None:
    """DynamoDB deletes a node-facts entry after its TTL (a node unchanged for 30 days), or the table was
    rebuilt: drift then asks EC2 for the topology itself."""
    dynamodb, table = client("dynamodb"), world.stack.deployment.table
    for item in dynamodb.scan(TableName=table)["Items"]:
        if item["sk"]["S"].startswith("NODE#"):
            dynamodb.delete_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]})
    world.functions.invoke("drift", {})


def _first_cut_result_late(world: World) -> None:
    """The result event of the run's first cut apply result (its whole document PUT to S3) is handled after that
    object expired: redriven from the event DLQ a day later, say. S3's lifecycle has deleted it (a delete
    marker: the bucket is versioned), and the result function records the cut document, having read a 404; a 403,
    without s3:ListBucket, would fail the invocation."""
    invoke, late = world.functions.invoke, []

    def invoke_late(function: str, event: Any) -> Any:
        detail = event.get("detail", {}) if function == "result" and not late else {}
        if event.get("source") == "aws.ssm" and "instance-id" in detail:
            with world.emulator.iam.as_harness():
                invocation = client("ssm").get_command_invocation(
                    CommandId=detail["command-id"], InstanceId=detail["instance-id"]
                )
                lines = str(invocation.get("StandardOutputContent", "")).strip().splitlines() or ["{}"]
                document = json.loads(lines[-1])
                pointer = document.get("full_result") or {}
                if document.get("mode") == "apply" and pointer.get("sha256"):
                    client("s3").delete_object(Bucket=world.stack.deployment.bucket, Key=pointer["key"])
                    late.append(pointer["key"])
        return invoke(function, event)

    world.functions.invoke = invoke_late  # type: ignore[method-assign]


def _the_full_story_and_more(world: World) -> None:
    for more in (_fail_on_purpose, _cluster_named_by_arn, _node_facts_expired):
        more(world)


def test_every_statement_is_needed_by_a_simulation() -> None:
    needed: dict[Key, set[str]] = {}
    for _, make, options, after in _scenarios():
        scenario = make()
        with running(scenario, **options) as world:
            world.emulator.iam.record = True
            _first_cut_result_late(world)
            play(world, scenario, lambda _: None)  # raises on any refusal: the stack's IAM is enough
            after(world)
            for key, action in _sweep(world).items():
                needed.setdefault(key, set()).update([action] if action else [])

    unneeded = set()
    for (owner, statement), actions in needed.items():
        parsed = json.loads(statement)
        first = _actions(parsed)[0]
        resources = parsed.get("Resource", "*")
        resource = (resources if isinstance(resources, str) else resources[0]).rsplit(":", 1)[-1]
        if not actions and first not in NOT_EXERCISED:
            unneeded.add((owner, first, resource))
    if FULL:  # exactly the known unproven ones: a new grant nothing needs fails here, and so does one now proven
        expected = set(UNPROVEN)
        if source_tarball()[0] is None:  # the one run that needs it did not play: said, never passed silently
            warnings.warn(f"Slurm 25.11 tier did not run: {DELETES_ENTRIES} not shown needed", stacklevel=1)
            expected.add(DELETES_ENTRIES)
        assert unneeded == expected
    else:
        assert unneeded == ELSEWHERE


def test_a_deleted_object_reads_as_missing_only_with_s3_list_bucket() -> None:
    """As S3 answers: a key whose current version is a delete marker (deleted, or expired by the lifecycle) is
    NoSuchKey to a caller who may list the bucket, AccessDenied to any other."""
    with running(small_scenario(), head_node="file") as world:
        iam, bucket, key = world.emulator.iam, world.stack.deployment.bucket, "results/topo-test/gone.json"
        with iam.as_harness():
            client("s3").put_object(Bucket=bucket, Key=key, Body=b"{}")
            client("s3").delete_object(Bucket=bucket, Key=key)
        role = iam.role(world.iam.function_roles["result"])
        answers = []
        for statements in (role.statements, [s for s in role.statements if s["Action"] != "s3:ListBucket"]):
            role.statements = statements
            with iam.acting_as(role.arn), pytest.raises(ClientError) as refused:
                client("s3").get_object(Bucket=bucket, Key=key)
            answers.append((refused.value.response["Error"]["Code"], refused.value.response["Error"]["Message"]))

    assert answers[0][0] == "NoSuchKey"
    assert answers[1][0] == "AccessDenied"
    assert f"s3:ListBucket on resource: arn:aws:s3:::{bucket} because no identity-based policy" in answers[1][1]
