"""The head-node files cannot import the package, so they carry literal copies of its contract values:
each copy must equal ``topokeeper.contract.constants``."""

from __future__ import annotations

from topokeeper.agent import agent
from topokeeper.applier import applier
from topokeeper.contract import constants


def test_the_applier_accepts_the_bundle_schema_the_package_writes() -> None:
    assert applier.BUNDLE_SCHEMA == constants.BUNDLE_SCHEMA


def test_the_applier_checks_the_signature_algorithm_the_package_signs_with() -> None:
    assert applier.SIGNATURE_ALGORITHM == constants.SIGNATURE_ALGORITHM


def test_the_agent_speaks_the_package_s_event_names_and_bundle_schema() -> None:
    assert agent.BUNDLE_SCHEMA == constants.BUNDLE_SCHEMA
    assert agent.SOURCE_PREFIX == constants.AGENT_SOURCE
    assert agent.event_source("llm-train") == constants.agent_source("llm-train")
    assert agent.APPLY_RESULT == constants.AGENT_APPLY_DETAIL_TYPE
    assert agent.VERIFY_RESULT == constants.AGENT_VERIFY_DETAIL_TYPE


def test_the_agent_polls_the_keys_the_agent_channel_writes() -> None:
    assert agent.DEFAULT_PREFIX == constants.AGENT_KEY_PREFIX
    assert agent.object_key(agent.DEFAULT_PREFIX, "llm-train", "enforce") == constants.agent_bundle_key("llm-train")
    assert agent.object_key(agent.DEFAULT_PREFIX, "llm-train", "verify") == constants.agent_verify_key("llm-train")


def test_every_field_the_head_node_writes_is_declared_in_apply_result() -> None:
    """Unknown fields are ignored (and logged): a field the applier or agent writes must not be one."""
    from topokeeper.contract.ports import ApplyResult

    declared = set(ApplyResult.model_fields)
    assert set(applier.new_result("apply")) <= declared
    assert set(agent.agent_result("failed", "apply", None, "no document")) <= declared
    assert set(agent.bounded_result({**applier.new_result("verify"), "error": "x" * 300_000})) <= declared
