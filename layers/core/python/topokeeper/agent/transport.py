"""One HTTP request, bounded in time and size, that never follows a redirect."""

from __future__ import annotations

import contextlib
import http.client
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from topokeeper.agent.errors import AgentError


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Dict[str, str]  # lower-case names
    body: bytes


class NoRedirect(urllib.request.HTTPRedirectHandler):
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
