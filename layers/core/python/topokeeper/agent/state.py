"""What must outlive a process: the state file (cursors, the bundle in force, the outbox) and the cycle lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from topokeeper.agent.json_text import no_constant
from topokeeper.agent.log import log
from topokeeper.wire import AGENT_DETAIL_TYPES


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
    last_facts_at: float = 0.0  # when placement facts were last put (or tried): their cadence


def load_state(path: str) -> State:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle, parse_constant=no_constant)
        bundle = document.get("bundle")
        state = State(
            etag=document.get("etag"),
            bundle=BundleRef(**bundle) if bundle else None,
            last_verify_at=float(document.get("last_verify_at", 0.0)),
            outbox=list(document.get("outbox", [])),
            request_etag=document.get("request_etag"),
            request_id=document.get("request_id"),
            last_facts_at=float(document.get("last_facts_at", 0.0)),
        )
        _check_state(state)
        return state
    except FileNotFoundError:
        return State()
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as error:
        # Starting over re-applies the current bundle, which the applier finds unchanged.
        log("state.unreadable", level="warning", path=path, error=str(error)[:200])
        return State()


def _check_state(state: State) -> None:
    """What this agent writes, or ValueError: a state it did not write would fail every cycle the same way."""
    reference = state.bundle
    texts = [state.etag] + ([reference.etag, reference.version_id, reference.plan_sha256] if reference else [])
    if not all(text is None or isinstance(text, str) for text in texts):
        raise ValueError("state: etag, version_id and plan_sha256 must be strings")
    if reference is not None and not isinstance(reference.etag, str):
        raise ValueError("state: bundle.etag must be a string")
    if not (0 <= state.last_verify_at < math.inf and 0 <= state.last_facts_at < math.inf):
        raise ValueError("state: last_verify_at and last_facts_at must be finite times")
    for report in state.outbox:
        detail = report.get("detail") if isinstance(report, dict) else None
        result = detail.get("result") if isinstance(detail, dict) else None
        if report.get("detail_type") not in AGENT_DETAIL_TYPES or not isinstance(result, dict):
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
