"""Registration entries on the in-memory ports: a ParallelCluster cluster on Slurm 25.11 gets one entry per running
bound instance, whose topology value is the plan's placement of that instance's node (the same value the head
node's ``scontrol update`` route sends), written again only when it changes, and never where it would be a write
topokeeper may not make (verify mode) or slurmd cannot take it (before 25.11)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.signing_support import LocalSigner
from tests.unit.service.test_bindings_usecases import BOUND, _table
from tests.unit.service.test_result_usecases import ssm_event
from tests.unit.service.test_signing_usecases import _trusted
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.errors import Permanent, Retryable
from topokeeper.contract.ports import ApplyResult, DeliveryHandle, Outcome
from topokeeper.headnode.bundle import parse_bundle
from topokeeper.headnode.signature import check_signature
from topokeeper.render.bundle import Bundle
from topokeeper.service import registration
from topokeeper.service.controller import reconcile
from topokeeper.service.registration import placements, with_registering
from topokeeper.service.result import finish_delivery, record_result
from topokeeper.service.signing import sign_bundle
from topokeeper.service.state import save_fields
from topokeeper.wire import (
    BUNDLE_SCHEMA,
    REGISTERING_BUNDLE_SCHEMA,
    REGISTRATION_WAIT_SECONDS,
    Registration,
    RegistrationError,
    parse_registration,
    registration_text,
)
from topokeeper.wire_updates import parse_topology_yaml, placements_by_node


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


def _replaced(controller: Controller, old: str, new: str) -> None:
    """``old``'s instance terminated and ``new`` launched on its private address (EC2 hands a terminated
    instance's IP to the next launch in the subnet): same node binding, same leaf, another instance id."""
    read = controller.facts.read

    def replaced(cluster: str):  # type: ignore[no-untyped-def]
        raw = read(cluster)
        for node in raw.nodes:
            node.InstanceId = new if node.InstanceId == old else node.InstanceId
        for topology in raw.instance_topology:
            topology.InstanceId = new if topology.InstanceId == old else topology.InstanceId
        return raw

    controller.facts.read = replaced  # type: ignore[method-assign]


@pytest.mark.parametrize("plan_changes", [True, False])
def test_a_new_instance_that_reuses_a_terminated_ones_address_gets_its_entry(plan_changes: bool) -> None:
    # The new instance's node is placed where the old one's was (same leaf: the same value): it still has no entry
    # yet. Whether or not something else changes the plan, it gets one, and the old instance's entry goes.
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    old, new = f"i-{1:017x}", f"i-{255:017x}"
    _replaced(controller, old, new)
    if plan_changes:
        controller.facts.move(7, 0)
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change(), controller.deps())

    assert (CLUSTER, new) in controller.plans.registrations
    assert (CLUSTER, old) not in controller.plans.registrations
    assert controller.plans.registration_puts == 8 + 1 + int(plan_changes)  # the new one and instance 8's move


def test_an_entry_already_current_is_not_put_again_by_a_later_reconcile() -> None:
    # Every reconcile compares the cluster's running instances with what was published (the state table's record),
    # not with the previous plan: an unchanged cluster reconciled again costs no PutObject.
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    for _ in range(2):
        save_fields(controller.state, CLUSTER, {"pending": None})
        reconcile(controller.change(), controller.deps())

    assert controller.plans.registration_puts == 8
    assert set(controller.state.published) == {(CLUSTER, f"i-{i:017x}") for i in range(1, 9)}


def test_a_terminated_instances_entry_is_deleted() -> None:
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    controller.facts.nodes = 7  # i-...8 (10.0.0.7) terminated: its node's binding is not reset yet

    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change(), controller.deps())

    gone = (CLUSTER, f"i-{8:017x}")
    assert gone not in controller.plans.registrations and gone not in controller.state.published
    assert len(controller.plans.registrations) == 7


