"""AWS credentials for the agent's requests: the environment's if set, else the instance role's (IMDSv2)."""

from __future__ import annotations

import calendar
import http.client
import json
import os
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from topokeeper.agent.errors import AgentError
from topokeeper.agent.log import log

Clock = Callable[[], float]

# Role credentials are replaced this long before they expire, so a request never carries stale ones.
CREDENTIAL_REFRESH_SECONDS = 600


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


def _imds_session(timeout: float) -> Tuple[str, Dict[str, str]]:
    """IMDS's endpoint and the headers of an IMDSv2 session (its token asked first)."""
    endpoint = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
    token = _imds_call(
        "PUT", endpoint + "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, timeout
    )
    return endpoint, {"X-aws-ec2-metadata-token": token}


def fetch_instance_id(timeout: float) -> str:
    """This instance's id, through IMDSv2 (a compute node's start action reads its own registration entry)."""
    endpoint, headers = _imds_session(timeout)
    return _imds_call("GET", endpoint + "/latest/meta-data/instance-id", headers, timeout).strip()


def fetch_role_credentials(timeout: float) -> Credentials:
    """The instance role's credentials through IMDSv2: a session token first, then the role's keys."""
    endpoint, headers = _imds_session(timeout)
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

    def __init__(self, timeout: float, clock: Clock = time.time, *, quiet: bool = False) -> None:
        self._timeout = timeout
        self._clock = clock
        self._role: Optional[Credentials] = None
        self._quiet = quiet  # a node's start action logs one line, whatever it fetched

    def get(self) -> Credentials:
        access_key = os.environ.get("AWS_ACCESS_KEY_ID")
        secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if access_key and secret_key:
            return Credentials(access_key, secret_key, os.environ.get("AWS_SESSION_TOKEN") or None)
        role = self._role
        if role is None or role.expires_at is None or role.expires_at - self._clock() < CREDENTIAL_REFRESH_SECONDS:
            role = self._role = fetch_role_credentials(self._timeout)
            if not self._quiet:
                log("credentials.refreshed", expires_at=role.expires_at)
        return role
