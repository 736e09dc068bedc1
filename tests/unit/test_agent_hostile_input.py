"""Hostile input to the head-node agent (issue 11): what S3, EventBridge, IMDS, the applier and its own files hand
it. Each property mutates a valid input as ``test_hostile_input`` does (shell metacharacters, newlines, quotes,
look-alike Unicode, lone surrogates, 10 kB strings, NaN, wrong types) or feeds raw bytes. The agent answers with
its own refusal or error, never a crash: a crash in a cycle repeats every cycle, and nothing reaches the applier
that the agent did not check.

``TOPOKEEPER_FUZZ_EXAMPLES`` examples per property (25 in make test, 1,000 in make reliability).
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.agent_support import CLUSTER, bundle_body, bundle_document
from tests.unit.test_hostile_input import FUZZ, HOSTILE_TEXT, mutated, write_fuzz_records
from topokeeper.agent import applier_process, cycle
from topokeeper.agent import credentials as credentials_module
from topokeeper.agent.applier_process import MAX_DETAIL_BYTES, agent_result, bounded_result, run_applier
from topokeeper.agent.aws import Aws, S3Object
from topokeeper.agent.bundle import BundleRefused, check_bundle
from topokeeper.agent.config import load_config
from topokeeper.agent.credentials import CredentialProvider, fetch_role_credentials
from topokeeper.agent.cycle import Agent
from topokeeper.agent.errors import AgentError
from topokeeper.agent.state import State, load_state
from topokeeper.agent.transport import HttpResponse
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, AgentConfig, AgentConfigError

TALLY: collections.Counter[tuple[str, str]] = collections.Counter()


def _tally(loader: str, outcome: str) -> None:
    TALLY[f"agent {loader}", outcome] += 1


@pytest.fixture(scope="module", autouse=True)
def _reliability_records() -> Iterator[None]:
    yield
    write_fuzz_records(TALLY)


BUNDLE = bundle_document()
RAW_BYTES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"", b"null", b"[]", b"\xff\xfe", b"[" * 100_000, bundle_body(BUNDLE)[:-10], b'{"a":"\\ud800"}']),
)


def _dumps(document: Any) -> bytes:
    return json.dumps(document, allow_nan=True).encode()


# ------------------------------------------------------------------------------------------------------------
# The bundle from S3: check_bundle, then the poll that hands it to the applier or reports the refusal


def _checked(body: bytes) -> str:
    try:
        document = check_bundle(body, CLUSTER)
    except BundleRefused:
        return "refused"
    # Accepted only as this cluster's, every file's content matching its sha256: a rendered file unchanged. (What
    # else the applier needs, it checks again itself: test_hostile_input.)
    assert document["cluster_name"] == CLUSTER
    for name, entry in document["files"].items():
        assert entry["sha256"] == hashlib.sha256(entry["content"].encode()).hexdigest()
        assert name not in BUNDLE["files"] or entry["content"] == BUNDLE["files"][name]["content"], name
    return "accepted"


@FUZZ
@given(mutated(BUNDLE))
def test_a_mutated_bundle_is_checked_or_refused_never_a_crash(document: dict[str, Any]) -> None:
    _tally("bundle", _checked(_dumps(document)))


@FUZZ
@given(RAW_BYTES)
def test_bundle_bytes_that_are_not_a_bundle_are_refused(body: bytes) -> None:
    assert _checked(body) == "refused"


class FakeAws:
    """S3 answers with one hostile object; EventBridge takes every report."""

    def __init__(self, fetched: S3Object) -> None:
        self.fetched = fetched

    def get_bundle_if_changed(self, etag: str | None) -> S3Object:
        return self.fetched

    def get_verify_request_if_changed(self, etag: str | None) -> S3Object | None:
        return None  # no verify asked for

    def put_event(self, detail_type: str, detail: dict[str, Any]) -> None:
        # What Aws.put_event sends: the detail must be JSON EventBridge takes, within one entry.
        text = json.dumps(detail, sort_keys=True, allow_nan=False)
        assert len(text.encode()) <= MAX_DETAIL_BYTES


def _one_cycle(poller: Agent, on_run: Callable[[str, str], object]) -> None:
    """One poll cycle with the applier replaced by a recorder of (mode, bundle path) that answers "applied"."""

    def run_applier(config: AgentConfig, mode: str, path: str, plan_sha256: str | None) -> dict[str, Any]:
        on_run(mode, path)
        return agent_result("applied", mode, plan_sha256, "")

    original = cycle.run_applier
    cycle.run_applier = run_applier  # type: ignore[assignment]
    try:
        poller.cycle()
    finally:
        cycle.run_applier = original  # type: ignore[assignment]


@FUZZ
@given(
    st.one_of(mutated(BUNDLE).map(_dumps), RAW_BYTES),
    st.sampled_from(['"etag-1"', "", *HOSTILE_TEXT[:6]]),
    st.one_of(st.none(), st.sampled_from(HOSTILE_TEXT[:6])),
)
def test_a_poll_of_a_hostile_object_reports_it_and_never_runs_the_applier_on_it(
    tmp_path_factory: pytest.TempPathFactory, body: bytes, etag: str, version_id: str | None
) -> None:
    state_dir = tmp_path_factory.mktemp("state")
    config = AgentConfig(cluster=CLUSTER, bucket="b", region="us-east-1", state_dir=str(state_dir))
    poller = Agent(config)
    poller._aws = FakeAws(S3Object(body, etag, version_id))  # type: ignore[assignment]
    ran: list[str] = []
    _one_cycle(poller, lambda mode, path: ran.append(Path(path).read_bytes().decode()))
    state = load_state(str(state_dir / "state.json"))
    if ran:
        assert _checked(ran[0].encode()) == "accepted"  # only a bundle that passed the check
        _tally("poll", "accepted")
    else:
        assert state.outbox == [] and state.bundle is None  # reported (FakeAws took it), nothing applied
        _tally("poll", "refused")


# ------------------------------------------------------------------------------------------------------------
# The agent's own files: its config (root's) and its state (its own, maybe corrupted on disk)


CONFIG = {
    "cluster": CLUSTER,
    "bucket": "topo-bundles",
    "region": "us-east-1",
    "prefix": "clusters",
    "mode": "enforce",
    "poll_interval_seconds": 60,
    "verify_interval_seconds": 900,
    "endpoint_url": None,
}


@FUZZ
@given(mutated(CONFIG))
def test_a_mutated_config_loads_or_is_refused_naming_the_key(
    tmp_path_factory: pytest.TempPathFactory, document: Any
) -> None:
    path = tmp_path_factory.mktemp("config") / "agent.json"
    path.write_bytes(_dumps(document))
    try:
        config = load_config(str(path))
    except AgentConfigError as error:
        assert str(error).startswith(str(path)), error
        _tally("config", "refused")
        return
    # Accepted: every interval a finite number, and the agent starts (its URLs and source built).
    for name in (
        "poll_interval_seconds",
        "verify_interval_seconds",
        "applier_timeout_seconds",
        "request_timeout_seconds",
    ):
        assert math.isfinite(getattr(config, name)) and getattr(config, name) >= 0, name
    Agent(config)
    _tally("config", "accepted")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1"])
def test_an_interval_that_is_not_a_finite_number_is_refused_naming_the_key(tmp_path: Path, number: str) -> None:
    """json reads NaN and Infinity; a NaN poll interval would make the agent spin, an infinite one stop."""
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(CONFIG)[:-1] + f', "poll_interval_seconds": {number}}}')
    with pytest.raises(AgentConfigError, match="poll_interval_seconds must be a number >= 0, finite"):
        load_config(str(path))


def test_a_config_string_that_is_not_utf8_text_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({**CONFIG, "cluster": "a\ud800"}))  # a \ud800 escape: json reads a lone surrogate
    with pytest.raises(AgentConfigError, match="cluster must be UTF-8 text"):
        load_config(str(path))


STATE = {
    "etag": '"etag-1"',
    "bundle": {"etag": '"etag-1"', "version_id": "v1", "plan_sha256": "a" * 64},
    "last_verify_at": 100.0,
    "outbox": [
        {"detail_type": AGENT_APPLY_DETAIL_TYPE, "detail": {"cluster": CLUSTER, "etag": '"etag-1"', "result": {}}}
    ],
}


class NotModified(FakeAws):
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def get_bundle_if_changed(self, etag: str | None) -> None:  # type: ignore[override]
        return None

    def put_event(self, detail_type: str, detail: dict[str, Any]) -> None:
        FakeAws.put_event(self, detail_type, detail)  # type: ignore[arg-type]
        self.sent.append((detail_type, detail))


@FUZZ
@given(st.one_of(mutated(STATE).map(_dumps), RAW_BYTES))
def test_a_corrupted_state_file_never_wedges_the_agent(tmp_path_factory: pytest.TempPathFactory, text: bytes) -> None:
    """Whatever state.json holds, a cycle completes (a bad one is started over), so the next bundle is applied."""
    state_dir = tmp_path_factory.mktemp("state")
    (state_dir / "state.json").write_bytes(text)
    kept = load_state(str(state_dir / "state.json")) != State()
    config = AgentConfig(cluster=CLUSTER, bucket="b", region="us-east-1", state_dir=str(state_dir))
    poller = Agent(config)
    aws = NotModified()
    poller._aws = aws  # type: ignore[assignment]
    original = cycle.run_applier
    cycle.run_applier = lambda *args: agent_result("in_sync", "verify", None, "")  # type: ignore[assignment]
    try:
        poller.cycle()
    finally:
        cycle.run_applier = original  # type: ignore[assignment]
    state = load_state(str(state_dir / "state.json"))
    assert state.outbox == [], "a report the agent could not send stays and blocks the rest"
    _tally("state", "accepted" if kept else "refused")


# ------------------------------------------------------------------------------------------------------------
# Answers: EventBridge's PutEvents, IMDS's credentials, the applier's stdout


PUT_EVENTS_ANSWER = {"FailedEntryCount": 0, "Entries": [{"EventId": "e-1"}]}


@FUZZ
@given(st.sampled_from([200, 400, 500]), st.one_of(mutated(PUT_EVENTS_ANSWER).map(_dumps), RAW_BYTES))
def test_a_hostile_put_events_answer_is_an_agent_error_or_success(status: int, body: bytes) -> None:
    config = AgentConfig(cluster=CLUSTER, bucket="b", region="us-east-1")
    aws = Aws(config, CredentialProvider(1.0), lambda: 0.0)
    aws._send = lambda *args: HttpResponse(status, {}, body)  # type: ignore[method-assign]
    try:
        aws.put_event(AGENT_APPLY_DETAIL_TYPE, {"cluster": CLUSTER})
    except AgentError:
        _tally("PutEvents answer", "refused")
        return
    _tally("PutEvents answer", "accepted")


CREDENTIALS = {
    "Code": "Success",
    "AccessKeyId": "AKIAEXAMPLE",
    "SecretAccessKey": "secret",
    "Token": "token",
    "Expiration": "2026-01-05T10:00:00Z",
}


@FUZZ
@given(st.one_of(mutated(CREDENTIALS).map(_dumps), RAW_BYTES))
def test_a_hostile_imds_credentials_document_is_an_agent_error_or_credentials(body: bytes) -> None:
    answers = iter(["token", "role-name", body.decode("utf-8", "replace")])
    original = credentials_module._imds_call
    credentials_module._imds_call = lambda *args: next(answers)  # type: ignore[assignment]
    try:
        credentials = fetch_role_credentials(1.0)
    except AgentError:
        _tally("IMDS credentials", "refused")
        return
    finally:
        credentials_module._imds_call = original  # type: ignore[assignment]
    assert all(isinstance(value, str) for value in (credentials.access_key, credentials.secret_key))
    _tally("IMDS credentials", "accepted")


APPLIER_DOCUMENT = agent_result("applied", "apply", "a" * 64, "")


@FUZZ
@given(st.one_of(mutated(APPLIER_DOCUMENT).map(_dumps), RAW_BYTES), st.sampled_from([0, 1, 2, -9]))
def test_hostile_applier_output_becomes_a_result_that_fits_one_event(stdout: bytes, exit_code: int) -> None:
    config = AgentConfig(cluster=CLUSTER, bucket="b", region="us-east-1")
    original = applier_process._run_bounded
    applier_process._run_bounded = lambda argv, environment, timeout: subprocess.CompletedProcess(  # type: ignore[assignment]
        argv, exit_code, stdout, b"\xff" * 3000
    )
    try:
        result = run_applier(config, "apply", "/nonexistent", "a" * 64)
    finally:
        applier_process._run_bounded = original  # type: ignore[assignment]
    assert isinstance(result["outcome"], str)
    detail = {"cluster": CLUSTER, "result": bounded_result(result)}
    text = json.dumps(detail, sort_keys=True, allow_nan=False)
    assert len(text.encode()) <= MAX_DETAIL_BYTES
    _tally("applier output", "refused" if result.get("applier_version") is None else "accepted")


# ------------------------------------------------------------------------------------------------------------
# What the properties found, pinned: each crashed a cycle (and every cycle after it) before


def _surrogate_bundle() -> bytes:
    document = json.loads(json.dumps(BUNDLE))
    name = next(iter(document["files"]))
    document["files"][name]["content"] = "a\ud800"
    return json.dumps(document).encode()  # ensure_ascii: the lone surrogate travels as a \ud800 escape


@pytest.mark.parametrize(
    ("body", "reason"),
    [(b"[" * 100_000, "not JSON"), (_surrogate_bundle(), "content: not UTF-8 text")],
    ids=["nested-past-the-stack", "lone-surrogate-content"],
)
def test_a_bundle_that_crashed_the_check_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(BundleRefused, match=reason):
        check_bundle(body, CLUSTER)


@pytest.mark.parametrize(
    "state",
    [
        {**STATE, "outbox": [None]},
        {**STATE, "outbox": [{"detail_type": AGENT_APPLY_DETAIL_TYPE, "detail": "x"}]},
        {**STATE, "last_verify_at": float("nan")},
        {**STATE, "etag": 5},
    ],
    ids=["outbox-null", "outbox-detail-not-an-object", "nan-time", "etag-not-a-string"],
)
def test_a_state_file_the_agent_did_not_write_is_started_over(tmp_path: Path, state: dict[str, Any]) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert load_state(str(path)) == State()


@pytest.mark.parametrize("body", [b"null", b"[]", b'{"FailedEntryCount": 1, "Entries": "x"}'])
def test_a_put_events_answer_that_crashed_the_report_is_an_agent_error_or_success(body: bytes) -> None:
    aws = Aws(AgentConfig(cluster=CLUSTER, bucket="b", region="us-east-1"), CredentialProvider(1.0), time.time)
    aws._send = lambda *args: HttpResponse(200, {}, body)  # type: ignore[method-assign]
    if body.startswith(b"{"):
        with pytest.raises(AgentError, match="entry failed"):
            aws.put_event(AGENT_APPLY_DETAIL_TYPE, {"cluster": CLUSTER})
    else:
        aws.put_event(AGENT_APPLY_DETAIL_TYPE, {"cluster": CLUSTER})  # no FailedEntryCount to read: sent


class HostileVerifyRequest(FakeAws):
    """The bundle is new; beside it lies a verify request of hostile bytes."""

    def __init__(self, bundle: S3Object, request: bytes) -> None:
        super().__init__(bundle)
        self.request = request

    def get_verify_request_if_changed(self, etag: str | None) -> S3Object | None:
        return S3Object(self.request, '"request-1"', None)


@pytest.mark.parametrize("request_body", [b"[" * 100_000, b'{"request_id":' * 30_000, b"\xff" * 10, b"[1]"])
def test_a_hostile_verify_request_never_stops_the_bundle_being_applied(tmp_path: Path, request_body: bytes) -> None:
    config = AgentConfig(cluster=CLUSTER, bucket="b", region="us-east-1", state_dir=str(tmp_path))
    poller = Agent(config)
    poller._aws = HostileVerifyRequest(S3Object(bundle_body(BUNDLE), '"etag-1"', None), request_body)  # type: ignore[assignment]
    modes: list[str] = []
    _one_cycle(poller, lambda mode, path: modes.append(mode))
    assert modes == ["apply"]  # the request is skipped as unreadable; the bundle applied all the same
    assert load_state(str(tmp_path / "state.json")).request_id is None
