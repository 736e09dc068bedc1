"""EventBridge refuses a PutEvents request whose entries total 256 KB or more; moto alone accepts it."""

from __future__ import annotations

import json

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from topokeeper.sim.aws.events import PUT_EVENTS_TOO_LARGE
from topokeeper.sim.aws_emulator import AwsEmulator

NO_RETRIES = Config(retries={"total_max_attempts": 1})


def _entry(detail_bytes: int) -> dict[str, object]:
    # Source (7) + DetailType (4) + the Detail's UTF-8 bytes, as EventBridge counts an entry
    return {"Source": "example", "DetailType": "Test", "Detail": json.dumps({"pad": "x" * (detail_bytes - 11)})}


def test_entries_totalling_256_kb_are_refused(aws: AwsEmulator) -> None:
    events = aws.client("events", config=NO_RETRIES)
    exactly = 256 * 1024 - 11  # one entry: 11 bytes of Source and DetailType, the rest Detail
    with pytest.raises(ClientError) as raised:
        events.put_events(Entries=[_entry(exactly)])
    assert raised.value.response["Error"]["Code"] == "ValidationException"
    assert raised.value.response["Error"]["Message"] == PUT_EVENTS_TOO_LARGE

    with pytest.raises(ClientError):
        events.put_events(Entries=[_entry(100_000), _entry(100_000), _entry(70_000)])


def test_entries_just_under_256_kb_are_accepted(aws: AwsEmulator) -> None:
    events = aws.client("events", config=NO_RETRIES)
    assert events.put_events(Entries=[_entry(256 * 1024 - 12)])["FailedEntryCount"] == 0
    assert events.put_events(Entries=[_entry(100_000), _entry(100_000), _entry(60_000)])["FailedEntryCount"] == 0
