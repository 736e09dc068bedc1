"""The EKS reconcile and drift check on the in-memory ports: Kueue files to the plan store on change only, one
``UpdateKueueTopology`` record per change, ``NodesWithoutTopologyData``, a lost event found by the schedule."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.fakes import (
    FakeChannel,
    FakeClock,
    MemoryAuditSink,
    MemoryKueueStore,
    MemoryMetrics,
    MemoryPlanStore,
    MemoryStateStore,
    MemoryWorkQueue,
    trigger,
)
from tests.unit.kueue.fleets import mixed_fleet, p5_fleet
from tests.unit.kueue.kueue_api import api_errors
from topokeeper.contract.config import ClusterConfig, Orchestrator, Settings
from topokeeper.contract.errors import Permanent
from topokeeper.contract.ports import KueueAuditRecord, Metric, ReconcileRequest
from topokeeper.contract.stack_spec import cluster_alarms
from topokeeper.engine.snapshot import AwsSnapshot
from topokeeper.kueue.objects import TOPOLOGY_FILE
from topokeeper.kueue.publication import LABELS_FILE, SUMMARY_FILE
from topokeeper.service.controller import check_drift, reconcile
from topokeeper.service.reconcile import ControllerDeps

CLUSTER = "eks-p5"


@dataclass
class SnapshotFacts:
    """DescribeCluster / ListClusterNodes / DescribeInstanceTopology as a document a test edits."""

    document: dict[str, Any]
    reads: int = 0

    def read(self, cluster: str) -> AwsSnapshot:
        self.reads += 1
        return AwsSnapshot.model_validate(self.document)

    def topology(self, index: int) -> dict[str, Any]:
        item: dict[str, Any] = self.document["instance_topology"][index]
        return item


@dataclass
class EksController:
    facts: SnapshotFacts = field(default_factory=lambda: SnapshotFacts(p5_fleet()))
    clock: FakeClock = field(default_factory=FakeClock)
    state: MemoryStateStore = field(default_factory=MemoryStateStore)
    queue: MemoryWorkQueue = field(default_factory=MemoryWorkQueue)
    metrics: MemoryMetrics = field(default_factory=MemoryMetrics)
    audit: MemoryAuditSink = field(default_factory=MemoryAuditSink)
    kueue: MemoryKueueStore = field(default_factory=MemoryKueueStore)

    def __post_init__(self) -> None:
        self.settings = Settings.model_validate(
            {
                "clusters": [{"name": CLUSTER, "orchestrator": "eks"}],
                "debounce_seconds": 0,
                "min_write_interval_seconds": 0,
            }
        )
        self.channel = FakeChannel(self.clock)

    def deps(self) -> ControllerDeps:
        return ControllerDeps(
            settings=self.settings,
            state=self.state,
            plans=MemoryPlanStore(),
            queue=self.queue,
            metrics=self.metrics,
            clock=self.clock,
            facts=lambda cluster: self.facts,
            channel=lambda cluster: self.channel,
            kueue=self.kueue,
            audit=self.audit,
        )

    def change(self, event_id: str) -> ReconcileRequest:
        self.clock.advance(60)
        state = self.state.record_change(CLUSTER, trigger(event_id, self.clock.now()), self.clock.now())
        return ReconcileRequest(cluster=CLUSTER, generation=state.generation, since=state.reconciled_generation)

    def reconcile(self, event_id: str) -> str:
        return reconcile(self.change(event_id), self.deps()).action

    def records(self) -> list[KueueAuditRecord]:
        return [r for r in self.audit.records.values() if isinstance(r, KueueAuditRecord)]

    def files(self) -> dict[str, str]:
        return self.kueue.files[(CLUSTER, self.kueue.latest[CLUSTER])]


@pytest.fixture
def eks() -> EksController:
    return EksController()


def test_first_reconcile_publishes_valid_kueue_objects_and_audits_once(eks: EksController) -> None:
    assert eks.reconcile("e-1") == "published"

    files = eks.files()
    documents = list(yaml.safe_load_all(files[TOPOLOGY_FILE]))
    assert {f"{d['kind']}/{d['metadata']['name']}" for d in documents} == {
        "Topology/aws-3-layer-network",
        "ResourceFlavor/ml-p5-48xlarge",
    }
    assert all(api_errors(document) == [] for document in documents)
    labels = json.loads(files[LABELS_FILE])["nodes"]
    assert len(labels) == 40 and all(len(entry["labels"]) == 3 for entry in labels.values())
    (record,) = eks.records()
    assert record.previous_plan_sha256 is None and record.node_count == 40 and record.nodes_added_count == 40
    assert record.objects_changed == record.objects
    assert record.location == f"kueue/{CLUSTER}/{record.plan_sha256}/"
    assert [t.event_id for t in record.triggers] == ["e-1"]
    state = eks.state.get(CLUSTER)
    assert state.desired_sha256 == state.applied_sha256 == record.plan_sha256
    assert eks.metrics.values(Metric.NODES_WITHOUT_TOPOLOGY_DATA) == [0]
    assert eks.channel.delivered == []  # nothing goes to the cluster


def test_same_facts_publish_nothing_new(eks: EksController) -> None:
    eks.reconcile("e-1")

    assert eks.reconcile("e-2") == "unchanged"

    assert eks.kueue.puts == 1 and len(eks.records()) == 1
    assert eks.state.get(CLUSTER).reconciled_generation == 2


def test_a_node_moved_to_another_leaf_is_audited_as_relabeled_with_the_objects_unchanged(eks: EksController) -> None:
    eks.reconcile("e-1")
    first = eks.kueue.latest[CLUSTER]
    moved = eks.facts.topology(0)
    moved["NetworkNodes"] = [*moved["NetworkNodes"][:2], eks.facts.topology(39)["NetworkNodes"][2]]

    assert eks.reconcile("e-2") == "published"

    change = next(r for r in eks.records() if r.previous_plan_sha256 == first)
    assert change.objects_changed == [] and change.nodes_added == [] and change.nodes_removed == []
    assert change.nodes_relabeled == [f"hyperpod-{moved['InstanceId']}"]
    assert (
        json.loads(eks.files()[LABELS_FILE])["nodes"][f"hyperpod-{moved['InstanceId']}"]["labels"][
            "topology.k8s.aws/network-node-layer-3"
        ]
        == eks.facts.topology(39)["NetworkNodes"][2]
    )


def test_a_node_without_topology_data_is_counted_listed_and_asked_again(eks: EksController) -> None:
    eks.reconcile("e-1")
    gone = eks.facts.document["instance_topology"].pop(5)  # not reported yet

    assert eks.reconcile("e-2") == "published"

    assert eks.metrics.values(Metric.NODES_WITHOUT_TOPOLOGY_DATA) == [0, 1]
    record = eks.records()[-1]
    assert record.nodes_without_topology_data == [f"hyperpod-{gone['InstanceId']}"]
    assert record.nodes_without_topology_data_count == 1
    assert json.loads(eks.files()[SUMMARY_FILE])["nodes_without_topology_data"] == record.nodes_without_topology_data
    assert eks.queue.sent[-1].reason == "retry"


def test_a_fleet_of_only_undescribable_nodes_still_counts_them() -> None:
    document = p5_fleet()
    document["instance_topology"] = []  # instances in a service account DescribeInstanceTopology cannot see
    eks = EksController(facts=SnapshotFacts(document))

    eks.reconcile("e-1")

    assert eks.metrics.values(Metric.NODES_WITHOUT_TOPOLOGY_DATA) == [40]


def test_a_mixed_fleet_gets_a_topology_per_layer_depth() -> None:
    eks = EksController(facts=SnapshotFacts(mixed_fleet()))

    eks.reconcile("e-1")

    assert eks.records()[0].objects == [
        "ResourceFlavor/ml-p5-48xlarge",
        "ResourceFlavor/ml-p6-b200-48xlarge",
        "Topology/aws-3-layer-network",
        "Topology/aws-4-layer-network",
    ]


def test_a_retry_after_a_crash_before_the_state_was_saved_audits_the_change_once(
    eks: EksController, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed")

    request = eks.change("e-1")
    monkeypatch.setattr("topokeeper.service.eks.save_fields", crash)
    with pytest.raises(RuntimeError):
        reconcile(request, eks.deps())
    monkeypatch.undo()

    assert reconcile(request, eks.deps()).action == "published"

    assert len(eks.records()) == 1 and eks.kueue.puts == 2  # the same bytes written twice, audited once


def test_drift_finds_a_lost_event_and_requests_a_reconcile(eks: EksController) -> None:
    eks.reconcile("e-1")
    cluster = eks.settings.clusters[0]

    quiet = check_drift(cluster, eks.deps())
    eks.facts.document["instance_topology"][0]["NetworkNodes"][2] = "nn-0000000000000beef"
    lost = check_drift(cluster, eks.deps())

    assert (quiet.aws, quiet.action, quiet.live) == ("current", "none", "not-applicable")
    assert (lost.aws, lost.action) == ("changed", "reconcile-requested")
    assert eks.queue.sent[-1].reason == "drift"
    assert eks.reconcile("e-3") == "published"


def test_without_a_kueue_store_the_eks_reconcile_fails_for_good(eks: EksController) -> None:
    deps = eks.deps()
    deps.kueue = None

    with pytest.raises(Permanent, match="Kueue store"):
        reconcile(eks.change("e-1"), deps)


def test_eks_clusters_take_no_slurm_settings_and_alarm_on_nodes_without_topology_data() -> None:
    with pytest.raises(ValueError, match="head_node apply to Slurm clusters only"):
        ClusterConfig(name="eks", orchestrator=Orchestrator.EKS, head_node="i-0123456789abcdef0")
    settings = Settings.model_validate({"clusters": [{"name": "eks", "orchestrator": "eks"}]})

    alarms = cluster_alarms(settings, settings.clusters[0])

    assert list(alarms) == [Metric.NODES_WITHOUT_TOPOLOGY_DATA]
    assert alarms[Metric.NODES_WITHOUT_TOPOLOGY_DATA].evaluation_periods == settings.drift_alarm_periods


def test_publication_is_deterministic() -> None:
    first, second = EksController(), EksController(facts=SnapshotFacts(copy.deepcopy(p5_fleet())))
    first.reconcile("e-1")
    second.reconcile("e-9")

    assert first.files() == second.files()


def test_the_eks_reconcile_imports_nothing_the_lambda_layer_lacks() -> None:
    """PyYAML is CLI-only (layers/core/requirements.txt): the reconcile must run without it."""
    code = "import sys; sys.modules['yaml'] = None; import topokeeper.service.eks, topokeeper.wiring.runtime"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_discovery_cut_short_continues_at_once_without_spending_a_topology_retry(eks: EksController) -> None:
    eks.facts.document["instance_topology"].pop(5)  # not described: the invocation's time ran out first
    eks.facts.document["undescribed"] = 1

    report = reconcile(eks.change("e-1"), eks.deps())

    assert (report.action, report.undescribed) == ("published", 1)
    assert eks.state.get(CLUSTER).topology_retries == 0
    assert eks.state.get(CLUSTER).triggers[-1].detail_type == "Discovery Continues"


def test_an_early_write_waits_for_the_full_interval_when_a_node_has_no_topology_yet(eks: EksController) -> None:
    """As for Slurm (``test_an_early_write_is_taken_only_when_it_places_every_node``): changes that stopped half
    an interval after the last write are written early only if every node is placed; else at the full interval."""
    eks.settings = eks.settings.model_copy(
        update={"debounce_seconds": 10, "max_wait_seconds": 30, "min_write_interval_seconds": 60}
    )
    first = eks.change("e-1")
    eks.clock.advance(10)
    assert reconcile(first, eks.deps()).action == "published"
    eks.facts.document["instance_topology"].pop(5)  # a node EC2 has not reported yet
    eks.clock.advance(25)
    state = eks.state.record_change(CLUSTER, trigger("e-2", eks.clock.now()), eks.clock.now())
    request = ReconcileRequest(cluster=CLUSTER, generation=state.generation, since=state.reconciled_generation)
    eks.clock.advance(10)  # quiet for the debounce, 35 s after the write

    early = reconcile(request, eks.deps())

    assert (early.action, early.defer_seconds) == ("deferred", 25)
    assert len(eks.records()) == 1
    eks.clock.advance(25)
    assert reconcile(request, eks.deps()).action == "published"  # the full interval writes what is there
    assert eks.records()[-1].nodes_without_topology_data_count == 1
