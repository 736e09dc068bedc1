#!/usr/bin/env python3
"""topokeeper head-node pull agent (standard library only, Python 3.8+).

SSM SendCommand cannot address HyperPod nodes (it only takes i-/mi- ids), so the head node pulls. Each
cycle asks S3 for the cluster's desired bundle with If-None-Match (an unchanged object costs one 304),
runs the applier next to this file on a new one, runs ``verify`` on a slower cadence, and reports every
result as an EventBridge event. A verify request (``verify-request.json`` beside the bundle, polled the same
way) asks for a verify at once: the backend writes one when HyperPod changed the topology itself, and the
report echoes its ``verify_request`` id. This file is copied to the head node as is and imports nothing from
topokeeper.

    agent.py --config /etc/topokeeper/agent.json [--once]

IAM for the node's role (the HyperPod instance group's execution role; one role per cluster):
    s3:GetObject      on arn:aws:s3:::BUCKET/PREFIX/CLUSTER/bundle.json (verify.json in verify mode)
                      and arn:aws:s3:::BUCKET/PREFIX/CLUSTER/verify-request.json
    events:PutEvents  on arn:aws:events:REGION:ACCOUNT:event-bus/BUS
                      with the condition events:source = topokeeper.agent.CLUSTER (the source it sends)
    kms:Decrypt on the bucket's key, only if it uses SSE-KMS with a customer managed key.
Without s3:ListBucket a missing bundle answers 403 instead of 404; both are logged and retried. A missing
verify request (404 or 403) is the usual case and only means nobody asked.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import datetime
import fcntl
import hashlib
import hmac
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

# Each cluster's agent reports as SOURCE_PREFIX.<cluster>: the receiver takes the cluster from the source,
# which the cluster's IAM policy pins, never from the detail.
SOURCE_PREFIX = "topokeeper.agent"
APPLY_RESULT = "Topology Apply Result"
VERIFY_RESULT = "Topology Verify Result"
# The newest bundle schema this agent understands. A newer one is refused as "agent_outdated": the
# install script that shipped this file must be re-run to get an agent (and applier) that knows it.
BUNDLE_SCHEMA_NAME = "topokeeper.bundle"
BUNDLE_SCHEMA_VERSION = 2
BUNDLE_SCHEMA = f"{BUNDLE_SCHEMA_NAME}/{BUNDLE_SCHEMA_VERSION}"
AGENT_OUTDATED = "agent_outdated"

MAX_BUNDLE_BYTES = 256 * 1024 * 1024
MAX_VERIFY_REQUEST_BYTES = 64 * 1024
MAX_EVENTS_RESPONSE_BYTES = 1024 * 1024
# PutEvents takes at most 256 KiB per request; one entry per request leaves room for the envelope.
MAX_DETAIL_BYTES = 200 * 1024
# Reports that could not be sent wait in the state file for the next cycle; the newest are kept.
MAX_OUTBOX = 20
# Role credentials are replaced this long before they expire, so a request never carries stale ones.
CREDENTIAL_REFRESH_SECONDS = 600

EXIT_OK = 0
EXIT_CRASHED = 1
EXIT_BAD_CONFIG = 2

Clock = Callable[[], float]


class AgentError(Exception):
    """A failure of one cycle's step: logged, and the step is tried again next cycle."""


class BundleRefused(Exception):
    """The downloaded bundle must not reach the applier."""

    outcome = "refused"


class AgentOutdated(BundleRefused):
    """The bundle is of a newer schema than this agent knows: only an upgrade helps."""

    outcome = AGENT_OUTDATED


def event_source(cluster: str) -> str:
    return SOURCE_PREFIX + "." + cluster


def log(event: str, level: str = "info", **details: Any) -> None:
    record: Dict[str, Any] = {
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "level": level,
        "event": event,
    }
    record.update(details)
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()


# --- configuration ---------------------------------------------------------------------------------


DEFAULT_PREFIX = "clusters"
# The applier's channel timeout and SIGTERM grace: mirrors of applier.CHANNEL_TIMEOUT_SECONDS and
# TERMINATE_GRACE_SECONDS (this file imports nothing of the package; tests check that they agree).
APPLIER_TIMEOUT_SECONDS = 600.0
TERMINATE_GRACE_SECONDS = 15.0
MODES = ("enforce", "verify")


