"""KMS Sign and Verify as AWS answers them: ``MessageType`` honoured, RAW capped at 4,096 bytes.

moto ignores ``MessageType`` (it hashes a DIGEST again, so its signature of a digest verifies against
nothing AWS would sign) and signs a RAW message of any size; the emulator answers as KMS does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from botocore.exceptions import ClientError
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils

from topokeeper.sim.aws_emulator import AwsEmulator

ALGORITHM = "RSASSA_PKCS1_V1_5_SHA_256"


def _signing_key(aws: AwsEmulator) -> tuple[Any, str]:
    kms = aws.client("kms")
    key_id: str = kms.create_key(KeySpec="RSA_3072", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["KeyId"]
    return kms, key_id


def _public_key(kms: Any, key_id: str) -> rsa.RSAPublicKey:
    der = kms.get_public_key(KeyId=key_id)["PublicKey"]
    key = serialization.load_der_public_key(der)
    assert isinstance(key, rsa.RSAPublicKey)
    return key


def _sign(kms: Any, key_id: str, message: bytes, message_type: str) -> bytes:
    signature: bytes = kms.sign(KeyId=key_id, Message=message, MessageType=message_type, SigningAlgorithm=ALGORITHM)[
        "Signature"
    ]
    return signature


def test_a_digest_is_signed_as_it_is_not_hashed_again(aws: AwsEmulator) -> None:
    kms, key_id = _signing_key(aws)
    message = b'{"generation": 1}'
    digest = hashlib.sha256(message).digest()

    signature = _sign(kms, key_id, digest, "DIGEST")

    public = _public_key(kms, key_id)
    public.verify(signature, digest, padding.PKCS1v15(), utils.Prehashed(hashes.SHA256()))
    public.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())  # the same as signing RAW
    with pytest.raises(InvalidSignature):  # what moto's double hashing would make
        public.verify(signature, digest, padding.PKCS1v15(), hashes.SHA256())


def test_raw_and_digest_signatures_of_one_message_are_equal(aws: AwsEmulator) -> None:
    kms, key_id = _signing_key(aws)
    message = b"x" * 4096  # the largest RAW message KMS signs

    assert _sign(kms, key_id, message, "RAW") == _sign(kms, key_id, hashlib.sha256(message).digest(), "DIGEST")


@pytest.mark.parametrize(
    ("message", "message_type", "reason"),
    [(b"x" * 4097, "RAW", "4096"), (b"\x00" * 48, "DIGEST", "Digest is invalid length")],
    ids=["raw-over-4096-bytes", "digest-of-the-wrong-length"],
)
def test_what_kms_refuses_to_sign_is_refused(aws: AwsEmulator, message: bytes, message_type: str, reason: str) -> None:
    kms, key_id = _signing_key(aws)

    with pytest.raises(ClientError) as refused:
        _sign(kms, key_id, message, message_type)

    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert reason in refused.value.response["Error"]["Message"]


def test_verify_honours_the_message_type(aws: AwsEmulator) -> None:
    kms, key_id = _signing_key(aws)
    digest = hashlib.sha256(b"bundle").digest()
    signature = _sign(kms, key_id, digest, "DIGEST")

    def verify(message: bytes, message_type: str, candidate: bytes = signature) -> bool:
        try:
            answer = kms.verify(
                KeyId=key_id,
                Message=message,
                MessageType=message_type,
                Signature=candidate,
                SigningAlgorithm=ALGORITHM,
            )
        except ClientError as error:  # KMS answers an invalid signature with an error, not False
            assert error.response["Error"]["Code"] == "KMSInvalidSignatureException"
            return False
        return bool(answer["SignatureValid"])

    assert verify(digest, "DIGEST")
    assert verify(b"bundle", "RAW")
    assert not verify(digest, "RAW")
    forged = signature[:-1] + bytes([signature[-1] ^ 1])
    assert not verify(digest, "DIGEST", forged)
