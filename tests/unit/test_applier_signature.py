"""The applier's standard-library PKCS#1 v1.5 verification, against signatures the ``cryptography`` package makes,
and against the known forgeries and malleations; generations only grow."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.signing_support import public_der, sign, signing_key, write_trusted_key
from topokeeper.cli.planning import plan_from_files
from topokeeper.headnode.bundle import Bundle, parse_bundle
from topokeeper.headnode.failures import BadSignature, Refused, Replayed
from topokeeper.headnode.main import main
from topokeeper.headnode.signature import (
    TrustedKey,
    check_generation,
    check_signature,
    pkcs1_sha256_valid,
    read_trusted_key,
    rsa_public_key,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLUSTER = "llm-train-slurm"
DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")


def _document() -> dict[str, Any]:
    document: dict[str, Any] = plan_from_files(EXAMPLES / "mixed-cluster.json", None, None).bundle.document()
    return document


def _trusted(key: rsa.RSAPrivateKey | None = None) -> TrustedKey:
    modulus, exponent = rsa_public_key(public_der(key or signing_key()))
    return TrustedKey(CLUSTER, "the stack's key", modulus, exponent)


def _bundle(document: dict[str, Any]) -> Bundle:
    return parse_bundle(json.dumps(document))


def _with_signature(document: dict[str, Any], value: bytes) -> dict[str, Any]:
    return {**document, "signature": {**document["signature"], "value": base64.b64encode(value).decode()}}


def _raw_sign(key: rsa.RSAPrivateKey, encoded: bytes) -> bytes:
    """An RSA signature of any encoded block: what a signer that pads differently would produce."""
    numbers = key.private_numbers()
    size = (numbers.public_numbers.n.bit_length() + 7) // 8
    value = pow(int.from_bytes(encoded, "big"), numbers.d, numbers.public_numbers.n)
    return value.to_bytes(size, "big")


def test_the_public_key_is_read_from_the_der_kms_returns() -> None:
    numbers = signing_key().public_key().public_numbers()
    assert rsa_public_key(public_der(signing_key())) == (numbers.n, numbers.e)


def test_a_bundle_signed_by_the_trusted_key_passes() -> None:
    bundle = _bundle(sign(_document(), 7))
    check_signature(bundle, "apply", _trusted())
    assert (bundle.generation, bundle.purpose) == (7, "apply")


def test_a_bundle_signed_by_another_key_is_refused() -> None:
    forged = _bundle(sign(_document(), 7, key=signing_key("attacker")))
    with pytest.raises(BadSignature, match="does not verify with the trusted key"):
        check_signature(forged, "apply", _trusted())


def test_an_unsigned_bundle_is_refused_when_a_key_is_trusted() -> None:
    with pytest.raises(BadSignature, match="not signed"):
        check_signature(_bundle(_document()), "apply", _trusted())


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: {**d, "generation": d["generation"] + 1},
        lambda d: {**d, "purpose": "verify"},
        lambda d: {**d, "nodes": d["nodes"][:-1]},
        lambda d: {**d, "cluster_name": "another-cluster"},
    ],
    ids=["generation", "purpose", "nodes", "cluster"],
)
def test_any_signed_field_edited_breaks_the_signature(edit: Any) -> None:
    with pytest.raises(BadSignature, match="does not verify"):
        check_signature(_bundle(edit(sign(_document(), 7))), "apply", _trusted())


def test_a_bundle_for_another_cluster_is_refused_though_validly_signed() -> None:
    document = sign({**_document(), "cluster_name": "another-cluster"}, 7)
    with pytest.raises(Refused, match="for cluster 'another-cluster'; this head node is 'llm-train-slurm'"):
        check_signature(_bundle(document), "apply", _trusted())


def test_a_bundle_signed_for_verify_is_never_applied() -> None:
    bundle = _bundle(sign(_document(), 7, purpose="verify"))
    check_signature(bundle, "verify", _trusted())
    with pytest.raises(Refused, match="signed for verify only"):
        check_signature(bundle, "apply", _trusted())


# --- forgeries and malleations: a lenient verifier accepts these, this one must not ---------------------


def test_bleichenbacher_2006_forgery_with_exponent_3_is_refused() -> None:
    """Garbage after the DigestInfo lets a cube root pass a verifier that parses the block: ours compares it."""
    key = signing_key("e3", exponent=3)
    trusted = _trusted(key)
    size = (trusted.modulus.bit_length() + 7) // 8
    digest = hashlib.sha256(b"a topology of the attacker's choosing").digest()
    prefix = b"\x00\x01\xff\x00" + DIGEST_INFO + digest
    garbage_bits = 8 * (size - len(prefix))
    target = int.from_bytes(prefix, "big") << garbage_bits
    root = _integer_cube_root(target) + 1
    forged = root.to_bytes(size, "big")
    assert pow(root, 3, trusted.modulus).to_bytes(size, "big").startswith(prefix)  # a real forgery attempt

    assert not pkcs1_sha256_valid(trusted, digest, forged)


def test_a_validly_signed_block_with_another_encoding_is_refused() -> None:
    """A real RSA signature of a non-canonical block (DigestInfo without the NULL, short padding, trailing
    data) is not a PKCS#1 v1.5 signature of the digest."""
    key = signing_key()
    trusted = _trusted(key)
    size = (trusted.modulus.bit_length() + 7) // 8
    digest = hashlib.sha256(b"bundle").digest()
    no_null = bytes.fromhex("302f300b0609608648016503040201") + b"\x04\x20" + digest
    blocks = [
        b"\x00\x01" + b"\xff" * (size - len(no_null) - 3) + b"\x00" + no_null,
        b"\x00\x01" + b"\xff" * 8 + b"\x00" + DIGEST_INFO + digest + b"\x00" * (size - 11 - len(DIGEST_INFO) - 32),
        b"\x00\x02" + b"\xff" * (size - len(DIGEST_INFO) - 35) + b"\x00" + DIGEST_INFO + digest,
    ]
    for block in blocks:
        assert len(block) == size
        assert not pkcs1_sha256_valid(trusted, digest, _raw_sign(key, block))
    canonical = b"\x00\x01" + b"\xff" * (size - len(DIGEST_INFO) - 35) + b"\x00" + DIGEST_INFO + digest
    assert pkcs1_sha256_valid(trusted, digest, _raw_sign(key, canonical))  # the same signer, canonical: valid