def test_a_refused_delete_keeps_the_record_and_a_later_reconcile_deletes_the_entry() -> None:
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    controller.facts.nodes = 7
    delete = controller.plans.delete_registrations

    def refuse(cluster: str, instance_ids: object) -> None:
        raise Retryable("SlowDown", code="SlowDown")

    controller.plans.delete_registrations = refuse  # type: ignore[method-assign]
    save_fields(controller.state, CLUSTER, {"pending": None})
    assert reconcile(controller.change(), controller.deps()).action == "delivered"  # the plan goes on
    gone = (CLUSTER, f"i-{8:017x}")
    assert gone in controller.plans.registrations and gone in controller.state.published

    controller.plans.delete_registrations = delete  # type: ignore[method-assign]
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change(), controller.deps())
    assert gone not in controller.plans.registrations and gone not in controller.state.published


@pytest.mark.parametrize(
    "since_write",
    [
        60,  # planned, then held back: the head node reconfigures for this change (it did last time)
        2,  # held back before planning: not even a live write goes this soon after the last write
    ],
)
def test_a_reconcile_held_back_by_the_write_interval_still_publishes_new_instances_entries(since_write: int) -> None:
    # Entries cost slurmctld nothing: the write interval, which spaces slurmctld's reconfigures, holds back the
    # plan's delivery, not the new instance's entry (its node may boot before the interval has passed).
    controller = Controller(orchestrator="ec2", mode="enforce", min_write_interval_seconds=600)
    save_fields(controller.state, CLUSTER, {"slurm_nodes": _table(BOUND), "slurm_version": "25.11"})
    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None, "applied_sha256": state.desired_sha256}))
    _replaced(controller, f"i-{1:017x}", f"i-{255:017x}")
    controller.facts.move(7, 0)
    save_fields(controller.state, CLUSTER, {"live_write_refused": "the head node reconfigured"})
    controller.clock.advance(since_write)

    report = reconcile(controller.change(), controller.deps())

    assert (report.action, report.reason) == ("deferred", "minimum interval between writes")
    assert len(controller.channel.delivered) == 1
    assert (CLUSTER, f"i-{255:017x}") in controller.plans.registrations
    assert (CLUSTER, f"i-{1:017x}") not in controller.plans.registrations


@pytest.mark.parametrize("error", [Retryable("SlowDown", code="SlowDown"), Permanent("denied", code="AccessDenied")])
def test_entries_that_s3_refuses_do_not_hold_back_the_plan(error: Exception) -> None:
    # Entries only spare nodes a wait: a throttled or denied PutObject (20,000 of them on a large cluster's
    # first plan) must not keep the plan itself from the head node.
    controller = _cluster()

    def refuse(cluster: str, entries: dict[str, str]) -> None:
        raise error

    controller.plans.put_registrations = refuse  # type: ignore[method-assign]

    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    # No entry to wait for: the head node places those nodes at once rather than after the registration wait.
    (bundle,) = controller.channel.delivered
    assert bundle.registering is None


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
        assert bundle.document()["schema"] == BUNDLE_SCHEMA  # head nodes that never need registration: no upgrade
        return
    node_of = {address: node for node, address in BOUND.items()}
    with_entries = sorted(
        node_of[f"10.0.0.{int(instance[2:], 16) - 1}"] for _, instance in controller.plans.registrations
    )
    assert bundle.registering == with_entries and bundle.document()["registering"] == with_entries
    assert "q1-dy-p5-5" not in with_entries  # powered down, no instance: no entry, placed by the apply
    # A key older head-node programs do not know: a newer schema, so their agent answers agent_outdated.
    assert bundle.document()["schema"] == REGISTERING_BUNDLE_SCHEMA


