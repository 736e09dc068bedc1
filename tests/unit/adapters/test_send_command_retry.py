"""SendCommand's retry policy: sent once unless SSM answered with throttling (issue 11).

botocore's own retries would send SendCommand again after a read timeout, when the first request may have
created a command; a later attempt's error would then release the claim of a delivery that is running.
These tests run botocore's real HTTP stack (retries, timeouts) against a local SSM endpoint that answers,
throttles or hangs per request, and count the requests it received.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ReadTimeoutError

from tests.unit.service.test_ssm_channel import RecordingS3
from tests.unit.service.usecase_support import CLUSTER, HEAD_NODE, Controller
from topokeeper.adapters.aws import CLIENT_CONFIG, SEND_COMMAND_CONFIG
from topokeeper.adapters.ssm_channel import SEND_ATTEMPTS, SsmChannel
from topokeeper.contract.errors import Permanent, Retryable
from topokeeper.render.bundle import Bundle
from topokeeper.service.controller import reconcile
from topokeeper.service.reconcile import plan_cluster

COMMAND_ID = "0e8d3c0e-71f7-4491-898f-0123456789ab"
READ_TIMEOUT = Config(read_timeout=0.3, connect_timeout=1)


class SsmEndpoint(ThreadingHTTPServer):
    """Answers each SendCommand with the next of ``script``: "ok", "hang" (no answer within the client's read
    timeout), or an error code (HTTP 400, or 500 for InternalServerError)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[str] = []
        self.requests: list[str] = []  # the X-Amz-Target of each request
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: SsmEndpoint

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        target = self.headers.get("X-Amz-Target", "")
        self.server.requests.append(target)
        step = self.server.script.pop(0) if self.server.script else "ok"
        if step == "hang":
            self.server.release.wait(10)
            return
        if step == "ok":
            self._answer(200, {"Command": {"CommandId": COMMAND_ID, "Status": "Pending"}})
        else:
            self._answer(500 if step == "InternalServerError" else 400, {"__type": step, "message": step})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[SsmEndpoint]:
    server = SsmEndpoint()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def _ssm(endpoint: SsmEndpoint, config: Config) -> Any:
    return boto3.session.Session().client(
        "ssm",
        region_name="us-east-1",
        endpoint_url=endpoint.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - a dummy credential for the local endpoint
        config=config.merge(READ_TIMEOUT),
    )


def _channel(endpoint: SsmEndpoint, waits: list[float]) -> SsmChannel:
    ssm = _ssm(endpoint, CLIENT_CONFIG)
    sender = _ssm(endpoint, SEND_COMMAND_CONFIG)
    return SsmChannel(
        ssm,
        RecordingS3(),
        "bucket",
        HEAD_NODE,
        cluster=CLUSTER,
        now=lambda: datetime.now(UTC),
        sleep=waits.append,
        sender=sender,
    )


def _bundle() -> Bundle:
    controller = Controller()
    return plan_cluster(controller.cluster, controller.now_state(), controller.facts).bundle


SEND = "AmazonSSM.SendCommand"


def test_botocores_own_retry_would_send_the_command_again_after_a_read_timeout(endpoint: SsmEndpoint) -> None:
    """Why SendCommand has its own client: the default retry policy resends it (the control of the tests below)."""
    endpoint.script = ["hang", "ok"]
    retrying = _ssm(endpoint, CLIENT_CONFIG.merge(Config(retries={"mode": "adaptive", "total_max_attempts": 2})))
    retrying.send_command(InstanceIds=[HEAD_NODE], DocumentName="AWS-RunShellScript")
    assert endpoint.requests == [SEND, SEND]


def test_a_read_timeout_is_raised_after_one_request_never_resent(endpoint: SsmEndpoint) -> None:
    endpoint.script = ["hang", "ok"]
    waits: list[float] = []
    with pytest.raises(ReadTimeoutError):
        _channel(endpoint, waits).deliver(_bundle())
    assert (endpoint.requests, waits) == ([SEND], [])


def test_throttling_is_sent_again_with_backoff_and_delivers(endpoint: SsmEndpoint) -> None:
    endpoint.script = ["ThrottlingException", "ThrottlingException", "ok"]
    waits: list[float] = []
    handle = _channel(endpoint, waits).deliver(_bundle())
    assert handle.reference == COMMAND_ID
    assert (endpoint.requests, waits) == ([SEND] * 3, [1.0, 2.0])


def test_throttling_on_every_attempt_is_retryable_after_the_last(endpoint: SsmEndpoint) -> None:
    endpoint.script = ["ThrottlingException"] * SEND_ATTEMPTS
    waits: list[float] = []
    with pytest.raises(Retryable) as info:
        _channel(endpoint, waits).deliver(_bundle())
    assert info.value.code == "ThrottlingException"
    assert len(endpoint.requests) == SEND_ATTEMPTS and len(waits) == SEND_ATTEMPTS - 1


@pytest.mark.parametrize(
    ("code", "kind"),
    [("InvalidInstanceId", Retryable), ("AccessDeniedException", Permanent), ("InternalServerError", Retryable)],
)
def test_any_other_answer_is_raised_at_once(endpoint: SsmEndpoint, code: str, kind: type[Exception]) -> None:
    endpoint.script = [code]
    waits: list[float] = []
    with pytest.raises(kind):
        _channel(endpoint, waits).deliver(_bundle())
    assert (endpoint.requests, waits) == ([SEND], [])


def test_a_sender_that_retries_by_itself_is_refused(endpoint: SsmEndpoint) -> None:
    with pytest.raises(Permanent, match="SEND_COMMAND_CONFIG"):
        SsmChannel(
            _ssm(endpoint, CLIENT_CONFIG),
            RecordingS3(),
            "bucket",
            HEAD_NODE,
            cluster=CLUSTER,
            now=lambda: datetime.now(UTC),
        )
    assert endpoint.requests == []


def test_a_reconcile_whose_send_timed_out_keeps_its_claim(endpoint: SsmEndpoint) -> None:
    """The first request hangs (the command may exist) and a resend would have been refused: nothing resends,
    so nothing releases the claim; it waits for the command's result or the delivery timeout."""
    endpoint.script = ["hang", "ThrottlingException", "InvalidInstanceId"]
    controller = Controller()
    controller.channel = _channel(endpoint, [])  # type: ignore[assignment]
    with pytest.raises(ReadTimeoutError):
        reconcile(controller.change(), controller.deps())
    pending = controller.now_state().pending
    assert pending is not None and pending.handle.reference == ""
    assert endpoint.requests == [SEND]
