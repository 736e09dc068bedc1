"""Authentic and fresh bundles: each delivered bundle is signed with the stack's KMS key and carries a
per-cluster generation that only grows; the head node's applier checks both before anything else.

A generation is above the cluster's last one and at least the time in milliseconds, so generations keep
growing when the state table is rebuilt (the head node remembers the last one it applied).
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


def for_reading(bundle: Bundle, last_generation: int, signer: BundleSigner | None) -> Bundle:
    """The bundle to verify or dry-run against: signed for verify only, at the cluster's current generation
    (the head node refuses an older one and never applies it); as is when the stack has no signing key."""
    if signer is None:
        return bundle
    return sign_bundle(bundle, max(last_generation, 1), "verify", signer)


def trusted_key_document(cluster: str, signer: BundleSigner) -> dict[str, str]:
    """What a head node of ``cluster`` keeps as its trusted key (the applier's ``--trusted-key`` file)."""
    return {
        "schema": TRUSTED_KEY_SCHEMA,
        "cluster": cluster,
        "key_id": signer.key_id,
        "public_key": base64.b64encode(signer.public_key()).decode(),
    }
