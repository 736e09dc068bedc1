"""Channel 1: SSM Run Command (``AWS-RunShellScript``) to the head node's ``i-``/``mi-`` id.

The shell text is fixed. Everything that varies (the head-node program, the bundle, the mode, the trusted
key) travels as one base64 block in a quoted heredoc, so nothing from AWS or config is ever parsed by the
shell. The program (``topokeeper-head-node.pyz``, base64 in the payload), then the bundle, ride inline while
the command fits well under SSM's 64 KB document limit; what does not is put in S3 (the program under its
sha256, as application/zip) and fetched by a presigned URL on the node (SigV4: S3 refuses SigV2 for the
KMS-encrypted bucket), then checked, as bytes, against the sha256 the command pins, and written as bytes. The
command also carries the public key the bundle must be signed with: whoever can send this command runs root
on the head node anyway, so the key is exactly as trusted as the program it travels with.

GetCommandInvocation keeps 24,000 characters of stdout, and the applier cuts its document to fit (a node
table over 200 rows). So every command also carries a presigned PUT URL for one object under ``results/``:
when the applier had to cut, it PUTs the whole document there and the cut one says where, with its sha256;
``result`` reads the whole one back, from no key but the one that command issued (this cluster's, this head
node's, with a random token the command's Comment carries back). The URL is signed by the sending role and is good
for that key only.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import THROTTLING_CODES, aws_errors, error_code, translate
from topokeeper.contract.config import SSM_TARGET
from topokeeper.contract.constants import (
    PRESIGNED_URL_SECONDS,
    RUN_SHELL_DOCUMENT,
    ssm_payload_key,
    ssm_program_key,
    ssm_result_key,
)
from topokeeper.contract.errors import InputError, Permanent
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes, program_sha256
from topokeeper.contract.ports import ApplyResult, Channel, DeliveryHandle, Outcome, log
from topokeeper.wire import CHANNEL_TIMEOUT_SECONDS, MAX_FULL_RESULT_BYTES, one_line, sha256_text

if TYPE_CHECKING:  # in signatures only: the functions that deliver load it at init (service.reconcile)
    from topokeeper.render.bundle import Bundle

INLINE_LIMIT_BYTES = 48_000  # of the JSON-encoded commands; SSM rejects documents over 64 KB
EXECUTION_TIMEOUT_SECONDS = CHANNEL_TIMEOUT_SECONDS  # the program's budget plus margin (topokeeper.wire)
STDOUT_LIMIT = 24_000  # GetCommandInvocation StandardOutputContent
SEND_ATTEMPTS = 6  # SendCommand answered with throttling: sent again up to this many times in all
SEND_BACKOFF_SECONDS = 1.0  # doubled after each throttled attempt
_PAYLOAD_END = "TOPOKEEPER_PAYLOAD_END"
_BOOTSTRAP_END = "TOPOKEEPER_BOOTSTRAP_END"

# Runs on the head node (Python 3.8+). Inline payloads need only what python3-minimal has (zlib reads
# gzip); what is fetched from S3 (the program, being larger than a command) needs urllib, as every full python3.
# The program is bytes (a zip archive): decoded, checked and written as bytes, never as text.
BOOTSTRAP = f"""\
import base64, hashlib, json, os, sys, zlib
work = sys.argv[1]
def refuse(error):
    print(json.dumps({{"outcome": "refused", "applier_version": None, "error": error}}))
    sys.exit(2)
with open(os.path.join(work, "payload"), "rb") as handle:
    payload = json.loads(zlib.decompress(base64.b64decode(handle.read()), 16 + zlib.MAX_WBITS))
mode = payload["mode"]
if mode not in ("apply", "dry-run", "verify", "placement-facts"):
    refuse("unknown mode")
