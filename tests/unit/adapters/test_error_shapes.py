"""Error shapes the emulator cannot produce, through botocore's Stubber: what each adapter makes of them.

Every client is a real botocore client with its service model, so requests and responses are checked
against AWS's shapes; retries are off so each stubbed answer is used exactly once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.stub import ANY, Stubber

from tests.helpers import gb200_nodes, p5_nodes, snapshot
from tests.unit.service.test_ssm_channel import RecordingS3
from topokeeper.adapters.agent_channel import AgentChannel
from topokeeper.adapters.audit_trail import AuditTrail
from topokeeper.adapters.dynamodb import DynamoStateStore, cluster_key
from topokeeper.adapters.ssm_channel import SsmChannel
from topokeeper.contract.config import Settings
from topokeeper.contract.errors import ConcurrentUpdate, Permanent, Retryable, TopokeeperError
from topokeeper.contract.ports import AuditRecord, Channel, ClusterState, Outcome, PendingDelivery
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import Bundle, render
from topokeeper.service.audit import build_records
from topokeeper.wiring import runtime as runtime_module
from topokeeper.wiring.runtime import LambdaEnvironment, Runtime

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TABLE = "topokeeper-state"
HEAD_NODE = "i-0123456789abcdef0"
COMMAND_ID = "3f2b6a8e-1c4d-4e5f-9a0b-1c2d3e4f5a6b"
CHANNEL_ARN = "arn:aws:cloudtrail:us-east-1:123456789012:channel/01234567-89ab-cdef-0123-456789abcdef"
CLUSTER_ARN = "arn:aws:sagemaker:us-east-1:123456789012:cluster/a1b2c3d4e5f6"


# One session for every client: it caches the service models it loads (seconds for ec2 if loaded per test).
_SESSION = botocore.session.get_session()


def _client(service: str) -> Any:
    return _SESSION.create_client(
        service,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - a dummy credential; the Stubber answers every call
        config=Config(retries={"total_max_attempts": 1}),
    )


@pytest.fixture
def stubbed() -> Iterator[Any]:
    """``stubbed(service)`` -> (client, stubber); every queued answer must have been used by the end."""
    stubbers: list[Stubber] = []

    def make(service: str) -> tuple[Any, Stubber]:
        client = _client(service)
        stubber = Stubber(client)
        stubber.activate()
        stubbers.append(stubber)
        return client, stubber

    yield make
    for stubber in stubbers:
        stubber.assert_no_pending_responses()
        stubber.deactivate()


def _bundle() -> Bundle:
    return render(plan(snapshot({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(1)}))).bundle


# ---------------------------------------------------------------- SSM GetCommandInvocation


def test_invocation_not_yet_visible_is_pending(stubbed: Any) -> None:
    # GetCommandInvocation is eventually consistent right after SendCommand
    ssm, stubber = stubbed("ssm")
    stubber.add_client_error(
        "get_command_invocation",
        service_error_code="InvocationDoesNotExist",
        http_status_code=400,
        expected_params={"CommandId": COMMAND_ID, "InstanceId": HEAD_NODE},
    )
    channel = SsmChannel(ssm, RecordingS3(), "bucket", HEAD_NODE, cluster="test-cluster", now=lambda: NOW)

    result = channel.result(COMMAND_ID)

    assert (result.outcome, result.error) == (Outcome.PENDING, None)


@pytest.mark.parametrize("code", ["InvalidCommandId", "InvalidInstanceId", "AccessDeniedException"])
def test_other_invocation_errors_propagate(stubbed: Any, code: str) -> None:
    ssm, stubber = stubbed("ssm")
    stubber.add_client_error("get_command_invocation", service_error_code=code, http_status_code=400)
    channel = SsmChannel(ssm, RecordingS3(), "bucket", HEAD_NODE, cluster="test-cluster", now=lambda: NOW)

    with pytest.raises(TopokeeperError) as info:
        channel.result(COMMAND_ID)

    assert info.value.code == code and isinstance(info.value.__cause__, ClientError)


def _send_command_params() -> dict[str, Any]:
    return {"DocumentName": ANY, "Parameters": ANY, "TimeoutSeconds": ANY, "Comment": ANY}


def test_run_keeps_polling_through_invocation_does_not_exist(stubbed: Any) -> None:
    ssm, stubber = stubbed("ssm")
    stubber.add_response(
        "send_command", {"Command": {"CommandId": COMMAND_ID}}, {"InstanceIds": [HEAD_NODE], **_send_command_params()}
    )
    stubber.add_client_error("get_command_invocation", service_error_code="InvocationDoesNotExist")
    document = {"outcome": "in_sync", "applier_version": "1.0.0", "mode": "verify", "plan_sha256": "a" * 64}
    stubber.add_response(
        "get_command_invocation",
        {
            "CommandId": COMMAND_ID,
            "InstanceId": HEAD_NODE,
            "Status": "Success",
            "StandardOutputContent": json.dumps(document),
        },
    )
    waits: list[float] = []
    channel = SsmChannel(
        ssm, RecordingS3(), "bucket", HEAD_NODE, cluster="test-cluster", now=lambda: NOW, sleep=waits.append
    )

    result = channel.verify(_bundle())

    assert result.outcome is Outcome.IN_SYNC
    assert waits == [2]


# ---------------------------------------------------------------- AuditTrail


def _records() -> list[AuditRecord]:
    rendered = render(plan(snapshot({"p5": p5_nodes(8, partition="p5"), "gb": gb200_nodes(1)})))
    document = json.loads(rendered.files()["plan.json"])
    handle = {
        "channel": Channel.AGENT,
        "cluster": "test-cluster",
        "plan_sha256": rendered.sha256,
        "reference": "v1",
        "target": "s3://bucket/clusters/test-cluster/bundle.json",
        "sent_at": NOW,
    }
    return build_records(
        cluster_name="test-cluster",
        previous=None,
        desired=document,
        delivery=PendingDelivery.model_validate({"handle": handle, "generation": 1}),
        outcome=Outcome.APPLIED,
        error=None,
        completed_at=NOW,
    )


def _not_seen_yet(stubber: Stubber, records: list[AuditRecord]) -> None:
    for record in records:
        key = {"pk": {"S": f"AUDITID#{record.audit_id}"}, "sk": {"S": "AUDITID"}}
        stubber.add_response("get_item", {}, {"TableName": TABLE, "Key": key, "ConsistentRead": True})


def _trail(dynamodb: Any, events: Any, lake: Any | None = None) -> AuditTrail:
    return AuditTrail(
        dynamodb=dynamodb,
        table=TABLE,
        events=events,
        event_bus="default",
        retention=timedelta(days=365),
        logger=logging.getLogger("tests.audit"),
        cloudtrail_data=lake,
        channel_arn=CHANNEL_ARN if lake is not None else None,
    )


def test_put_events_with_failed_entries_raises_and_stores_nothing(stubbed: Any) -> None:
    # Given two new records, and EventBridge taking only the first
    records = _records()
    dynamodb, table_stub = stubbed("dynamodb")
    events, events_stub = stubbed("events")
    _not_seen_yet(table_stub, records)
    events_stub.add_response(
        "put_events",
        {
            "FailedEntryCount": 1,
            "Entries": [{"EventId": "11111111-2222-3333-4444-555555555555"}, {"ErrorCode": "InternalFailure"}],
        },
        {"Entries": ANY},
    )

    # When they are published, the error names the failure; no TransactWriteItems was stubbed, so none was made
    with pytest.raises(Retryable, match=r"PutEvents failed for 1 record\(s\): \['InternalFailure'\]"):
        _trail(dynamodb, events).publish(records)


def test_put_audit_events_with_failed_entries_is_logged_and_the_records_still_stored(
    stubbed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """CloudTrail Lake is optional (and closed to new customers): its failure must not strand a delivery."""
    records = _records()
    dynamodb, table_stub = stubbed("dynamodb")
    events, events_stub = stubbed("events")
    lake, lake_stub = stubbed("cloudtrail-data")
    _not_seen_yet(table_stub, records)
    events_stub.add_response("put_events", {"FailedEntryCount": 0, "Entries": [{"EventId": "e1"}, {"EventId": "e2"}]})
    lake_stub.add_response(
        "put_audit_events",
        {
            "successful": [{"id": records[0].audit_id, "eventID": "lake-1"}],
            "failed": [{"id": records[1].audit_id, "errorCode": "ValidationException", "errorMessage": "bad"}],
        },
        {"channelArn": CHANNEL_ARN, "auditEvents": ANY},
    )

    for _ in records:
        table_stub.add_response("transact_write_items", {})

    assert _trail(dynamodb, events, lake).publish(records) == len(records)
    assert "CloudTrail Lake PutAuditEvents failed" in caplog.text
    assert "['ValidationException']" in caplog.text


# ---------------------------------------------------------------- Runtime.cluster_name_of_arn


@pytest.fixture
def runtime_with(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Runtime whose ``client(service)`` is the given stubbed client (the cached factory is bypassed)."""

    def make(sagemaker: Any) -> Runtime:
        monkeypatch.setattr(runtime_module, "client", lambda service, region=None: sagemaker)
        settings = Settings.model_validate({"clusters": [{"name": "llm-train"}]})
        env = LambdaEnvironment(
            TOPOKEEPER_CONFIG=settings.to_env(),
            TABLE_NAME=TABLE,
            BUCKET_NAME="topokeeper-plans",
            QUEUE_URL="https://sqs.us-east-1.amazonaws.com/123456789012/topokeeper-work.fifo",
        )
        return Runtime(env=env, settings=settings)

    return make