def object_key(prefix: str, cluster: str, mode: str) -> str:
    """Where the desired bundle lives: ``bundle.json`` to apply, ``verify.json`` to verify only."""
    name = "bundle.json" if mode == "enforce" else "verify.json"
    return "/".join(part for part in (prefix.strip("/"), cluster, name) if part)


def verify_request_key(prefix: str, cluster: str) -> str:
    """Where the backend asks for a verify at once (beside the bundle)."""
    return "/".join(part for part in (prefix.strip("/"), cluster, "verify-request.json") if part)


@dataclass(frozen=True)
class Config:
    cluster: str
    bucket: str
    region: str
    prefix: str = DEFAULT_PREFIX
    # verify: the bundle is only ever verified against, never applied (HyperPod manages the topology).
    mode: str = "enforce"
    event_bus: str = "default"
    endpoint_url: Optional[str] = None  # one endpoint for S3 (path style) and EventBridge: tests, emulators
    poll_interval_seconds: float = 60.0
    verify_interval_seconds: float = 900.0
    applier: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "applier.py")
    state_dir: str = "/var/lib/topokeeper"
    applier_timeout_seconds: float = APPLIER_TIMEOUT_SECONDS
    request_timeout_seconds: float = 15.0
    # The applier's --trusted-key file: bundles must be signed by the stack's key (the install script writes it).
    trusted_key: Optional[str] = None

    @property
    def key(self) -> str:
        return object_key(self.prefix, self.cluster, self.mode)


class ConfigError(Exception):
    pass


