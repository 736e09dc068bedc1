"""``topokeeper cost``: what a synthesized stack costs a month, from its template's resources and list prices.

Fixed charges (keys, alarms, dashboards, load balancers) are counted from the template exactly; usage charges
(Lambda, DynamoDB, S3, SQS, logs) are estimated for the drift schedule, the one load the stack makes on its own.
Every resource type the stack can contain is classified here, so a new one fails the tests until it is priced.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topokeeper.contract.errors import InputError

# AWS list prices in us-east-1, as published on the AWS pricing pages (checked 2026-12-04). Other regions differ
# by a few percent; confirm with the AWS Pricing Calculator before budgeting.
PRICES_AS_OF = "2026-12-04, us-east-1 list prices"
HOURS_PER_MONTH = 730
# Monthly price of one resource of each type that bills while it exists.
FIXED_MONTHLY = {
    "AWS::KMS::Key": 1.00,  # per key-month (the symmetric data key and the asymmetric signing key alike)
    "AWS::CloudWatch::Alarm": 0.10,  # standard-resolution alarm-month
    "AWS::CloudWatch::Dashboard": 3.00,  # per dashboard-month (an account's first three are free)
    "AWS::ElasticLoadBalancingV2::LoadBalancer": 0.0225 * HOURS_PER_MONTH,  # NLB hours, before its LCU usage
}
# Billed by use only (requests, storage, GB ingested): what the drift schedule makes of them is estimated below.
USAGE_PRICED = frozenset(
    {
        "AWS::Lambda::Function",
        "AWS::DynamoDB::Table",
        "AWS::S3::Bucket",
        "AWS::SQS::Queue",
        "AWS::SNS::Topic",
        "AWS::Logs::LogGroup",
        "AWS::EC2::FlowLog",
        "AWS::Scheduler::Schedule",
        "AWS::Events::Rule",
    }
)
# No charge of their own.
FREE = frozenset(
    {
        "AWS::IAM::Role",
        "AWS::IAM::Policy",
        "AWS::IAM::ManagedPolicy",
        "AWS::Lambda::Permission",
        "AWS::Lambda::EventInvokeConfig",
        "AWS::Lambda::EventSourceMapping",
        "AWS::Lambda::LayerVersion",
        "AWS::S3::BucketPolicy",
        "AWS::SQS::QueuePolicy",
        "AWS::SNS::TopicPolicy",
        "AWS::SNS::Subscription",
        "AWS::EC2::SecurityGroup",
        "AWS::EC2::SecurityGroupIngress",
        "AWS::EC2::SecurityGroupEgress",
        "AWS::ElasticLoadBalancingV2::Listener",
        "AWS::ElasticLoadBalancingV2::TargetGroup",
        "AWS::CDK::Metadata",
        "Custom::AWS",  # an SDK call CloudFormation makes at deploy time (its function is counted apart)
    }
)
# The drift function's estimate: each run lists and verifies every cluster; 10 s per cluster is generous.
LAMBDA_REQUEST = 0.20 / 1_000_000
LAMBDA_ARM_GB_SECOND = 0.0000133334
DRIFT_SECONDS_PER_CLUSTER = 10
_RATE = re.compile(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)")
_UNIT_MINUTES = {"minute": 1, "minutes": 1, "hour": 60, "hours": 60, "day": 1440, "days": 1440}


@dataclass(frozen=True)
class CostLine:
    resource_type: str
    count: int
    unit_monthly: float | None  # None: priced by use
    monthly: float


@dataclass(frozen=True)
class CostEstimate:
    lines: tuple[CostLine, ...]
    drift_runs: int
    drift_monthly: float

    @property
    def resources(self) -> int:
        return sum(line.count for line in self.lines)

    @property
    def fixed_monthly(self) -> float:
        return sum(line.monthly for line in self.lines)

    @property
    def monthly(self) -> float:
        return self.fixed_monthly + self.drift_monthly


def estimate(template: dict[str, Any], clusters: int) -> CostEstimate:
    """The month's cost of ``template`` (a synthesized CloudFormation template) for ``clusters`` clusters."""
    resources = template.get("Resources")
    if not isinstance(resources, dict) or not resources:
        raise InputError("--template", "no Resources: not a synthesized CloudFormation template")
    counts = Counter(str(resource.get("Type")) for resource in resources.values())
    unknown = sorted(set(counts) - set(FIXED_MONTHLY) - USAGE_PRICED - FREE)
    if unknown:
        raise InputError("--template", f"resource types this estimate does not price: {', '.join(unknown)}")
    lines = tuple(
        CostLine(kind, count, FIXED_MONTHLY.get(kind), FIXED_MONTHLY.get(kind, 0.0) * count)
        for kind, count in sorted(counts.items())
        if kind not in FREE
    )
    runs, memory_mb = _drift_schedule(resources)
    seconds = runs * DRIFT_SECONDS_PER_CLUSTER * max(clusters, 1)
    drift = runs * LAMBDA_REQUEST + seconds * memory_mb / 1024 * LAMBDA_ARM_GB_SECOND
    return CostEstimate(lines, runs, drift)