def fetched(name):
    inline = payload.get(name)
    if inline is None:
        try:
            import urllib.request
        except ImportError:
            refuse("the " + name + " is too large to travel inline and this python3 lacks urllib.request")
        with urllib.request.urlopen(payload[name + "_url"], timeout=60) as response:
            data = response.read()
    else:
        data = base64.b64decode(inline) if name == "program" else inline.encode()
    if hashlib.sha256(data).hexdigest() != payload[name + "_sha256"]:
        refuse(name + " sha256 mismatch")
    return data
program = os.path.join(work, "{PROGRAM_NAME}")
files = [(program, fetched("program"))]
argv = [sys.executable, program, mode]
if mode != "placement-facts":  # the read of jobs and nodes takes no bundle
    files.append((os.path.join(work, "bundle.json"), fetched("bundle")))
    argv.append(os.path.join(work, "bundle.json"))
if payload.get("trusted_key"):
    files.append((os.path.join(work, "trusted-key.json"), payload["trusted_key"].encode()))
    argv += ["--trusted-key", os.path.join(work, "trusted-key.json")]
if payload.get("result_url"):
    target = {{"url": payload["result_url"], "key": payload["result_key"]}}
    files.append((os.path.join(work, "upload-result.json"), json.dumps(target).encode()))
    argv += ["--upload-result", os.path.join(work, "upload-result.json")]
for path, data in files:
    with open(path, "wb") as handle:
        handle.write(data)
