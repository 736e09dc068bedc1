"""AWS Signature Version 4 for the agent's two kinds of request (S3 GET, EventBridge PutEvents)."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse
from typing import Dict, Mapping

from topokeeper.agent.credentials import Credentials


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