def _drift_schedule(resources: dict[str, Any]) -> tuple[int, int]:
    """Runs a month of the stack's one schedule (the drift check), and the largest function memory in MB."""
    runs = 0
    for resource in resources.values():
        if resource.get("Type") == "AWS::Scheduler::Schedule":
            match = _RATE.fullmatch(str(resource.get("Properties", {}).get("ScheduleExpression", "")))
            if match:
                runs += HOURS_PER_MONTH * 60 // (int(match.group(1)) * _UNIT_MINUTES[match.group(2)])
            else:  # a cron expression: at most hourly in the stack's validation; count hourly
                runs += HOURS_PER_MONTH
    memory = max(
        (
            int(resource.get("Properties", {}).get("MemorySize", 128))
            for resource in resources.values()
            if resource.get("Type") == "AWS::Lambda::Function"
        ),
        default=128,
    )
    return runs, memory


def render(cost: CostEstimate, clusters: int) -> str:
    rows = [f"{'RESOURCE':44} {'COUNT':>5} {'EACH':>9} {'MONTHLY':>9}"]
    for line in cost.lines:
        if line.unit_monthly is None:
            each, monthly = "by use", "-"
        else:
            each, monthly = f"${line.unit_monthly:.2f}", f"${line.monthly:.2f}"
        rows.append(f"{line.resource_type:44} {line.count:>5} {each:>9} {monthly:>9}")
    rows.append(
        f"drift checks: {cost.drift_runs} runs a month for {clusters} cluster(s), about "
        f"${cost.drift_monthly:.2f} of Lambda (DynamoDB, S3, SQS and log charges at this load: cents)"
    )
    rows.append(
        f"total: about ${cost.monthly:.2f} a month for the {cost.resources} resources that bill "
        f"({PRICES_AS_OF}; a login endpoint's NLB adds its LCU usage, free tiers not deducted)"
    )
    return "\n".join(rows)


def _cmd_cost(args: argparse.Namespace) -> int:
    from topokeeper.contract.operator_files import read_mapping  # noqa: PLC0415 (pydantic-core: not for --help)

    template = read_mapping(args.template, "--template")
    try:
        clusters = len(json.loads(_config_of(template)).get("clusters", [])) if _config_of(template) else 0
        cost = estimate(template, clusters)
    except (AttributeError, TypeError, ValueError) as error:  # a JSON file of another shape than cdk synth's
        if isinstance(error, InputError):
            raise
        raise InputError("--template", f"not a synthesized CloudFormation template: {error}") from None
    if args.json:
        document = {
            "prices": PRICES_AS_OF,
            "lines": [line.__dict__ for line in cost.lines],
            "drift_runs": cost.drift_runs,
            "drift_monthly": round(cost.drift_monthly, 4),
            "monthly": round(cost.monthly, 2),
        }
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(render(cost, clusters))
    return 0


def _config_of(template: dict[str, Any]) -> str:
    """The TOPOKEEPER_CONFIG a function of the template carries (the clusters the stack serves), or ''."""
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Lambda::Function":
            variables = resource.get("Properties", {}).get("Environment", {}).get("Variables", {})
            value = variables.get("TOPOKEEPER_CONFIG")
            if isinstance(value, str):
                return value
    return ""


def register(commands: Any) -> None:
    parser = commands.add_parser("cost", help="the monthly cost of a synthesized stack (make synth writes it)")
    parser.add_argument(
        "--template", type=Path, default=Path("cdk.out/Topokeeper.template.json"), help="the synthesized template"
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.set_defaults(run=_cmd_cost)