def test_a_stored_plan_delivered_with_registering_is_signed_as_bundle_3_and_verifies_on_the_head_node() -> None:
    controller, signer = _cluster(), LocalSigner()
    reconcile(controller.change(), dataclasses.replace(controller.deps(), signer=signer))
    (delivered,) = controller.channel.delivered
    assert delivered.registering

    stored = controller.plans.bundle(CLUSTER, delivered.plan_sha256)  # what a later delivery starts from
    assert stored.document()["schema"] == BUNDLE_SCHEMA and stored.registering is None  # content-addressed as /2
    again = sign_bundle(with_registering(stored, delivered.registering), 9, "apply", signer)
    for bundle in (delivered, again):
        parsed = parse_bundle(json.dumps(bundle.document(), sort_keys=True))
        check_signature(parsed, "apply", _trusted(signer))  # the schema is signed with the rest
        assert bundle.document()["schema"] == REGISTERING_BUNDLE_SCHEMA
        assert parsed.registering == tuple(delivered.registering)


def _record_pending(controller: Controller, document: dict[str, object]) -> str:
    """The delivery in flight answered with ``document`` (an ApplyResult's fields, applier 1.0.0), its result
    recorded; its reference."""
    pending = controller.now_state().pending
    assert pending is not None
    reference = pending.handle.reference
    controller.ssm_results[reference] = ApplyResult.model_validate({"applier_version": "1.0.0", **document})
    record_result(ssm_event(reference), controller.result_deps())
    return reference


def _applied_leaving_one_to_registration() -> Controller:
    """A delivered plan whose apply left REGISTERED to its slurmd, its result recorded."""
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
    return controller


def test_nodes_the_head_node_left_to_registration_are_named_registration_in_the_audit_record() -> None:
    controller = _applied_leaving_one_to_registration()

    (record,) = controller.audit.records.values()
    assert record.placed_by == {"registration": [REGISTERED], "update": OTHERS}


def test_entries_are_put_and_deleted_at_most_a_cap_a_reconcile_and_each_deleted_batch_is_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 20,000-node scale-up or scale-down must not hold the write back behind its S3 calls, and deletes S3 keeps
    # refusing must not pile up work for every reconcile.
    monkeypatch.setattr(registration, "MAX_ENTRY_CALLS", 3)
    monkeypatch.setattr(registration, "DELETE_BATCH", 1)
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    assert len(controller.plans.registrations) == 3
    (bundle,) = controller.channel.delivered
    assert bundle.registering is not None and len(bundle.registering) == 3  # only those with an entry wait
    for _ in range(2):
        save_fields(controller.state, CLUSTER, {"pending": None})
        reconcile(controller.change(), controller.deps())
    assert len(controller.plans.registrations) == 8

    controller.facts.nodes = 3  # five instances gone
    delete, calls = controller.plans.delete_registrations, []

    def second_refused(cluster: str, instance_ids: list[str]) -> None:
        calls.append(instance_ids)
        if len(calls) == 2:
            raise Retryable("SlowDown", code="SlowDown")
        delete(cluster, instance_ids)

    controller.plans.delete_registrations = second_refused  # type: ignore[method-assign]
    save_fields(controller.state, CLUSTER, {"pending": None})
    reconcile(controller.change(), controller.deps())
    assert len(calls) == 2 and len(controller.plans.registrations) == 7  # the first batch deleted and recorded
    assert len(controller.state.published) == 7
    for _ in range(2):
        save_fields(controller.state, CLUSTER, {"pending": None})
        reconcile(controller.change(), controller.deps())
    assert len(controller.plans.registrations) == 3 and len(controller.state.published) == 3


def test_when_the_registration_wait_ends_the_plan_is_delivered_again_with_no_change_to_bring_it() -> None:
    # A node left to its slurmd that registered without its topology (no OnNodeStart action, its entry late) is
    # placed by the head node's next apply: that apply must come when the wait ends, not at the next change.
    controller = _applied_leaving_one_to_registration()
    check = controller.queue.sent[-1]
    assert controller.now_state().registration_check_at is not None

    assert reconcile(check, controller.deps()).action == "deferred"  # within the wait
    assert len(controller.channel.delivered) == 1
    controller.clock.advance(REGISTRATION_WAIT_SECONDS + 31)
    assert reconcile(check, controller.deps()).action == "delivered"
    first, again = controller.channel.delivered
    assert again.plan_sha256 == first.plan_sha256 and controller.now_state().registration_check_at is None


