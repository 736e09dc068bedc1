"""The stack's own IAM in the emulator: the synthesized template's roles, identity policies, bucket, queue and key
policies, their references resolved to the simulated stack's resources, enforced on every request the functions
and the head node make (``sim.aws.iam``).

The template is synthesized from ``infra/`` for the simulation's settings (``python -m infra.template``, in a
source checkout) and kept in a cache keyed by the settings and the sources that make it, so a run pays for a
synthesis only when either changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topokeeper.contract import stack_spec as spec
from topokeeper.contract.config import Settings
from topokeeper.contract.ports import Channel
from topokeeper.sim.aws.emulator import AwsEmulator
from topokeeper.sim.slurm_chroot import HarnessError
from topokeeper.sim.stack import SimStack

# layers/core/python/topokeeper/sim/stack_iam.py -> the repository root.
_CHECKOUT = Path(__file__).resolve().parents[5]
CACHE_VARIABLE = "TOPOKEEPER_TEMPLATE_CACHE"
Template = dict[str, Any]


def _cache_dir() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(configured) if configured else base / "topokeeper" / "templates"


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([*(_CHECKOUT / "infra").glob("*.py"), _CHECKOUT / "cdk.json"]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def settings_config(settings: Settings) -> dict[str, Any]:
    """``settings`` as the stack's ``topokeeper`` context value."""
    config: dict[str, Any] = settings.model_dump(mode="json", exclude_defaults=True)
    return config


def synthesized_template(settings: Settings) -> Template:
    """The stack's template for ``settings`` (cached; synthesized by ``python -m infra.template`` when missing)."""
    if not (_CHECKOUT / "infra" / "template.py").is_file():
        raise HarnessError(
            f"the simulator authorizes requests with the stack's synthesized IAM, and {_CHECKOUT} has no "
            "infra/template.py: run it from a topokeeper source checkout"
        )
    config = settings_config(settings)
    key = hashlib.sha256((json.dumps(config, sort_keys=True) + _sources_digest()).encode()).hexdigest()[:32]
    cached = _cache_dir() / f"{key}.json"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="topokeeper-template-") as work:
            config_file, out = Path(work) / "config.json", Path(work) / "template.json"
            config_file.write_text(json.dumps(config))
            done = subprocess.run(
                [sys.executable, "-m", "infra.template", str(config_file), str(out)],
                cwd=_CHECKOUT,
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "PYTHONPATH": os.pathsep.join([str(_CHECKOUT), os.environ.get("PYTHONPATH", "")])},
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise HarnessError(f"synthesizing the stack's template for the simulation failed: {last}")
            os.replace(out, cached)
    template: Template = json.loads(cached.read_text())
    return template


def function_role_arn(account_id: str, function: str) -> str:
    return f"arn:aws:iam::{account_id}:role/topokeeper-{function}"


def head_node_role_arn(account_id: str, cluster: str) -> str:
    """The head node's instance role (the operator's, outside the stack), carrying the cluster's agent policy."""
    return f"arn:aws:iam::{account_id}:role/{cluster}-head-node"


@dataclass
class StackIam:
    """What was installed: each function's role ARN, each agent cluster's head-node role ARN, the template."""

    template: Template
    function_roles: dict[str, str] = field(default_factory=dict)
    head_node_roles: dict[str, str] = field(default_factory=dict)


@dataclass
class _Resolver:
    """CloudFormation's intrinsic functions over the template, with the simulated stack's physical values."""

    emulator: AwsEmulator
    refs: dict[str, str]  # logical id -> what Ref answers
    arns: dict[str, str]  # logical id -> what Fn::GetAtt [id, Arn] answers

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "Ref" in value:
            pseudo = {"AWS::Partition": "aws", "AWS::Region": self.emulator.region, "AWS::URLSuffix": "amazonaws.com"}
            pseudo["AWS::AccountId"] = self.emulator.account_id
            name = value["Ref"]
            # An unsimulated resource resolves to a name no request carries.
            return pseudo.get(name) or self.refs.get(name) or f"unsimulated-{name}"
        if "Fn::GetAtt" in value:
            logical, attribute = value["Fn::GetAtt"]
            if attribute != "Arn":
                raise HarnessError(f"the simulation cannot resolve Fn::GetAtt {logical}.{attribute}")
            return self.arns.get(logical) or f"arn:aws:unsimulated:::{logical}"
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(str(self(part)) for part in parts)
        return {key: self(item) for key, item in value.items()}


def _by_type(template: Template, kind: str) -> dict[str, dict[str, Any]]:
    return {lid: r for lid, r in template["Resources"].items() if r["Type"] == kind}


def _output_ref(template: Template, output: str) -> str:
    value = template["Outputs"][output]["Value"]
    return str(value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0])


