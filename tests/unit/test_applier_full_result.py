"""A document too large for SSM's stdout: the applier PUTs the whole one to the URL the command carries and points
at it; the channel reads it back only when it matches the pointer and the cut document."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.unit.service.test_ssm_channel import RecordingS3, _bundle, _decode
from topokeeper.adapters.ssm_channel import SsmChannel, read_full_result
from topokeeper.contract.ports import ApplyResult, Outcome
from topokeeper.headnode import output
from topokeeper.headnode.output import UploadTarget, new_result, publish
from topokeeper.wire import MAX_STDOUT_CHARS

HEAD_NODE = "i-0123456789abcdef0"
KEY = f"results/c1/{HEAD_NODE}-" + "ab" * 16 + ".json"


class Bucket:
    """An HTTP server that keeps what is PUT, or answers ``refuse`` (status, S3 error code) instead."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, str, bytes]] = []
        self.refuse: tuple[int, str] | None = None
        bucket = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if bucket.refuse is not None:
                    status, code = bucket.refuse
                    reply = f"<Error><Code>{code}</Code><Message>no</Message></Error>".encode()
                    self.send_response(status)
                else:
                    bucket.puts.append((self.path, self.headers["Content-Type"], body))
                    reply = b""
                    self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{KEY}?X-Amz-Algorithm=AWS4-HMAC-SHA256"


@pytest.fixture
def bucket() -> Iterator[Bucket]:
    served = Bucket()
    threading.Thread(target=served.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield served
    served.server.shutdown()
    served.server.server_close()


def _result(rows: int) -> dict[str, Any]:
    result = new_result("verify")
    result.update(outcome="in_sync", plan_sha256="a" * 64)
    result["slurm_nodes"] = [[f"q1-dy-p5-{n}", f"q1-dy-p5-{n}", f"q1-dy-p5-{n}", "q1"] for n in range(1, rows + 1)]
    return result


def test_a_document_that_fits_is_printed_whole_and_nothing_is_put(bucket: Bucket) -> None:
    result = _result(100)
    text = publish(result, UploadTarget(bucket.url, KEY), None)
    assert json.loads(text) == result and bucket.puts == []


def test_a_5000_row_table_is_put_whole_and_stdout_points_at_it(bucket: Bucket) -> None:
    result = _result(5000)

    text = publish(result, UploadTarget(bucket.url, KEY), None)

    printed = json.loads(text)
    assert len(text) <= MAX_STDOUT_CHARS and printed["dropped"] == {"slurm_nodes": 4800}
    ((path, content_type, body),) = bucket.puts
    assert (path.split("?")[0], content_type, json.loads(body)) == (f"/{KEY}", "application/json", result)
    assert printed["full_result"] == {
        "key": KEY,
        "bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "error": None,
    }


def test_without_a_target_the_cut_document_is_printed_as_before(bucket: Bucket) -> None:
    printed = json.loads(publish(_result(5000), None, None))
    assert printed["full_result"] is None and printed["dropped"] == {"slurm_nodes": 4800}


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        ("refused", "PUT failed: HTTP 403 AccessDenied"),
        ("no urllib", "PUT failed: import of urllib.request halted"),
        ("too large", "bytes, over the 1000 this applier uploads"),
        ("bad target", "--upload-result /x: expected {url: an http(s) URL, key: a string}"),
    ],
)
def test_when_the_whole_document_cannot_go_stdout_says_why_and_keeps_the_cut_one(
    bucket: Bucket, monkeypatch: pytest.MonkeyPatch, setup: str, error: str
) -> None:
    target: UploadTarget | None = UploadTarget(bucket.url, KEY)
    target_error = None
    if setup == "refused":
        bucket.refuse = (403, "AccessDenied")
    elif setup == "no urllib":  # python3-minimal: no urllib.request
        monkeypatch.setitem(sys.modules, "urllib.request", None)
    elif setup == "too large":
        monkeypatch.setattr(output, "MAX_FULL_RESULT_BYTES", 1000)
    else:
        target, target_error = None, error

    printed = json.loads(publish(_result(5000), target, target_error))

    assert bucket.puts == [] and printed["outcome"] == "in_sync" and printed["dropped"] == {"slurm_nodes": 4800}
    assert printed["full_result"]["sha256"] is None and error in printed["full_result"]["error"]


class ObjectStore:
    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.reads: list[str] = []

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        self.reads.append(Key)
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "gone"}}, "GetObject")
        return {"Body": io.BytesIO(self.objects[Key]), "ContentLength": len(self.objects[Key])}


