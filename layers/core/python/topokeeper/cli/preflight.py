"""``topokeeper preflight``: read-only, with the operator's credentials, what the project cannot prove without an
account, in one table. Each check's AWS refusal (AccessDenied included) is that row's failure, never a traceback;
a missing region or credentials stops the command in one line (``cli.main``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError, ParamValidationError
from pydantic import ValidationError

from topokeeper.adapters.aws import client, error_code
from topokeeper.adapters.ec2 import InstanceTopologyReader, LocalRateLimiter, MemoryNodeFactsCache
from topokeeper.adapters.hyperpod import list_cluster_nodes, topology_candidates
from topokeeper.cli.operator_commands import deployment_from_args
from topokeeper.cli.options import add_endpoint_option
from topokeeper.contract.config import ClusterConfig, Orchestrator, Settings
from topokeeper.contract.errors import InputError, TopokeeperError, one_line
from topokeeper.contract.operator_files import read_mapping
from topokeeper.contract.ports import Channel
from topokeeper.contract.stack_spec import PEAK_CONCURRENT_EXECUTIONS, POWERTOOLS_LAYER_PARAMETER

EXIT_OK, EXIT_FAILED = 0, 1
PASS, FAIL, SKIP = "pass", "FAIL", "skip"
LAMBDA_CONCURRENCY_QUOTA = "L-B99A9384"  # Lambda: Concurrent executions
MANAGEMENT_READ_WRITE = frozenset({"All", "WriteOnly"})  # the rules match write (change) events


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    detail: str
    fix: str = ""


def _refused(check: str, error: BaseException, needs: str) -> Row:
    """An AWS answer as the row's failure: the code and message, and for a refusal the permission to grant."""
    if isinstance(error, ClientError):
        code = error_code(error)
        message = str(error.response.get("Error", {}).get("Message", "")).strip()
        denied = "AccessDenied" in code or code.startswith("Unauthorized")
        return Row(
            check, FAIL, one_line(f"{code}: {message}"), f"allow {needs} for these credentials" if denied else ""
        )
    cause = error.__cause__ if isinstance(error.__cause__, ClientError) else None
    if cause is not None:
        return _refused(check, cause, needs)
    return Row(check, FAIL, one_line(str(error)))


def topology_row(cluster: ClusterConfig) -> Row:
    check = "DescribeInstanceTopology sees the cluster"
    if cluster.orchestrator is Orchestrator.EC2:
        return Row(check, SKIP, "an EC2 cluster's instances are this account's own")
    ids = topology_candidates(list_cluster_nodes(client("sagemaker"), cluster.name))
    if not ids:
        return Row(check, SKIP, "no running node of a type with network topology to ask about")
    # The adapter's own guards: ids checked, batches of at most 100, the 1-per-second bucket, service-account ids.
    reader = InstanceTopologyReader(
        client("ec2"), MemoryNodeFactsCache(), LocalRateLimiter(), lambda: datetime.now(UTC)
    )
    answered = {str(item["InstanceId"]) for item in reader.read(cluster.name, ids)}
    missing = sorted(set(ids) - answered)
    if not missing:
        return Row(check, PASS, f"{len(ids)} of {len(ids)} running instance(s) answered")
    return Row(
        check,
        FAIL,
        f"{len(missing)} of {len(ids)} instance(s) not in this account's answer (e.g. {missing[0]}); HyperPod may run "
        "its nodes in a service account",
        "plan without network topology (tree: under no-topology; UltraServer blocks still come from UltraServerInfo), "
        "or ask AWS whether this cluster's instances can be described from the account",
    )


def _trail_delivers(trail: dict[str, Any]) -> bool:
    home = client("cloudtrail", str(trail.get("HomeRegion") or "") or None)
    if not home.get_trail_status(Name=trail["TrailARN"]).get("IsLogging"):
        return False
    selectors = home.get_event_selectors(TrailName=trail["TrailARN"])
    for selector in selectors.get("EventSelectors") or []:
        if (
            selector.get("IncludeManagementEvents", True)
            and selector.get("ReadWriteType", "All") in MANAGEMENT_READ_WRITE
        ):
            return True
    for selector in selectors.get("AdvancedEventSelectors") or []:
        fields = {f.get("Field"): f for f in selector.get("FieldSelectors") or []}
        management = "Management" in (fields.get("eventCategory") or {}).get("Equals", [])
        if management and "true" not in (fields.get("readOnly") or {}).get("Equals", []):
            return True
    return False


def trail_row(region: str) -> Row:
    check = "a trail delivers management events"
    trails = client("cloudtrail").describe_trails(includeShadowTrails=True).get("trailList", [])
    covering = [t for t in trails if t.get("IsMultiRegionTrail") or t.get("HomeRegion") == region]
    refused: ClientError | None = None
    for trail in covering:
        try:
            if _trail_delivers(trail):
                return Row(check, PASS, f"{trail['Name']} logs management write events in {region}")
        except ClientError as error:  # e.g. an organization's trail this account may not read: try the others
            refused = refused or error
    if refused is not None:
        raise refused
    return Row(
        check,
        FAIL,
        f"none of {len(trails)} trail(s) is logging management events (All or WriteOnly) in {region}",
        "create or start a multi-region trail with management events (aws cloudtrail create-trail "
        "--is-multi-region-trail, then start-logging): EventBridge gets the API-call events the rules match only then",
    )