def _physical(emulator: AwsEmulator, stack: SimStack, template: Template) -> tuple[dict[str, str], dict[str, str]]:
    """Each stack resource the simulation has: logical id -> (Ref, ARN)."""
    region, account = emulator.region, emulator.account_id
    deployment = stack.deployment
    refs: dict[str, str] = {}
    arns: dict[str, str] = {}
    table, bucket = _output_ref(template, "TableName"), _output_ref(template, "BucketName")
    refs[table], arns[table] = deployment.table, f"arn:aws:dynamodb:{region}:{account}:table/{deployment.table}"
    refs[bucket], arns[bucket] = deployment.bucket, f"arn:aws:s3:::{deployment.bucket}"
    queues = {
        "QueueUrl": deployment.queue_url,
        "DeadLetterQueueUrl": stack.dead_letter_urls[spec.WORK_DLQ],
        "EventDeadLetterQueueUrl": stack.dead_letter_urls[spec.EVENT_DLQ],
    }
    for output, url in queues.items():
        logical = _output_ref(template, output)
        refs[logical], arns[logical] = url, f"arn:aws:sqs:{region}:{account}:{url.rsplit('/', 1)[-1]}"
    if deployment.signing_key_id:
        arns[_output_ref(template, "SigningKeyArn")] = deployment.signing_key_id
    encryption = template["Resources"][bucket]["Properties"]["BucketEncryption"]
    data_key = encryption["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]["KMSMasterKeyID"]
    arns[data_key["Fn::GetAtt"][0]] = stack.data_key_arn
    for function in _by_type(template, "AWS::Lambda::Function").values():
        name = str(function["Properties"].get("Description", "")).removeprefix("topokeeper ")
        if name in spec.FUNCTION_NAMES:
            arns[function["Properties"]["Role"]["Fn::GetAtt"][0]] = function_role_arn(account, name)
    return refs, arns


def install_stack_iam(
    emulator: AwsEmulator, stack: SimStack, settings: Settings, template: Template, target_group: str | None = None
) -> StackIam:
    """Every role, identity policy and resource policy of ``template`` enforced by ``emulator``'s IAM;
    ``target_group``: the simulated cluster's login endpoint target group (a world simulates one cluster)."""
    refs, arns = _physical(emulator, stack, template)
    if target_group is not None:
        for logical in _by_type(template, "AWS::ElasticLoadBalancingV2::TargetGroup"):
            refs[logical], arns[logical] = target_group, target_group
    resolve = _Resolver(emulator, refs, arns)
    iam = emulator.iam
    installed = StackIam(template)
    statements: dict[str, list[dict[str, Any]]] = {}  # role ARN -> its identity statements
    for policy in _by_type(template, "AWS::IAM::Policy").values():
        for role in policy["Properties"].get("Roles", []):
            arn = arns.get(role["Ref"])
            if arn is not None:
                statements.setdefault(arn, []).extend(resolve(policy["Properties"]["PolicyDocument"]["Statement"]))
    for function in spec.FUNCTION_NAMES:
        arn = function_role_arn(emulator.account_id, function)
        iam.add_role(arn, statements.get(arn, []))
        installed.function_roles[function] = arn
    for cluster in settings.clusters:
        output = next((o for o in template.get("Outputs", {}) if o == _agent_output(cluster.name)), None)
        if cluster.effective_channel is Channel.AGENT and output is not None:
            document = template["Resources"][_output_ref(template, output)]["Properties"]["PolicyDocument"]
            arn = head_node_role_arn(emulator.account_id, cluster.name)
            # The agent reads a missing bundle or verify request as absent on 403 too (topokeeper.agent).
            iam.add_role(arn, resolve(document["Statement"]), missing_as_forbidden=True)
            installed.head_node_roles[cluster.name] = arn
    _resource_policies(emulator, template, resolve, arns)
    iam.bucket_keys[stack.deployment.bucket] = stack.data_key_arn
    iam.table_keys[stack.deployment.table] = stack.data_key_arn
    for url in [stack.deployment.queue_url, *stack.dead_letter_urls.values()]:
        iam.queue_keys[f"arn:aws:sqs:{emulator.region}:{emulator.account_id}:{url.rsplit('/', 1)[-1]}"] = (
            stack.data_key_arn
        )
    return installed


def _agent_output(cluster: str) -> str:
    """infra.agent.agent_policy_output's name for ``cluster`` (AgentPolicyArn + the name in CamelCase)."""
    return "AgentPolicyArn" + "".join(part.capitalize() for part in cluster.split("-"))


def _resource_policies(
    emulator: AwsEmulator, template: Template, resolve: Callable[[Any], Any], arns: Mapping[str, str]
) -> None:
    iam = emulator.iam
    for policy in _by_type(template, "AWS::S3::BucketPolicy").values():
        bucket = arns.get(policy["Properties"]["Bucket"]["Ref"])
        if bucket is not None:
            iam.resource_policies[bucket] = resolve(policy["Properties"]["PolicyDocument"]["Statement"])
    for policy in _by_type(template, "AWS::SQS::QueuePolicy").values():
        for queue in policy["Properties"]["Queues"]:
            arn = arns.get(queue["Ref"])
            if arn is not None:
                iam.resource_policies[arn] = resolve(policy["Properties"]["PolicyDocument"]["Statement"])
    for logical, key in _by_type(template, "AWS::KMS::Key").items():
        arn = arns.get(logical)
        if arn is not None:
            iam.key_policies[arn] = resolve(key["Properties"]["KeyPolicy"]["Statement"])
