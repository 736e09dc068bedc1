"""The stdlib agent reads the same object keys the package writes and the stack's policy grants."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from topokeeper.agent import agent
from topokeeper.constants import AGENT_KEY_PREFIX, bundle_key, verify_key


def test_the_agent_default_prefix_is_the_package_one() -> None:
    assert agent.DEFAULT_PREFIX == AGENT_KEY_PREFIX


@pytest.mark.parametrize(("mode", "key"), [("enforce", bundle_key), ("verify", verify_key)])
def test_the_agent_reads_the_key_the_package_writes(mode: str, key: Callable[[str], str]) -> None:
    assert mode in agent.MODES
    assert agent.object_key(agent.DEFAULT_PREFIX, "llm-train-slurm", mode) == key("llm-train-slurm")
