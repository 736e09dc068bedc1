"""The stack's bundle-signing key: KMS Sign of a SHA-256 digest (``MessageType=DIGEST``: a RAW message is capped
at 4,096 bytes, and bundles are larger), GetPublicKey once per process.

Throttling, ``KMSInternalException`` and ``DependencyTimeoutException`` are Retryable; a disabled key
(``DisabledException``), one pending deletion (``KMSInvalidStateException``), a missing one (``NotFoundException``),
a key that cannot sign (``InvalidKeyUsageException``) and access errors are Permanent, with KMS's reason.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from topokeeper.adapters.aws import aws_errors
from topokeeper.contract.errors import Permanent
from topokeeper.wire import SIGNATURE_ALGORITHM

SHA256_DIGEST_BYTES = 32


class KmsBundleSigner:
    def __init__(self, kms: Any, key_id: str) -> None:
        self._kms = kms
        self._key_id = key_id

    @property
    def key_id(self) -> str:
        return self._key_id

    @aws_errors()
    def sign_digest(self, digest: bytes) -> bytes:
        if len(digest) != SHA256_DIGEST_BYTES:  # KMS refuses it too, after a round trip
            raise Permanent(f"a SHA-256 digest is {SHA256_DIGEST_BYTES} bytes, not {len(digest)}")
        response = self._kms.sign(
            KeyId=self._key_id, Message=digest, MessageType="DIGEST", SigningAlgorithm=SIGNATURE_ALGORITHM
        )
        signature: bytes = response["Signature"]
        return signature

    def public_key(self) -> bytes:
        return self._public_key

    @cached_property
    @aws_errors()
    def _public_key(self) -> bytes:
        response = self._kms.get_public_key(KeyId=self._key_id)
        if SIGNATURE_ALGORITHM not in response.get("SigningAlgorithms", []):
            raise Permanent(
                f"KMS key {self._key_id} cannot sign with {SIGNATURE_ALGORITHM} (is it RSA_3072 SIGN_VERIFY?)"
            )
        key: bytes = response["PublicKey"]
        return key
