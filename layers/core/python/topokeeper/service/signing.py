"""Authentic and fresh bundles: each delivered bundle is signed with the stack's KMS key and carries a
per-cluster generation that only grows; the head node's applier checks both before anything else.

A generation is above the cluster's last one and at least the time in milliseconds, so generations keep
growing when the state table is rebuilt (the head node remembers the last one it applied). Only apply
generations are recorded (here and on the head node); a verify bundle's binds the answer to its request.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from typing import Literal

from topokeeper.contract.ports import BundleSigner
from topokeeper.render.bundle import Bundle, BundleSignature
from topokeeper.wire import SIGNATURE_ALGORITHM, TRUSTED_KEY_SCHEMA, signed_bytes


def next_generation(previous: int, now: datetime) -> int:
    return max(previous + 1, int(now.timestamp() * 1000))


def sign_bundle(bundle: Bundle, generation: int, purpose: Literal["apply", "verify"], signer: BundleSigner) -> Bundle:
    """``bundle`` with ``generation`` and ``purpose``, signed over the SHA-256 of its canonical bytes."""
    unsigned = bundle.unsigned().model_copy(update={"generation": generation, "purpose": purpose})
    value = signer.sign_digest(hashlib.sha256(signed_bytes(unsigned.document())).digest())
    signature = BundleSignature(
        algorithm=SIGNATURE_ALGORITHM, key_id=signer.key_id, value=base64.b64encode(value).decode()
    )
    return unsigned.model_copy(update={"signature": signature})


def for_reading(bundle: Bundle, last_generation: int, signer: BundleSigner | None, now: datetime) -> Bundle:
    """The bundle to verify or dry-run against: signed for verify only, at a generation of its own that nothing
    records (time-floored, so head-node programs that still compare it accept it after a rebuilt table too); the
    head node echoes it in its answer, and the SSM channel takes only the answer to this request
    (``adapters.ssm_channel.answer_to``). As is when the stack has no signing key."""
    if signer is None:
        return bundle
    return sign_bundle(bundle, next_generation(last_generation, now), "verify", signer)


def trusted_key_document(cluster: str, signer: BundleSigner) -> dict[str, str]:
    """What a head node of ``cluster`` keeps as its trusted key (the applier's ``--trusted-key`` file)."""
    return {
        "schema": TRUSTED_KEY_SCHEMA,
        "cluster": cluster,
        "key_id": signer.key_id,
        "public_key": base64.b64encode(signer.public_key()).decode(),
    }