def test_malleated_signature_values_are_refused() -> None:
    trusted = _trusted()
    document = sign(_document(), 7)
    value = base64.b64decode(document["signature"]["value"])
    size = len(value)
    plus_modulus = int.from_bytes(value, "big") + trusted.modulus
    candidates = [
        (plus_modulus % (1 << (8 * size))).to_bytes(size, "big") if plus_modulus < 1 << (8 * size) else b"\xff" * size,
        b"\x00" + value,  # one byte longer, same number
        value[1:] if value[0] == 0 else value[:-1],  # one byte shorter
        b"\x00" * size,
        (1).to_bytes(size, "big"),  # 1^e = 1
        (trusted.modulus - 1).to_bytes(size, "big"),  # (-1)^e = -1
        value[:-1] + bytes([value[-1] ^ 1]),
    ]
    for candidate in candidates:
        with pytest.raises(BadSignature):
            check_signature(_bundle(_with_signature(document, candidate)), "apply", _trusted())


def test_a_signature_that_is_not_base64_is_refused() -> None:
    document = sign(_document(), 7)
    document["signature"]["value"] = "not base64!"
    with pytest.raises(BadSignature, match="not base64"):
        check_signature(_bundle(document), "apply", _trusted())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: {k: v for k, v in d.items() if k != "purpose"}, "a signed bundle has"),
        (lambda d: {**d, "generation": 0}, "bundle.generation"),
        (lambda d: {**d, "generation": True}, "bundle.generation"),
        (lambda d: {**d, "generation": 2**63}, "bundle.generation"),
        (lambda d: {**d, "purpose": "anything"}, "bundle.purpose"),
        (lambda d: {**d, "signature": {**d["signature"], "algorithm": "RSASSA_PSS_SHA_256"}}, "algorithm"),
        (lambda d: {**d, "signature": "AAAA"}, "bundle.signature: expected"),
    ],
)
def test_a_malformed_signing_field_is_bad_signature_naming_it(edit: Any, message: str) -> None:
    with pytest.raises(BadSignature, match=message):
        parse_bundle(json.dumps(edit(sign(_document(), 7))))


# --- the trusted-key file ------------------------------------------------------------------------------


def test_the_trusted_key_file_must_be_present_and_writable_by_root_only(tmp_path: Path) -> None:
    path = write_trusted_key(tmp_path / "key.json", CLUSTER)
    assert read_trusted_key(str(path)).modulus == _trusted().modulus
    os.chmod(path, 0o664)
    with pytest.raises(BadSignature, match="writable by no one else"):
        read_trusted_key(str(path))
    with pytest.raises(BadSignature, match="cannot check the signature"):
        read_trusted_key(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "x"}))
    os.chmod(tmp_path / "bad.json", 0o600)
    with pytest.raises(BadSignature, match="expected schema"):
        read_trusted_key(str(tmp_path / "bad.json"))


def test_a_trusted_key_that_is_no_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    # A FIFO with no writer would block the open until SIGKILL; a device could be read forever.
    fifo = tmp_path / "key.json"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(BadSignature, match="not a regular file"):
        read_trusted_key(str(fifo))


def test_a_forged_bundle_is_bad_signature_with_exit_2_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = write_trusted_key(tmp_path / "key.json", CLUSTER)
    bundle_file = tmp_path / "bundle.json"
    bundle_file.write_text(json.dumps(sign(_document(), 7, key=signing_key("attacker"))))
    # No scontrol exists here: refusing first is the only way this ends in bad_signature.
    code = main(["apply", str(bundle_file), "--trusted-key", str(key_file), "--scontrol", "/nonexistent"], environ={})
    document = json.loads(capsys.readouterr().out)
    assert (code, document["outcome"], document["signature"]) == (2, "bad_signature", "unchecked")


# --- generations -----------------------------------------------------------------------------------------


def test_apply_generations_only_grow() -> None:
    bundle = _bundle(sign(_document(), 7))
    check_generation(bundle, (0, None))
    check_generation(bundle, (6, "older plan"))
    check_generation(bundle, (7, bundle.plan_sha256))  # the same bundle again: a retry
    with pytest.raises(Replayed, match="generation 7 is not newer than generation 8"):
        check_generation(bundle, (8, "newer plan"))
    with pytest.raises(Replayed):
        check_generation(bundle, (7, "another plan"))


def _integer_cube_root(value: int) -> int:
    root = 1 << ((value.bit_length() + 2) // 3)
    while True:
        better = (2 * root + value // (root * root)) // 3
        if better >= root:
            break
        root = better
    while root**3 > value:
        root -= 1
    return root
