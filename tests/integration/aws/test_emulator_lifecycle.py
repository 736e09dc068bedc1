"""Starting and stopping the emulator: endpoint, environment, clean stop, patches scoped, call counter."""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
import pytest
from botocore.httpsession import URLLib3Session
from moto.events.utils import EventTemplateParser

from tests.integration.aws.support import cluster_request
from topokeeper.adapters.aws import PRESIGN_CONFIG
from topokeeper.sim.aws import moto_patches
from topokeeper.sim.aws_emulator import AwsEmulator


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in values.items():
            patch.setenv(key, value)
        yield


def test_clients_from_the_environment_reach_it_and_stop_leaves_nothing_behind() -> None:
    threads_before = set(threading.enumerate())
    template_before = EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE
    emulator = AwsEmulator(seed=1)
    with emulator:
        assert emulator.endpoint_url.startswith("http://127.0.0.1:")
        port = int(emulator.endpoint_url.rsplit(":", 1)[1])
        assert moto_patches.applied()
        with _environment(emulator.env()):
            sts = boto3.client("sts")  # endpoint, credentials and region from the environment only
            assert sts.get_caller_identity()["Account"] == emulator.account_id
            assert boto3.client("sqs").list_queues().get("QueueUrls", []) == []
    assert not emulator.running
    assert not moto_patches.applied()
    assert template_before == EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE
    assert set(threading.enumerate()) == threads_before
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # the port is free again
    with pytest.raises(RuntimeError, match="not running"):
        _ = emulator.endpoint_url


def test_botocore_reaches_it_in_process_and_everything_else_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    original_send = URLLib3Session.send

    def send(self: URLLib3Session, request: object) -> object:
        sent.append(str(getattr(request, "url", "")))
        return original_send(self, request)

    monkeypatch.setattr(URLLib3Session, "send", send)
    with AwsEmulator(seed=1) as emulator:
        endpoint = emulator.endpoint_url
        with _environment(emulator.env()):
            session = boto3.session.Session()  # made while it runs: its clients skip the socket
            sqs = session.client("sqs")
            queue = sqs.create_queue(QueueName="work")["QueueUrl"]
            sqs.send_message(QueueUrl=queue, MessageBody="hello")
            assert [m["Body"] for m in sqs.receive_message(QueueUrl=queue)["Messages"]] == ["hello"]
            s3 = session.client("s3")
            s3.create_bucket(Bucket="plans")
            s3.put_object(Bucket="plans", Key="a b/plan.json", Body=b"{}", Metadata={"under_score": "kept"})
            stored = s3.get_object(Bucket="plans", Key="a b/plan.json")
            assert (stored["Body"].read(), stored["Metadata"]) == (b"{}", {"under_score": "kept"})
            assert sent == []
            # What is not botocore (the head node's agent and applier, presigned URLs) goes over HTTP.
            url = session.client("s3", config=PRESIGN_CONFIG).generate_presigned_url(
                "get_object", Params={"Bucket": "plans", "Key": "a b/plan.json"}
            )
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the emulator on 127.0.0.1
                assert response.read() == b"{}"
            assert emulator.calls.by_operation()["GetObject"] == 2
    # Stopped, its sessions' clients no longer reach it in process (a later emulator may get the port).
    with pytest.raises(Exception, match="Could not connect"):
        sqs.list_queues()
    assert sent and sent[-1].startswith(endpoint)


def test_one_emulator_at_a_time_and_each_starts_from_a_clean_moto() -> None:
    with AwsEmulator(seed=1) as first:
        first.client("sqs").create_queue(QueueName="left-over")
        with pytest.raises(RuntimeError, match="already running"):
            AwsEmulator(seed=2).start()
        moto_patches.apply()  # idempotent
        assert moto_patches.applied()
    with AwsEmulator(seed=1) as second:
        assert second.client("sqs").list_queues().get("QueueUrls", []) == []


def test_the_call_counter_counts_every_request_by_operation(aws: AwsEmulator) -> None:
    sagemaker, sqs, s3 = aws.client("sagemaker"), aws.client("sqs"), aws.client("s3")
    sagemaker.create_cluster(**cluster_request())
    for _ in range(3):
        sagemaker.list_cluster_nodes(ClusterName="llm-train")
    sqs.create_queue(QueueName="q")
    s3.create_bucket(Bucket="bundles")
    s3.put_object(Bucket="bundles", Key="a/bundle.json", Body=b"{}")
    s3.get_object(Bucket="bundles", Key="a/bundle.json")
    with pytest.raises(sagemaker.exceptions.ResourceNotFound):
        sagemaker.describe_cluster(ClusterName="missing")

    assert aws.calls["ListClusterNodes"] == 3
    assert aws.calls["sagemaker:ListClusterNodes"] == 3
    assert aws.calls["CreateCluster"] == 1
    assert aws.calls["DescribeCluster"] == 1  # failed calls are received calls too
    assert aws.calls["CreateQueue"] == 1
    assert (aws.calls["CreateBucket"], aws.calls["PutObject"], aws.calls["GetObject"]) == (1, 1, 1)
    assert aws.calls.by_service()["sagemaker"] == {"CreateCluster": 1, "DescribeCluster": 1, "ListClusterNodes": 3}
    assert aws.calls.total == 9
    aws.reset_counters()
    assert aws.calls.total == 0
    assert aws.calls["ListClusterNodes"] == 0


def test_a_presigned_url_fetch_is_counted_by_its_operation(aws: AwsEmulator) -> None:
    s3 = aws.client("s3", config=PRESIGN_CONFIG)  # SigV4 query signing, as the SSM channel presigns
    s3.create_bucket(Bucket="bundles")
    s3.put_object(Bucket="bundles", Key="payloads/applier.py", Body=b"print()")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "bundles", "Key": "payloads/applier.py"})
    aws.reset_counters()
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (the emulator's own http URL)
        assert response.read() == b"print()"  # as the head node's SSM command fetches the applier
    assert aws.calls.by_service() == {"s3": {"GetObject": 1}}  # credentials in the query, not "Unknown"


def _request_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "process_request_thread" in t.name}


def test_stop_joins_the_thread_of_a_connection_still_open() -> None:
    # socketserver joins only non-daemon request threads: a daemon one still reading a kept-alive connection
    # outlived stop() and leaked into the next test (a flaky CI run).
    before = _request_threads()
    with AwsEmulator(seed=1) as emulator:
        host, port = emulator.endpoint_url.removeprefix("http://").rsplit(":", 1)
        idle = socket.create_connection((host, int(port)), timeout=10)
        idle.sendall(b"GET / HTTP/1.1\r\n")  # a request line, headers still to come: its thread is reading
        for _ in range(500):
            if _request_threads() - before:
                break
            threading.Event().wait(0.01)
        assert _request_threads() - before, "the connection got no request thread"
    assert _request_threads() - before == set()
    idle.close()
