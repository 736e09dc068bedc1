"""An EKS-orchestrated HyperPod cluster through the deployed backend on the emulator: the shipped EKS scenario's
node events -> ingest -> reconcile -> Kueue files in the plan bucket, UpdateKueueTopology in the history table and
on EventBridge, NodesWithoutTopologyData and its alarm; the drift schedule finds nothing left to publish."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.integration.backend.conftest import AuditCapture
from tests.unit.kueue.kueue_api import api_errors
from topokeeper.adapters.aws import client
from topokeeper.adapters.plans import kueue_latest_key
from topokeeper.cli.main import main
from topokeeper.kueue.objects import TOPOLOGY_FILE
from topokeeper.sim.commands import SCENARIOS
from topokeeper.sim.report import render_report
from topokeeper.sim.scenario import load_scenario
from topokeeper.sim.simulator import play
from topokeeper.sim.stack import BUCKET
from topokeeper.sim.world import World


def test_the_eks_scenario_publishes_audits_and_alarms(
    world_factory: Callable[..., World], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = load_scenario(SCENARIOS / "eks.yaml")
    world = world_factory(scenario)
    capture = AuditCapture()

    result = play(world, scenario, lambda _: None)

    create, scale, replace, wait = result.steps
    assert [s.kueue is not None for s in result.steps] == [True] * 4
    assert all(s.audit_records == [] and s.head_node_writes == 0 for s in result.steps)  # no Slurm side at all
    # New instances have no topology data for two minutes: published without Topologies, counted, alarmed;
    # then published again with them, and the alarm clears.
    first, second = create.kueue.audit_records
    assert first["nodes_without_topology_data_count"] == 12 and first["objects_changed"] == [
        "ResourceFlavor/ml-p5-48xlarge",
        "ResourceFlavor/ml-p6-b200-48xlarge",
    ]
    assert second["nodes_without_topology_data_count"] == 0 and second["previous_plan_sha256"] == first["plan_sha256"]
    assert "Topology/aws-4-layer-network" in second["objects_changed"]
    assert create.kueue.alarm_raised and create.kueue.nodes_without_topology_data == 12
    assert sum(r["nodes_added_count"] for r in scale.kueue.audit_records) == 4
    replaced = replace.kueue.audit_records[0]
    assert (replaced["nodes_added_count"], replaced["nodes_removed_count"]) == (1, 1)
    assert wait.kueue.audit_records == [] and wait.kueue.alarm == "OK" and wait.converged
    assert all(s.converged for s in result.steps)

    # The bucket's latest plan is the final one, and every object in it passes the CRD schema and CEL rules.
    latest = json.loads(client("s3").get_object(Bucket=BUCKET, Key=kueue_latest_key("eks-demo"))["Body"].read())
    assert latest["plan_sha256"] == result.desired["sha256"] == wait.kueue.published_sha256
    topology = client("s3").get_object(Bucket=BUCKET, Key=latest["prefix"] + TOPOLOGY_FILE)["Body"].read()
    documents = list(yaml.safe_load_all(topology))
    assert len(documents) == 4 and all(api_errors(document) == [] for document in documents)
    # Every change once in the history table and once on the bus.
    history = world.runtime.audit.history("eks-demo", 100, event_name="UpdateKueueTopology")
    steps_records = [r for s in result.steps for r in s.kueue.audit_records]
    assert len(history) == len(steps_records) == result.totals["audit_records"]
    published = [e for e in capture.events() if e["detail-type"] == "UpdateKueueTopology"]
    assert sorted(e["detail"]["audit_id"] for e in published) == sorted(r["audit_id"] for r in history)
    assert list(result.mermaid) == ["network layers"]
    html = render_report(result, mermaid_js="")
    assert "flowchart TB" in html and "layer 4" in html  # the report draws the EKS layer map
    # The operator sees the same history.
    deployment = tmp_path / "deployment.json"
    deployment.write_text(world.stack.deployment.model_dump_json())
    capsys.readouterr()
    assert main(["audit", "--cluster", "eks-demo", "--deployment", str(deployment), "--kind", "kueue", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == history
