"""Authentic and fresh: the KMS signature and the generation."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from typing import (
    NamedTuple,
    Optional,
    Tuple,
)

from topokeeper.headnode.bundle import Bundle
from topokeeper.headnode.config_dir import (
    Faults,
    open_regular,
    read_json,
    write_json,
)
from topokeeper.headnode.failures import BadSignature, Failed, NotRegularFile, Refused, Replayed
from topokeeper.wire import TRUSTED_KEY_SCHEMA

# The reconcile signs sha256(signed_bytes(document)) with an asymmetric KMS key (RSASSA_PKCS1_V1_5_SHA_256,
# MessageType DIGEST). The head node holds the public key in a root-owned file (--trusted-key): the SSM
# command carries it, the agent's install script writes it. PKCS#1 v1.5 verification (RFC 8017 8.2.2) is
# one modular exponentiation and a comparison with the one encoding the digest allows, never a parse of the
# decrypted block (what the Bleichenbacher'06 forgeries exploit). Each signed bundle carries a generation
# that only grows per cluster; an apply records it beside the journal and a lower one is refused. Verify and
# dry-run change nothing, so they compare and record no generation (a rebuilt state table signs them below the
# recorded one): their generation is the request's, echoed in the result for the backend to match.


GENERATION_FILE = "generation.json"
MIN_RSA_BITS = 2048
_SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")  # RFC 8017 9.2 note 1
_RSA_ENCRYPTION = bytes.fromhex("2a864886f70d010101")  # OID 1.2.840.113549.1.1.1


class TrustedKey(NamedTuple):
    cluster: str
    key_id: str
    modulus: int
    exponent: int


def _der(data: bytes, offset: int, tag: int) -> Tuple[int, int]:
    """The start and end of the value of the DER element of ``tag`` at ``offset``."""
    if offset + 2 > len(data) or data[offset] != tag:
        raise ValueError("expected DER tag 0x%02x at %d" % (tag, offset))
    length, offset = data[offset + 1], offset + 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4:
            raise ValueError("bad DER length at %d" % offset)
        length, offset = int.from_bytes(data[offset : offset + count], "big"), offset + count
    if offset + length > len(data):
        raise ValueError("DER element runs past the end")
    return offset, offset + length


def rsa_public_key(der: bytes) -> Tuple[int, int]:
    """(modulus, exponent) of a DER SubjectPublicKeyInfo of an RSA key, as KMS GetPublicKey returns it."""
    start, _ = _der(der, 0, 0x30)
    algorithm, algorithm_end = _der(der, start, 0x30)
    oid, oid_end = _der(der, algorithm, 0x06)
    if der[oid:oid_end] != _RSA_ENCRYPTION:
        raise ValueError("not an RSA public key")
    bits, _ = _der(der, algorithm_end, 0x03)
    if der[bits : bits + 1] != b"\x00":
        raise ValueError("the key's BIT STRING has unused bits")
    sequence, _ = _der(der, bits + 1, 0x30)
    modulus_start, modulus_end = _der(der, sequence, 0x02)
    exponent_start, exponent_end = _der(der, modulus_end, 0x02)
    modulus = int.from_bytes(der[modulus_start:modulus_end], "big")
    exponent = int.from_bytes(der[exponent_start:exponent_end], "big")
    if modulus.bit_length() < MIN_RSA_BITS or exponent < 3 or exponent % 2 == 0:
        raise ValueError("RSA key too small or with a bad exponent")
    return modulus, exponent


def read_trusted_key(path: str) -> TrustedKey:
    """The head node's public key file; it must be root's (this user's) and writable by no one else."""
    try:
        with os.fdopen(open_regular(path), "rb") as reader:
            found = os.fstat(reader.fileno())
            if found.st_uid != os.geteuid() or found.st_mode & 0o022:
                raise ValueError(
                    "owner uid %d, mode %04o: must be this user's, writable by no one else"
                    % (found.st_uid, stat.S_IMODE(found.st_mode))
                )
            document = json.loads(reader.read().decode("utf-8"))
        if not isinstance(document, dict) or document.get("schema") != TRUSTED_KEY_SCHEMA:
            raise ValueError("expected schema %s" % TRUSTED_KEY_SCHEMA)
        cluster, key_id, public_key = document.get("cluster"), document.get("key_id"), document.get("public_key")
        if not (isinstance(cluster, str) and isinstance(key_id, str) and isinstance(public_key, str)):
            raise ValueError("expected cluster, key_id and public_key strings")
        modulus, exponent = rsa_public_key(base64.b64decode(public_key, validate=True))
    except (OSError, ValueError) as error:  # binascii.Error and JSON errors are ValueErrors
        detail = error.strerror if isinstance(error, NotRegularFile) else error  # its str names the path again
        raise BadSignature("cannot check the signature: trusted key %s: %s" % (path, detail)) from None
    return TrustedKey(cluster, key_id, modulus, exponent)


def pkcs1_sha256_valid(key: TrustedKey, digest: bytes, signature: bytes) -> bool:
    """RSASSA-PKCS1-v1_5 verification with SHA-256 (RFC 8017 8.2.2): the signature's e-th power mod n must
    equal, byte for byte, 00 01 FF..FF 00 DigestInfo(digest); compared in time independent of where it differs."""
    size = (key.modulus.bit_length() + 7) // 8
    if len(signature) != size or len(digest) != 32:
        return False
    representative = int.from_bytes(signature, "big")
    if representative >= key.modulus:
        return False
    encoded = pow(representative, key.exponent, key.modulus).to_bytes(size, "big")
    suffix = _SHA256_DIGEST_INFO + digest
    expected = b"\x00\x01" + b"\xff" * (size - len(suffix) - 3) + b"\x00" + suffix
    difference = 0
    for index in range(size):
        difference |= encoded[index] ^ expected[index]
    return difference == 0


def check_signature(bundle: Bundle, mode: str, key: TrustedKey) -> None:
    """Before anything else: signed by the trusted key, for this cluster, for this use."""
    if bundle.signature is None or bundle.generation is None:
        raise BadSignature("the bundle is not signed, and this head node trusts only bundles signed by %s" % key.key_id)
    try:
        value = base64.b64decode(str(bundle.signature["value"]), validate=True)
    except ValueError:
        raise BadSignature("bundle.signature.value: not base64") from None
    if not pkcs1_sha256_valid(key, hashlib.sha256(bundle.signed_bytes).digest(), value):
        raise BadSignature(
            "the signature does not verify with the trusted key %s (the bundle says %s): forged or edited"
            % (key.key_id, str(bundle.signature["key_id"])[:200])
        )
    if bundle.cluster_name != key.cluster:
        raise Refused("the bundle is for cluster %r; this head node is %r" % (bundle.cluster_name[:80], key.cluster))
    if mode == "apply" and bundle.purpose != "apply":
        raise Refused("the bundle is signed for %s only, never to apply" % bundle.purpose)


def last_generation(backup_fd: int, where: str = GENERATION_FILE) -> Tuple[int, Optional[str]]:
    """The generation (and its plan) of the last signed bundle an apply accepted here; (0, None) before any.
    ``where``: the file's path, for messages."""
    try:
        document = read_json(backup_fd, GENERATION_FILE, where)
    except (ValueError, Failed) as error:
        raise Failed(
            "%s is not readable JSON (%s): remove it only if no older bundle can be replayed" % (GENERATION_FILE, error)
        ) from None
    if document is None:
        return 0, None
    generation, plan = document.get("generation"), document.get("plan_sha256")
    if type(generation) is not int or not isinstance(plan, str):
        raise Failed("%s: expected {generation, plan_sha256}" % GENERATION_FILE)
    return generation, plan


def check_generation(bundle: Bundle, last: Tuple[int, Optional[str]]) -> None:
    """An apply only newer than the last one; the same generation only as the very same bundle again (a retry)."""
    generation, plan = last
    offered = bundle.generation or 0  # a signed bundle's is at least 1
    if offered < generation or (offered == generation and bundle.plan_sha256 != plan):
        raise Replayed(
            "bundle generation %d is not newer than generation %d, applied here last (plan %s): an older bundle"
            " put back?" % (offered, generation, (plan or "")[:12])
        )


def accept_generation(backup_fd: int, where: str, bundle: Bundle, faults: "Faults") -> None:
    """Under the lock, before the apply writes: record the generation (in the backup root ``where``), so no
    older bundle applies after it."""
    last = last_generation(backup_fd, os.path.join(where, GENERATION_FILE))
    check_generation(bundle, last)
    if last == (bundle.generation, bundle.plan_sha256):
        return  # the same bundle again (a retry): recorded already, and a full disk needs no block for it
    document = {"generation": bundle.generation, "plan_sha256": bundle.plan_sha256}
    try:
        write_json(backup_fd, GENERATION_FILE, document, faults, "generation")
    except OSError as error:
        raise Failed(
            "could not record generation %d in %s (%s); this bundle changed nothing"
            % (bundle.generation or 0, os.path.join(where, GENERATION_FILE), error.strerror or error)
        ) from None
