"""The agent signs its own requests and fetches its own credentials: checked against botocore and a local IMDS."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from topokeeper.agent.aws import Aws
from topokeeper.agent.credentials import (
    CREDENTIAL_REFRESH_SECONDS,
    CredentialProvider,
    Credentials,
    fetch_role_credentials,
)
from topokeeper.agent.errors import AgentError
from topokeeper.agent.sigv4 import sign
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, AgentConfig, agent_source

NOW = datetime(2026, 3, 14, 15, 9, 26, tzinfo=UTC)
CREDENTIALS = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "FwoGZXIvYXdzEJr//token=")
# Each character here needs URI encoding in a key: space, +, =, ü, &, and a colon.
AWKWARD_PREFIX = "team a/tôpo+keeper=1&x:y"


def _botocore_headers(
    auth: type[SigV4Auth], service: str, method: str, url: str, headers: dict[str, str], body: bytes
) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    botocore_credentials = BotoCredentials(CREDENTIALS.access_key, CREDENTIALS.secret_key, CREDENTIALS.token)
    auth(botocore_credentials, service, "us-west-2").add_auth(request)
    return dict(request.headers.items())


@pytest.fixture(autouse=True)
def _frozen_botocore_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))


@pytest.mark.parametrize("endpoint_url", [None, "http://127.0.0.1:5055"])
def test_s3_conditional_get_is_signed_as_botocore_signs_it(endpoint_url: str | None) -> None:
    config = AgentConfig(
        cluster="llm-train-slurm",
        bucket="topo-bundles",
        region="us-west-2",
        prefix=AWKWARD_PREFIX,
        endpoint_url=endpoint_url,
    )
    url = Aws(config, CredentialProvider(1.0), clock=NOW.timestamp).object_url
    headers = {"If-None-Match": '"9b2cf535f27731c974343645a3985328"'}

    ours = sign("GET", url, headers, b"", service="s3", region="us-west-2", credentials=CREDENTIALS, now=NOW)
    theirs = _botocore_headers(S3SigV4Auth, "s3", "GET", url, headers, b"")

    for name in ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256", "X-Amz-Security-Token"):
        assert ours[name] == theirs[name], name
    assert "if-none-match" in ours["Authorization"]  # the condition is signed too


def test_s3_key_is_encoded_as_boto3_encodes_it() -> None:
    config = AgentConfig(cluster="llm-train-slurm", bucket="topo-bundles", region="us-west-2", prefix=AWKWARD_PREFIX)
    url = Aws(config, CredentialProvider(1.0), clock=NOW.timestamp).object_url
    s3 = boto3.client("s3", region_name="us-west-2", aws_access_key_id="a", aws_secret_access_key="b")  # noqa: S106
    presigned = s3.generate_presigned_url("get_object", Params={"Bucket": "topo-bundles", "Key": config.key})
    assert urllib.parse.urlsplit(url).path == urllib.parse.urlsplit(presigned).path
    assert url.startswith("https://topo-bundles.s3.us-west-2.amazonaws.com/")
    assert config.key == f"{AWKWARD_PREFIX}/llm-train-slurm/bundle.json"


def test_eventbridge_put_events_is_signed_as_botocore_signs_it() -> None:
    url = "https://events.us-west-2.amazonaws.com/"
    headers = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "AWSEvents.PutEvents"}
    body = json.dumps(
        {
            "Entries": [
                {"Source": agent_source("llm-train-slurm"), "DetailType": AGENT_APPLY_DETAIL_TYPE, "Detail": "{}"}
            ]
        }
    ).encode()

    ours = sign("POST", url, headers, body, service="events", region="us-west-2", credentials=CREDENTIALS, now=NOW)
    theirs = _botocore_headers(SigV4Auth, "events", "POST", url, headers, body)

    for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
        assert ours[name] == theirs[name], name
    assert "X-Amz-Content-SHA256" not in ours and "X-Amz-Content-SHA256" not in theirs


def test_without_a_session_token_none_is_sent() -> None:
    keys_only = Credentials(CREDENTIALS.access_key, CREDENTIALS.secret_key)
    url = "https://events.us-west-2.amazonaws.com/"
    ours = sign("POST", url, {}, b"{}", service="events", region="us-west-2", credentials=keys_only, now=NOW)
    request = AWSRequest(method="POST", url=url, headers={}, data=b"{}")
    SigV4Auth(BotoCredentials(keys_only.access_key, keys_only.secret_key), "events", "us-west-2").add_auth(request)
    assert ours["Authorization"] == request.headers["Authorization"]
    assert "X-Amz-Security-Token" not in ours


# --- IMDSv2 ----------------------------------------------------------------------------------------


class _Imds(BaseHTTPRequestHandler):
    """IMDSv2 as EC2 serves it: no token, no answer."""

    token = "imds-token-1"  # noqa: S105 (a fake IMDS)
    accepted = token
    role = "topokeeper-head-node"
    requests: list[tuple[str, str, str | None]] = []  # noqa: RUF012 (reset by the fixture)

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        self.requests.append(("PUT", self.path, self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")))
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._reply(400, "")
        else:
            self._reply(200, self.token)

    def do_GET(self) -> None:
        self.requests.append(("GET", self.path, self.headers.get("X-aws-ec2-metadata-token")))
        base = "/latest/meta-data/iam/security-credentials/"
        if self.headers.get("X-aws-ec2-metadata-token") != self.accepted:
            self._reply(401, "")
        elif self.path == base:
            self._reply(200, self.role + "\n")
        elif self.path == base + self.role:
            document = {
                "Code": "Success",
                "Type": "AWS-HMAC",
                "AccessKeyId": "ASIAROLE",
                "SecretAccessKey": "role-secret",
                "Token": "role-session-token",
                "Expiration": "2026-03-14T21:09:26Z",
            }
            self._reply(200, json.dumps(document))
        else:
            self._reply(404, "")


@pytest.fixture
def imds(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Imds]]:
    _Imds.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}/")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # IMDS must never go through a proxy
    try:
        yield _Imds
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_role_credentials_come_from_imdsv2_with_the_token_on_every_read(imds: type[_Imds]) -> None:
    now = [datetime(2026, 3, 14, 15, 9, 26, tzinfo=UTC).timestamp()]
    provider = CredentialProvider(timeout=2.0, clock=lambda: now[0])

    credentials = provider.get()

    assert credentials == Credentials(
        "ASIAROLE", "role-secret", "role-session-token", datetime(2026, 3, 14, 21, 9, 26, tzinfo=UTC).timestamp()
    )
    assert [(method, path) for method, path, _ in imds.requests] == [
        ("PUT", "/latest/api/token"),
        ("GET", "/latest/meta-data/iam/security-credentials/"),
        ("GET", "/latest/meta-data/iam/security-credentials/topokeeper-head-node"),
    ]
    assert all(header == imds.token for method, _, header in imds.requests if method == "GET")


def test_role_credentials_are_cached_then_refreshed_before_they_expire(imds: type[_Imds]) -> None:
    expiration = datetime(2026, 3, 14, 21, 9, 26, tzinfo=UTC).timestamp()
    now = [expiration - 3600]
    provider = CredentialProvider(timeout=2.0, clock=lambda: now[0])
    provider.get()
    provider.get()
    assert sum(method == "PUT" for method, _, _ in imds.requests) == 1  # cached

    now[0] = expiration - CREDENTIAL_REFRESH_SECONDS + 1
    provider.get()
    assert sum(method == "PUT" for method, _, _ in imds.requests) == 2  # refreshed ahead of expiry


def test_environment_credentials_win_over_the_role(imds: type[_Imds], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    assert CredentialProvider(timeout=2.0).get() == Credentials("AKIDENV", "env-secret", None)
    assert imds.requests == []


def test_imds_that_refuses_the_token_is_an_agent_error(imds: type[_Imds], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imds, "accepted", "another-token")
    with pytest.raises(AgentError, match="401"):
        fetch_role_credentials(timeout=2.0)
