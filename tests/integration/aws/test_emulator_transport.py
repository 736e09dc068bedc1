"""The emulator's two ways in: botocore in this process (moto's handlers called without Flask) and HTTP (moto's
Flask application). The same request gets the same bytes from moto either way, and what the emulator refuses over
HTTP it refuses in process too. In process, botocore sets every SigV4 header but computes no signature (moto checks
none); over HTTP and in presigned URLs (which the emulator verifies) it signs in full."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from unittest.mock import patch
from urllib.parse import urlsplit

import botocore.auth
import pytest
from botocore import UNSIGNED
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError, NoCredentialsError
from botocore.httpsession import URLLib3Session
from moto.moto_api._internal import mock_random
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

from topokeeper.sim.aws.clock import ManualClock
from topokeeper.sim.aws.events import PUT_EVENTS_TOO_LARGE
from topokeeper.sim.aws.server import UNCOMPUTED_SIGNATURE, BackendDispatcher, InProcessTransport, MotoHandlers
from topokeeper.sim.aws_emulator import AwsEmulator

NO_RETRIES = Config(retries={"total_max_attempts": 1})
Answer = tuple[int, list[tuple[str, str]], bytes]


def _answer(response: AWSResponse) -> Answer:
    return response.status_code, list(response.headers.items()), response.content


def _bytes_body(request: AWSPreparedRequest) -> None:
    """A stream body read once would be empty the second time: keep it as bytes."""
    if request.body is not None and not isinstance(request.body, bytes | bytearray | str):
        request.body = request.body.read()


@pytest.fixture
def compare(aws: AwsEmulator) -> Iterator[Callable[[Any], list[tuple[str, Answer, Answer]]]]:
    """``compare(client)``: from then on each of the client's requests goes to moto twice, through its Flask
    application and through ``MotoHandlers``, from the same random seed (moto's ids); the client gets the second
    answer; the returned list collects (operation, Flask's answer, the handlers' answer)."""
    endpoint = urlsplit(aws.endpoint_url)
    host, port = str(endpoint.hostname), int(endpoint.port or 0)
    flask, handlers = (
        InProcessTransport(DomainDispatcherApplication(create_backend_app), host, port),  # moto's own, as it is
        InProcessTransport(MotoHandlers(BackendDispatcher(create_backend_app)), host, port),
    )
    compared: list[tuple[str, Answer, Answer]] = []

    def both(request: AWSPreparedRequest, event_name: str, **_: Any) -> AWSResponse | None:
        _bytes_body(request)
        mock_random.seed(13)
        via_flask = flask(request)
        mock_random.seed(13)
        via_handlers = handlers(request)
        assert via_flask is not None and via_handlers is not None
        compared.append((event_name.rsplit(".", 1)[-1], _answer(via_flask), _answer(via_handlers)))
        return via_handlers

    def start(client: Any) -> list[tuple[str, Answer, Answer]]:
        client.meta.events.register_first("before-send", both)
        return compared

    yield start


def test_moto_answers_in_process_with_the_bytes_its_flask_application_sends(
    aws: AwsEmulator, compare: Callable[[Any], list[tuple[str, Answer, Answer]]]
) -> None:
    dynamodb, sqs, s3, events, sts, ssm = (
        aws.client(name) for name in ("dynamodb", "sqs", "s3", "events", "sts", "ssm")
    )
    dynamodb.create_table(
        TableName="state",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    queue = sqs.create_queue(QueueName="work.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    empty = sqs.create_queue(QueueName="empty")["QueueUrl"]
    s3.create_bucket(Bucket="topokeeper-plans")
    ssm.put_parameter(Name="/topokeeper/config", Value="{}", Type="String")
    compared = [compare(client) for client in (dynamodb, sqs, s3, events, sts, ssm)][-1]  # one list for all

    # Each request below answers the same when it runs twice (once for each path), so both see the same state.
    key = {"pk": {"S": "CLUSTER#a"}, "sk": {"S": "STATE"}}
    item = {**key, "generation": {"N": "3"}, "table": {"B": b"\x00\x01"}, "names": {"SS": ["b", "a"]}}
    dynamodb.put_item(TableName="state", Item=item)
    dynamodb.get_item(TableName="state", Key=key, ConsistentRead=True)
    dynamodb.get_item(TableName="state", Key={**key, "sk": {"S": "MISSING"}})
    dynamodb.update_item(
        TableName="state",
        Key=key,
        UpdateExpression="SET last_event_at = :now, first_pending_at = if_not_exists(first_pending_at, :now)",
        ExpressionAttributeValues={":now": {"S": "2026-01-01T00:00:00+00:00"}},
        ReturnValues="ALL_NEW",
    )
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        dynamodb.update_item(
            TableName="state",
            Key=key,
            UpdateExpression="SET generation = :g",
            ConditionExpression="generation = :other",
            ExpressionAttributeValues={":g": {"N": "4"}, ":other": {"N": "9"}},
        )
    dynamodb.query(
        TableName="state", KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": "CLUSTER#a"}}
    )
    dynamodb.batch_get_item(RequestItems={"state": {"Keys": [key], "ProjectionExpression": "generation"}})
    dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": "state", "Item": item}}])
    dynamodb.describe_table(TableName="state")
    with pytest.raises(ClientError, match="ResourceNotFound"):
        dynamodb.describe_table(TableName="missing")

    sqs.send_message(QueueUrl=queue, MessageBody='{"cluster": "a"}', MessageGroupId="a", MessageDeduplicationId="a-1")
    sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])
    sqs.receive_message(QueueUrl=empty, WaitTimeSeconds=0)
    with pytest.raises(ClientError, match="ReceiptHandleIsInvalid"):
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle="not-a-handle", VisibilityTimeout=0)

    s3.put_object(Bucket="topokeeper-plans", Key="payloads/a b/plan.json", Body=b'{"plan": 1}')
    s3.get_object(Bucket="topokeeper-plans", Key="payloads/a b/plan.json")
    s3.head_object(Bucket="topokeeper-plans", Key="payloads/a b/plan.json")
    s3.list_objects_v2(Bucket="topokeeper-plans", Prefix="payloads/")
    with pytest.raises(ClientError, match="NoSuchKey"):
        s3.get_object(Bucket="topokeeper-plans", Key="missing.json")
    with pytest.raises(ClientError, match="404"):
        s3.head_object(Bucket="topokeeper-plans", Key="missing.json")

    events.put_events(Entries=[{"Source": "topokeeper", "DetailType": "Test", "Detail": json.dumps({"a": 1})}])
    sts.get_caller_identity()  # the query protocol: a form body
    ssm.get_parameter(Name="/topokeeper/config")

    assert len(compared) == 23
    for operation, via_flask, via_handlers in compared:
        assert via_handlers == via_flask, operation
    statuses = {status for _, (status, _, _), _ in compared}
    assert statuses == {200, 400, 404}  # answers and errors of both kinds were compared


def test_the_dispatcher_finds_each_hosts_backend_as_moto_does() -> None:
    ours, moto = BackendDispatcher(create_backend_app), DomainDispatcherApplication(create_backend_app)
    hosts = [
        None,
        "moto_api",
        "dynamodb",
        "sqs.us-east-1.amazonaws.com",
        "api.sagemaker.eu-west-1.amazonaws.com",
        "s3.us-east-1.amazonaws.com",
        "topokeeper-plans.s3.us-east-1.amazonaws.com",
        "unknown.example.com",
    ]
    for _ in range(2):  # found, then remembered
        assert [ours.get_backend_for_host(host) for host in hosts] == [moto.get_backend_for_host(h) for h in hosts]
    assert ours.get_backend_for_host("dynamodb") == "dynamodb"


def _over_http(request: AWSPreparedRequest) -> Answer:
    session = URLLib3Session()
    try:
        return _answer(session.send(request))
    finally:
        session.close()


def test_what_the_emulator_refuses_over_http_it_refuses_in_process(aws: AwsEmulator) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="topokeeper-plans")
    unsigned = aws.client("s3", config=Config(signature_version=UNSIGNED, retries={"total_max_attempts": 1}))
    events = aws.client("events", config=NO_RETRIES)
    sagemaker = aws.client("sagemaker", config=NO_RETRIES)
    over_http: list[tuple[int, str]] = []

    def also_over_http(request: AWSPreparedRequest, **_: Any) -> None:
        """The same request's bytes over HTTP first; then (None) the client's own transport, in process."""
        _bytes_body(request)
        status, _, body = _over_http(request)
        over_http.append((status, _error_code(body)))

    for client in (unsigned, events, sagemaker):
        client.meta.events.register_first("before-send", also_over_http)
    refused: list[dict[str, Any]] = []
    with pytest.raises(ClientError) as raised:  # an unsigned request to one of its buckets (moto would serve it)
        unsigned.put_object(Bucket="topokeeper-plans", Key="x.json", Body=b"{}")
    refused.append(raised.value.response)
    too_large = {"Source": "example", "DetailType": "Test", "Detail": json.dumps({"pad": "x" * (256 * 1024)})}
    with pytest.raises(ClientError) as raised:  # PutEvents of 256 KB or more (moto would take it)
        events.put_events(Entries=[too_large])
    refused.append(raised.value.response)
    assert raised.value.response["Error"]["Message"] == PUT_EVENTS_TOO_LARGE
    with pytest.raises(ClientError) as raised:  # the emulator's own HyperPod checks a name's pattern
        sagemaker.describe_cluster(ClusterName="bad_name!")
    refused.append(raised.value.response)

    in_process = [(response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]) for response in refused]
    assert (
        in_process == over_http == [(403, "AccessDenied"), (400, "ValidationException"), (400, "ValidationException")]
    )
    assert "Contents" not in s3.list_objects_v2(Bucket="topokeeper-plans")  # written neither way


def _error_code(body: bytes) -> str:
    """The error's code, from a JSON body (``__type``) or an XML one (``<Code>``)."""
    text = body.decode()
    if text.startswith("{"):
        return str(json.loads(text).get("__type", "")).rsplit("#", 1)[-1]
    start = text.find("<Code>")
    return text[start + 6 : text.find("</Code>")] if start >= 0 else ""


def _sent_headers(aws: AwsEmulator, service: str) -> dict[str, str]:
    """The headers of one request of a new ``service`` client, as botocore sent it (in process) at a fixed time."""
    client = aws.client(service, config=NO_RETRIES)
    seen: dict[str, str] = {}

    def capture(request: AWSPreparedRequest, **_: Any) -> None:
        seen.update({name: _text(value) for name, value in request.headers.items()})

    client.meta.events.register_first("before-send", capture)
    with patch("botocore.auth.get_current_datetime", return_value=datetime(2026, 12, 3, 9, 30)):
        client.list_buckets() if service == "s3" else client.list_queues()
    return seen


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.mark.parametrize("service", ["sqs", "s3"])
def test_in_process_requests_carry_every_signing_header_but_the_signature_is_not_computed(
    aws: AwsEmulator, service: str
) -> None:
    scope_only = _sent_headers(aws, service)
    with patch.dict(botocore.auth.AUTH_TYPE_MAPS, {"v4": SigV4Auth, "s3v4": S3SigV4Auth}):  # botocore's own
        full = _sent_headers(aws, service)
    authorization, _, signature = full.pop("Authorization").rpartition("Signature=")
    assert scope_only.pop("Authorization") == authorization + "Signature=" + UNCOMPUTED_SIGNATURE
    assert signature != UNCOMPUTED_SIGNATURE and len(signature) == 64
    del scope_only["amz-sdk-invocation-id"], full["amz-sdk-invocation-id"]  # a new uuid for each call
    assert scope_only == full  # X-Amz-Date, S3's X-Amz-Content-SHA256, ...
    assert "X-Amz-Date" in full and (service != "s3" or "X-Amz-Content-SHA256" in full)


def test_what_goes_over_http_or_is_presigned_is_signed_in_full(aws: AwsEmulator) -> None:
    # A signer for another endpoint (an account's, or the emulator over HTTP) computes the signature.
    signer = botocore.auth.AUTH_TYPE_MAPS["v4"](Credentials("testing", "testing"), "sqs", aws.region)
    request = AWSRequest(method="POST", url="http://127.0.0.1:1/", data=b"Action=ListQueues")
    signer.add_auth(request)
    assert not str(request.headers["Authorization"]).endswith(UNCOMPUTED_SIGNATURE)
    # A presigned URL is verified by the emulator: a signature that is not botocore's is refused.
    s3 = aws.client("s3", config=Config(signature_version="s3v4"))
    s3.create_bucket(Bucket="topokeeper-plans")
    s3.put_object(Bucket="topokeeper-plans", Key="plan.json", Body=b"{}")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "topokeeper-plans", "Key": "plan.json"})
    assert UNCOMPUTED_SIGNATURE not in url
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - the emulator on 127.0.0.1
        assert response.read() == b"{}"
    forged = url.replace(url.split("X-Amz-Signature=")[1][:64], UNCOMPUTED_SIGNATURE)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=30)  # noqa: S310
    assert refused.value.code == 403


def test_without_credentials_an_in_process_request_fails_as_botocore_fails(aws: AwsEmulator) -> None:
    for version, service in (("v4", "sqs"), ("s3v4", "s3")):
        signer = botocore.auth.AUTH_TYPE_MAPS[version](None, service, aws.region)
        with pytest.raises(NoCredentialsError):
            signer.add_auth(AWSRequest(method="GET", url=aws.endpoint_url + "/"))


def test_the_signer_table_is_botocores_again_once_the_emulator_stops(clock: ManualClock) -> None:
    originals = dict(botocore.auth.AUTH_TYPE_MAPS)
    with AwsEmulator(seed=7, clock=clock):
        assert botocore.auth.AUTH_TYPE_MAPS["v4"] is not originals["v4"]
        assert issubclass(botocore.auth.AUTH_TYPE_MAPS["s3v4"], originals["s3v4"])
    assert originals == botocore.auth.AUTH_TYPE_MAPS
