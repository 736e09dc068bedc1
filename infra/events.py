"""What triggers the functions: EventBridge rules with the package's patterns, and the drift schedule."""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import CfnResource, Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as scheduler_targets
from constructs import Construct

from infra.functions import Functions, head_nodes
from infra.nag import acknowledge, arn_of
from infra.queue import Queues
from topokeeper.contract.config import Settings
from topokeeper.contract.event_schemas import change_patterns, result_patterns

# EventBridge retries a failed delivery with backoff, then dead-letters it. A late change event is
# still worth a reconcile; a late result still belongs in the audit trail.
_RETRY_ATTEMPTS = 20
_CHANGE_MAX_AGE = Duration.hours(2)
_RESULT_MAX_AGE = Duration.hours(24)
# A missed drift check is replaced by the next one; retry briefly only.
_SCHEDULE_RETRY_ATTEMPTS = 2
_SCHEDULE_MAX_AGE = Duration.minutes(10)


def _field(value: Any) -> Any:
    # CDK types top-level fields as lists of strings; a prefix filter goes through its Match helper.
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict) and list(value[0]) == ["prefix"]:
        return events.Match.prefix(value[0]["prefix"])
    return value


def event_pattern(pattern: dict[str, Any]) -> events.EventPattern:
    """The package's pattern as CDK's EventPattern ("detail-type" -> detail_type), unchanged."""
    return events.EventPattern(**{key.replace("-", "_"): _field(value) for key, value in pattern.items()})


class Triggers(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, settings: Settings, functions: Functions, queues: Queues
    ) -> None:
        super().__init__(scope, construct_id)
        self.rules: dict[str, events.Rule] = {}
        self._add_rules(change_patterns(), functions.ingest, queues, _CHANGE_MAX_AGE, "a cluster may have changed")
        self._add_rules(
            result_patterns(head_nodes(settings)), functions.result, queues, _RESULT_MAX_AGE, "a delivery ended"
        )

        schedule_role = iam.Role(self, "DriftScheduleRole", assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"))
        # Scheduler dead-letters with this role (not as a service principal), so it needs the key too.
        queues.grant_send_event_dead_letters(schedule_role)
        self.drift_schedule = scheduler.Schedule(
            self,
            "DriftSchedule",
            description="topokeeper drift check of every managed cluster",
            schedule=scheduler.ScheduleExpression.expression(settings.drift_schedule),
            target=scheduler_targets.LambdaInvoke(
                functions.drift,
                role=schedule_role,
                input=scheduler.ScheduleTargetInput.from_object({}),  # DriftRequest: every cluster
                dead_letter_queue=queues.event_dlq,
                retry_attempts=_SCHEDULE_RETRY_ATTEMPTS,
                max_event_age=_SCHEDULE_MAX_AGE,
            ),
        )
        acknowledge(
            schedule_role,
            f"IAM5[Resource::{arn_of(cast(CfnResource, functions.drift.node.default_child))}:*]",
            "CDK's invoke grant also covers the drift function's versions and aliases; it invokes nothing else.",
        )

    def _add_rules(
        self,
        patterns: dict[str, dict[str, Any]],
        function: lambda_.IFunction,
        queues: Queues,
        max_event_age: Duration,
        meaning: str,
    ) -> None:
        for name, pattern in patterns.items():
            self.rules[name] = events.Rule(
                self,
                name,
                description=f"topokeeper {name}: {meaning}",
                event_pattern=event_pattern(pattern),
                targets=[
                    targets.LambdaFunction(
                        function,
                        dead_letter_queue=queues.event_dlq,
                        retry_attempts=_RETRY_ATTEMPTS,
                        max_event_age=max_event_age,
                    )
                ],
            )
