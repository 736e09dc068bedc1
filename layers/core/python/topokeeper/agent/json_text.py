"""JSON the agent reads back and passes on to EventBridge."""

from __future__ import annotations

from typing import Any


def no_constant(name: str) -> Any:
    """``parse_constant`` for json.loads: NaN and Infinity, which Python writes and EventBridge refuses."""
    raise ValueError(f"{name} is not JSON")
