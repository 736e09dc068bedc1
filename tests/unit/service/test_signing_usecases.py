"""Reconcile signs every bundle it delivers, with a generation that only grows; drift signs what it verifies
for verify only. The applier's own check (not the signer's) says the signatures are valid."""

from __future__ import annotations

import base64
import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.fakes import MemoryStateStore
from tests.signing_support import LocalSigner, signing_key
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.errors import Retryable
from topokeeper.contract.ports import ApplyResult
from topokeeper.headnode import bundle as head_node_bundle
from topokeeper.headnode.bundle import parse_bundle
from topokeeper.headnode.failures import Refused
from topokeeper.headnode.signature import TrustedKey, check_signature, rsa_public_key
from topokeeper.render.bundle import Bundle
from topokeeper.service.controller import check_drift, reconcile
from topokeeper.service.reconcile import ControllerDeps
from topokeeper.service.signing import next_generation, trusted_key_document


def _signed_deps(controller: Controller, signer: LocalSigner) -> ControllerDeps:
    return dataclasses.replace(controller.deps(), signer=signer)


def _trusted(signer: LocalSigner) -> TrustedKey:
    document = trusted_key_document(CLUSTER, signer)
    modulus, exponent = rsa_public_key(base64.b64decode(document["public_key"]))
    return TrustedKey(document["cluster"], document["key_id"], modulus, exponent)


def _as_applier_reads_it(bundle: Bundle) -> head_node_bundle.Bundle:
    return parse_bundle(json.dumps(bundle.document(), sort_keys=True))


def test_a_delivered_bundle_is_signed_with_a_new_generation_the_applier_accepts() -> None:
    controller, signer = Controller(), LocalSigner()
    report = reconcile(controller.change(), _signed_deps(controller, signer))

    assert report.action == "delivered"
    (bundle,) = controller.channel.delivered
    state = controller.now_state()
    assert bundle.purpose == "apply" and bundle.generation == state.bundle_generation
    assert state.pending is not None and state.pending.bundle_generation == bundle.generation
    assert bundle.generation >= int(controller.clock.now().timestamp() * 1000)
    check_signature(_as_applier_reads_it(bundle), "apply", _trusted(signer))
    # The plans store keeps the plan's own bundle, content-addressed and unsigned.
    assert controller.plans.bundle(CLUSTER, bundle.plan_sha256) == bundle.unsigned()


def test_a_bundle_signed_by_another_key_fails_the_applier_check() -> None:
    controller = Controller()
    reconcile(controller.change(), _signed_deps(controller, LocalSigner(signing_key("attacker"))))
    (bundle,) = controller.channel.delivered
    with pytest.raises(Refused, match="does not verify"):
        check_signature(_as_applier_reads_it(bundle), "apply", _trusted(LocalSigner()))


def test_generations_grow_past_the_last_one_and_past_a_rebuilt_table() -> None:
    now = datetime(2026, 12, 2, 21, 0, tzinfo=UTC)
    first = next_generation(0, now)
    assert first == int(now.timestamp() * 1000)
    assert next_generation(first, now) == first + 1  # two in the same millisecond
    assert next_generation(first + 5, now - timedelta(seconds=10)) == first + 6  # a clock behind never goes back
    assert next_generation(0, now + timedelta(seconds=1)) > first + 1  # the table rebuilt: time carries on


def test_a_signing_failure_releases_the_claim_and_delivers_nothing() -> None:
    controller = Controller()

    class Throttled(LocalSigner):
        def sign_digest(self, digest: bytes) -> bytes:
            raise Retryable("ThrottlingException: Rate exceeded")

    with pytest.raises(Retryable):
        reconcile(controller.change(), _signed_deps(controller, Throttled()))
    assert controller.channel.delivered == []
    assert controller.now_state().pending is None


def test_drift_verifies_with_a_bundle_signed_for_verify_only_at_a_fresh_generation_nothing_records() -> None:
    controller, signer = Controller(), LocalSigner()
    reconcile(controller.change(), _signed_deps(controller, signer))
    state = controller.now_state()
    controller.state.save(state.model_copy(update={"pending": None, "applied_sha256": state.desired_sha256}))
    verified: list[Bundle] = []
    original = controller.channel.verify

    def recording(bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        verified.append(bundle)
        return original(bundle, request=request)

    controller.channel.verify = recording  # type: ignore[method-assign]
    check_drift(controller.cluster, _signed_deps(controller, signer))

    (bundle,) = verified
    # Time-floored, so even a head-node program that still compares it accepts it after a rebuilt table.
    assert bundle.purpose == "verify" and bundle.generation == next_generation(
        state.bundle_generation, controller.clock.now()
    )
    assert controller.now_state().bundle_generation == state.bundle_generation  # only applies are recorded
    parsed = _as_applier_reads_it(bundle)
    check_signature(parsed, "verify", _trusted(signer))
    with pytest.raises(Refused, match="signed for verify only"):
        check_signature(parsed, "apply", _trusted(signer))


def test_a_fresh_state_store_is_what_a_rebuilt_table_looks_like() -> None:
    controller, signer = Controller(), LocalSigner()
    reconcile(controller.change(), _signed_deps(controller, signer))
    (before,) = controller.channel.delivered
    controller.state = MemoryStateStore()
    controller.clock.advance(1)
    reconcile(controller.change(), _signed_deps(controller, signer))
    assert controller.channel.delivered[-1].generation > before.generation  # type: ignore[operator]
