"""Registration entries on the in-memory ports: a ParallelCluster cluster on Slurm 25.11 gets one entry per running
bound instance, whose topology value is the plan's placement of that instance's node (the same value the head
node's ``scontrol update`` route sends), written again only when it changes, and never where it would be a write
topokeeper may not make (verify mode) or slurmd cannot take it (before 25.11)."""

from __future__ import annotations

import json

import pytest

from tests.unit.service.test_bindings_usecases import BOUND, _table
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.errors import Permanent, Retryable
from topokeeper.contract.ports import ApplyResult, Outcome
from topokeeper.service.controller import reconcile
from topokeeper.service.registration import placements
from topokeeper.service.result import record_result
from topokeeper.service.state import save_fields
from topokeeper.wire import (
    Registration,
    RegistrationError,
    parse_registration,
    parse_topology_yaml,
    placements_by_node,
    registration_text,
)


def _cluster(version: str = "25.11", mode: str = "enforce") -> Controller:
    controller = Controller(orchestrator="ec2", mode=mode)
    save_fields(controller.state, CLUSTER, {"slurm_nodes": _table(BOUND), "slurm_version": version})
    return controller


def test_each_running_bound_instance_gets_its_nodes_planned_topology() -> None:
    controller = _cluster()

    assert reconcile(controller.change(), controller.deps()).action == "delivered"

    (bundle,) = controller.channel.delivered
    planned = placements_by_node(parse_topology_yaml(bundle.files["topology.yaml"].content) or {})
    assert planned and placements(bundle) == planned  # the update route's values, from the same plan
    entries = controller.plans.registrations
    # FakeFacts' eight instances (10.0.0.0-7) back the four static and four bound dynamic nodes; q1-dy-p5-5 is
    # powered down (no instance): no entry.
    assert len(entries) == 8
    node_of = {address: node for node, address in BOUND.items()}
    for (cluster, instance), text in entries.items():
        entry = parse_registration(text.encode(), CLUSTER, instance)
        index = int(instance[2:], 16) - 1
        assert (cluster, entry.topology) == (CLUSTER, planned[node_of[f"10.0.0.{index}"]])
        assert entry.plan_sha256 == bundle.plan_sha256


def test_an_unchanged_placement_is_not_written_again() -> None:
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    assert controller.plans.registration_puts == 8

    controller.facts.move(0, 1)  # one instance under another leaf: the plan changes, one entry with it
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change(), controller.deps())

    assert controller.plans.registration_puts == 9
    text = controller.plans.registrations[(CLUSTER, f"i-{1:017x}")]
    assert json.loads(text)["topology"] == placements(controller.channel.delivered[-1])["q1-st-p5-1"]


@pytest.mark.parametrize(("version", "mode"), [("25.05", "enforce"), ("24.11", "enforce"), ("25.11", "verify")])
def test_no_entry_where_slurmd_cannot_take_it_or_topokeeper_may_not_write(version: str, mode: str) -> None:
    controller = _cluster(version, mode)

    reconcile(controller.change(), controller.deps())

    assert controller.plans.registrations == {}


def test_a_hyperpod_cluster_gets_no_entry() -> None:
    controller = Controller()
    save_fields(controller.state, CLUSTER, {"slurm_version": "25.11"})

    reconcile(controller.change(), controller.deps())

    assert controller.plans.registrations == {}


@pytest.mark.parametrize("value", ["t1:leaf 1", "t1:leaf\n", "t1", "t1:a;reboot", 't1:"x"', "t1:a=b", ":leaf"])
def test_the_source_refuses_a_value_a_node_would_refuse(value: str) -> None:
    entry = Registration(CLUSTER, "i-0123456789abcdef0", value, 1, "0" * 64)

    with pytest.raises(RegistrationError, match="^topology: "):
        registration_text(entry)


# q1-st-p5-1 is the node the head node found already placed as planned. The others are placed by the apply, the
# powered-down q1-dy-p5-5 too (under the no-topology switch the file writes).
REGISTERED = "q1-st-p5-1"
OTHERS = sorted(node for node in BOUND if node != REGISTERED)


