"""The two AWS services the agent calls, signed with SigV4: S3 (the bundle, the verify request, the placement
facts it puts) and EventBridge (the reports)."""

from __future__ import annotations

import datetime
import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, Optional

from topokeeper.agent.credentials import Clock, CredentialProvider
from topokeeper.agent.errors import AgentError
from topokeeper.agent.sigv4 import sign
from topokeeper.agent.transport import HttpResponse, NoRedirect, http_request
from topokeeper.wire import AgentConfig, agent_source, agent_verify_request_key

MAX_BUNDLE_BYTES = 256 * 1024 * 1024
MAX_EVENTS_RESPONSE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class S3Object:
    body: bytes
    etag: str
    version_id: Optional[str]


def _s3_error_code(body: bytes) -> str:
    match = re.search(rb"<Code>([^<]{1,100})</Code>", body)
    return match.group(1).decode("ascii", "replace") if match else ""


class Aws:
    """The two calls the agent makes, signed with SigV4."""

    def __init__(self, config: AgentConfig, credentials: CredentialProvider, clock: Clock) -> None:
        self._config = config
        self._credentials = credentials
        self._clock = clock
        self._opener = urllib.request.build_opener(NoRedirect)
        suffix = "amazonaws.com.cn" if config.region.startswith("cn-") else "amazonaws.com"
        if config.endpoint_url:
            endpoint = config.endpoint_url.rstrip("/")
            bucket_url = f"{endpoint}/{config.bucket}/"
            self.events_url = endpoint + "/"
        else:
            if "." in config.bucket:  # a dotted bucket name breaks the virtual host's TLS certificate
                bucket_url = f"https://s3.{config.region}.{suffix}/{config.bucket}/"
            else:
                bucket_url = f"https://{config.bucket}.s3.{config.region}.{suffix}/"
            self.events_url = f"https://events.{config.region}.{suffix}/"
        self._bucket_url = bucket_url
        self.object_url = bucket_url + urllib.parse.quote(config.key, safe="/")
        self.request_key = agent_verify_request_key(config.cluster, config.prefix)
        self.request_url = bucket_url + urllib.parse.quote(self.request_key, safe="/")

    def _send(
        self,
        service: str,
        method: str,
        url: str,
        headers: Dict[str, str],
        body: bytes,
        *,
        timeout: Optional[float] = None,
        max_bytes: Optional[int] = None,
    ) -> HttpResponse:
        now = datetime.datetime.fromtimestamp(self._clock(), datetime.timezone.utc)
        signed = sign(
            method,
            url,
            headers,
            body,
            service=service,
            region=self._config.region,
            credentials=self._credentials.get(),
            now=now,
        )
        return http_request(
            self._opener,
            method,
            url,
            signed,
            body or None,
            timeout=self._config.request_timeout_seconds if timeout is None else timeout,
            max_bytes=max_bytes or (MAX_BUNDLE_BYTES if service == "s3" else MAX_EVENTS_RESPONSE_BYTES),
        )

    def get(self, key: str, timeout: float, max_bytes: int) -> HttpResponse:
        """One signed GET of ``key`` in the bucket, any status returned (a node's registration entry)."""
        url = self._bucket_url + urllib.parse.quote(key, safe="/")
        return self._send("s3", "GET", url, {}, b"", timeout=timeout, max_bytes=max_bytes)

    def get_bundle_if_changed(self, etag: Optional[str]) -> Optional[S3Object]:
        """The object, or None when it still has ``etag`` (304)."""
        response = self._get_if_changed(self.object_url, etag)
        if response.status == 304:
            return None
        if response.status != 200:
            code = _s3_error_code(response.body)
            raise AgentError(f"GET s3://{self._config.bucket}/{self._config.key}: HTTP {response.status} {code}")
        return S3Object(response.body, response.headers.get("etag", ""), response.headers.get("x-amz-version-id"))

    def get_verify_request_if_changed(self, etag: Optional[str]) -> Optional[S3Object]:
        """The verify request, or None when unchanged (304) or absent (404, or 403 without s3:ListBucket)."""
        response = self._get_if_changed(self.request_url, etag)
        if response.status in (304, 403, 404):
            return None
        if response.status != 200:
            code = _s3_error_code(response.body)
            raise AgentError(f"GET s3://{self._config.bucket}/{self.request_key}: HTTP {response.status} {code}")
        return S3Object(response.body, response.headers.get("etag", ""), response.headers.get("x-amz-version-id"))

    def _get_if_changed(self, url: str, etag: Optional[str]) -> HttpResponse:
        headers = {"If-None-Match": etag} if etag else {}
        return self._send("s3", "GET", url, headers, b"")

    def put_object(self, key: str, body: bytes) -> None:
        """One signed PUT of ``key`` (JSON); no encryption header, so the bucket's default (its KMS key) applies,
        the only one its policy takes."""
        url = self._bucket_url + urllib.parse.quote(key, safe="/")
        response = self._send("s3", "PUT", url, {"Content-Type": "application/json"}, body)
        if response.status != 200:
            code = _s3_error_code(response.body)
            raise AgentError(f"PUT s3://{self._config.bucket}/{key}: HTTP {response.status} {code}")

    def put_event(self, detail_type: str, detail: Dict[str, Any]) -> None:
        entry = {
            "Source": agent_source(self._config.cluster),
            "DetailType": detail_type,
            "Detail": json.dumps(detail, sort_keys=True),
            "EventBusName": self._config.event_bus,
        }
        headers = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "AWSEvents.PutEvents"}
        body = json.dumps({"Entries": [entry]}).encode("utf-8")
        response = self._send("events", "POST", self.events_url, headers, body)
        try:
            answer = json.loads(response.body.decode("utf-8")) if response.body else {}
        except (ValueError, RecursionError):
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if response.status != 200:
            message = answer.get("message") or answer.get("Message") or ""
            raise AgentError(f"PutEvents: HTTP {response.status} {answer.get('__type', '')} {message}")
        if answer.get("FailedEntryCount", 0):
            entries = answer.get("Entries")
            failed = entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], dict) else {}
            raise AgentError(f"PutEvents: entry failed: {failed.get('ErrorCode')} {failed.get('ErrorMessage')}")
