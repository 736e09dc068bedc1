"""The bundle signer on the emulator's KMS: a digest signed as the applier verifies it; a disabled, deleted or
wrong key is Permanent with KMS's reason; throttling is Retryable."""

from __future__ import annotations

import hashlib

import pytest
from botocore.config import Config

from topokeeper.adapters.kms import KmsBundleSigner
from topokeeper.contract.errors import Permanent, Retryable
from topokeeper.headnode.signature import TrustedKey, pkcs1_sha256_valid, rsa_public_key
from topokeeper.sim.aws_emulator import AwsEmulator

ONE_ATTEMPT = Config(retries={"total_max_attempts": 1})


def _signer(aws: AwsEmulator, **key: str) -> tuple[KmsBundleSigner, str]:
    kms = aws.client("kms", config=ONE_ATTEMPT)
    spec = key or {"KeySpec": "RSA_3072", "KeyUsage": "SIGN_VERIFY"}
    key_id: str = kms.create_key(**spec)["KeyMetadata"]["Arn"]
    return KmsBundleSigner(kms, key_id), key_id


def test_a_digest_kms_signs_is_what_the_applier_verifies(aws: AwsEmulator) -> None:
    signer, key_id = _signer(aws)
    digest = hashlib.sha256(b"canonical bundle bytes").digest()
    modulus, exponent = rsa_public_key(signer.public_key())
    trusted = TrustedKey("c", key_id, modulus, exponent)

    assert pkcs1_sha256_valid(trusted, digest, signer.sign_digest(digest))
    assert not pkcs1_sha256_valid(trusted, hashlib.sha256(digest).digest(), signer.sign_digest(digest))


@pytest.mark.parametrize("state", ["disabled", "pending deletion"])
def test_a_key_that_cannot_sign_now_is_permanent_with_the_reason(aws: AwsEmulator, state: str) -> None:
    signer, key_id = _signer(aws)
    kms, bare_id = aws.client("kms"), key_id.split("/")[-1]
    if state == "disabled":
        kms.disable_key(KeyId=bare_id)
    else:
        kms.schedule_key_deletion(KeyId=bare_id, PendingWindowInDays=7)
    with pytest.raises(Permanent, match="DisabledException" if state == "disabled" else "KMSInvalidStateException"):
        signer.sign_digest(hashlib.sha256(b"x").digest())


def test_a_key_that_is_not_a_signing_key_is_permanent(aws: AwsEmulator) -> None:
    signer, _ = _signer(aws, KeySpec="SYMMETRIC_DEFAULT", KeyUsage="ENCRYPT_DECRYPT")
    with pytest.raises(Permanent, match="InvalidKeyUsageException"):
        signer.sign_digest(hashlib.sha256(b"x").digest())


def test_throttling_is_retryable(aws: AwsEmulator) -> None:
    signer, _ = _signer(aws)
    aws.rate_limits.set("Sign", capacity=1, refill_per_second=0.001)  # simulated time stands still
    signer.sign_digest(hashlib.sha256(b"x").digest())
    with pytest.raises(Retryable, match="ThrottlingException"):
        signer.sign_digest(hashlib.sha256(b"y").digest())
