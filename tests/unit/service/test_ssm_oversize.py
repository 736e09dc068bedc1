"""Oversize on the SSM path (issue 11): a 20,000-node bundle, a command past the inline limit even with the
bundle in S3, and stdout past the 24,000 characters GetCommandInvocation keeps."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import p5_nodes, snapshot
from topokeeper.adapters import ssm_channel
from topokeeper.adapters.ssm_channel import INLINE_LIMIT_BYTES, STDOUT_LIMIT, SsmChannel, command_size, parse_invocation
from topokeeper.contract.errors import Permanent
from topokeeper.contract.ports import Outcome
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import Bundle, render


@functools.cache
def bundle_of_20000_nodes() -> Bundle:
    partitions = {f"p{i:02d}": p5_nodes(500, prefix=f"n{i:02d}-", partition=f"p{i:02d}", per_leaf=2) for i in range(40)}
    bundle = render(plan(snapshot(partitions))).bundle
    assert len(bundle.document()["nodes"]) == 20000
    return bundle


class ServedS3:
    """PutObject into a directory an HTTP server serves; presigned URLs point there (SigV4-shaped query)."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.sent: list[Any] = []

    def put_object(self, Bucket: str, Key: str, Body: bytes, **_: object) -> dict[str, str]:
        path = self.root / Key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(Body)
        return {"ETag": '"x"'}

    def generate_presigned_url(self, operation: str, Params: dict[str, str], ExpiresIn: int) -> str:
        return f"{self.url}/{Params['Key']}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires={ExpiresIn}"

    def send_command(self, **request: Any) -> dict[str, Any]:  # the SSM client too: records what was sent
        self.sent.append(request)
        return {"Command": {"CommandId": "0e8d3c0e-71f7-4491-898f-0123456789ab"}}


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[ServedS3]:
    root = tmp_path / "bucket"
    root.mkdir()

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield ServedS3(root, f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


def _channel(s3: ServedS3) -> SsmChannel:
    return SsmChannel(s3, s3, "bucket", "i-0123456789abcdef0", cluster="test-cluster", now=lambda: datetime.now(UTC))


@pytest.mark.parametrize("mode", ["apply", "verify"])
def test_a_20000_node_bundle_travels_through_s3_and_the_head_node_checks_and_runs_it(
    s3: ServedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The command stays under the limit with the bundle in S3; on the head node the bootstrap fetches it, checks
    its sha256 and execs the program on it (a stand-in that reports what it was given)."""
    applier = (
        "import hashlib, json, sys\n"
        "text = open(sys.argv[2]).read()\n"
        "print(json.dumps({'outcome': 'unchanged', 'applier_version': '1.0.0', 'mode': sys.argv[1],"
        " 'plan_sha256': json.loads(text)['plan_sha256'], 'nodes': len(json.loads(text)['nodes']),"
        " 'sha256': hashlib.sha256(text.encode()).hexdigest()}))\n"
    )
    program = applier.encode()  # a script in the program's place: python3 runs a file that is no zip as one
    monkeypatch.setattr(ssm_channel, "program_bytes", lambda: program)
    monkeypatch.setattr(ssm_channel, "program_sha256", lambda: hashlib.sha256(program).hexdigest())
    bundle = bundle_of_20000_nodes()
    commands = _channel(s3).payload(bundle, mode)
    assert command_size(commands) <= INLINE_LIMIT_BYTES
    (stored_path,) = (s3.root / f"payloads/{bundle.cluster_name}").glob("*.json")  # named by its own sha256
    stored = stored_path.read_text()
    assert len(stored) > 10 * INLINE_LIMIT_BYTES

    work = tmp_path / "tmp"
    work.mkdir()
    run = subprocess.run(
        ["sh", "-c", "\n".join(commands)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent), "TMPDIR": str(work)},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    reported = json.loads(run.stdout)
    assert reported["sha256"] == hashlib.sha256(stored.encode()).hexdigest()
    assert (reported["mode"], reported["plan_sha256"], reported["nodes"]) == (mode, bundle.plan_sha256, 20000)


def test_a_command_past_the_limit_even_with_the_bundle_in_s3_is_permanent_and_never_sent(
    s3: ServedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the applier and the bundle are in S3: if even that does not fit, SendCommand is not
    called (SSM would refuse the document) and the error says how large the command is."""
    monkeypatch.setattr(ssm_channel, "INLINE_LIMIT_BYTES", 1_000)
    with pytest.raises(Permanent, match=r"SSM command is \d+ bytes even with the bundle and applier in S3"):
        _channel(s3).deliver(bundle_of_20000_nodes())
    assert s3.sent == []


def _applier_document(partitions: int) -> dict[str, Any]:
    """An applier document in the applier's key order, too large for SSM's stdout (as another applier version
    might print: this one keeps its own under the cap, tests/integration/head_node/test_applier_run.py)."""
    names = [f"p{i:03d}" for i in range(partitions)]
    return {
        "outcome": "applied",
        "mode": "apply",
        "plan_sha256": "a" * 64,
        "before_sha256": "b" * 64,
        "after_sha256": "a" * 64,
        "partitions_changed": names[:3],
        "reconfigured": True,
        "readback": {name: {"units": 250, "matches": True, "mismatches": []} for name in names},
        "drift": [],
        "slurm_version": "26.05.5",
        "applier_version": "1.0.0",
    }


def test_a_document_cut_at_24000_characters_is_read_from_its_complete_leading_fields() -> None:
    text = json.dumps(_applier_document(1000))
    assert len(text) > 2 * STDOUT_LIMIT
    result = parse_invocation(
        {
            "Status": "Success",
            "StatusDetails": "Success",
            "ResponseCode": 0,
            "StandardOutputContent": text[:STDOUT_LIMIT],
        }
    )
    assert (result.outcome, result.mode, result.plan_sha256) == (Outcome.APPLIED, "apply", "a" * 64)
    assert result.partitions_changed == ["p000", "p001", "p002"] and result.reconfigured is True
    # What the cut took is not guessed: marked truncated, the unread fields left empty.
    assert result.truncated is True and result.readback == {} and result.applier_version is None


def test_a_document_that_fits_is_read_whole_not_from_its_leading_fields() -> None:
    text = json.dumps(_applier_document(10))
    result = parse_invocation({"Status": "Success", "StatusDetails": "Success", "StandardOutputContent": text})
    assert result.truncated is False and result.applier_version == "1.0.0" and len(result.readback) == 10


@pytest.mark.parametrize(
    ("stdout", "reason"),
    [
        ("x" * STDOUT_LIMIT, "no document at all"),
        ("banner\n" * 3500 + json.dumps(_applier_document(1000)), "the document starts past the cut"),
        ('{"outcome"' + " " * STDOUT_LIMIT, "the cut falls inside the outcome"),
    ],
)
def test_stdout_cut_before_the_outcome_is_a_failure_naming_the_cap(stdout: str, reason: str) -> None:
    result = parse_invocation(
        {
            "Status": "Success",
            "StatusDetails": "Success",
            "ResponseCode": 0,
            "StandardOutputContent": stdout[:STDOUT_LIMIT],
        }
    )
    assert result.outcome is Outcome.FAILED, reason
    assert "24,000-character cap" in (result.error or "")