def load_config(path: str) -> Config:
    """Read the JSON config; unknown keys and wrong types are errors that name the key."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    known = {f.name: f for f in fields(Config)}
    for name in document:
        if name not in known:
            raise ConfigError(f"{path}: unknown key {name!r}")
    for name in ("cluster", "bucket", "region"):
        if name not in document:
            raise ConfigError(f"{path}: missing key {name!r}")
    for name, value in document.items():
        _check_value(path, name, known[name].type, value)
    if document.get("mode", "enforce") not in MODES:
        raise ConfigError(f"{path}: mode must be one of {', '.join(MODES)}")
    return Config(**document)


def _check_value(path: str, name: str, kind: Any, value: Any) -> None:
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ConfigError(f"{path}: {name} must be a number >= 0, finite")
    elif value is None and kind == "Optional[str]":
        return
    elif not isinstance(value, str) or (not value and name != "prefix"):
        raise ConfigError(f"{path}: {name} must be a non-empty string")
    elif not _encodes(value):  # a \ud800 escape: every URL and path built from it would fail
        raise ConfigError(f"{path}: {name} must be UTF-8 text")


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- credentials -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: Optional[str] = None
    expires_at: Optional[float] = None  # epoch seconds; None for credentials from the environment


# IMDS is link-local: never send its requests through a proxy from the environment.
_IMDS_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _imds_call(method: str, url: str, headers: Dict[str, str], timeout: float) -> str:
    request = urllib.request.Request(url, headers=headers, method=method)  # noqa: S310 (IMDS http URL)
    try:
        with _IMDS_OPENER.open(request, timeout=timeout) as response:
            return str(response.read(64 * 1024).decode("utf-8"))
    except (OSError, http.client.HTTPException, UnicodeDecodeError) as error:
        raise AgentError(f"IMDS {method} {url}: {error}") from error


_HEADER_TOKEN = re.compile(r"[!-~]{1,4096}")


def fetch_role_credentials(timeout: float) -> Credentials:
    """The instance role's credentials through IMDSv2: a session token first, then the role's keys."""
    endpoint = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    token = _imds_call(
        "PUT", endpoint + "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, timeout
    )
    headers = {"X-aws-ec2-metadata-token": token}
    base = endpoint + "/latest/meta-data/iam/security-credentials/"
    roles = _imds_call("GET", base, headers, timeout).split()
    if not roles:
        raise AgentError("IMDS: this instance has no role")
    try:
        document = json.loads(_imds_call("GET", base + urllib.parse.quote(roles[0]), headers, timeout))
        if document.get("Code", "Success") != "Success":
            raise AgentError(f"IMDS: role credentials unavailable: {str(document.get('Code'))[:100]}")
        for key in ("AccessKeyId", "SecretAccessKey", "Token"):  # each goes into a header as is
            if not isinstance(document[key], str) or not _HEADER_TOKEN.fullmatch(document[key]):
                raise AgentError(f"IMDS: role credentials: {key} is not a printable string")
        return Credentials(
            access_key=document["AccessKeyId"],
            secret_key=document["SecretAccessKey"],
            token=document["Token"],
            expires_at=float(calendar.timegm(time.strptime(document["Expiration"], "%Y-%m-%dT%H:%M:%SZ"))),
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise AgentError(f"IMDS: unreadable role credentials: {repr(error)[:200]}") from error


class CredentialProvider:
    """Environment variables if set, else the instance role, refreshed before it expires."""

    def __init__(self, timeout: float, clock: Clock = time.time) -> None:
        self._timeout = timeout
        self._clock = clock
        self._role: Optional[Credentials] = None

    def get(self) -> Credentials:
        access_key = os.environ.get("AWS_ACCESS_KEY_ID")
        secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if access_key and secret_key:
            return Credentials(access_key, secret_key, os.environ.get("AWS_SESSION_TOKEN") or None)
        role = self._role
        if role is None or role.expires_at is None or role.expires_at - self._clock() < CREDENTIAL_REFRESH_SECONDS:
            role = self._role = fetch_role_credentials(self._timeout)
            log("credentials.refreshed", expires_at=role.expires_at)
        return role


# --- Signature Version 4 ---------------------------------------------------------------------------


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def _host(parts: urllib.parse.SplitResult) -> str:
    host = parts.hostname or ""
    if parts.port is not None and parts.port != {"http": 80, "https": 443}.get(parts.scheme):
        host += f":{parts.port}"
    return host


def sign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    service: str,
    region: str,
    credentials: Credentials,
    now: datetime.datetime,
) -> Dict[str, str]:
    """``headers`` plus Host, X-Amz-Date, the session token and Authorization; S3 also gets
    X-Amz-Content-SHA256. Every header sent is signed. Neither request here has a query string."""
    parts = urllib.parse.urlsplit(url)
    if parts.query:
        raise ValueError(f"query strings are not supported: {url}")
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    payload_hash = hashlib.sha256(body).hexdigest()
    signed = dict(headers)
    signed["Host"] = _host(parts)
    signed["X-Amz-Date"] = amz_date
    if service == "s3":
        signed["X-Amz-Content-SHA256"] = payload_hash
    if credentials.token:
        signed["X-Amz-Security-Token"] = credentials.token
    canonical = {name.lower(): " ".join(value.split()) for name, value in signed.items()}
    signed_headers = ";".join(sorted(canonical))
    path = parts.path or "/"
    # S3 signs the path exactly as sent; other services sign it URI-encoded once more.
    canonical_uri = path if service == "s3" else urllib.parse.quote(path, safe="/~")
    canonical_request = "\n".join(
        [
            method,
            canonical_uri,
            "",
            "".join(f"{name}:{canonical[name]}\n" for name in sorted(canonical)),
            signed_headers,
            payload_hash,
        ]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()]
    )
    key = _hmac(("AWS4" + credentials.secret_key).encode("utf-8"), amz_date[:8])
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    signed["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={signed_headers}, Signature={signature}"
    )
    return signed


# --- HTTP ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Dict[str, str]  # lower-case names
    body: bytes


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer to log: following it would send the signature to another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _read_bounded(response: Any, deadline: float, max_bytes: int) -> bytes:
    chunks: List[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise AgentError("response not received in time")
        chunk = response.read(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise AgentError(f"response larger than {max_bytes} bytes")
        chunks.append(chunk)


def http_request(
    opener: urllib.request.OpenerDirector,
    method: str,
    url: str,
    headers: Dict[str, str],
    body: Optional[bytes],
    *,
    timeout: float,
    max_bytes: int,
) -> HttpResponse:
    """One request, bounded by ``timeout`` in total; any status is returned, transport failures raise."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, data=body, headers=headers, method=method)  # noqa: S310 (http(s) only)
    try:
        try:
            response = opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as error:  # 304, 4xx, 5xx: the status and body are the answer
            response = error
        with contextlib.closing(response):
            status = response.code if isinstance(response, urllib.error.HTTPError) else response.status
            payload = _read_bounded(response, deadline, max_bytes)
            return HttpResponse(status, {name.lower(): value for name, value in response.headers.items()}, payload)
    except (OSError, http.client.HTTPException) as error:
        raise AgentError(f"{method} {url}: {error}") from error


