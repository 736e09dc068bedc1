"""agent.py still carries literal copies of contract values (until the agent imports ``topokeeper.wire``): each
copy must equal the one definition. The head-node program imports the wire contract and carries no copies."""

from __future__ import annotations

from topokeeper import constants, wire
from topokeeper.agent import agent
from topokeeper.headnode.output import new_result


def test_the_agent_speaks_the_package_s_event_names_and_bundle_schema() -> None:
    assert agent.BUNDLE_SCHEMA == wire.BUNDLE_SCHEMA
    assert agent.SOURCE_PREFIX == constants.AGENT_SOURCE
    assert agent.event_source("llm-train") == constants.agent_source("llm-train")
    assert agent.APPLY_RESULT == constants.AGENT_APPLY_DETAIL_TYPE
    assert agent.VERIFY_RESULT == constants.AGENT_VERIFY_DETAIL_TYPE


def test_the_agent_polls_the_keys_the_agent_channel_writes() -> None:
    assert agent.DEFAULT_PREFIX == constants.AGENT_KEY_PREFIX
    assert agent.object_key(agent.DEFAULT_PREFIX, "llm-train", "enforce") == constants.agent_bundle_key("llm-train")
    assert agent.object_key(agent.DEFAULT_PREFIX, "llm-train", "verify") == constants.agent_verify_key("llm-train")


def test_the_agent_times_the_program_out_as_the_channel_does() -> None:
    assert agent.APPLIER_TIMEOUT_SECONDS == wire.CHANNEL_TIMEOUT_SECONDS
    assert agent.TERMINATE_GRACE_SECONDS == wire.TERMINATE_GRACE_SECONDS


def test_every_field_the_head_node_writes_is_declared_in_apply_result() -> None:
    """Unknown fields are ignored (and logged): a field the applier or agent writes must not be one."""
    from topokeeper.ports import ApplyResult

    declared = set(ApplyResult.model_fields)
    assert set(new_result("apply")) <= declared
    assert set(agent.agent_result("failed", "apply", None, "no document")) <= declared
    assert set(agent.bounded_result({**new_result("verify"), "error": "x" * 300_000})) <= declared
