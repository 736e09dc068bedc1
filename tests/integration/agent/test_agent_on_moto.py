"""The head-node agent against S3 and EventBridge served by moto in server mode, with a fake applier.

A rule on the bus sends the agent's events to an SQS queue, so the test sees what any consumer would see.
Each cycle runs in a fresh Agent, as under the systemd timer: nothing survives between cycles but the
state directory.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.agent_support import (
    CLUSTER,
    FakeApplier,
    agent_command,
    agent_program,
    bundle_body,
    bundle_document,
    events_named,
    log_records,
    released_agent,
    released_program,
    write_config,
)
from tests.helpers import RecordingMetrics
from topokeeper.agent.bundle import BUNDLE_SCHEMA_NAME, BUNDLE_SCHEMA_VERSION
from topokeeper.agent.config import load_config
from topokeeper.agent.cycle import Agent
from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.event_schemas import TopokeeperEvent, result_patterns
from topokeeper.contract.ports import ClusterState
from topokeeper.render.bundle import Bundle
from topokeeper.service.registration import with_registering
from topokeeper.service.result import ResultDeps, ResultReport, record_result
from topokeeper.sim.aws import moto_patches
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, AGENT_VERIFY_DETAIL_TYPE, agent_source, agent_verify_request_key

REGION = "us-east-1"
BUCKET = "topo-bundles"
KEY = f"clusters/{CLUSTER}/bundle.json"
FAKE_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # keep stderr for the agent's own log
    moto_patches.apply()  # delivered events carry "account", as EventBridge's do
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        moto_patches.restore()


class Cloud:
    """The bundle bucket, and the events EventBridge delivered."""

    def __init__(self, url: str) -> None:
        self.url = url
        options: dict[str, Any] = {
            "endpoint_url": url,
            "region_name": REGION,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        self.s3 = boto3.client("s3", **options)
        self.events = boto3.client("events", **options)
        self.sqs = boto3.client("sqs", **options)
        self.s3.create_bucket(Bucket=BUCKET)
        self.s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        self.queue_url = self.sqs.create_queue(QueueName="agent-events")["QueueUrl"]
        self.capture("default")

    def capture(self, bus: str) -> None:
        """Route the agent's events on ``bus`` to the queue, with the stack's own rule pattern."""
        queue_arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])
        pattern = result_patterns([])["AgentResults"]
        self.events.put_rule(Name=f"capture-{bus}", EventBusName=bus, EventPattern=json.dumps(pattern))
        self.events.put_targets(
            Rule=f"capture-{bus}",
            EventBusName=bus,
            Targets=[{"Id": "queue", "Arn": queue_arn["Attributes"]["QueueArn"]}],
        )

    def put_bundle(self, body: bytes) -> tuple[str, str]:
        response = self.s3.put_object(Bucket=BUCKET, Key=KEY, Body=body)
        return response["ETag"], response["VersionId"]

    def delivered(self) -> list[dict[str, Any]]:
        """Events delivered since the last call (moto delivers during PutEvents)."""
        events: list[dict[str, Any]] = []
        while messages := self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get("Messages"):
            for message in messages:
                events.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return events


@pytest.fixture
def cloud(moto_url: str) -> Cloud:
    # The local moto server's own reset endpoint.
    reset = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")  # noqa: S310
    urllib.request.urlopen(reset, timeout=10).close()  # noqa: S310
    return Cloud(moto_url)


class Node:
    """The head node: the fake applier, the agent's config and state, and a clock the test moves."""

    def __init__(self, directory: Path, endpoint_url: str) -> None:
        self.directory = directory
        self.applier = FakeApplier(directory / "opt")
        self.state_dir = directory / "state"
        self.config_path = directory / "agent.json"
        self.now = 1_800_000_000.0
        self.settings: dict[str, Any] = {"endpoint_url": endpoint_url, "verify_interval_seconds": 300}
        self.configure()

    def configure(self, **settings: Any) -> None:
        self.settings.update(settings)
        write_config(self.config_path, self.applier, self.state_dir, **self.settings)

    def cycle(self, after_seconds: float = 60) -> None:
        self.now += after_seconds
        Agent(load_config(str(self.config_path)), clock=lambda: self.now).cycle()

    def run_agent(self, *arguments: str, program: Path | None = None) -> subprocess.Popen[str]:
        """The agent as it ships (the one .pyz; ``program``: a released one) as its own process, as systemd starts
        it."""
        program = program or agent_program(self.directory / "program")
        argv, environment = agent_command(program, "--config", str(self.config_path), *arguments)
        return self._popen(argv, environment, program.parent)

    def run_released_agent(self, released: Path, *arguments: str) -> subprocess.Popen[str]:
        """A released one-file agent.py as its own process."""
        argv = [sys.executable, str(released), "--config", str(self.config_path), *arguments]
        return self._popen(argv, dict(os.environ), released.parent)

    @staticmethod
    def _popen(argv: list[str], environment: dict[str, str], directory: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv,
            env={**environment, **FAKE_KEYS},
            cwd=directory,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def node(tmp_path: Path, cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> Node:
    for name, value in FAKE_KEYS.items():
        monkeypatch.setenv(name, value)
    return Node(tmp_path, cloud.url)


def _applier_document(outcome: str, mode: str, plan_sha256: str, **changes: Any) -> dict[str, Any]:
    """What tests/fixtures/fake_applier.py prints."""
    return {
        "outcome": outcome,
        "mode": mode,
        "plan_sha256": plan_sha256,
        "before_sha256": "0" * 64,
        "after_sha256": plan_sha256,
        "partitions_changed": [],
        "reconfigured": False,
        "error": None,
        "drift": [],
        "applier_version": "fake",
        **changes,
    }


def test_first_poll_applies_and_reports_then_an_unchanged_bundle_costs_one_304(
    cloud: Cloud, node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    document = bundle_document()
    etag, version_id = cloud.put_bundle(bundle_body(document))

    node.cycle()

    plan = document["plan_sha256"]
    assert node.applier.calls() == [{"mode": "apply", "plan_sha256": plan, "aws_variables": []}]
    [event] = cloud.delivered()
    assert (event["source"], event["detail-type"], event["region"]) == (
        f"topokeeper.agent.{CLUSTER}",
        AGENT_APPLY_DETAIL_TYPE,
        REGION,
    )
    assert event["detail"] == {
        "cluster": CLUSTER,
        "plan_sha256": plan,
        "etag": etag,
        "version_id": version_id,
        "host": socket.gethostname(),
        "result": _applier_document("applied", "apply", plan, partitions_changed=["ml-p5"], reconfigured=True),
    }
    assert (node.state_dir / "bundle.json").read_bytes() == bundle_body(document)

    node.cycle()

    assert len(node.applier.calls()) == 1
    assert cloud.delivered() == []
    log = capsys.readouterr().err
    assert [record["etag"] for record in events_named(log, "poll.not_modified")] == [etag]
    assert [record["outcome"] for record in events_named(log, "apply.result")] == ["applied"]


def test_a_new_object_version_is_applied_again(cloud: Cloud, node: Node) -> None:
    first, second = bundle_document(), bundle_document("24.11")
    cloud.put_bundle(bundle_body(first))
    node.cycle()
    etag, version_id = cloud.put_bundle(bundle_body(second))

    node.cycle()

    assert [call["plan_sha256"] for call in node.applier.calls()] == [first["plan_sha256"], second["plan_sha256"]]
    events = cloud.delivered()
    assert [(e["detail"]["plan_sha256"], e["detail"]["version_id"]) for e in events][-1] == (
        second["plan_sha256"],
        version_id,
    )
    assert events[-1]["detail"]["etag"] == etag


def test_a_rolled_back_apply_is_reported_as_such_and_not_retried(cloud: Cloud, node: Node) -> None:
    document = bundle_document()
    cloud.put_bundle(bundle_body(document))
    node.applier.answer("apply", "rolled_back", 1)

    node.cycle()
    node.cycle()

    assert len(node.applier.calls()) == 1
    [event] = cloud.delivered()
    assert event["detail-type"] == AGENT_APPLY_DETAIL_TYPE
    assert event["detail"]["result"] == _applier_document(
        "rolled_back",
        "apply",
        document["plan_sha256"],
        after_sha256="0" * 64,
        error="slurmctld rejected the new topology",
    )


def test_verify_runs_on_its_own_cadence_and_reports_drift(cloud: Cloud, node: Node) -> None:
    document = bundle_document()
    etag, version_id = cloud.put_bundle(bundle_body(document))
    drift = [{"partition": "ml-p5", "expected": "tree-ml-p5", "live": None}]
    node.applier.answer("verify", "drift", 3, drift=drift)

    node.cycle()  # applies; an apply reads back, so the verify clock starts here
    cloud.delivered()
    node.cycle(after_seconds=100)
    assert [call["mode"] for call in node.applier.calls()] == ["apply"]

    node.cycle(after_seconds=200)  # 300 s since the apply

    assert [call["mode"] for call in node.applier.calls()] == ["apply", "verify"]
    [event] = cloud.delivered()
    assert event["detail-type"] == AGENT_VERIFY_DETAIL_TYPE
    assert (event["detail"]["etag"], event["detail"]["version_id"]) == (etag, version_id)
    assert event["detail"]["result"] == _applier_document(
        "drift", "verify", document["plan_sha256"], after_sha256="0" * 64, drift=drift
    )

    node.applier.answer("verify", "in_sync", 0)
    node.cycle(after_seconds=299)
    assert cloud.delivered() == []
    node.cycle(after_seconds=1)
    assert [e["detail"]["result"]["outcome"] for e in cloud.delivered()] == ["in_sync"]


def test_a_corrupted_bundle_never_reaches_the_applier_and_is_reported_refused(
    cloud: Cloud, node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    good = bundle_document()
    cloud.put_bundle(bundle_body(good))
    node.cycle()
    corrupted = bundle_document("24.11")
    corrupted["files"]["topology.conf"]["content"] += "SwitchName=evil Nodes=ip-10-1-0-1\n"
    etag, version_id = cloud.put_bundle(bundle_body(corrupted))
    cloud.delivered()

    node.cycle()
    node.cycle()  # reported once, not at every poll

    assert [call["mode"] for call in node.applier.calls()] == ["apply"]
    [event] = cloud.delivered()
    assert event["detail-type"] == AGENT_APPLY_DETAIL_TYPE
    assert (event["detail"]["etag"], event["detail"]["version_id"]) == (etag, version_id)
    assert event["detail"]["plan_sha256"] == corrupted["plan_sha256"]
    result = event["detail"]["result"]
    assert (result["outcome"], result["reconfigured"]) == ("refused", False)
    assert result["error"] == "files[topology.conf].sha256 does not match its content"
    assert (node.state_dir / "bundle.json").read_bytes() == bundle_body(good)  # verify keeps the last good one
    assert len(events_named(capsys.readouterr().err, "bundle.refused")) == 1

    node.cycle(after_seconds=300)
    assert node.applier.calls()[-1] == {"mode": "verify", "plan_sha256": good["plan_sha256"], "aws_variables": []}


class _Failing(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = b"<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>"
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def failing_s3() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_s3_errors_are_logged_and_retried_next_cycle(
    cloud: Cloud, node: Node, failing_s3: str, capsys: pytest.CaptureFixture[str]
) -> None:
    document = bundle_document()
    cloud.put_bundle(bundle_body(document))

    node.configure(endpoint_url=failing_s3)
    node.cycle()
    node.configure(endpoint_url=f"http://127.0.0.1:{_closed_port()}", request_timeout_seconds=2)
    node.cycle()

    assert node.applier.calls() == []
    errors = [record["error"] for record in events_named(capsys.readouterr().err, "poll.failed")]
    assert errors[0] == f"GET s3://{BUCKET}/{KEY}: HTTP 500 InternalError"
    assert "Connection refused" in errors[1]

    node.configure(endpoint_url=cloud.url)
    node.cycle()

    assert [call["plan_sha256"] for call in node.applier.calls()] == [document["plan_sha256"]]
    assert [e["detail"]["result"]["outcome"] for e in cloud.delivered()] == ["applied"]


def test_a_report_that_cannot_be_sent_waits_in_the_state_for_the_next_cycle(
    cloud: Cloud, node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud.put_bundle(bundle_body(bundle_document()))
    node.configure(event_bus="topokeeper-audit")  # not created yet: PutEvents fails

    node.cycle()

    assert [call["mode"] for call in node.applier.calls()] == ["apply"]
    [failure] = events_named(capsys.readouterr().err, "report.failed")
    assert "ResourceNotFoundException" in failure["error"]

    cloud.events.create_event_bus(Name="topokeeper-audit")
    cloud.capture("topokeeper-audit")
    node.cycle()

    assert len(node.applier.calls()) == 1  # the report is sent again, the bundle is not applied again
    assert [(e["detail-type"], e["detail"]["result"]["outcome"]) for e in cloud.delivered()] == [
        (AGENT_APPLY_DETAIL_TYPE, "applied")
    ]
    assert json.loads((node.state_dir / "state.json").read_text())["outbox"] == []


def test_a_restarted_agent_keeps_its_etag_and_does_not_apply_again(cloud: Cloud, node: Node) -> None:
    cloud.put_bundle(bundle_body(bundle_document()))

    logs = []
    for _ in range(2):
        process = node.run_agent("--once")
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        logs.append([record["event"] for record in log_records(stderr)])

    assert logs[0] == ["poll.changed", "apply.result", "report.sent"]
    assert logs[1] == ["poll.not_modified"]
    assert len(node.applier.calls()) == 1
    assert len(cloud.delivered()) == 1


def test_the_loop_polls_until_sigterm(cloud: Cloud, node: Node) -> None:
    cloud.put_bundle(bundle_body(bundle_document()))
    node.configure(poll_interval_seconds=0.2)

    process = node.run_agent()
    deadline = time.monotonic() + 30
    while not cloud.delivered() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # a few more polls
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)

    assert process.returncode == 0
    events = [record["event"] for record in log_records(stderr)]
    assert events[0] == "agent.started" and events[-1] == "agent.stopped"
    assert events.count("apply.result") == 1 and events.count("poll.not_modified") >= 1


def test_verify_mode_only_ever_verifies_against_verify_json(cloud: Cloud, node: Node) -> None:
    """For clusters whose topology HyperPod manages: the agent must never write it."""
    node.configure(mode="verify")
    document = bundle_document()
    cloud.s3.put_object(Bucket=BUCKET, Key=KEY, Body=bundle_body(document))  # an apply bundle it must ignore
    node.applier.answer("verify", "drift", 3, drift=[{"what": "topology", "name": "tree-ml-p5"}])
    node.cycle()
    assert node.applier.calls() == []  # no verify.json yet: nothing to do

    cloud.s3.put_object(Bucket=BUCKET, Key=f"clusters/{CLUSTER}/verify.json", Body=bundle_body(document))
    node.cycle()
    node.cycle(after_seconds=301)

    assert [call["mode"] for call in node.applier.calls()] == ["verify", "verify"]
    events = cloud.delivered()
    assert [e["detail-type"] for e in events] == [AGENT_VERIFY_DETAIL_TYPE, AGENT_VERIFY_DETAIL_TYPE]
    assert events[0]["detail"]["result"]["outcome"] == "drift"


def test_a_verify_request_is_honoured_at_once_once(cloud: Cloud, node: Node) -> None:
    """HyperPod changed the topology itself: the backend asks for a fresh verify rather than wait for the cadence."""
    node.configure(mode="verify")
    document = bundle_document()
    request_key = f"clusters/{CLUSTER}/verify-request.json"
    cloud.s3.put_object(Bucket=BUCKET, Key=f"clusters/{CLUSTER}/verify.json", Body=bundle_body(document))
    cloud.s3.put_object(Bucket=BUCKET, Key=request_key, Body=json.dumps({"request_id": "r-1"}).encode())
    node.cycle()  # a new verify.json and a request in one cycle: one verify answers both
    node.cycle(after_seconds=10)  # nothing new: no verify (the cadence is 300 s)
    cloud.s3.put_object(Bucket=BUCKET, Key=request_key, Body=json.dumps({"request_id": "r-2"}).encode())
    node.cycle(after_seconds=10)  # a new request: verify at once, long before the cadence

    assert [call["mode"] for call in node.applier.calls()] == ["verify", "verify"]
    events = cloud.delivered()
    assert [(e["detail-type"], e["detail"].get("verify_request")) for e in events] == [
        (AGENT_VERIFY_DETAIL_TYPE, "r-1"),
        (AGENT_VERIFY_DETAIL_TYPE, "r-2"),
    ]
    assert agent_verify_request_key(CLUSTER) == request_key


# --- old and new agents against a newer bundle schema --------------------------------------------


class _NothingInFlight:
    def get(self, cluster: str) -> ClusterState:
        return ClusterState(cluster=cluster)


def _result_function(event: dict[str, Any], metrics: RecordingMetrics) -> ResultReport:
    """The result service on a delivered event; with no delivery in flight it reads only state and metrics."""
    deps = ResultDeps(
        settings=Settings(clusters=[ClusterConfig(name=CLUSTER, mode="enforce")]),
        state=_NothingInFlight(),  # type: ignore[arg-type]
        plans=None,  # type: ignore[arg-type]
        audit=None,  # type: ignore[arg-type]
        queue=None,  # type: ignore[arg-type]
        metrics=metrics,
        clock=None,  # type: ignore[arg-type]
        ssm_result=None,  # type: ignore[arg-type]
    )
    return record_result(TopokeeperEvent.model_validate(event), deps)


def _newer_schema_bundle() -> dict[str, Any]:
    document = bundle_document()
    document["schema"] = f"{BUNDLE_SCHEMA_NAME}/{BUNDLE_SCHEMA_VERSION + 1}"
    return document


def test_a_newer_bundle_schema_is_reported_agent_outdated_and_raises_the_metric(cloud: Cloud, node: Node) -> None:
    document = _newer_schema_bundle()
    cloud.put_bundle(bundle_body(document))

    node.cycle()
    node.cycle()  # reported once, not at every poll

    assert node.applier.calls() == []
    [event] = cloud.delivered()
    assert (event["source"], event["detail-type"]) == (agent_source(CLUSTER), AGENT_APPLY_DETAIL_TYPE)
    result = event["detail"]["result"]
    assert (result["outcome"], result["plan_sha256"]) == ("agent_outdated", document["plan_sha256"])
    assert "re-run the `topokeeper agent install-script` output" in result["error"]

    metrics = RecordingMetrics()
    report = _result_function(event, metrics)
    assert (report.cluster, report.status) == (CLUSTER, "ignored")  # no delivery in flight to finish
    assert metrics.points == [(CLUSTER, "AgentOutdated", 1)]


def _registering_bundle() -> dict[str, Any]:
    """A bundle as the backend delivers it on Slurm 25.11, listing nodes whose instance has a registration entry."""
    plan = Bundle.model_validate(bundle_document())
    return with_registering(plan, plan.nodes[:2]).document()


def test_a_program_released_before_registering_bundles_reports_one_agent_outdated(
    cloud: Cloud, node: Node, tmp_path: Path
) -> None:
    """An agent-pull head node that never re-ran the install script is sent a bundle with `registering`, a key its
    program does not know: its agent says it is outdated (the alarm with the upgrade hint), not a bare refusal."""
    document = _registering_bundle()
    cloud.put_bundle(bundle_body(document))

    process = node.run_agent("--once", program=released_program(tmp_path / "released"))
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 0, stderr
    assert node.applier.calls() == []  # its applier would refuse the unknown key, with no hint to upgrade
    [event] = cloud.delivered()
    result = event["detail"]["result"]
    assert (result["outcome"], result["plan_sha256"]) == ("agent_outdated", document["plan_sha256"]), result["error"]
    assert "re-run the `topokeeper agent install-script` output" in result["error"]
    metrics = RecordingMetrics()
    _result_function(event, metrics)
    assert metrics.points == [(CLUSTER, "AgentOutdated", 1)]


def test_a_program_released_before_registering_bundles_still_applies_one_without(
    cloud: Cloud, node: Node, tmp_path: Path
) -> None:
    """Head nodes that never need registration (not Slurm 25.11) keep working without an upgrade."""
    document = bundle_document()
    cloud.put_bundle(bundle_body(document))

    process = node.run_agent("--once", program=released_program(tmp_path / "released"))
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 0, stderr
    assert node.applier.calls() == [{"mode": "apply", "plan_sha256": document["plan_sha256"], "aws_variables": []}]
    assert [event["detail"]["result"]["outcome"] for event in cloud.delivered()] == ["applied"]


def _released_agent_cycle(node: Node, tmp_path: Path) -> list[str]:
    """One cycle of the released agent.py as its own process; the names of what it logged."""
    process = node.run_released_agent(released_agent(tmp_path), "--once")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    return [record["event"] for record in log_records(stderr)]


def _outdated_and_counted(event: dict[str, Any]) -> ResultReport:
    metrics = RecordingMetrics()
    report = _result_function(event, metrics)
    assert (report.status, report.cluster) == ("outdated", CLUSTER)
    assert metrics.points == [(CLUSTER, "AgentOutdated", 1)]
    return report


def test_an_agent_released_before_schema_versions_refuses_a_newer_bundle_and_counts_as_outdated(
    cloud: Cloud, node: Node, tmp_path: Path
) -> None:
    """What a head node that never re-ran the install script does with a bundle of a newer schema."""
    cloud.put_bundle(bundle_body(_newer_schema_bundle()))

    assert _released_agent_cycle(node, tmp_path) == ["poll.changed", "bundle.refused", "report.sent"]

    assert node.applier.calls() == []
    [event] = cloud.delivered()  # the stack's rule still takes the shared source it sends
    assert (event["source"], event["detail"]["cluster"]) == ("topokeeper.agent", CLUSTER)
    assert event["detail"]["result"]["outcome"] == "refused"
    assert event["detail"]["result"]["error"].startswith("schema: expected topokeeper.bundle/1")  # what it knew
    assert "re-run the install script" in _outdated_and_counted(event).reason


def test_an_agent_released_before_per_cluster_sources_is_counted_outdated_and_never_recorded(
    cloud: Cloud, node: Node, tmp_path: Path
) -> None:
    """Until it is upgraded, an old agent still applies a bundle it knows, but its report proves nothing."""
    known = {**bundle_document(), "schema": "topokeeper.bundle/1"}  # before signed bundles (/2) too
    cloud.put_bundle(bundle_body(known))

    assert _released_agent_cycle(node, tmp_path) == ["poll.changed", "apply.result", "report.sent"]

    assert [call["mode"] for call in node.applier.calls()] == ["apply"]
    [event] = cloud.delivered()
    assert (event["source"], event["detail"]["result"]["outcome"]) == ("topokeeper.agent", "applied")
    _outdated_and_counted(event)