def test_unknown_cluster_arn_resolves_to_none(stubbed: Any, runtime_with: Any) -> None:
    sagemaker, stubber = stubbed("sagemaker")
    stubber.add_client_error(
        "describe_cluster",
        service_error_code="ResourceNotFound",
        service_message=f"Cluster {CLUSTER_ARN} not found.",
        expected_params={"ClusterName": CLUSTER_ARN},
    )
    stubber.add_response("describe_cluster", _described("llm-train"), {"ClusterName": CLUSTER_ARN})
    runtime = runtime_with(sagemaker)

    assert runtime.cluster_name_of_arn(CLUSTER_ARN) is None
    assert runtime.cluster_name_of_arn(CLUSTER_ARN) == "llm-train"


def test_other_describe_cluster_errors_propagate(stubbed: Any, runtime_with: Any) -> None:
    sagemaker, stubber = stubbed("sagemaker")
    stubber.add_client_error("describe_cluster", service_error_code="AccessDeniedException", http_status_code=403)

    with pytest.raises(Permanent) as info:
        runtime_with(sagemaker).cluster_name_of_arn(CLUSTER_ARN)

    assert info.value.code == "AccessDeniedException"


def _described(name: str) -> dict[str, Any]:
    return {
        "ClusterArn": CLUSTER_ARN,
        "ClusterName": name,
        "ClusterStatus": "InService",
        "InstanceGroups": [],
    }