# --- AWS -------------------------------------------------------------------------------------------


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

    def __init__(self, config: Config, credentials: CredentialProvider, clock: Clock) -> None:
        self._config = config
        self._credentials = credentials
        self._clock = clock
        self._opener = urllib.request.build_opener(_NoRedirect)
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
        self.object_url = bucket_url + urllib.parse.quote(config.key, safe="/")
        self.request_key = verify_request_key(config.prefix, config.cluster)
        self.request_url = bucket_url + urllib.parse.quote(self.request_key, safe="/")

    def _send(self, service: str, method: str, url: str, headers: Dict[str, str], body: bytes) -> HttpResponse:
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
            timeout=self._config.request_timeout_seconds,
            max_bytes=MAX_BUNDLE_BYTES if service == "s3" else MAX_EVENTS_RESPONSE_BYTES,
        )

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

    def put_event(self, detail_type: str, detail: Dict[str, Any]) -> None:
        entry = {
            "Source": event_source(self._config.cluster),
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


# --- bundle and applier ----------------------------------------------------------------------------

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


_SCHEMA = re.compile(re.escape(BUNDLE_SCHEMA_NAME) + r"/([1-9][0-9]{0,5})")


def check_schema(schema: Any) -> None:
    """Only this agent's schema passes; a newer version of it means this agent is outdated."""
    if schema == BUNDLE_SCHEMA:
        return
    match = _SCHEMA.fullmatch(schema) if isinstance(schema, str) else None
    if match and int(match.group(1)) > BUNDLE_SCHEMA_VERSION:
        raise AgentOutdated(
            f"agent outdated: the bundle is {schema}, this agent knows {BUNDLE_SCHEMA} at most; re-run the "
            "`topokeeper agent install-script` output on this head node"
        )
    raise BundleRefused(f"schema: expected {BUNDLE_SCHEMA}, got {repr(schema)[:80]}")


def check_bundle(body: bytes, cluster: str) -> Dict[str, Any]:
    """Keep junk from the applier: the bundle parses, is this cluster's, and every file matches its sha256.
    The applier checks everything again; it never trusts this."""
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # RecursionError: nested past the stack
        raise BundleRefused(f"bundle is not JSON: {str(error)[:200]}") from error
    if not isinstance(document, dict):
        raise BundleRefused("bundle is not a JSON object")
    check_schema(document.get("schema"))
    if document.get("cluster_name") != cluster:
        raise BundleRefused(f"cluster_name: {document.get('cluster_name')!r} is not this cluster ({cluster!r})")
    if not isinstance(document.get("plan_sha256"), str) or not _SHA256.match(document["plan_sha256"]):
        raise BundleRefused("plan_sha256: not a sha256")
    files = document.get("files")
    if not isinstance(files, dict):
        raise BundleRefused("files: not an object")
    for name in sorted(files):
        entry = files[name]
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str):
            raise BundleRefused(f"files[{name}].content: not a string")
        try:
            encoded = content.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate from a \ud800 escape: no file can hold it
            raise BundleRefused(f"files[{name}].content: not UTF-8 text") from error
        if entry.get("sha256") != hashlib.sha256(encoded).hexdigest():
            raise BundleRefused(f"files[{name}].sha256 does not match its content")
    return document


def agent_result(outcome: str, mode: str, plan_sha256: Optional[str], error: str) -> Dict[str, Any]:
    """A result document in the applier's shape, for when the applier's own never came."""
    return {
        "outcome": outcome,
        "mode": mode,
        "plan_sha256": plan_sha256,
        "before_sha256": None,
        "after_sha256": None,
        "partitions_changed": [],
        "reconfigured": False,
        "error": error,
        "drift": [],
        "grouping_drift": False,
        "applier_version": None,  # the applier's own document never came
    }


