"""The failure every step of a cycle raises for what the outside world did (S3, EventBridge, IMDS)."""

from __future__ import annotations


class AgentError(Exception):
    """A failure of one cycle's step: logged, and the step is tried again next cycle."""