@pytest.mark.parametrize(
    ("version", "apply_path", "expected"),
    [
        # 25.11 publishes entries: a node the head node found already placed as planned was placed at registration.
        ("25.11", "whole_file", {"registration": [REGISTERED], "file": OTHERS}),
        ("25.11", "incremental", {"registration": [REGISTERED], "update": OTHERS}),
        # 25.05 has no entries: whatever slurmctld already served, the apply's own route is named.
        ("25.05", "incremental", {"update": sorted([REGISTERED, *OTHERS])}),
        # Nothing loaded (a rolled-back apply): the record lists no node (it moved none), so no route either;
        # the next apply finds the registered node in place and names registration then.
        ("25.11", None, {}),
    ],
)
def test_the_audit_record_names_the_route_that_placed_each_node(
    version: str, apply_path: str | None, expected: dict[str, list[str]]
) -> None:
    controller = _cluster(version)
    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    pending = controller.now_state().pending
    assert pending is not None and pending.registration is (version == "25.11")
    controller.ssm_results[pending.handle.reference] = ApplyResult(
        outcome=Outcome.APPLIED if apply_path else Outcome.ROLLED_BACK,
        applier_version="1.0.0",
        apply_path=apply_path,  # type: ignore[arg-type]
        nodes_placed_before=[REGISTERED],
    )

    record_result(ssm_event(pending.handle.reference), controller.result_deps())

    (record,) = controller.audit.records.values()
    assert {route: sorted(nodes) for route, nodes in record.placed_by.items()} == expected
    assert record.placed_by_count == {route: len(nodes) for route, nodes in expected.items()}


@pytest.mark.xfail(
    strict=True,
    reason="red team: publish_registrations diffs against the previous plan through today's instances and IPs, "
    "so an instance that took a terminated one's address (same leaf) is taken as already published",
)
def test_a_new_instance_that_reuses_a_terminated_ones_address_gets_its_entry() -> None:
    # EC2 hands a terminated instance's private IP to the next launch in the subnet. The new instance's node
    # may be placed where the old one's was (same leaf: the same value): it still has no entry yet.
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    read = controller.facts.read

    def replaced(cluster: str):  # type: ignore[no-untyped-def]
        raw = read(cluster)
        old, new = f"i-{1:017x}", f"i-{255:017x}"  # 10.0.0.0's instance terminated; its address reused by new
        for node in raw.nodes:
            node.InstanceId = new if node.InstanceId == old else node.InstanceId
        for topology in raw.instance_topology:
            topology.InstanceId = new if topology.InstanceId == old else topology.InstanceId
        return raw

    controller.facts.read = replaced  # type: ignore[method-assign]
    controller.facts.move(7, 0)  # and something else changes, so a plan is published
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change(), controller.deps())

    assert (CLUSTER, f"i-{255:017x}") in controller.plans.registrations


@pytest.mark.parametrize("error", [Retryable("SlowDown", code="SlowDown"), Permanent("denied", code="AccessDenied")])
def test_entries_that_s3_refuses_do_not_hold_back_the_plan(error: Exception) -> None:
    # Entries only spare nodes a wait: a throttled or denied PutObject (20,000 of them on a large cluster's
    # first plan) must not keep the plan itself from the head node.
    controller = _cluster()

    def refuse(cluster: str, entries: dict[str, str]) -> None:
        raise error

    controller.plans.put_registrations = refuse  # type: ignore[method-assign]

    assert reconcile(controller.change(), controller.deps()).action == "delivered"


def test_an_address_two_nodes_are_bound_to_gets_no_entry() -> None:
    # A powered-down node's binding not yet reset while its old address already backs another node's instance:
    # which node the instance runs as is not known, so it gets no entry (the update route places it).
    controller = Controller(orchestrator="ec2", mode="enforce")
    table = BOUND | {"q1-dy-p5-5": "10.0.0.0"}  # q1-st-p5-1's address too
    save_fields(controller.state, CLUSTER, {"slurm_nodes": _table(table), "slurm_version": "25.11"})

    assert reconcile(controller.change(), controller.deps()).action == "delivered"

    assert (CLUSTER, f"i-{1:017x}") not in controller.plans.registrations
    assert len(controller.plans.registrations) == 7


@pytest.mark.parametrize("version", ["25.11", "25.05"])
def test_the_delivered_bundle_lists_the_nodes_with_entries_as_registering(version: str) -> None:
    controller = _cluster(version)

    reconcile(controller.change(), controller.deps())

    (bundle,) = controller.channel.delivered
    if version != "25.11":  # no entries: the key is absent, the bundle's bytes as before
        assert bundle.registering is None and "registering" not in bundle.document()
        return
    node_of = {address: node for node, address in BOUND.items()}
    with_entries = sorted(
        node_of[f"10.0.0.{int(instance[2:], 16) - 1}"] for _, instance in controller.plans.registrations
    )
    assert bundle.registering == with_entries and bundle.document()["registering"] == with_entries
    assert "q1-dy-p5-5" not in with_entries  # powered down, no instance: no entry, placed by the apply


def test_nodes_the_head_node_left_to_registration_are_named_registration_in_the_audit_record() -> None:
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    pending = controller.now_state().pending
    assert pending is not None
    controller.ssm_results[pending.handle.reference] = ApplyResult(
        outcome=Outcome.APPLIED,
        applier_version="1.0.0",
        apply_path="incremental",
        nodes_left_to_registration=[REGISTERED],
    )

    record_result(ssm_event(pending.handle.reference), controller.result_deps())

    (record,) = controller.audit.records.values()
    assert record.placed_by == {"registration": [REGISTERED], "update": OTHERS}