# ---------------------------------------------------------------- DynamoStateStore


def _save_params(version: int) -> dict[str, Any]:
    return {
        "TableName": TABLE,
        "Key": cluster_key("llm-train"),
        "UpdateExpression": "SET controller = :c, version = :next REMOVE slurm_nodes_gz",  # no node table known
        "ConditionExpression": "attribute_not_exists(version) OR version = :seen",
        "ExpressionAttributeValues": {":c": ANY, ":next": {"N": str(version + 1)}, ":seen": {"N": str(version)}},
    }


def test_save_conflict_is_a_concurrent_update(stubbed: Any) -> None:
    dynamodb, stubber = stubbed("dynamodb")
    stubber.add_client_error(
        "update_item", service_error_code="ConditionalCheckFailedException", expected_params=_save_params(4)
    )

    with pytest.raises(ConcurrentUpdate, match="llm-train"):
        DynamoStateStore(dynamodb, TABLE).save(ClusterState(cluster="llm-train", version=4))


@pytest.mark.parametrize("code", ["ResourceNotFoundException", "ValidationException", "AccessDeniedException"])
def test_other_save_errors_propagate(stubbed: Any, code: str) -> None:
    dynamodb, stubber = stubbed("dynamodb")
    stubber.add_client_error("update_item", service_error_code=code, expected_params=_save_params(0))

    with pytest.raises(Permanent) as info:
        DynamoStateStore(dynamodb, TABLE).save(ClusterState(cluster="llm-train"))

    assert info.value.code == code


def test_consume_triggers_ignores_only_a_conditional_failure(stubbed: Any) -> None:
    dynamodb, stubber = stubbed("dynamodb")
    stubber.add_client_error("update_item", service_error_code="ConditionalCheckFailedException")
    stubber.add_client_error("update_item", service_error_code="ResourceNotFoundException")
    store = DynamoStateStore(dynamodb, TABLE)

    store.consume_triggers("llm-train", 3)  # newer changes arrived: nothing to do
    with pytest.raises(Permanent, match="ResourceNotFoundException"):
        store.consume_triggers("llm-train", 3)


def test_marking_an_event_seen_propagates_errors(stubbed: Any) -> None:
    dynamodb, stubber = stubbed("dynamodb")
    stubber.add_client_error("put_item", service_error_code="ProvisionedThroughputExceededException")
    store = DynamoStateStore(dynamodb, TABLE)

    with pytest.raises(Retryable, match="ProvisionedThroughputExceededException"):
        store.mark_seen("event-1", NOW)


# ---------------------------------------------------------------- AgentChannel


def test_agent_verify_does_not_overwrite_when_the_bucket_refuses_to_answer(stubbed: Any) -> None:
    # A 403 on HeadObject (no s3:ListBucket, or a KMS denial) is not "missing": nothing is written
    s3, stubber = stubbed("s3")
    stubber.add_client_error("head_object", service_error_code="403", http_status_code=403)
    channel = AgentChannel(s3, "bucket", None, now=lambda: NOW, max_report_age=timedelta(minutes=30), verify_only=True)  # type: ignore[arg-type]

    with pytest.raises(TopokeeperError) as info:
        channel.verify(_bundle())

    assert info.value.code == "403"
