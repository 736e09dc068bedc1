"""The synthesized example stack, resource by resource (one synth per session, see conftest)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Match

from infra import constants as c
from infra.agent import agent_clusters, agent_policy_output
from infra.functions import head_nodes
from infra.registration import registration_policy_output
from tests.infra.conftest import Synthesized
from topokeeper.contract.constants import AUDIT_SOURCE
from topokeeper.contract.deployment import (
    OUTPUT_BUCKET,
    OUTPUT_DEAD_LETTER_QUEUE,
    OUTPUT_QUEUE,
    OUTPUT_RECONCILE_FUNCTION,
    OUTPUT_TABLE,
)
from topokeeper.contract.event_schemas import change_patterns, result_patterns
from topokeeper.contract.head_node_program import program_sha256
from topokeeper.contract.ports import METRICS_DIMENSION, METRICS_NAMESPACE, Metric
from topokeeper.wire import AGENT_SOURCE, agent_source
from topokeeper.wiring.runtime import LambdaEnvironment

pytestmark = pytest.mark.infra


def ref(example: Synthesized, construct: Any) -> dict[str, str]:
    return {"Ref": example.logical_id(construct)}


def arn(example: Synthesized, construct: Any) -> dict[str, list[str]]:
    return {"Fn::GetAtt": [example.logical_id(construct), "Arn"]}


def of_type(example: Synthesized, kind: str) -> dict[str, dict[str, Any]]:
    return {name: resource for name, resource in example.resources.items() if resource["Type"] == kind}


def statements(example: Synthesized, policy_type: str = "AWS::IAM::Policy") -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, resource in of_type(example, policy_type).items():
        found += [(name, statement) for statement in resource["Properties"]["PolicyDocument"]["Statement"]]
    return found


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def role_statements(example: Synthesized, role: Any) -> list[dict[str, Any]]:
    """The statements of the inline policies attached to ``role``."""
    attached = {"Ref": example.logical_id(role)}
    return [
        statement
        for policy in of_type(example, "AWS::IAM::Policy").values()
        if attached in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_state_table(example: Synthesized) -> None:
    table = example.resource(example.stack.state.table)

    assert table["DeletionPolicy"] == "Retain"
    properties = table["Properties"]
    assert properties["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert sorted(d["AttributeType"] for d in properties["AttributeDefinitions"]) == ["S", "S"]
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert properties["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert properties["SSESpecification"] == {
        "KMSMasterKeyId": arn(example, example.stack.key.key),
        "SSEEnabled": True,
        "SSEType": "KMS",
    }


def test_the_data_key_rotates_and_outlives_the_stack(example: Synthesized) -> None:
    key = example.resource(example.stack.key.key)

    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Retain"


def test_the_plan_bucket(example: Synthesized) -> None:
    bucket = example.resource(example.stack.plans.bucket)

    assert bucket["DeletionPolicy"] == "Retain"
    properties = bucket["Properties"]
    assert properties["VersioningConfiguration"] == {"Status": "Enabled"}
    assert properties["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "KMSMasterKeyID": arn(example, example.stack.key.key),
        "SSEAlgorithm": "aws:kms",
    }
    assert properties["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    rule, staged, results = properties["LifecycleConfiguration"]["Rules"]
    assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": example.settings.audit_retention_days}
    assert rule["Status"] == "Enabled" and "Prefix" not in rule
    # What one SSM command fetched (applier, large bundle) or PUT (a result too large for stdout) expires; plans
    # and audit evidence do not.
    for expiring, prefix in ((staged, "payloads/"), (results, "results/")):
        assert (expiring["Prefix"], expiring["ExpirationInDays"], expiring["Status"]) == (prefix, 1, "Enabled")
        assert expiring["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    example.template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": ref(example, example.stack.plans.bucket),
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            },
        },
    )


def test_the_fifo_work_queue_and_its_fifo_dlq(example: Synthesized) -> None:
    queues = example.stack.queues
    work = example.resource(queues.work)["Properties"]
    reconcile_timeout = example.resource(example.stack.functions.reconcile)["Properties"]["Timeout"]

    assert work["FifoQueue"] is True
    assert work["VisibilityTimeout"] >= 6 * reconcile_timeout
    assert work["RedrivePolicy"]["deadLetterTargetArn"] == arn(example, queues.work_dlq)
    assert example.resource(queues.work_dlq)["Properties"]["FifoQueue"] is True
    # EventBridge and Scheduler dead-letter only into standard queues.
    assert "FifoQueue" not in example.resource(queues.event_dlq)["Properties"]
    key = arn(example, example.stack.key.key)
    for queue in (queues.work, queues.work_dlq, queues.event_dlq):
        assert example.resource(queue)["Properties"]["KmsMasterKeyId"] == key


def test_four_arm64_functions_with_both_layers(example: Synthesized) -> None:
    powertools = example.template.to_json()["Parameters"]
    (parameter,) = [p for p in powertools.values() if p["Default"].startswith("/aws/service/powertools/")]
    assert parameter == {
        "Type": "AWS::SSM::Parameter::Value<String>",
        "Default": "/aws/service/powertools/python/arm64/python3.14/latest",
    }
    powertools_ref = {"Ref": next(name for name, p in powertools.items() if p is parameter)}

    functions = example.stack.functions.by_name
    assert sorted(functions) == sorted(c.FUNCTION_NAMES)
    for function in functions.values():
        properties = example.resource(function)["Properties"]
        assert properties["Runtime"] == "python3.14"
        assert properties["Architectures"] == ["arm64"]
        assert properties["Handler"] == "handler.lambda_handler"
        assert properties["Layers"] == [powertools_ref, ref(example, example.stack.layers.core)]


def test_the_environment_contract(example: Synthesized) -> None:
    stack, settings = example.stack, example.settings
    common = {
        "TOPOKEEPER_CONFIG": settings.to_env(),
        "TABLE_NAME": ref(example, stack.state.table),
        "BUCKET_NAME": ref(example, stack.plans.bucket),
        "QUEUE_URL": ref(example, stack.queues.work),
        "EVENT_BUS_NAME": "default",
        "POWERTOOLS_SERVICE_NAME": "topokeeper",
        "POWERTOOLS_METRICS_NAMESPACE": "topokeeper",
        "LOG_LEVEL": "INFO",
    }
    signing = {"SIGNING_KEY_ID": {"Fn::GetAtt": [example.logical_id(stack.signing_key.key), "Arn"]}}
    expected = {
        c.INGEST: common,
        c.RECONCILE: {**common, "DEAD_LETTER_QUEUE_URL": ref(example, stack.queues.work_dlq), **signing},
        c.RESULT: {**common, "AUDIT_RETENTION_DAYS": str(settings.audit_retention_days)},
        c.DRIFT: {**common, **signing},
    }
    handler_fields = {field.alias for field in LambdaEnvironment.model_fields.values()}
    for name, function in stack.functions.by_name.items():
        variables = example.resource(function)["Properties"]["Environment"]["Variables"]
        assert variables == expected[name], name
        # Every variable is one the handlers read (runtime.LambdaEnvironment) or Powertools' own.
        assert set(variables) - handler_fields <= {
            "POWERTOOLS_SERVICE_NAME",
            "POWERTOOLS_METRICS_NAMESPACE",
            "LOG_LEVEL",
        }


def test_log_groups_keep_the_configured_retention(example: Synthesized) -> None:
    groups = of_type(example, "AWS::Logs::LogGroup")
    assert len(groups) == len(c.FUNCTION_NAMES)
    for name, group in groups.items():
        assert group["Properties"]["RetentionInDays"] == example.settings.log_retention_days, name
    for function in example.stack.functions.by_name.values():
        log_group = example.resource(function)["Properties"]["LoggingConfig"]["LogGroup"]
        assert log_group["Ref"] in groups


def test_reconcile_is_fed_by_the_fifo_queue(example: Synthesized) -> None:
    (mapping,) = of_type(example, "AWS::Lambda::EventSourceMapping").values()

    assert mapping["Properties"]["EventSourceArn"] == arn(example, example.stack.queues.work)
    assert mapping["Properties"]["FunctionName"] == ref(example, example.stack.functions.reconcile)
    assert mapping["Properties"]["BatchSize"] == 10
    assert mapping["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_rules_use_the_package_patterns_verbatim(example: Synthesized) -> None:
    functions = example.stack.functions
    expected = {name: (pattern, functions.ingest) for name, pattern in change_patterns().items()}
    ssm_head_nodes = head_nodes(example.settings)
    assert ssm_head_nodes == ["i-0a1b2c3d4e5f60718"]
    expected |= {name: (pattern, functions.result) for name, pattern in result_patterns(ssm_head_nodes).items()}

    rules = example.stack.triggers.rules
    assert sorted(rules) == sorted(expected)
    assert len(of_type(example, "AWS::Events::Rule")) == len(expected)
    for name, (pattern, function) in expected.items():
        properties = example.resource(rules[name])["Properties"]
        assert properties["EventPattern"] == pattern, name
        (target,) = properties["Targets"]
        assert target["Arn"] == arn(example, function)
        assert target["DeadLetterConfig"] == {"Arn": arn(example, example.stack.queues.event_dlq)}
        assert target["RetryPolicy"]["MaximumRetryAttempts"] > 0
        assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] > 0


def test_the_drift_schedule(example: Synthesized) -> None:
    (schedule,) = of_type(example, "AWS::Scheduler::Schedule").values()

    properties = schedule["Properties"]
    assert properties["ScheduleExpression"] == example.settings.drift_schedule
    target = properties["Target"]
    assert target["Arn"] == arn(example, example.stack.functions.drift)
    assert json.loads(target["Input"]) == {}  # DriftRequest: every cluster
    assert target["DeadLetterConfig"] == {"Arn": arn(example, example.stack.queues.event_dlq)}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 0


def test_async_failures_of_event_driven_functions_are_kept(example: Synthesized) -> None:
    configs = of_type(example, "AWS::Lambda::EventInvokeConfig").values()
    targets = {config["Properties"]["FunctionName"]["Ref"] for config in configs}

    functions = example.stack.functions
    assert targets == {example.logical_id(f) for f in (functions.ingest, functions.result, functions.drift)}
    for config in configs:
        destination = config["Properties"]["DestinationConfig"]["OnFailure"]["Destination"]
        assert destination == arn(example, example.stack.queues.event_dlq)


def alarms_by_metric(example: Synthesized) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for alarm in of_type(example, "AWS::CloudWatch::Alarm").values():
        properties = alarm["Properties"]
        dimensions = {d["Name"]: d["Value"] for d in properties.get("Dimensions", [])}
        subject = dimensions.get(METRICS_DIMENSION) or json.dumps(dimensions, sort_keys=True)
        found[(properties["MetricName"], subject)] = properties
    return found


def test_per_cluster_drift_and_apply_failure_alarms(example: Synthesized) -> None:
    alarms = alarms_by_metric(example)
    topic = ref(example, example.stack.monitoring.topic)

    for cluster in example.settings.clusters:
        drift = alarms[(Metric.TOPOLOGY_DRIFT, cluster.name)]
        assert drift["Namespace"] == METRICS_NAMESPACE
        assert drift["Statistic"] == "Maximum"
        assert drift["Period"] == 900  # one period per drift check of rate(15 minutes)
        assert drift["EvaluationPeriods"] == example.settings.drift_alarm_periods
        assert (drift["ComparisonOperator"], drift["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
        assert drift["AlarmActions"] == [topic]

        failures = alarms[(Metric.APPLY_FAILURES, cluster.name)]
        assert failures["Namespace"] == METRICS_NAMESPACE
        assert failures["Statistic"] == "Sum"
        assert (failures["ComparisonOperator"], failures["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
        assert failures["AlarmActions"] == [topic]


def test_dlq_depth_and_function_error_and_throttle_alarms(example: Synthesized) -> None:
    alarms = list(of_type(example, "AWS::CloudWatch::Alarm").values())
    topic = ref(example, example.stack.monitoring.topic)

    depth = [a["Properties"] for a in alarms if a["Properties"]["MetricName"] == "ApproximateNumberOfMessagesVisible"]
    queues = example.stack.queues
    assert sorted(json.dumps(a["Dimensions"][0]["Value"]) for a in depth) == sorted(
        json.dumps({"Fn::GetAtt": [example.logical_id(q), "QueueName"]}) for q in (queues.work_dlq, queues.event_dlq)
    )
    for alarm in depth:
        assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 0)

    for metric in ("Errors", "Throttles"):
        watched = [a["Properties"] for a in alarms if a["Properties"]["MetricName"] == metric]
        assert sorted(a["Dimensions"][0]["Value"]["Ref"] for a in watched) == sorted(
            example.logical_id(f) for f in example.stack.functions.by_name.values()
        )
    assert all(a["Properties"]["AlarmActions"] == [topic] for a in alarms)
    per_cluster = 3 * len(example.settings.clusters) + 2 * len(agent_clusters(example.settings))
    per_cluster += sum(cluster.alarm_on_managed_topology_updates for cluster in example.settings.clusters)
    assert len(alarms) == per_cluster + 2 + 2 * len(c.FUNCTION_NAMES)


def test_agent_clusters_alarm_on_outdated_agents_and_forged_reports(example: Synthesized) -> None:
    alarms = alarms_by_metric(example)
    topic = ref(example, example.stack.monitoring.topic)

    assert agent_clusters(example.settings) == ["llm-train"]
    for metric in (Metric.AGENT_OUTDATED, Metric.FORGED_REPORTS):
        assert (metric, "cfd-pcluster") not in alarms  # an SSM cluster has no agent
        alarm = alarms[(metric, "llm-train")]
        assert (alarm["Namespace"], alarm["Statistic"]) == (METRICS_NAMESPACE, "Sum")
        assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
        assert alarm["AlarmActions"] == [topic]


def test_the_alarm_topic_is_encrypted_and_mails_the_operator(example: Synthesized) -> None:
    topic = example.resource(example.stack.monitoring.topic)["Properties"]

    assert topic["KmsMasterKeyId"] == arn(example, example.stack.key.key)
    example.template.has_resource_properties(
        "AWS::SNS::Subscription",
        {
            "Protocol": "email",
            "Endpoint": example.settings.alarm_email,
            "TopicArn": ref(example, example.stack.monitoring.topic),
        },
    )


PLACEMENT_METRICS = (
    Metric.LARGEST_PLACEABLE_JOB_NODES,
    Metric.JOBS_SPREAD_BEYOND_NEED,
    Metric.TOPOLOGY_PENDING_SECONDS,
    Metric.PLACEMENT_FACTS_FAILURES,
)


def test_the_dashboard_has_a_row_per_cluster(example: Synthesized) -> None:
    (dashboard,) = of_type(example, "AWS::CloudWatch::Dashboard").values()
    text = "".join(part for part in dashboard["Properties"]["DashboardBody"]["Fn::Join"][1] if isinstance(part, str))

    for cluster in example.settings.clusters:
        assert f"## {cluster.name}" in text
        for metric in Metric:
            login_only = metric in (Metric.LOGIN_TARGETS_HEALTHY, Metric.LOGIN_TARGETS_DRIFT)  # test_login_endpoint
            alarm_only = (Metric.APPLY_FAILURES, Metric.AGENT_OUTDATED, Metric.FORGED_REPORTS, Metric.BUNDLE_REFUSALS)
            # Per partition, and only with placement_metrics (tests/infra/test_placement_alarms.py).
            placement = metric in PLACEMENT_METRICS
            if metric not in alarm_only and not login_only and not placement:
                assert f'"{METRICS_NAMESPACE}","{metric}","{METRICS_DIMENSION}","{cluster.name}"' in text, metric


def test_send_command_only_with_run_shell_script_and_only_on_the_configured_tagged_head_nodes(
    example: Synthesized,
) -> None:
    def partition_arn(*parts: Any) -> dict[str, Any]:
        return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, *parts]]}

    document = partition_arn(":ssm:", {"Ref": "AWS::Region"}, "::document/AWS-RunShellScript")
    instances = partition_arn(
        ":ec2:", {"Ref": "AWS::Region"}, ":", {"Ref": "AWS::AccountId"}, ":instance/i-0a1b2c3d4e5f60718"
    )
    tagged = {"StringEquals": {"ssm:resourceTag/topokeeper:head-node": "true"}}
    expected = [
        {"Action": "ssm:SendCommand", "Effect": "Allow", "Resource": document},
        {"Action": "ssm:SendCommand", "Condition": tagged, "Effect": "Allow", "Resource": instances},
    ]

    for name, function in example.stack.functions.by_name.items():
        send = [s for s in role_statements(example, function.role) if "ssm:SendCommand" in listed(s["Action"])]
        assert send == (expected if name in (c.RECONCILE, c.DRIFT) else []), name


def test_no_statement_allows_commands_or_writes_on_every_resource(example: Synthesized) -> None:
    unscoped = {
        action
        for _, statement in statements(example) + statements(example, "AWS::IAM::ManagedPolicy")
        if "*" in listed(statement["Resource"])
        for action in listed(statement["Action"])
    }

    assert unscoped == {"ec2:DescribeInstances", "ec2:DescribeInstanceTopology", "ssm:GetCommandInvocation"}


def test_each_function_role_holds_only_what_its_adapters_call(example: Synthesized) -> None:
    table = {"dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query"} | {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:BatchWriteItem",
    }
    key = {"kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey"}
    logs = {"logs:CreateLogStream", "logs:PutLogEvents"}
    bucket_read = {"s3:ListBucket", "s3:GetObject"}
    facts = {"sagemaker:DescribeCluster", "sagemaker:ListClusterNodes", "sagemaker:DescribeClusterNode"} | {
        "ec2:DescribeInstanceTopology",
        "ec2:DescribeInstances",
    }
    commands = {"ssm:SendCommand", "ssm:GetCommandInvocation"}
    sign = {"kms:Sign", "kms:GetPublicKey"}  # the bundle-signing key
    consume = {"sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueUrl", "sqs:DeleteMessage"}
    expected = {
        c.INGEST: logs | table | key | {"sqs:SendMessage", "sagemaker:DescribeCluster", "ec2:DescribeInstances"},
        c.RECONCILE: logs
        | table
        | key
        | bucket_read
        | {"s3:PutObject", "sqs:SendMessage"}
        | {"s3:DeleteObject"}  # a terminated instance's registration entry (the example's EC2 cluster)
        | facts
        | commands
        | sign
        | consume
        | {"sqs:GetQueueAttributes"},
        c.RESULT: logs
        | table
        | key
        | bucket_read
        # ChangeMessageVisibility: a result resumes the reconcile message deferred behind its delivery.
        | {"sqs:SendMessage", "sqs:ChangeMessageVisibility", "events:PutEvents", "ssm:GetCommandInvocation"},
        c.DRIFT: logs | table | key | bucket_read | {"s3:PutObject", "sqs:SendMessage"} | facts | commands | sign,
    }
    for name, function in example.stack.functions.by_name.items():
        granted = {action for s in role_statements(example, function.role) for action in listed(s["Action"])}
        assert granted == expected[name], name


def test_events_are_put_only_on_the_default_bus_with_our_own_sources(example: Synthesized) -> None:
    put = [
        s
        for _, s in statements(example) + statements(example, "AWS::IAM::ManagedPolicy")
        if "events:PutEvents" in listed(s["Action"])
    ]

    assert sorted(json.dumps(s["Condition"]["StringEquals"]["events:source"]) for s in put) == sorted(
        [json.dumps([agent_source("llm-train"), AGENT_SOURCE]), json.dumps(AUDIT_SOURCE)]
    )
    for statement in put:
        assert statement["Resource"]["Fn::Join"][1][-1] == ":event-bus/default"


def test_the_agent_policy_reads_only_its_clusters_bundles(example: Synthesized) -> None:
    managed = of_type(example, "AWS::IAM::ManagedPolicy")
    registration = example.logical_id(example.stack.registration.policies["cfd-pcluster"])
    (policy,) = [resource for name, resource in managed.items() if name != registration]
    assert policy == example.resource(example.stack.agent.policies["llm-train"])
    by_sid = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}

    bucket = arn(example, example.stack.plans.bucket)
    assert by_sid["FetchBundles"]["Action"] == "s3:GetObject"
    assert by_sid["FetchBundles"]["Resource"] == [
        {"Fn::Join": ["", [bucket, f"/clusters/llm-train/{name}"]]}
        for name in ("bundle.json", "verify-request.json", "verify.json")
    ]
    sources = [agent_source("llm-train"), AGENT_SOURCE]
    assert by_sid["ReportResults"]["Condition"] == {"StringEquals": {"events:source": sources}}


def test_outputs_for_operators_and_the_cli(example: Synthesized) -> None:
    outputs = example.template.to_json()["Outputs"]
    stack = example.stack

    assert outputs[OUTPUT_TABLE]["Value"] == ref(example, stack.state.table)
    assert outputs[OUTPUT_BUCKET]["Value"] == ref(example, stack.plans.bucket)
    assert outputs[OUTPUT_QUEUE]["Value"] == ref(example, stack.queues.work)
    assert outputs[OUTPUT_DEAD_LETTER_QUEUE]["Value"] == ref(example, stack.queues.work_dlq)
    assert outputs[OUTPUT_RECONCILE_FUNCTION]["Value"] == ref(example, stack.functions.reconcile)
    assert outputs[agent_policy_output("llm-train")]["Value"] == ref(example, stack.agent.policies["llm-train"])
    registration = stack.registration.policies["cfd-pcluster"]
    assert outputs[registration_policy_output("cfd-pcluster")]["Value"] == ref(example, registration)
    # What an operator checks a copy of the head-node program against (sha256sum), computed at synth.
    assert outputs["HeadNodeProgramSha256"]["Value"] == program_sha256()