def _cut_and_whole(bucket: Bucket) -> tuple[ApplyResult, bytes]:
    text = publish(_result(5000), UploadTarget(bucket.url, KEY), None)
    ((_, _, body),) = bucket.puts
    return ApplyResult.model_validate_json(text), body


def test_the_channel_reads_the_whole_document_back(bucket: Bucket) -> None:
    cut, body = _cut_and_whole(bucket)
    assert cut.node_table() is None  # a cut table is never stored

    whole = read_full_result(ObjectStore({KEY: body}), "plans", KEY, cut)

    table = whole.node_table()
    assert table is not None and len(table) == 5000 and whole.full_result == cut.full_result


@pytest.mark.parametrize(
    "change",
    [
        "other bytes",
        "gone",
        "other outcome",
        "not a document",
        "key outside results/",
        "other head node",
        "other cluster",
        "other token",
        "no key issued",
    ],
)
def test_a_whole_document_that_does_not_match_leaves_the_cut_one_with_the_reason(bucket: Bucket, change: str) -> None:
    cut, body = _cut_and_whole(bucket)
    objects = {KEY: body}
    if change == "other bytes":
        objects[KEY] = body.replace(b'q1-dy-p5-1"', b'q1-dy-p5-9"', 1)
    elif change == "gone":
        objects = {}
    elif change in ("other outcome", "not a document"):
        objects[KEY] = json.dumps({**json.loads(body), "outcome": "drift"}).encode()
        if change == "not a document":
            objects[KEY] = b"[" * 100_000
        assert cut.full_result is not None
        cut = cut.model_copy(
            update={
                "full_result": {
                    **cut.full_result,
                    "bytes": len(objects[KEY]),
                    "sha256": hashlib.sha256(objects[KEY]).hexdigest(),
                }
            }
        )
    elif change != "no key issued":  # the pointer names KEY, but the command's comment carries no token
        assert cut.full_result is not None
        other = {
            "key outside results/": "plans/c1/" + "ab" * 32 + "/plan.json",
            "other head node": KEY.replace("i-0", "i-f"),
            "other cluster": KEY.replace("/c1/", "/other-cluster/"),  # that cluster's head node may PUT there
            "other token": KEY.replace("ab" * 16, "cd" * 16),  # another command's result
        }[change]
        objects[other] = body
        cut = cut.model_copy(update={"full_result": {**cut.full_result, "key": other}})
    store = ObjectStore(objects)

    kept = read_full_result(store, "plans", None if change == "no key issued" else KEY, cut)

    assert kept.outcome is Outcome.IN_SYNC and kept.node_table() is None and kept.full_result is not None
    assert kept.full_result["error"]
    refused_keys = ("key outside results/", "other head node", "other cluster", "other token", "no key issued")
    assert store.reads == ([] if change in refused_keys else [KEY])


class ReadableS3(RecordingS3, ObjectStore):
    """What the channel stages and presigns, and what the head node PUT, read back."""

    def __init__(self) -> None:
        RecordingS3.__init__(self)
        ObjectStore.__init__(self, self.objects)


class OneCommandSsm:
    """SendCommand, then GetCommandInvocation answering with the Comment sent and ``stdout``."""

    def __init__(self) -> None:
        self.sent: dict[str, Any] = {}
        self.stdout = ""

    def send_command(self, **request: Any) -> dict[str, Any]:
        self.sent = request
        return {"Command": {"CommandId": "c-1"}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict[str, Any]:
        comment = self.sent["Comment"]
        return {
            "Status": "Success",
            "StatusDetails": "Success",
            "Comment": comment,
            "StandardOutputContent": self.stdout,
        }


def test_the_channel_reads_back_only_the_key_its_command_issued(bucket: Bucket) -> None:
    """The command's Comment carries its result key's token (GetCommandInvocation returns it): the whole document
    is read from that key, never from another command's key of the same cluster and head node."""
    cut, body = _cut_and_whole(bucket)
    ssm, s3 = OneCommandSsm(), ReadableS3()
    channel = SsmChannel(ssm, s3, "plans", HEAD_NODE, cluster="c1", now=lambda: datetime.now(UTC))
    command_id = channel.deliver(_bundle(4)).reference
    issued = _decode(ssm.sent["Parameters"]["commands"])["result_key"]
    assert issued.startswith(f"results/c1/{HEAD_NODE}-") and ssm.sent["Comment"].endswith(issued[-37:-5])
    assert cut.full_result is not None
    for key in (KEY, issued):  # another command's result, then this one's
        s3.objects[key] = body
        ssm.stdout = cut.model_copy(update={"full_result": {**cut.full_result, "key": key}}).model_dump_json()

        result = channel.result(command_id)

        assert (result.node_table() is not None) is (key == issued), result.full_result
