import base64
import gzip
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.helpers import gb200_nodes, p5_nodes, snapshot
from tests.signing_support import LocalSigner
from topokeeper.adapters.ssm_channel import (
    BOOTSTRAP,
    INLINE_LIMIT_BYTES,
    SsmChannel,
    build_commands,
    command_size,
    guard_target,
    parse_invocation,
)
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes, program_sha256
from topokeeper.contract.ports import Outcome
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render
from topokeeper.service.signing import sign_bundle, trusted_key_document


class RecordingS3:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.content_types: dict[str, str] = {}

    def put_object(self, Bucket: str, Key: str, Body: bytes, ContentType: str = "", **_: object) -> dict:
        self.objects[Key] = Body
        self.content_types[Key] = ContentType
        return {"ETag": '"x"'}

    def generate_presigned_url(self, operation: str, Params: dict, ExpiresIn: int) -> str:
        return f"https://example.invalid/{Params['Key']}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires={ExpiresIn}"


def _channel(s3: RecordingS3) -> SsmChannel:
    return SsmChannel(None, s3, "bucket", "i-0123456789abcdef0", cluster="test-cluster", now=lambda: datetime.now(UTC))


def _bundle(nodes: int):
    return render(plan(snapshot({"p5": p5_nodes(nodes, partition="p5"), "gb": gb200_nodes(2)}))).bundle


def _decode(commands: list[str]) -> dict:
    start = commands.index("cat > \"$work/payload\" <<'TOPOKEEPER_PAYLOAD_END'") + 1
    end = commands.index("TOPOKEEPER_PAYLOAD_END")
    return json.loads(gzip.decompress(base64.b64decode("".join(commands[start:end]))))