def test_a_change_reconciled_within_the_registration_wait_does_not_cancel_its_end() -> None:
    # A change reconciled within the wait, its plan unchanged (nothing to write yet), closes the cycle that holds
    # the wait's own trigger: the wait's end must still bring the plan again, not the next change or drift check.
    controller = _applied_leaving_one_to_registration()
    first = len(controller.queue.sent) - 1  # the wait's own request

    assert reconcile(controller.change("e-2"), controller.deps()).action == "unchanged"
    assert len(controller.queue.sent) == first + 2  # one message more, no loop
    assert reconcile(controller.queue.sent[-1], controller.deps()).action == "deferred"  # within the wait
    controller.clock.advance(REGISTRATION_WAIT_SECONDS + 31)
    actions, index = [], first
    while index < len(controller.queue.sent) and index < first + 10:  # every message queued since, in order
        actions.append(reconcile(controller.queue.sent[index], controller.deps()).action)
        index += 1

    assert actions.count("delivered") == 1, actions  # the others covered (one an SQS duplicate of the cycle's)
    first_bundle, again = controller.channel.delivered
    assert again.plan_sha256 == first_bundle.plan_sha256 and controller.now_state().registration_check_at is None


def test_a_result_that_beats_the_reconciles_save_keeps_its_registration_wait() -> None:
    # SSM's status event may be handled before the reconcile saved its command id: the reconcile's late save must
    # not clear the wait that result set (nothing would then bring the plan again when it ends).
    controller = _cluster()
    deliver = controller.channel.deliver

    def deliver_and_report_at_once(bundle: Bundle) -> DeliveryHandle:
        handle = deliver(bundle)
        controller.ssm_results[handle.reference] = ApplyResult(
            outcome=Outcome.APPLIED,
            applier_version="1.0.0",
            mode="apply",
            plan_sha256=bundle.plan_sha256,
            nodes_left_to_registration=[REGISTERED],
        )
        assert record_result(ssm_event(handle.reference), controller.result_deps()).status == "recorded"
        return handle

    controller.channel.deliver = deliver_and_report_at_once  # type: ignore[method-assign]

    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    state = controller.now_state()
    assert state.pending is None and state.registration_check_at is not None


def test_a_write_within_the_registration_wait_brings_the_plan_again_when_the_first_wait_ends_not_later() -> None:
    # A plan change written within the wait clears the check (its result sets the next). The head node still
    # leaves the node, whose wait runs from the first apply that left it: the next check is when that ends, as the
    # head node says, not a whole wait after this write (the node would wait up to twice the bound).
    controller = _applied_leaving_one_to_registration()
    first_ends = controller.now_state().registration_check_at
    controller.clock.advance(200)
    controller.facts.move(0, 1)

    assert reconcile(controller.change("e-2"), controller.deps()).action == "delivered"
    _record_pending(
        controller,
        {
            "outcome": "applied",
            "nodes_left_to_registration": [REGISTERED],
            "registration_wait_seconds": REGISTRATION_WAIT_SECONDS - 200,
        },
    )

    assert controller.now_state().registration_check_at == first_ends


def test_a_node_whose_wait_ended_unregistered_is_audited_under_the_update_that_placed_it() -> None:
    # The apply that left the node audited it as `registration` (left to it); its slurmd never came, and the plan
    # delivered again when the wait ended placed it by scontrol update: that delivery's record must say so, though
    # the plan (and so every partition's content) is the same.
    controller = _applied_leaving_one_to_registration()
    controller.clock.advance(REGISTRATION_WAIT_SECONDS + 31)
    assert reconcile(controller.queue.sent[-1], controller.deps()).action == "delivered"
    reference = _record_pending(
        controller,
        {
            "outcome": "applied",
            "apply_path": "incremental",
            "nodes_updated": 1,
            "nodes_placed_after_wait": [REGISTERED],
        },
    )

    again = [r for r in controller.audit.records.values() if r.delivery_reference == reference]
    assert [(r.reason, r.placed_by, r.placed_by_count) for r in again] == [
        ("drift-repair", {"update": [REGISTERED]}, {"update": 1})
    ]


