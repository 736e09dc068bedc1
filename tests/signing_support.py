"""Signed bundles and trusted-key files for tests, made with the ``cryptography`` package (never the applier's
own code), so that the applier's standard-library verification is checked against an independent signer."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils

from topokeeper.wire import SIGNATURE_ALGORITHM, TRUSTED_KEY_SCHEMA, signed_bytes

KEY_ID = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"


@cache
def signing_key(name: str = "stack", exponent: int = 65537) -> rsa.RSAPrivateKey:
    """One RSA-3072 key per name (as KMS RSA_3072), made once per test session."""
    return rsa.generate_private_key(public_exponent=exponent, key_size=3072)


def public_der(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def sign(
    document: dict[str, Any], generation: int, *, key: rsa.RSAPrivateKey | None = None, purpose: str = "apply"
) -> dict[str, Any]:
    """``document`` signed as the reconcile signs it (the SHA-256 of the canonical bytes, PKCS#1 v1.5)."""
    unsigned = {k: v for k, v in document.items() if k not in ("generation", "purpose", "signature")}
    unsigned.update(generation=generation, purpose=purpose)
    digest = hashlib.sha256(signed_bytes(unsigned)).digest()
    value = (key or signing_key()).sign(digest, padding.PKCS1v15(), utils.Prehashed(hashes.SHA256()))
    signature = {"algorithm": SIGNATURE_ALGORITHM, "key_id": KEY_ID, "value": base64.b64encode(value).decode()}
    return {**unsigned, "signature": signature}


def write_trusted_key(path: Path, cluster: str, key: rsa.RSAPrivateKey | None = None) -> Path:
    """The head node's trusted-key file, root-only as the installers write it."""
    document = {
        "schema": TRUSTED_KEY_SCHEMA,
        "cluster": cluster,
        "key_id": KEY_ID,
        "public_key": base64.b64encode(public_der(key or signing_key())).decode(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    os.chmod(path, 0o600)
    return path


class LocalSigner:
    """A ``BundleSigner`` on a local key: what KMS Sign with MessageType DIGEST returns, without KMS."""

    def __init__(self, key: rsa.RSAPrivateKey | None = None, key_id: str = KEY_ID) -> None:
        self._key = key or signing_key()
        self._key_id = key_id
        self.signed = 0

    @property
    def key_id(self) -> str:
        return self._key_id

    def sign_digest(self, digest: bytes) -> bytes:
        self.signed += 1
        return self._key.sign(digest, padding.PKCS1v15(), utils.Prehashed(hashes.SHA256()))

    def public_key(self) -> bytes:
        return public_der(self._key)
