"""topokeeper.contract.stack_spec against the synthesized template: the simulator builds its stack from those values
(sim/stack.py), so this one test is what keeps ``make demo`` and the deployed stack in agreement."""

from __future__ import annotations

import json
from typing import Any

from infra.functions import head_nodes
from tests.infra.conftest import Synthesized
from topokeeper.contract import stack_spec as spec
from topokeeper.contract.ports import METRICS_DIMENSION, METRICS_NAMESPACE


def _of_type(example: Synthesized, kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in example.resources.values() if r["Type"] == kind]


def _evaluation(properties: dict[str, Any]) -> spec.AlarmSpec:
    """What CloudWatch evaluates, read back from an AWS::CloudWatch::Alarm."""
    return spec.AlarmSpec(
        statistic=properties["Statistic"],
        period_seconds=properties["Period"],
        evaluation_periods=properties["EvaluationPeriods"],
        datapoints_to_alarm=properties.get("DatapointsToAlarm"),
        threshold=properties["Threshold"],
        comparison=spec.Comparison(properties["ComparisonOperator"]),
        missing=spec.MissingData(properties.get("TreatMissingData", "missing")),
    )


def test_the_stack_is_built_from_stack_spec(example: Synthesized) -> None:
    stack, settings = example.stack, example.settings

    table = example.resource(stack.state.table)["Properties"]
    assert table["KeySchema"] == [
        {"AttributeName": spec.PARTITION_KEY, "KeyType": "HASH"},
        {"AttributeName": spec.SORT_KEY, "KeyType": "RANGE"},
    ]
    assert {(d["AttributeName"], d["AttributeType"]) for d in table["AttributeDefinitions"]} == {
        (spec.PARTITION_KEY, spec.KEY_TYPE),
        (spec.SORT_KEY, spec.KEY_TYPE),
    }
    assert table["TimeToLiveSpecification"] == {"AttributeName": spec.TTL_ATTRIBUTE, "Enabled": True}
    assert table["BillingMode"] == spec.BILLING_MODE

    work = example.resource(stack.queues.work)["Properties"]
    assert work["FifoQueue"] is True
    assert work.get("ContentBasedDeduplication", False) is spec.WORK_CONTENT_BASED_DEDUPLICATION
    assert work["VisibilityTimeout"] == spec.WORK_VISIBILITY_TIMEOUT_SECONDS
    assert work["RedrivePolicy"]["maxReceiveCount"] == spec.WORK_MAX_RECEIVE_COUNT
    reconcile = example.resource(stack.functions.reconcile)["Properties"]
    assert reconcile["Timeout"] == spec.RECONCILE_TIMEOUT_SECONDS
    for name, queue in stack.queues.dead_letter_queues.items():
        properties = example.resource(queue)["Properties"]
        assert properties.get("FifoQueue", False) is spec.DEAD_LETTER_QUEUES_FIFO[name], name
        assert properties["MessageRetentionPeriod"] == spec.DEAD_LETTER_RETENTION_SECONDS, name

    rules = {name: example.resource(rule)["Properties"] for name, rule in stack.triggers.rules.items()}
    functions = {spec.INGEST: stack.functions.ingest, spec.RESULT: stack.functions.result}
    expected_rules = spec.rule_patterns(head_nodes(settings))
    assert sorted(rules) == sorted(name for patterns in expected_rules.values() for name in patterns)
    for function, patterns in expected_rules.items():
        for name, pattern in patterns.items():
            assert rules[name]["EventPattern"] == pattern, name
            (target,) = rules[name]["Targets"]
            assert target["Arn"] == {"Fn::GetAtt": [example.logical_id(functions[function]), "Arn"]}, name

    (schedule,) = _of_type(example, "AWS::Scheduler::Schedule")
    assert schedule["ScheduleExpression"] == settings.drift_schedule
    assert spec.drift_alarm_period_seconds(settings) == spec.schedule_rate_seconds(settings.drift_schedule)

    alarms = _of_type(example, "AWS::CloudWatch::Alarm")
    by_name = {json.dumps(a["AlarmName"], sort_keys=True): a for a in alarms}
    expected: dict[str, spec.AlarmSpec] = {}
    for cluster in settings.clusters:
        for metric, alarm in spec.cluster_alarms(settings, cluster).items():
            name = spec.cluster_alarm_name(stack.stack_name, cluster.name, metric)
            expected[json.dumps(name)] = alarm
            properties = by_name[json.dumps(name)]
            assert (properties["Namespace"], properties["MetricName"]) == (METRICS_NAMESPACE, metric.value)
            assert properties["Dimensions"] == [{"Name": METRICS_DIMENSION, "Value": cluster.name}]
    for queue in stack.queues.dead_letter_queues:
        expected[json.dumps(f"{stack.stack_name}-{queue}-Depth")] = spec.DEAD_LETTER_DEPTH_ALARM
    for function in stack.functions.by_name:
        expected[json.dumps(f"{stack.stack_name}-{function}-Errors")] = spec.FUNCTION_ERRORS_ALARM
        expected[json.dumps(f"{stack.stack_name}-{function}-Throttles")] = spec.FUNCTION_THROTTLES_ALARM
    assert sorted(by_name) == sorted(expected)
    for name, alarm in expected.items():
        assert _evaluation(by_name[name]) == alarm, name