def ssm_row(cluster: ClusterConfig) -> Row:
    check = "SSM reaches the head node"
    if cluster.orchestrator is Orchestrator.EKS or cluster.effective_channel is not Channel.SSM:
        return Row(check, SKIP, "not an ssm-channel cluster (the head-node agent polls the bucket)")
    head = str(cluster.head_node)
    found = client("ssm").describe_instance_information(Filters=[{"Key": "InstanceIds", "Values": [head]}])
    rows = found.get("InstanceInformationList", [])
    if not rows:
        return Row(
            check,
            FAIL,
            f"{head} is not an SSM managed node",
            "run the SSM agent on the head node with an instance profile allowing AmazonSSMManagedInstanceCore "
            "(or a hybrid activation for mi- ids)",
        )
    ping = rows[0].get("PingStatus")
    if ping != "Online":
        return Row(
            check, FAIL, f"{head}: PingStatus {ping}", "start the SSM agent on the head node and check its network"
        )
    return Row(check, PASS, f"{head}: PingStatus Online")


def powertools_row(region: str) -> Row:
    check = "Powertools layer in the region"
    try:
        value = client("ssm").get_parameter(Name=POWERTOOLS_LAYER_PARAMETER)["Parameter"]["Value"]
    except ClientError as error:
        if error_code(error) != "ParameterNotFound":
            raise
        return Row(
            check,
            FAIL,
            f"no {POWERTOOLS_LAYER_PARAMETER} in {region}",
            "deploy in a region where AWS publishes the Powertools for AWS Lambda (Python) arm64 layer",
        )
    return Row(check, PASS, str(value))


def quota_row() -> Row:
    check = "service quotas fit"
    quotas = client("service-quotas")
    asked = {"ServiceCode": "lambda", "QuotaCode": LAMBDA_CONCURRENCY_QUOTA}
    try:
        value = float(quotas.get_service_quota(**asked)["Quota"]["Value"])
    except ClientError as error:
        if error_code(error) != "NoSuchResourceException":
            raise
        # No value applied to the account: AWS's default holds.
        value = float(quotas.get_aws_default_service_quota(**asked)["Quota"]["Value"])
    # SendCommand's rate is not a Service Quotas value: one command per delivery is far under it, and a throttled
    # send is answered without a command, which the SSM channel retries.
    ssm_note = "; SSM SendCommand: one per delivery, well under its API rate"
    if value < PEAK_CONCURRENT_EXECUTIONS:
        return Row(
            check,
            FAIL,
            f"Lambda concurrent executions {value:g} < {PEAK_CONCURRENT_EXECUTIONS} the stack runs at once{ssm_note}",
            f"request more: aws service-quotas request-service-quota-increase --service-code lambda "
            f"--quota-code {LAMBDA_CONCURRENCY_QUOTA} --desired-value 1000",
        )
    return Row(check, PASS, f"Lambda concurrent executions {value:g} >= {PEAK_CONCURRENT_EXECUTIONS}{ssm_note}")


CHECKS: list[tuple[str, str, Callable[[ClusterConfig, str], Row]]] = [
    ("DescribeInstanceTopology sees the cluster", "sagemaker:ListClusterNodes and ec2:DescribeInstanceTopology",
     lambda cluster, _: topology_row(cluster)),
    ("a trail delivers management events",
     "cloudtrail:DescribeTrails, cloudtrail:GetTrailStatus and cloudtrail:GetEventSelectors",
     lambda _, region: trail_row(region)),
    ("SSM reaches the head node", "ssm:DescribeInstanceInformation", lambda cluster, _: ssm_row(cluster)),
    ("Powertools layer in the region", "ssm:GetParameter", lambda _, region: powertools_row(region)),
    ("service quotas fit", "servicequotas:GetServiceQuota and servicequotas:GetAWSDefaultServiceQuota",
     lambda _, __: quota_row()),
]  # fmt: skip


def run_checks(cluster: ClusterConfig) -> list[Row]:
    region = str(client("ssm").meta.region_name)
    rows = []
    for check, needs, run in CHECKS:
        try:
            rows.append(run(cluster, region))
        except (ClientError, TopokeeperError, ParamValidationError) as error:
            rows.append(_refused(check, error, needs))
    return rows


def _cluster(args: argparse.Namespace) -> ClusterConfig:
    if args.config:
        try:
            settings = Settings.model_validate(read_mapping(args.config, "--config"))
        except ValidationError as error:
            first = error.errors()[0]
            raise InputError("--config", f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from error
    else:
        settings = deployment_from_args(args).settings
    cluster = settings.cluster(args.cluster)
    if cluster is None:
        raise InputError("--cluster", f"{args.cluster} is not in these settings")
    return cluster


def table(rows: list[Row]) -> str:
    width = max(len(row.check) for row in rows)
    lines = [f"{'CHECK'.ljust(width)}  RESULT  DETAIL"]
    for row in rows:
        lines.append(f"{row.check.ljust(width)}  {row.status.ljust(6)}  {row.detail}")
        if row.fix:
            lines.append(f"{''.ljust(width)}  {''.ljust(6)}  -> {row.fix}")
    return "\n".join(lines)


def cmd_preflight(args: argparse.Namespace) -> int:
    rows = run_checks(_cluster(args))
    if args.json:
        print(json.dumps({"cluster": args.cluster, "checks": [asdict(row) for row in rows]}, indent=2))
    else:
        print(table(rows))
    return EXIT_FAILED if any(row.status == FAIL for row in rows) else EXIT_OK


def register(commands: Any) -> None:
    parser = commands.add_parser("preflight", help="read-only checks of the account before deploying")
    parser.add_argument("--cluster", required=True, help="cluster name (or ARN)")
    add_endpoint_option(parser, argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--config", type=Path, help="the stack's settings (the JSON or YAML given to cdk deploy)")
    group.add_argument("--stack-name", help="the deployed topokeeper stack")
    group.add_argument("--deployment", type=Path, help="deployment JSON (the simulator writes one)")
    parser.set_defaults(run=cmd_preflight)