def _stand_in_program(main: str) -> bytes:
    """A zipapp whose ``__main__.py`` is ``main``: binary like the real program (its headers are not UTF-8)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("__main__.py", main)
    data = buffer.getvalue()
    with pytest.raises(UnicodeDecodeError):
        data.decode()
    return data


def _inline(program: bytes) -> dict[str, str]:
    return {"program": base64.b64encode(program).decode(), "program_sha256": hashlib.sha256(program).hexdigest()}


def test_shell_text_is_fixed_and_data_is_only_base64() -> None:
    a = build_commands({"mode": "apply", "bundle": "x; rm -rf / $(reboot) `id`", "program": "a"})
    b = build_commands({"mode": "apply", "bundle": "something else entirely", "program": "b"})
    start = a.index("cat > \"$work/payload\" <<'TOPOKEEPER_PAYLOAD_END'") + 1
    fixed_a = a[:start] + a[a.index("TOPOKEEPER_PAYLOAD_END") :]
    fixed_b = b[:start] + b[b.index("TOPOKEEPER_PAYLOAD_END") :]
    assert fixed_a == fixed_b
    data = a[start : a.index("TOPOKEEPER_PAYLOAD_END")]
    assert all(set(line) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") for line in data)


def test_small_bundle_travels_inline_and_the_program_through_s3() -> None:
    """The program does not fit in the command (the tripwire): it goes to S3 as application/zip under its sha256,
    pinned by it; a small bundle still rides inline."""
    s3 = RecordingS3()
    bundle = _bundle(16)
    commands = _channel(s3).payload(bundle, "apply")
    payload = _decode(commands)
    assert json.loads(payload["bundle"])["plan_sha256"] == bundle.plan_sha256
    assert payload["mode"] == "apply" and "bundle_url" not in payload
    assert command_size(commands) <= INLINE_LIMIT_BYTES
    program = program_bytes()
    assert command_size(build_commands({**payload, **_inline(program), "program_url": None})) > INLINE_LIMIT_BYTES
    key = f"payloads/test-cluster/program-{program_sha256()}.pyz"
    assert payload["program"] is None and payload["program_url"].startswith(f"https://example.invalid/{key}?")
    assert s3.objects == {key: program}
    assert s3.content_types[key] == "application/zip"
    assert payload["program_sha256"] == hashlib.sha256(program).hexdigest()


def test_large_bundle_goes_to_s3_with_its_hash() -> None:
    s3 = RecordingS3()
    bundle = _bundle(4000)
    commands = _channel(s3).payload(bundle, "verify")
    payload = _decode(commands)
    assert payload["bundle"] is None
    assert payload["bundle_url"].startswith("https://example.invalid/payloads/test-cluster/")
    stored = s3.objects[f"payloads/test-cluster/{payload['bundle_sha256']}.json"].decode()
    assert hashlib.sha256(stored.encode()).hexdigest() == payload["bundle_sha256"]
    assert command_size(commands) <= INLINE_LIMIT_BYTES


def test_inline_limit_boundary() -> None:
    """Find the node count where the bundle stops fitting inline: just below stays inline, just above goes to S3."""
    s3 = RecordingS3()
    channel = _channel(s3)
    low, high = 16, 4000
    inline: list[str] | None = None
    # Each payload carries fresh random names (the result key's token), so the search keeps what it measured
    # rather than building the boundary's payloads again.
    while high - low > 1:
        middle = (low + high) // 2
        payload = channel.payload(_bundle(middle), "apply")
        if _decode(payload).get("bundle") is not None:
            low, inline = middle, payload
        else:
            high = middle
    assert inline is not None and high < 4000  # a boundary inside the range, measured on both sides
    assert INLINE_LIMIT_BYTES - 2000 < command_size(inline) <= INLINE_LIMIT_BYTES


def test_the_real_program_travels_inline_byte_for_byte_and_answers(tmp_path: Path) -> None:
    """The built program through the whole command under /bin/sh: decoded, checked, written and run as bytes."""
    bundle = "{}"
    commands = build_commands(
        {
            "mode": "verify",
            **_inline(program_bytes()),
            "bundle": bundle,
            "bundle_sha256": hashlib.sha256(bundle.encode()).hexdigest(),
        }
    )
    script = tmp_path / "_script.sh"  # AWS-RunShellScript writes the commands to a file and runs it
    script.write_text("\n".join(commands) + "\n")
    (tmp_path / "work").mkdir()
    result = subprocess.run(
        ["sh", str(script)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent), "TMPDIR": str(tmp_path / "work")},
    )
    document = json.loads(result.stdout)
    assert (result.returncode, result.stderr, document["outcome"]) == (2, "", "refused")
    assert document["error"].startswith("bundle.schema: expected topokeeper.bundle/2")


@pytest.mark.parametrize(
    "target", ["sagemaker-cluster:abc_controller-i-0123456789abcdef0", "i-123", "mi-12", "i-0123456789abcdef0 "]
)
def test_only_ssm_ids_are_targeted(target: str) -> None:
    with pytest.raises(ValueError, match="i-/mi- ids only"):
        guard_target(target)
    assert guard_target("mi-0123456789abcdef0") == "mi-0123456789abcdef0"


def test_bootstrap_refuses_a_tampered_payload(tmp_path: Path) -> None:
    """The on-node bootstrap checks hashes before anything runs."""
    payload = {
        "mode": "apply",
        "program": base64.b64encode(_stand_in_program("print('never')")).decode(),
        "program_sha256": "0" * 64,
        "bundle": "{}",
        "bundle_sha256": "0" * 64,
    }
    (tmp_path / "payload").write_bytes(base64.b64encode(gzip.compress(json.dumps(payload).encode())))
    result = subprocess.run(
        [sys.executable, "-", str(tmp_path)], input=BOOTSTRAP, capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert json.loads(result.stdout) == {
        "outcome": "refused",
        "applier_version": None,
        "error": "program sha256 mismatch",
    }


def _bootstrap(tmp_path: Path, payload: dict) -> subprocess.CompletedProcess[str]:
    (tmp_path / "payload").write_bytes(base64.b64encode(gzip.compress(json.dumps(payload).encode())))
    return subprocess.run(
        [sys.executable, "-", str(tmp_path)], input=BOOTSTRAP, capture_output=True, text=True, check=False
    )


def test_bootstrap_fetches_the_program_checks_its_pinned_hash_and_passes_the_trusted_key(tmp_path: Path) -> None:
    program = _stand_in_program("import json, sys; print(json.dumps({'outcome': 'unchanged', 'argv': sys.argv}))")
    (tmp_path / "staged.pyz").write_bytes(program)
    payload = {
        "mode": "apply",
        "program": None,
        "program_url": (tmp_path / "staged.pyz").as_uri(),  # urllib reads file: URLs as it reads presigned ones
        "program_sha256": hashlib.sha256(program).hexdigest(),
        "bundle": "{}",
        "bundle_sha256": hashlib.sha256(b"{}").hexdigest(),
        "trusted_key": '{"schema": "topokeeper.signing-key/1"}',
    }
    work = tmp_path / "work"
    work.mkdir()
    result = _bootstrap(work, payload)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    expected = [str(work / PROGRAM_NAME), "apply", str(work / "bundle.json")]
    assert argv == [*expected, "--trusted-key", str(work / "trusted-key.json")]
    assert (work / "trusted-key.json").read_text() == payload["trusted_key"]
    assert (work / PROGRAM_NAME).read_bytes() == program  # written as the bytes it is

    (tmp_path / "staged.pyz").write_bytes(program + b"\nimport os; os.system('id')")  # swapped in the bucket
    result = _bootstrap(work, payload)
    assert (result.returncode, json.loads(result.stdout)["error"]) == (2, "program sha256 mismatch")


def test_script_runs_under_sh_and_execs_the_program(tmp_path: Path) -> None:
    """The whole command text runs under /bin/sh; here the program is a stand-in zipapp that echoes its argv."""
    program = _stand_in_program("import json, sys; print(json.dumps({'outcome': 'unchanged', 'argv': sys.argv[1:2]}))")
    bundle = "{}"
    commands = build_commands(
        {
            "mode": "verify",
            **_inline(program),
            "bundle": bundle,
            "bundle_sha256": hashlib.sha256(bundle.encode()).hexdigest(),
        }
    )
    script = tmp_path / "_script.sh"  # AWS-RunShellScript writes the commands to a file and runs it
    script.write_text("\n".join(commands) + "\n")
    (tmp_path / "work").mkdir()
    result = subprocess.run(
        ["sh", str(script)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent), "TMPDIR": str(tmp_path / "work")},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"outcome": "unchanged", "argv": ["verify"]}
    assert list((tmp_path / "work").iterdir()) == []  # the work directory is removed


@pytest.mark.parametrize(
    ("invocation", "outcome"),
    [
        (
            {
                "Status": "Success",
                "StatusDetails": "Success",
                "StandardOutputContent": '{"outcome": "applied", "applier_version": "1.0.0"}',
            },
            Outcome.APPLIED,
        ),
        (
            {
                "Status": "Failed",
                "StatusDetails": "Failed",
                "ResponseCode": 1,
                "StandardOutputContent": "motd\n"
                + json.dumps({"outcome": "rolled_back", "applier_version": "1.0.0", "error": "fatal"}),
            },
            Outcome.ROLLED_BACK,
        ),
        (
            {
                "Status": "Failed",
                "StatusDetails": "Failed",
                "ResponseCode": 2,
                "StandardOutputContent": '{"outcome": "refused", "applier_version": "1.0.0", "error": "unknown nodes"}',
            },
            Outcome.REFUSED,
        ),
        (
            {
                "Status": "Failed",
                "StatusDetails": "Failed",
                "ResponseCode": 127,
                "StandardOutputContent": "",
                "StandardErrorContent": "python3: not found",
            },
            Outcome.FAILED,
        ),
        ({"Status": "TimedOut", "StatusDetails": "Execution Timed Out"}, Outcome.TIMED_OUT),
        ({"Status": "TimedOut", "StatusDetails": "Delivery Timed Out"}, Outcome.TIMED_OUT),
        ({"Status": "Cancelled", "StatusDetails": "Cancelled"}, Outcome.CANCELLED),
        ({"Status": "Failed", "StatusDetails": "Undeliverable"}, Outcome.UNDELIVERABLE),
        ({"Status": "Failed", "StatusDetails": "Terminated"}, Outcome.UNDELIVERABLE),
        ({"Status": "InProgress", "StatusDetails": "InProgress"}, Outcome.PENDING),
        ({"Status": "Success", "StatusDetails": "Success", "StandardOutputContent": "x" * 24000}, Outcome.FAILED),
    ],
)
def test_every_ssm_status_maps_to_a_clear_outcome(invocation: dict, outcome: Outcome) -> None:
    result = parse_invocation(invocation)
    assert result.outcome is outcome
    if outcome in (Outcome.FAILED, Outcome.TIMED_OUT, Outcome.CANCELLED, Outcome.UNDELIVERABLE):
        assert result.error
    if len(invocation.get("StandardOutputContent", "")) >= 24000:
        assert "24,000" in (result.error or "")


def test_the_s3_fallback_fits_with_a_real_presigned_url_of_the_longest_names() -> None:
    """The fallback (the program and the bundle both fetched from S3, the trusted key inline, the URL the whole
    result document is PUT to) must fit with what Lambda really presigns (a session token in each URL, a
    63-character bucket and cluster name), not a short test URL: measured 5,299 of 48,000 bytes."""
    import random

    import boto3

    from topokeeper.adapters.aws import PRESIGN_CONFIG

    token = base64.b64encode(random.Random(0).randbytes(1000)).decode()  # Lambda role tokens: ~1,000-1,400 chars
    session = boto3.session.Session(
        aws_access_key_id="ASIA" + "A" * 16, aws_secret_access_key="s" * 40, aws_session_token=token
    )
    real = session.client("s3", region_name="ap-southeast-1", config=PRESIGN_CONFIG)

    class PresigningS3(RecordingS3):
        def generate_presigned_url(self, operation: str, Params: dict, ExpiresIn: int) -> str:
            return str(real.generate_presigned_url(operation, Params=Params, ExpiresIn=ExpiresIn))

    bucket, cluster = "b" * 63, "c" * 63
    facts = snapshot({"p5": p5_nodes(4000, partition="p5")}).model_copy(update={"cluster_name": cluster})
    signer = LocalSigner()
    bundle = sign_bundle(render(plan(facts)).bundle, 2**62, "apply", signer)
    channel = SsmChannel(
        None,
        PresigningS3(),
        bucket,
        "i-0123456789abcdef0",
        cluster=cluster,
        now=lambda: datetime.now(UTC),
        trusted_key=lambda: trusted_key_document(cluster, signer),
    )
    commands = channel.payload(bundle, "apply")
    payload = _decode(commands)
    assert "X-Amz-Security-Token" in payload["bundle_url"] and "X-Amz-Security-Token" in payload["program_url"]
    assert (
        "X-Amz-Security-Token" in payload["result_url"] and "X-Amz-Algorithm=AWS4-HMAC-SHA256" in payload["result_url"]
    )
    assert payload["result_key"].startswith(f"results/{cluster}/") and payload["result_key"] in payload["result_url"]
    assert json.loads(payload["trusted_key"])["cluster"] == cluster
    assert command_size(commands) <= INLINE_LIMIT_BYTES


class _AnsweringSsm:
    """SendCommand and GetCommandInvocation of one command whose stdout is ``document``."""

    def __init__(self, document: dict) -> None:
        self.document = document

    def send_command(self, **_: object) -> dict:
        return {"Command": {"CommandId": "c-1"}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict:
        return {"Status": "Success", "StatusDetails": "Success", "StandardOutputContent": json.dumps(self.document)}


@pytest.mark.parametrize(
    ("outcome", "echoed", "kept"),
    [
        ("in_sync", 1767603610001, True),  # this request's own generation
        ("would_apply", 1767603610001, True),
        ("in_sync", 1767603610000, False),  # another request's bundle answered
        ("drift", None, False),  # answered without checking the signature
        ("bad_signature", None, True),  # a refusal, not an account of the live state
    ],
)
def test_a_read_only_answer_must_echo_the_generation_of_this_requests_bundle(
    outcome: str, echoed: int | None, kept: bool
) -> None:
    bundle = sign_bundle(_bundle(4), 1767603610001, "verify", LocalSigner())
    document = {"outcome": outcome, "applier_version": "1", "mode": "verify", "generation": echoed}
    channel = SsmChannel(
        _AnsweringSsm(document),
        RecordingS3(),
        "bucket",
        "i-0123456789abcdef0",
        cluster="test-cluster",
        now=datetime.now,
    )

    result = channel.run(bundle, "verify")

    if kept:
        assert result.outcome.value == outcome and result.error is None
    else:
        assert result.outcome is Outcome.FAILED and result.error is not None
        assert f"generation {echoed}, not this request's 1767603610001" in result.error
