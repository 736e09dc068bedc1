"""AgentChannel.placement_facts: the newest facts the agent put, their age by S3's clock, stale ones refused for the
drift check, and every unusable object one line naming it. The agent that puts them and the emulated bucket:
tests/integration/backend/test_placement_live.py."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from topokeeper.adapters.agent_channel import AgentChannel
from topokeeper.contract.errors import Permanent
from topokeeper.wire import MAX_FULL_RESULT_BYTES, PLACEMENT_FACTS_SCHEMA

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = "clusters/hp/placement-facts.json"
FACTS = {"schema": PLACEMENT_FACTS_SCHEMA, "now": 1, "jobs": [], "error": None}


class Bucket:
    """get_object of one object put ``age`` before NOW, or NoSuchKey."""

    def __init__(self, body: bytes | None, age: timedelta = timedelta(0)) -> None:
        self.body, self.age = body, age

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        assert (Bucket, Key) == ("plans", KEY)
        if self.body is None:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "gone"}}, "GetObject")
        return {"Body": io.BytesIO(self.body), "LastModified": NOW - self.age}


def _channel(bucket: Bucket) -> AgentChannel:
    return AgentChannel(
        bucket,
        "plans",
        None,  # type: ignore[arg-type]
        now=lambda: NOW,
        max_report_age=timedelta(minutes=30),
        verify_only=True,
    )


def test_fresh_facts_come_with_their_age() -> None:
    channel = _channel(Bucket(json.dumps(FACTS).encode(), timedelta(seconds=312)))

    assert channel.placement_facts("hp") == (FACTS, timedelta(seconds=312))
    assert channel.current_placement_facts("hp") == FACTS


def test_facts_older_than_the_bound_are_never_current() -> None:
    channel = _channel(Bucket(json.dumps(FACTS).encode(), timedelta(minutes=30, seconds=1)))

    assert channel.placement_facts("hp")[1] == timedelta(seconds=1801)  # the CLI shows them, marked stale
    with pytest.raises(Permanent) as refused:
        channel.current_placement_facts("hp")
    assert str(refused.value) == "the agent's placement facts are 1801 s old, over the 1800 s bound: not current"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (None, f"no placement facts at s3://plans/{KEY}: the agent puts them only with placement_metrics"),
        (b"x" * (MAX_FULL_RESULT_BYTES + 1), f"s3://plans/{KEY}: over the {MAX_FULL_RESULT_BYTES} bytes the agent"),
        (b"\xff{", f"s3://plans/{KEY}: not JSON"),
        (b"[" * 100_000, f"s3://plans/{KEY}: not JSON"),
        (b"[]", f"s3://plans/{KEY}: not a JSON object"),
    ],
)
def test_an_unusable_object_is_one_line_naming_it(body: bytes | None, says: str) -> None:
    with pytest.raises(Permanent) as refused:
        _channel(Bucket(body)).placement_facts("hp")
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value), refused.value
