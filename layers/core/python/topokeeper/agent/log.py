"""The agent's log: one JSON object a line on stderr (the journal keeps it under systemd)."""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any, Dict


def log(event: str, level: str = "info", **details: Any) -> None:
    record: Dict[str, Any] = {
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "level": level,
        "event": event,
    }
    record.update(details)
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()
