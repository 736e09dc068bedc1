"""The head-node program (applier and agent) imports the wire contract and carries no copies; what it writes
must still be what the package reads."""

from __future__ import annotations

from topokeeper.agent.applier_process import agent_result, bounded_result
from topokeeper.headnode.output import new_result


def test_every_field_the_head_node_writes_is_declared_in_apply_result() -> None:
    """Unknown fields are ignored (and logged): a field the applier or agent writes must not be one."""
    from topokeeper.contract.ports import ApplyResult

    declared = set(ApplyResult.model_fields)
    assert set(new_result("apply")) <= declared
    assert set(agent_result("failed", "apply", None, "no document")) <= declared
    assert set(bounded_result({**new_result("verify"), "error": "x" * 300_000})) <= declared