os.execv(sys.executable, argv)
"""

_HEAD = [
    "set -eu",
    "umask 077",
    'work="$(mktemp -d /tmp/topokeeper.XXXXXX)"',
    "trap 'rm -rf \"$work\"' EXIT",
    f"cat > \"$work/payload\" <<'{_PAYLOAD_END}'",
]
_TAIL = [
    _PAYLOAD_END,
    f"python3 - \"$work\" <<'{_BOOTSTRAP_END}'",
    *BOOTSTRAP.splitlines(),
    _BOOTSTRAP_END,
]


def build_commands(payload: dict[str, Any]) -> list[str]:
    """The ``commands`` parameter: fixed lines around one base64 block of the gzipped payload."""
    encoded = base64.b64encode(gzip.compress(json.dumps(payload, sort_keys=True).encode(), mtime=0)).decode()
    block = [encoded[i : i + 76] for i in range(0, len(encoded), 76)]
    return [*_HEAD, *block, *_TAIL]


def command_size(commands: list[str]) -> int:
    return len(json.dumps({"commands": commands}))


def guard_target(instance_id: str) -> str:
    if not SSM_TARGET.fullmatch(instance_id):
        raise InputError("head_node", f"SSM SendCommand takes i-/mi- ids only, not {instance_id!r}")
    return instance_id


def guard_single_attempt(sender: Any) -> Any:
    """SendCommand must reach SSM once per call: a client that retries by itself could run it twice."""
    config = getattr(getattr(sender, "meta", None), "config", None)
    if config is not None and (config.retries or {}).get("total_max_attempts") != 1:
        raise Permanent(
            "the SSM client for SendCommand retries by itself (it could run a command twice): build it with "
            "adapters.aws.SEND_COMMAND_CONFIG"
        )
    return sender


def guard_sigv4(url: str) -> str:
    """S3 refuses a SigV2 URL for the KMS-encrypted plan bucket; refuse to send one (``presigning_s3``)."""
    if "X-Amz-Algorithm=AWS4-HMAC-SHA256" not in urlsplit(url).query:
        raise Permanent("the presigned URL is not SigV4; build the S3 client with adapters.aws.PRESIGN_CONFIG")
    return url


class SsmChannel:
    def __init__(
        self,
        ssm: Any,
        s3: Any,
        bucket: str,
        head_node: str,
        *,
        cluster: str,
        now: Callable[[], datetime],
        sleep: Callable[[float], None] = time.sleep,
        sender: Any = None,
        trusted_key: Callable[[], Mapping[str, str]] | None = None,
        deadline: datetime | None = None,
    ) -> None:
        """``ssm`` reads invocations (retried by botocore); ``sender`` (default ``ssm``) sends commands and
        must not retry by itself (``SEND_COMMAND_CONFIG``). ``run`` waits for no answer past ``deadline`` (the
        calling invocation's time). ``cluster`` names the result keys its commands issue."""
        self._cluster = cluster
        self._deadline = deadline
        self._trusted_key = trusted_key  # the applier's --trusted-key document (None: signatures unchecked)
        self._ssm = ssm
        self._sender = guard_single_attempt(ssm if sender is None else sender)
        self._s3 = s3
        self._bucket = bucket
        self._target = guard_target(head_node)
        self._now = now
        self._sleep = sleep

    def payload(self, bundle: Bundle | None, mode: str, token: str | None = None) -> list[str]:
        """The command's lines; ``token`` names its result key (``command_comment`` carries it too). Without a
        bundle (``placement-facts``) the program alone travels."""
        payload: dict[str, Any] = {
            "mode": mode,
            "program": base64.b64encode(program_bytes()).decode("ascii"),
            "program_sha256": program_sha256(),
            "result_key": self._result_key(token or secrets.token_hex(16)),
        }
        payload["result_url"] = self._presign("put_object", payload["result_key"])
        cluster = self._cluster if bundle is None else bundle.cluster_name
        staged = [("program", ssm_program_key(cluster, payload["program_sha256"]), "application/zip")]
        bodies = {"program": program_bytes()}
        if bundle is not None:
            document = json.dumps(bundle.document(), sort_keys=True)
            payload["bundle"], payload["bundle_sha256"] = document, sha256_text(document)
            payload["trusted_key"] = (
                None if self._trusted_key is None else json.dumps(self._trusted_key(), sort_keys=True)
            )
            staged.append(("bundle", ssm_payload_key(cluster, payload["bundle_sha256"]), "application/json"))
            bodies["bundle"] = document.encode()
        commands = build_commands(payload)
        for field, key, content_type in staged:  # the program (the larger) to S3 first, then the bundle too
            if command_size(commands) <= INLINE_LIMIT_BYTES:
                return commands
            self._s3.put_object(Bucket=self._bucket, Key=key, Body=bodies[field], ContentType=content_type)
            payload[field] = None
            payload[f"{field}_url"] = self._presign("get_object", key)
            commands = build_commands(payload)
        if command_size(commands) > INLINE_LIMIT_BYTES:
            raise Permanent(f"SSM command is {command_size(commands)} bytes even with the bundle and applier in S3")
        return commands

    def _result_key(self, token: str) -> str:
        """The one key a command may PUT its whole document to: this cluster's, this head node's, its own token."""
        return ssm_result_key(self._cluster, f"{self._target}-{token}")

    def _presign(self, operation: str, key: str) -> str:
        return guard_sigv4(
            self._s3.generate_presigned_url(
                operation, Params={"Bucket": self._bucket, "Key": key}, ExpiresIn=PRESIGNED_URL_SECONDS
            )
        )

    def _send(self, bundle: Bundle | None, mode: str) -> str:
        """SendCommand, sent again only after a throttling answer (no command was created). Any other answer
        is raised translated (the reconcile releases its claim); a timeout or a lost connection is raised as
        botocore raised it, never resent: the command may exist, and the claim waits for its result."""
        token = secrets.token_hex(16)
        with aws_errors():
            request = {
                "InstanceIds": [self._target],
                "DocumentName": RUN_SHELL_DOCUMENT,
                "Parameters": {
                    "commands": self.payload(bundle, mode, token),
                    "executionTimeout": [str(EXECUTION_TIMEOUT_SECONDS)],
                },
                "TimeoutSeconds": EXECUTION_TIMEOUT_SECONDS,
                "Comment": command_comment(mode, bundle, token, self._cluster),
            }
        attempt, backoff = 1, SEND_BACKOFF_SECONDS
        while True:
            try:
                response = self._sender.send_command(**request)
            except ClientError as error:
                if error_code(error) not in THROTTLING_CODES or attempt == SEND_ATTEMPTS:
                    raise translate(error) from error
            else:
                command_id: str = response["Command"]["CommandId"]
                return command_id
            self._sleep(backoff)
            attempt, backoff = attempt + 1, backoff * 2

    def deliver(self, bundle: Bundle) -> DeliveryHandle:
        return DeliveryHandle(
            channel=Channel.SSM,
            cluster=bundle.cluster_name,
            plan_sha256=bundle.plan_sha256,
            reference=self._send(bundle, "apply"),
            target=self._target,
            sent_at=self._now(),
        )

    def verify(self, bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        """Run ``verify`` on the head node and wait for its document (the drift function is synchronous), so
        every answer is fresh and ``request`` needs nothing more."""
        return self.run(bundle, "verify")

    def run(self, bundle: Bundle, mode: str, timeout: float = 120, poll: float = 2) -> ApplyResult:
        """Run the applier in ``mode`` and wait for its document, up to ``timeout`` seconds (and the deadline)."""
        command_id = self._send(bundle, mode)
        waited = 0.0
        while True:
            result = self.result(command_id)
            out_of_time = self._deadline is not None and self._now() + timedelta(seconds=poll) > self._deadline
            if result.outcome is not Outcome.PENDING or waited >= timeout or out_of_time:
                return answer_to(bundle, result)
            self._sleep(poll)
            waited += poll

    def placement_facts(self, timeout: float = 120, poll: float = 2) -> dict[str, Any]:
        """Run the program's read-only ``placement-facts`` and return its document (``topokeeper.headnode.
        placement``), the whole one from S3 when stdout could not carry it. A head node that does not answer,
        or answers no facts, raises ``Permanent`` with the reason in one line."""
        command_id = self._send(None, "placement-facts")
        waited = 0.0
        while True:
            with aws_errors():
                try:
                    invocation = self._ssm.get_command_invocation(CommandId=command_id, InstanceId=self._target)
                except ClientError as error:
                    if error_code(error) != "InvocationDoesNotExist":
                        raise
                    invocation = {"Status": "Pending"}
            channel = parse_invocation(invocation)  # a channel outcome (pending, timed out) or FAILED: no document
            if channel.outcome is not Outcome.PENDING and channel.outcome is not Outcome.FAILED:
                raise Permanent(f"head node {self._target}: {channel.error}")
            if channel.outcome is Outcome.FAILED or waited >= timeout:
                break
            self._sleep(poll)
            waited += poll
        if channel.outcome is Outcome.PENDING:
            raise Permanent(f"head node {self._target}: no answer to placement-facts in {timeout:.0f}s")
        return self._facts_document(invocation)

    def _facts_document(self, invocation: Mapping[str, Any]) -> dict[str, Any]:
        stdout = str(invocation.get("StandardOutputContent", ""))
        for line in reversed(stdout.strip().splitlines()):
            try:
                document = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(document, dict) and "schema" in document:
                break
        else:
            stderr = one_line(str(invocation.get("StandardErrorContent", "")).strip())[-300:]
            raise Permanent(
                f"head node {self._target}: placement-facts printed no document (SSM {invocation.get('Status')},"
                f" exit {invocation.get('ResponseCode')}): {stderr}"
            )
        pointer = document.get("full_result")
        if not isinstance(pointer, dict) or not pointer.get("sha256"):
            return document  # the facts themselves, or an error the reader reports
        issued = _ISSUED_TOKEN.search(str(invocation.get("Comment", "")))
        with aws_errors():
            body, problem = whole_body(self._s3, self._bucket, self._result_key(issued[1]) if issued else None, pointer)
        if body is None:
            raise Permanent(f"head node {self._target}: the whole placement facts are not used: {problem}")
        try:
            whole: dict[str, Any] = json.loads(body)
        except (ValueError, RecursionError) as error:
            raise Permanent(f"head node {self._target}: the whole placement facts are no JSON: {error}") from None
        return whole

    @aws_errors()
    def result(self, command_id: str) -> ApplyResult:
        try:
            invocation = self._ssm.get_command_invocation(CommandId=command_id, InstanceId=self._target)
        except ClientError as error:
            if error_code(error) == "InvocationDoesNotExist":
                return ApplyResult.from_channel(Outcome.PENDING)  # eventually consistent right after SendCommand
            raise
        result = parse_invocation(invocation)
        if result.full_result and result.full_result.get("sha256"):
            issued = _ISSUED_TOKEN.search(str(invocation.get("Comment", "")))
            return read_full_result(self._s3, self._bucket, self._result_key(issued[1]) if issued else None, result)
        return result


_ISSUED_TOKEN = re.compile(r" result ([0-9a-f]{32})\Z")


def command_comment(mode: str, bundle: Bundle | None, token: str, cluster: str = "") -> str:
    """SendCommand's Comment (at most 100 characters): what the command is for, then the token of the result key
    it issued, which GetCommandInvocation returns with the output. Only whoever may send the command (root on the
    head node) can set it, so it is as trusted as the command."""
    suffix = f" result {token}"
    what = f"{cluster}" if bundle is None else f"{bundle.cluster_name} {bundle.plan_sha256[:12]}"
    return f"topokeeper {mode} {what}"[: 100 - len(suffix)] + suffix


_ANSWERS = frozenset({Outcome.IN_SYNC, Outcome.DRIFT, Outcome.WOULD_APPLY, Outcome.UNCHANGED})


def answer_to(bundle: Bundle, result: ApplyResult) -> ApplyResult:
    """``result`` if it answers this request: an account of the live state, given for a signed bundle, echoes the
    generation that bundle was signed with (a verify bundle's is its own: ``service.signing.for_reading``); one
    that does not is no answer to this request, and fails naming both."""
    if bundle.generation is None or result.outcome not in _ANSWERS or result.generation == bundle.generation:
        return result
    return ApplyResult.from_channel(
        Outcome.FAILED,
        f"the head node's {result.outcome.value} answers bundle generation {result.generation}, not this"
        f" request's {bundle.generation} ({bundle.purpose})",
    )


def read_full_result(s3: Any, bucket: str, issued_key: str | None, cut: ApplyResult) -> ApplyResult:
    """The whole document the applier PUT when stdout could not carry it, checked against the cut one's pointer
    (``issued_key``, the key the command issued: its cluster, head node and token; size; sha256) and its outcome,
    mode, plan and generation. One that is gone, or fails a check, leaves the cut document, with the reason in
    ``full_result.error`` (its node table is then not stored: see node_table)."""
    pointer = dict(cut.full_result or {})
    key = pointer.get("key")
    body, problem = whole_body(s3, bucket, issued_key, pointer)
    whole: ApplyResult | None = None
    if body is not None:
        try:
            whole = ApplyResult.model_validate(json.loads(body))
        except (ValueError, RecursionError) as error:  # pydantic's ValidationError is a ValueError
            problem = f"not an applier document: {str(error)[:200]}"
        if whole is not None and (whole.outcome, whole.mode, whole.plan_sha256, whole.generation) != (
            cut.outcome,
            cut.mode,
            cut.plan_sha256,
            cut.generation,
        ):
            problem, whole = "its outcome, mode, plan or generation differs from the command's output", None
    if whole is None:
        log.warning("the applier's whole document %s is not used: %s", str(key)[:200], problem)
        return cut.model_copy(update={"full_result": {**pointer, "error": problem}})
    return whole.model_copy(update={"full_result": pointer})


def whole_body(s3: Any, bucket: str, issued_key: str | None, pointer: Mapping[str, Any]) -> tuple[bytes | None, str]:
    """The whole document a command PUT under the key it was issued (``full_result``: key, bytes, sha256), checked
    against that pointer; else None and why not."""
    key, size, digest = pointer.get("key"), pointer.get("bytes"), pointer.get("sha256")
    problem = _pointer_problem(key, size, issued_key)
    if problem is not None:
        return None, problem
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error_code(error) not in ("NoSuchKey", "404"):
            raise
        return None, "the object is gone (its lifecycle expires it after a day)"
    body: bytes = response["Body"].read(MAX_FULL_RESULT_BYTES + 1)
    if len(body) != size or hashlib.sha256(body).hexdigest() != digest:
        return None, f"{len(body)} bytes, not the {size} bytes of sha256 {str(digest)[:64]} the command printed"
    return body, ""


def _pointer_problem(key: Any, size: Any, issued_key: str | None) -> str | None:
    if issued_key is None:
        return "the command's comment names no result key (sent by a topokeeper before result keys were bound)"
    if key != issued_key:
        return f"key {str(key)[:200]!r} is not {issued_key}, the one the command issued"
    if not (type(size) is int and 0 < size <= MAX_FULL_RESULT_BYTES):
        return f"size {str(size)[:20]} is not 1 to {MAX_FULL_RESULT_BYTES} bytes"
    return None


_CHANNEL_OUTCOMES = {
    "TimedOut": Outcome.TIMED_OUT,
    "Cancelled": Outcome.CANCELLED,
    "Cancelling": Outcome.CANCELLED,
    "Undeliverable": Outcome.UNDELIVERABLE,
    "Terminated": Outcome.UNDELIVERABLE,
    "Pending": Outcome.PENDING,
    "InProgress": Outcome.PENDING,
    "Delayed": Outcome.PENDING,
}


def parse_invocation(invocation: dict[str, Any]) -> ApplyResult:
    """GetCommandInvocation -> the applier's document, or the channel's reason there is none."""
    status = str(invocation.get("Status", ""))
    details = str(invocation.get("StatusDetails", ""))
    for key in (details, status):
        if key in _CHANNEL_OUTCOMES:
            outcome = _CHANNEL_OUTCOMES[key]
            return ApplyResult.from_channel(outcome, None if outcome is Outcome.PENDING else f"SSM {status}: {details}")
    stdout = str(invocation.get("StandardOutputContent", ""))
    document = _last_json_line(stdout)
    if document is None and len(stdout) >= STDOUT_LIMIT:
        document = _leading_fields(stdout)
    if document is not None:
        return ApplyResult.model_validate(document)
    stderr = str(invocation.get("StandardErrorContent", "")).strip()
    truncated = " (stdout reached the 24,000-character cap)" if len(stdout) >= STDOUT_LIMIT else ""
    return ApplyResult.from_channel(
        Outcome.FAILED,
        f"SSM {status} (exit {invocation.get('ResponseCode')}) without a result document{truncated}: {stderr[-300:]}",
    )


def _leading_fields(text: str) -> dict[str, Any] | None:
    """SSM cut stdout at 24,000 characters inside the document (the applier keeps its own under that; a longer one
    is from another applier version): its complete leading fields, if they say the outcome. The applier writes
    the outcome, mode, plan and partitions first; what was cut is marked ``truncated``."""
    start = text.rfind('{"outcome"')
    if start < 0:
        return None
    decoder = json.JSONDecoder()
    fields: dict[str, Any] = {}
    position = start + 1
    try:
        while True:
            key, position = decoder.raw_decode(text, _skip(text, position))
            position = _skip(text, position)
            if not isinstance(key, str) or text[position] != ":":
                break
            fields[key], position = decoder.raw_decode(text, _skip(text, position + 1))
            position = _skip(text, position)
            if text[position] != ",":
                break
            position += 1
    except (json.JSONDecodeError, IndexError):
        pass  # the cut: everything before it is kept
    if not isinstance(fields.get("outcome"), str):
        return None
    return {"applier_version": None, **fields, "truncated": True}


def _skip(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _last_json_line(text: str) -> dict[str, Any] | None:
    """The applier prints one JSON document; anything a login script printed before it is ignored."""
    text = text.strip()
    candidates = [text] + [line.strip() for line in reversed(text.splitlines()) if line.strip().startswith("{")]
    for candidate in candidates:
        try:
            document = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(document, dict) and "outcome" in document:
            return document
    return None