def _run_bounded(argv: List[str], environment: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv``; past ``timeout`` send SIGTERM, wait TERMINATE_GRACE_SECONDS, then SIGKILL. The applier
    installs no handler: a cut-off apply is repaired from its journal at the next start, not on the way out."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(environment)) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.communicate(timeout=TERMINATE_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def run_applier(config: Config, mode: str, bundle_path: str, plan_sha256: Optional[str]) -> Dict[str, Any]:
    """``python3 APPLIER MODE BUNDLE`` (an argv list, never a shell) -> its JSON document."""
    argv = [sys.executable, config.applier, mode, bundle_path]
    if config.trusted_key:
        argv += ["--trusted-key", config.trusted_key]
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    try:
        completed = _run_bounded(argv, environment, config.applier_timeout_seconds)
    except subprocess.TimeoutExpired:
        return agent_result(
            "timed_out", mode, plan_sha256, f"applier did not finish in {config.applier_timeout_seconds}s"
        )
    except OSError as error:
        return agent_result("failed", mode, plan_sha256, f"applier did not start: {error}")
    try:  # NaN or Infinity would make the report JSON that EventBridge refuses, blocking the outbox
        document = json.loads(completed.stdout.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        document = None
    if not isinstance(document, dict) or not isinstance(document.get("outcome"), str):
        stderr = completed.stderr.decode("utf-8", "replace").strip()[-2000:]
        return agent_result(
            "failed",
            mode,
            plan_sha256,
            f"applier exited {completed.returncode} without a result document: {stderr}",
        )
    return document


_SUMMARY_KEYS = (
    "outcome",
    "mode",
    "plan_sha256",
    "before_sha256",
    "after_sha256",
    "partitions_changed",
    "grouping_drift",
    "applier_version",
    "managed_by",  # ParallelCluster writes the topology: the backend keeps the cluster in verify
)


def bounded_result(result: Dict[str, Any]) -> Dict[str, Any]:
    """The result as is when it fits one event; else its summary, the error cut short and the first drifts."""
    if len(json.dumps(result)) <= MAX_DETAIL_BYTES - 4096:
        return result
    summary = {key: result.get(key) for key in _SUMMARY_KEYS}
    summary["partitions_changed"] = list(result.get("partitions_changed") or [])[:100]
    summary["reconfigured"] = result.get("reconfigured")
    summary["error"] = str(result.get("error"))[:2000] if result.get("error") is not None else None
    summary["drift"] = list(result.get("drift") or [])[:20]
    summary["truncated"] = True
    if len(json.dumps(summary)) > MAX_DETAIL_BYTES - 4096:
        summary["drift"] = []
    return summary


# --- state -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BundleRef:
    """The S3 object version the bundle on disk came from."""

    etag: str
    version_id: Optional[str]
    plan_sha256: Optional[str]  # None only for a refused bundle that claims no valid one


@dataclass
class State:
    etag: Optional[str] = None  # the last object seen, applied or refused: the If-None-Match cursor
    bundle: Optional[BundleRef] = None  # the last bundle handed to the applier (verify runs against it)
    last_verify_at: float = 0.0
    outbox: List[Dict[str, Any]] = field(default_factory=list)
    request_etag: Optional[str] = None  # the last verify request seen: its If-None-Match cursor
    request_id: Optional[str] = None  # the last verify request honoured


def load_state(path: str) -> State:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle, parse_constant=_no_constant)
        bundle = document.get("bundle")
        state = State(
            etag=document.get("etag"),
            bundle=BundleRef(**bundle) if bundle else None,
            last_verify_at=float(document.get("last_verify_at", 0.0)),
            outbox=list(document.get("outbox", [])),
            request_etag=document.get("request_etag"),
            request_id=document.get("request_id"),
        )
        _check_state(state)
        return state
    except FileNotFoundError:
        return State()
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as error:
        # Starting over re-applies the current bundle, which the applier finds unchanged.
        log("state.unreadable", level="warning", path=path, error=str(error)[:200])
        return State()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python writes them, EventBridge refuses them


def _check_state(state: State) -> None:
    """What this agent writes, or ValueError: a state it did not write would fail every cycle the same way."""
    reference = state.bundle
    texts = [state.etag] + ([reference.etag, reference.version_id, reference.plan_sha256] if reference else [])
    if not all(text is None or isinstance(text, str) for text in texts):
        raise ValueError("state: etag, version_id and plan_sha256 must be strings")
    if reference is not None and not isinstance(reference.etag, str):
        raise ValueError("state: bundle.etag must be a string")
    if not 0 <= state.last_verify_at < math.inf:
        raise ValueError("state: last_verify_at must be a finite time")
    for report in state.outbox:
        detail = report.get("detail") if isinstance(report, dict) else None
        result = detail.get("result") if isinstance(detail, dict) else None
        if report.get("detail_type") not in (APPLY_RESULT, VERIFY_RESULT) or not isinstance(result, dict):
            raise ValueError("state: an outbox report is not one this agent writes")


def write_atomically(path: str, data: bytes) -> None:
    temporary = path + ".tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def save_state(path: str, state: State) -> None:
    write_atomically(path, json.dumps(asdict(state), sort_keys=True).encode("utf-8"))


@contextlib.contextmanager
def exclusive(path: str) -> Iterator[bool]:
    """Yields whether this process holds the lock: a cycle never overlaps another on the same state."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)


# --- the cycle -------------------------------------------------------------------------------------


class Agent:
    """One cluster's pull loop; everything that must outlive a process is in ``state_dir``."""

    def __init__(self, config: Config, clock: Clock = time.time) -> None:
        self.config = config
        self._clock = clock
        self._aws = Aws(config, CredentialProvider(config.request_timeout_seconds, clock), clock)
        self._host = socket.gethostname()
        self._state_path = os.path.join(config.state_dir, "state.json")
        self._bundle_path = os.path.join(config.state_dir, "bundle.json")

    def cycle(self) -> None:
        """Poll, apply when changed, verify when due, send the reports. S3, EventBridge and applier failures
        are logged and left for the next cycle, never raised."""
        os.makedirs(self.config.state_dir, mode=0o700, exist_ok=True)
        with exclusive(os.path.join(self.config.state_dir, "lock")) as locked:
            if not locked:
                log("cycle.skipped", reason="another cycle holds the lock")
                return
            state = load_state(self._state_path)
            request = self._verify_request(state)
            applied = self._poll(state, request)
            verified = applied and self.config.mode == "verify"  # _poll verified a new bundle, for the request too
            if request is not None and not verified and state.bundle is not None:
                # Asked for: verify now, even right after an apply (the live state may have changed since).
                self._verify(state, state.bundle, request)
            elif not applied and state.bundle is not None and self._verify_due(state):
                self._verify(state, state.bundle)
            save_state(self._state_path, state)
            if state.outbox:
                self._send_reports(state)
                save_state(self._state_path, state)

    def _poll(self, state: State, request_id: Optional[str] = None) -> bool:
        """Returns whether the applier ran. In verify mode a new bundle is verified, answering ``request_id``."""
        try:
            fetched = self._aws.get_bundle_if_changed(state.etag)
        except AgentError as error:
            log("poll.failed", level="error", error=str(error))
            return False
        if fetched is None:
            log("poll.not_modified", etag=state.etag)
            return False
        if fetched.etag == state.etag:  # a proxy on the way answered without honouring If-None-Match
            log("poll.unchanged", etag=state.etag)
            return False
        log("poll.changed", etag=fetched.etag, version_id=fetched.version_id, size=len(fetched.body))
        state.etag = fetched.etag
        try:
            bundle = check_bundle(fetched.body, self.config.cluster)
        except BundleRefused as refusal:
            log("bundle.refused", level="error", etag=fetched.etag, outcome=refusal.outcome, error=str(refusal))
            plan_sha256 = _plan_sha256_of(fetched.body)
            result = agent_result(refusal.outcome, "apply", plan_sha256, str(refusal))
            self._queue(state, APPLY_RESULT, BundleRef(fetched.etag, fetched.version_id, plan_sha256), result)
            return False
        write_atomically(self._bundle_path, fetched.body)
        reference = BundleRef(fetched.etag, fetched.version_id, bundle["plan_sha256"])
        state.bundle = reference
        if self.config.mode == "verify":
            self._verify(state, reference, request_id)
            return True
        result = run_applier(self.config, "apply", self._bundle_path, reference.plan_sha256)
        log("apply.result", outcome=result.get("outcome"), plan_sha256=reference.plan_sha256, error=result.get("error"))
        state.last_verify_at = self._clock()  # an apply reads the live config back: it counts as a verify
        self._queue(state, APPLY_RESULT, reference, result)
        return True

    def _verify_request(self, state: State) -> Optional[str]:
        """The id of a verify request not honoured yet, or None. A request is
        ``{"request_id": "...", ...}``; anything else is logged and skipped."""
        try:
            fetched = self._aws.get_verify_request_if_changed(state.request_etag)
        except AgentError as error:
            log("verify_request.failed", level="error", error=str(error))
            return None
        if fetched is None or fetched.etag == state.request_etag:
            return None
        state.request_etag = fetched.etag
        try:
            request_id = json.loads(fetched.body[:MAX_VERIFY_REQUEST_BYTES].decode("utf-8")).get("request_id")
        except (UnicodeDecodeError, ValueError, AttributeError, RecursionError):  # json recurses per nesting level
            request_id = None
        if not isinstance(request_id, str) or not request_id or len(request_id) > 200:
            log("verify_request.unreadable", level="warning", etag=fetched.etag)
            return None
        if request_id == state.request_id:
            return None
        log("verify_request.received", request_id=request_id)
        state.request_id = request_id
        return request_id

    def _verify_due(self, state: State) -> bool:
        return (
            os.path.exists(self._bundle_path)
            and self._clock() - state.last_verify_at >= self.config.verify_interval_seconds
        )

    def _verify(self, state: State, reference: BundleRef, request_id: Optional[str] = None) -> None:
        result = run_applier(self.config, "verify", self._bundle_path, reference.plan_sha256)
        log("verify.result", outcome=result.get("outcome"), plan_sha256=reference.plan_sha256, request_id=request_id)
        state.last_verify_at = self._clock()
        self._queue(state, VERIFY_RESULT, reference, result, request_id)

    def _queue(
        self,
        state: State,
        detail_type: str,
        reference: BundleRef,
        result: Dict[str, Any],
        request_id: Optional[str] = None,
    ) -> None:
        detail: Dict[str, Any] = {
            "cluster": self.config.cluster,
            "plan_sha256": reference.plan_sha256,
            "etag": reference.etag,
            "version_id": reference.version_id,
            "host": self._host,
            "result": bounded_result(result),
        }
        if request_id is not None:
            detail["verify_request"] = request_id
        state.outbox.append({"detail_type": detail_type, "detail": detail})
        if len(state.outbox) > MAX_OUTBOX:
            log("report.dropped", level="warning", count=len(state.outbox) - MAX_OUTBOX)
            del state.outbox[:-MAX_OUTBOX]

    def _send_reports(self, state: State) -> None:
        """Oldest first; a failure leaves the rest for the next cycle."""
        while state.outbox:
            report = state.outbox[0]
            try:
                self._aws.put_event(report["detail_type"], report["detail"])
            except AgentError as error:
                log("report.failed", level="error", pending=len(state.outbox), error=str(error))
                return
            state.outbox.pop(0)
            log(
                "report.sent",
                detail_type=report["detail_type"],
                outcome=report["detail"]["result"].get("outcome"),
                etag=report["detail"].get("etag"),
            )


def _plan_sha256_of(body: bytes) -> Optional[str]:
    """The plan hash a refused bundle claims, for the report only."""
    try:
        claimed = json.loads(body.decode("utf-8")).get("plan_sha256")
    except (UnicodeDecodeError, ValueError, AttributeError, RecursionError):
        return None
    return claimed if isinstance(claimed, str) and _SHA256.match(claimed) else None


def _guarded_cycle(agent: Agent) -> bool:
    """One cycle; a bug is logged with its traceback rather than ending the loop."""
    try:
        agent.cycle()
    except Exception as error:
        log("cycle.crashed", level="error", error=repr(error), traceback=traceback.format_exc())
        return False
    return True


def run_forever(agent: Agent) -> None:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log("agent.started", cluster=agent.config.cluster, poll_interval_seconds=agent.config.poll_interval_seconds)
    while not stop.is_set():
        _guarded_cycle(agent)
        stop.wait(agent.config.poll_interval_seconds)
    log("agent.stopped")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="topokeeper head-node pull agent")
    parser.add_argument("--config", required=True, help="the agent's JSON config file")
    parser.add_argument("--once", action="store_true", help="run one cycle and exit (tests, systemd timers)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as error:
        log("config.invalid", level="error", error=str(error))
        return EXIT_BAD_CONFIG
    agent = Agent(config)
    if args.once:
        return EXIT_OK if _guarded_cycle(agent) else EXIT_CRASHED
    run_forever(agent)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
