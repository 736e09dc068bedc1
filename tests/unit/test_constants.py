"""The applier cannot import the package, so it carries literal copies of its contract values: each copy must
equal ``topokeeper.constants``. (The agent shares its event names and keys through ``topokeeper.wire``.)"""

from __future__ import annotations

from topokeeper import constants
from topokeeper.agent import bundle
from topokeeper.agent.applier_process import agent_result, bounded_result
from topokeeper.applier import applier


def test_the_applier_accepts_the_bundle_schema_the_package_writes() -> None:
    assert applier.BUNDLE_SCHEMA == constants.BUNDLE_SCHEMA


def test_the_applier_checks_the_signature_algorithm_the_package_signs_with() -> None:
    assert applier.SIGNATURE_ALGORITHM == constants.SIGNATURE_ALGORITHM


def test_the_agent_accepts_the_bundle_schema_the_package_writes() -> None:
    assert bundle.BUNDLE_SCHEMA == constants.BUNDLE_SCHEMA


def test_every_field_the_head_node_writes_is_declared_in_apply_result() -> None:
    """Unknown fields are ignored (and logged): a field the applier or agent writes must not be one."""
    from topokeeper.ports import ApplyResult

    declared = set(ApplyResult.model_fields)
    assert set(applier.new_result("apply")) <= declared
    assert set(agent_result("failed", "apply", None, "no document")) <= declared
    assert set(bounded_result({**applier.new_result("verify"), "error": "x" * 300_000})) <= declared
