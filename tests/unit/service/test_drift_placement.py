"""The drift check's per-partition placement metrics (``placement_metrics``), from the head node's facts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.service.test_drift_usecases import _applied
from tests.unit.service.usecase_support import CLUSTER, Controller
from topokeeper.contract.config import Settings
from topokeeper.contract.errors import Permanent
from topokeeper.contract.ports import Metric
from topokeeper.service.controller import check_drift
from topokeeper.wiring import runtime as runtime_module
from topokeeper.wiring.runtime import PLACEMENT_FACTS_SECONDS, LambdaEnvironment, Runtime

NOW = 1_796_400_000
# Two leaves of four; job 7 runs on one node of each (one leaf would do), job 8 waits 600 s for 4 nodes in
# one leaf (6 are free, 3 per leaf), job 9 waits on no topology at all.
FACTS: dict[str, Any] = {
    "schema": "topokeeper.placement-facts/1",
    "now": NOW,
    "topologies": {"": [["s1", "n[01-04]"], ["s2", "n[05-08]"]]},
    "topology_kinds": {"": "tree"},
    "partition_topologies": {},
    "nodes": [["ALLOCATED", "gpu", "n[01,05]"], ["IDLE", "gpu", "n[02-04,06-08]"]],
    "jobs": [
        ["7", "gpu", "RUNNING", 2, "n[01,05]", 0, 0, NOW - 60, "None"],
        ["8", "gpu", "PENDING", 4, "", 1, 0, NOW - 600, "Resources"],
        ["9", "gpu", "PENDING", 1, "", 0, 0, NOW - 900, "Priority"],
    ],
}


def _opted_in(controller: Controller, answer: Any) -> Controller:
    controller.settings = controller.settings.model_copy(
        update={"clusters": [controller.cluster.model_copy(update={"placement_metrics": True})]}
    )
    deps = controller.deps

    def with_facts() -> Any:
        built = deps()
        built.placement_facts = answer
        return built

    controller.deps = with_facts  # type: ignore[method-assign]
    return controller


def _raise(error: Exception) -> Any:
    def answer(cluster: object) -> Any:
        raise error

    return answer


def test_each_partition_gets_its_three_figures() -> None:
    controller = _opted_in(Controller(), lambda cluster: FACTS)
    _applied(controller)
    report = check_drift(controller.cluster, controller.deps())
    assert report.drift == 0
    assert controller.metrics.partition_points == [
        (CLUSTER, "gpu", Metric.LARGEST_PLACEABLE_JOB_NODES, 3),
        (CLUSTER, "gpu", Metric.JOBS_SPREAD_BEYOND_NEED, 1),
        (CLUSTER, "gpu", Metric.TOPOLOGY_PENDING_SECONDS, 600),
    ]
    assert controller.metrics.values(Metric.PLACEMENT_FACTS_FAILURES) == [0]


@pytest.mark.parametrize(
    "answer",
    [
        _raise(Permanent("head node mi-0123456789abcdef0: no answer to placement-facts in 60s")),
        _raise(ConnectionError("read timeout")),
        lambda cluster: {"schema": "topokeeper.placement-facts/1", "error": "scontrol ping: down"},
        lambda cluster: {"schema": "topokeeper.placement-facts/1", "jobs": [[1]]},
    ],
    ids=["no-answer", "lost-connection", "slurmctld-down", "malformed"],
)
def test_facts_that_cannot_be_read_are_counted_and_the_check_goes_on(answer: Any) -> None:
    controller = _opted_in(Controller(), answer)
    _applied(controller)
    report = check_drift(controller.cluster, controller.deps())
    assert (report.live, report.drift, report.action) == ("in_sync", 0, "none")
    assert controller.metrics.values(Metric.TOPOLOGY_DRIFT) == [0]
    assert controller.metrics.values(Metric.PLACEMENT_FACTS_FAILURES) == [1]
    assert controller.metrics.partition_points == []


def test_a_cluster_that_did_not_opt_in_is_not_asked() -> None:
    asked: list[object] = []
    controller = Controller()
    _applied(controller)
    deps = controller.deps()
    deps.placement_facts = lambda cluster: asked.append(cluster) or FACTS
    check_drift(controller.cluster, deps)
    assert asked == []
    assert controller.metrics.values(Metric.PLACEMENT_FACTS_FAILURES) == []


def test_the_drift_function_reads_the_facts_over_its_ssm_channel_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, float]] = []

    class Channel:
        def __init__(self, name: str) -> None:
            self.name = name

        def placement_facts(self, timeout: float) -> dict[str, Any]:
            asked.append((self.name, timeout))
            return FACTS

    monkeypatch.setattr(Runtime, "ssm_channel", lambda self, cluster, deadline=None: Channel(cluster.name))
    cluster = {"name": "pc", "orchestrator": "ec2", "head_node": "i-0123456789abcdef0", "placement_metrics": True}
    settings = Settings.model_validate({"clusters": [cluster]})
    deps = _drift_deps(monkeypatch, settings)
    assert deps.placement_facts is not None
    assert deps.placement_facts(settings.clusters[0]) is FACTS
    assert asked == [("pc", PLACEMENT_FACTS_SECONDS)]


def _drift_deps(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Any:
    """The drift function's dependencies as its Lambda builds them, with no AWS client made."""
    env = LambdaEnvironment(
        TOPOKEEPER_CONFIG=settings.to_env(),
        TABLE_NAME="topokeeper-state",
        BUCKET_NAME="topokeeper-plans",
        QUEUE_URL="https://sqs.us-east-1.amazonaws.com/123456789012/topokeeper-work.fifo",
    )
    monkeypatch.setattr(runtime_module, "client", lambda service, region=None: object())
    deps = Runtime(env=env, settings=settings).drift_deps()
    return deps


def test_the_drift_function_reads_an_agent_cluster_s_newest_facts_from_the_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HyperPod: no command to send; the facts the agent put, refused when stale (adapters.agent_channel)."""
    asked: list[str] = []

    class Channel:
        def current_placement_facts(self, cluster: str) -> dict[str, Any]:
            asked.append(cluster)
            return FACTS

    monkeypatch.setattr(Runtime, "agent_channel", lambda self, cluster: Channel())
    monkeypatch.setattr(Runtime, "ssm_channel", lambda *args, **kwargs: pytest.fail("an agent cluster has no SSM"))
    settings = Settings.model_validate({"clusters": [{"name": "hp", "placement_metrics": True}]})
    deps = _drift_deps(monkeypatch, settings)
    assert deps.placement_facts is not None
    assert deps.placement_facts(settings.clusters[0]) is FACTS
    assert asked == ["hp"]