def test_a_result_whose_left_nodes_were_cut_from_its_document_still_brings_the_plan_again() -> None:
    # A document cut to fit stdout (a long node table, no upload: the agent's channel) may list none of the nodes it
    # left, only their count in `dropped`: they wait for their registration all the same.
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    _record_pending(controller, {"outcome": "applied", "dropped": {"nodes_left_to_registration": 250}})

    assert controller.now_state().registration_check_at is not None
    assert controller.queue.sent[-1].reason == "retry"


def test_a_late_copy_of_a_result_does_not_set_a_registration_wait_over_a_newer_delivery() -> None:
    # SSM's status event may be handled twice (EventBridge delivers at least once); the second copy read the
    # delivery in flight before the first finished it and a newer delivery went out. That delivery cleared the
    # check (its own result sets the next): the late copy must not set one again, nor queue its own reconcile.
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    read_early = controller.now_state()
    assert read_early.pending is not None
    reference = read_early.pending.handle.reference
    controller.ssm_results[reference] = ApplyResult.model_validate(
        {"outcome": "applied", "applier_version": "1.0.0", "nodes_left_to_registration": [REGISTERED]}
    )
    record_result(ssm_event(reference), controller.result_deps())
    controller.facts.move(0, 1)
    assert reconcile(controller.change("e-2"), controller.deps()).action == "delivered"
    assert controller.now_state().registration_check_at is None
    queued = len(controller.queue.sent)

    report = finish_delivery(
        controller.cluster, read_early, read_early.pending, controller.ssm_results[reference], controller.result_deps()
    )

    assert report.status == "recorded"
    assert controller.now_state().registration_check_at is None
    assert len(controller.queue.sent) == queued


@pytest.mark.parametrize(
    ("said", "waits"),
    [(-5, 0), (float("nan"), 0), (float("-inf"), 0), (float("inf"), 300), (1e308, 300), (True, 1), ("12", 12)],
)
def test_a_registration_wait_the_head_node_says_is_bounded_whatever_its_value(said: object, waits: float) -> None:
    # The document is the head node's: a value no program of ours writes (negative, not finite, huge, a bool or a
    # numeric string, which pydantic reads as a number) neither stretches the check past one wait nor breaks it.
    controller = _cluster()
    reconcile(controller.change(), controller.deps())
    _record_pending(
        controller,
        {
            "outcome": "applied",
            "nodes_left_to_registration": [REGISTERED],
            "registration_wait_seconds": said,
        },
    )

    check_at = controller.now_state().registration_check_at
    assert check_at is not None
    assert (check_at - controller.clock.now()).total_seconds() == waits + 30


def test_a_node_whose_wait_ended_placed_by_an_apply_bringing_a_new_plan_is_in_its_plan_change_record() -> None:
    # docs/operate.md: such a node is in the record of the apply that places it, a drift-repair one only when that
    # apply brings the same plan.
    controller = _applied_leaving_one_to_registration()
    controller.clock.advance(REGISTRATION_WAIT_SECONDS + 31)
    controller.facts.move(0, 1)
    assert reconcile(controller.change("e-2"), controller.deps()).action == "delivered"
    reference = _record_pending(
        controller,
        {
            "outcome": "applied",
            "apply_path": "incremental",
            "nodes_updated": 2,
            "nodes_placed_after_wait": [REGISTERED],
        },
    )

    records = [r for r in controller.audit.records.values() if r.delivery_reference == reference]
    assert [(r.reason, REGISTERED in r.placed_by.get("update", [])) for r in records] == [("plan-change", True)]
