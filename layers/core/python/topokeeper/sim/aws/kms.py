"""KMS Sign and Verify as AWS answers them; moto keeps the keys (and serves GetPublicKey and the rest).

moto ignores ``MessageType``: it hashes a DIGEST again, so its signature of a digest is one AWS never makes,
and it signs a RAW message of any size. KMS signs a RAW message of at most 4,096 bytes, takes a DIGEST only
of the algorithm's digest length, refuses a disabled key or one pending deletion, and answers an invalid
signature with ``KMSInvalidSignatureException``, never ``SignatureValid: false``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from moto.kms.exceptions import NotFoundException
from moto.kms.models import kms_backends

from topokeeper.sim.aws.protocol import ApiError, ApiRequest, json_params

MAX_RAW_MESSAGE_BYTES = 4096
_HASHES: dict[str, Callable[[], hashes.HashAlgorithm]] = {
    "SHA_256": hashes.SHA256,
    "SHA_384": hashes.SHA384,
    "SHA_512": hashes.SHA512,
}


def _hash_for(algorithm: str) -> hashes.HashAlgorithm:
    return _HASHES[algorithm[-7:]]()


def _rsa_padding(algorithm: str) -> padding.AsymmetricPadding:
    if algorithm.startswith("RSASSA_PSS_"):
        # KMS signs PSS with a salt as long as the digest, and verifies only that.
        return padding.PSS(mgf=padding.MGF1(_hash_for(algorithm)), salt_length=padding.PSS.DIGEST_LENGTH)
    return padding.PKCS1v15()


class KmsSigning:
    """``handlers()`` serve Sign and Verify over moto's keys."""

    def __init__(self, account_id: str, region: str) -> None:
        self._account_id = account_id
        self._region = region

    def handlers(self) -> dict[tuple[str, str], Callable[[ApiRequest], Mapping[str, Any]]]:
        return {("kms", "Sign"): self.sign, ("kms", "Verify"): self.verify}

    def sign(self, request: ApiRequest) -> dict[str, Any]:
        params = json_params(request)
        key, algorithm, digest = self._prepare(request, params)
        private = key.private_key.private_key
        if isinstance(private, rsa.RSAPrivateKey):
            signature = private.sign(digest, _rsa_padding(algorithm), utils.Prehashed(_hash_for(algorithm)))
        else:
            signature = private.sign(digest, ec.ECDSA(utils.Prehashed(_hash_for(algorithm))))
        return {"KeyId": key.arn, "Signature": base64.b64encode(signature).decode(), "SigningAlgorithm": algorithm}

    def verify(self, request: ApiRequest) -> dict[str, Any]:
        params = json_params(request)
        key, algorithm, digest = self._prepare(request, params)
        signature = _blob(params, "Signature")
        public = key.private_key.private_key.public_key()
        try:
            if isinstance(public, rsa.RSAPublicKey):
                public.verify(signature, digest, _rsa_padding(algorithm), utils.Prehashed(_hash_for(algorithm)))
            else:
                public.verify(signature, digest, ec.ECDSA(utils.Prehashed(_hash_for(algorithm))))
        except InvalidSignature:
            raise ApiError("KMSInvalidSignatureException", "", 400) from None
        return {"KeyId": key.arn, "SignatureValid": True, "SigningAlgorithm": algorithm}

    def _prepare(self, request: ApiRequest, params: Mapping[str, Any]) -> tuple[Any, str, bytes]:
        """The key, the algorithm and the digest to sign or verify, or the error KMS answers."""
        backend = kms_backends[self._account_id][request.region or self._region]
        key_id = params.get("KeyId")
        try:
            key = backend.describe_key(str(key_id))
        except (KeyError, NotFoundException):
            raise ApiError("NotFoundException", f"Invalid keyId {key_id}") from None
        if key.key_state == "Disabled":
            raise ApiError("DisabledException", f"{key.arn} is disabled.")
        if key.key_state != "Enabled":
            raise ApiError("KMSInvalidStateException", f"{key.arn} is {key.key_state.lower()}.")
        if key.key_usage != "SIGN_VERIFY":
            raise ApiError("InvalidKeyUsageException", f"{key.arn} key usage is {key.key_usage} which is not valid.")
        algorithm = str(params.get("SigningAlgorithm"))
        if algorithm not in key.signing_algorithms:
            raise ApiError(
                "ValidationException",
                f"1 validation error detected: Value '{algorithm}' at 'SigningAlgorithm' failed to satisfy "
                f"constraint: Member must satisfy enum value set: {key.signing_algorithms}",
            )
        message = _blob(params, "Message")
        message_type = params.get("MessageType", "RAW")
        hash_algorithm = _hash_for(algorithm)
        if message_type == "RAW":
            if len(message) > MAX_RAW_MESSAGE_BYTES:
                raise ApiError(
                    "ValidationException",
                    "1 validation error detected: Value at 'message' failed to satisfy constraint: "
                    f"Member must have length less than or equal to {MAX_RAW_MESSAGE_BYTES}",
                )
            digest = hashes.Hash(hash_algorithm)
            digest.update(message)
            return key, algorithm, digest.finalize()
        if message_type == "DIGEST":
            if len(message) != hash_algorithm.digest_size:
                raise ApiError("ValidationException", f"Digest is invalid length for algorithm {algorithm}.")
            return key, algorithm, message
        raise ApiError(
            "ValidationException",
            f"1 validation error detected: Value '{message_type}' at 'messageType' failed to satisfy constraint: "
            "Member must satisfy enum value set: [RAW, DIGEST]",
        )


def _blob(params: Mapping[str, Any], name: str) -> bytes:
    value = params.get(name)
    try:
        blob = base64.b64decode(str(value), validate=True) if value is not None else b""
    except (binascii.Error, ValueError):
        raise ApiError("SerializationException", f"{name}: not base64") from None
    if not blob:
        raise ApiError(
            "ValidationException",
            f"1 validation error detected: Value at '{name[0].lower() + name[1:]}' failed to satisfy constraint: "
            "Member must have length greater than or equal to 1",
        )
    return blob
