"""What `topokeeper simulate` prints for an EKS step and for a login endpoint."""

from __future__ import annotations

import pytest

from topokeeper.sim.commands import _print_step
from topokeeper.sim.eks import KueueStep
from topokeeper.sim.login_endpoint import LoginStep
from topokeeper.sim.simulator import StepResult


def _step(**parts: object) -> StepResult:
    return StepResult.model_validate(
        {
            "step": "scale",
            "started_at": 0,
            "ended_at": 60,
            "events_sent": 2,
            "aws_calls": {},
            "reconciles": 1,
            "head_node_writes": 0,
            "reconfigures": 0,
            "apply_failures": 0,
            "applied_sha256": None,
            "desired_sha256": "ab" * 32,
            "converged": True,
            "convergence_seconds": None,
            "audit_records": [],
            "drift": None,
            "alarm": "OK",
            "alarm_raised": False,
            "live_topology": {},
            "nodes": 4,
            **parts,
        }
    )


def test_an_eks_step_prints_its_kueue_records_and_the_metric(capsys: pytest.CaptureFixture[str]) -> None:
    record = {
        "previous_plan_sha256": None,
        "plan_sha256": "cd" * 32,
        "node_count": 4,
        "nodes_added_count": 4,
        "nodes_removed_count": 0,
        "nodes_relabeled_count": 0,
        "nodes_without_topology_data_count": 1,
        "objects_changed": ["Topology/aws-3-layer-network"],
    }
    kueue = KueueStep(
        published_sha256="cd" * 32,
        objects=["Topology/aws-3-layer-network"],
        nodes_without_topology_data=1,
        alarm="ALARM",
        alarm_raised=True,
        audit_records=[record],
        topology_yaml="kind: Topology\n",
        labels_table="LAYER  DOMAIN\n",
    )

    _print_step(_step(kueue=kueue), show=True)

    printed = capsys.readouterr().out
    assert "NodesWithoutTopologyData peak 1  alarm raised, now ALARM" in printed
    assert "UpdateKueueTopology - -> cdcdcdcdcdcd nodes    4 +4/-0 relabeled 0 without topology 1" in printed
    assert "changed: Topology/aws-3-layer-network" in printed and "kind: Topology" in printed


def test_a_login_endpoint_prints_its_targets_and_changes(capsys: pytest.CaptureFixture[str]) -> None:
    login = LoginStep(
        targets={"10.1.0.5": "healthy"},
        login_nodes={"10.1.0.5": "i-0123456789abcdef0", "10.1.0.6": "i-0123456789abcdef1"},
        in_sync=False,
        healthy_min=1,
        audit_records=[{"registered": ["10.1.0.5"], "deregistered": [], "target_count": 1}],
    )

    _print_step(_step(login=login), show=False)

    printed = capsys.readouterr().out
    assert "login endpoint NOT in sync: targets 10.1.0.5 healthy" in printed
    assert "UpdateLoginTargets registered 10.1.0.5 deregistered - -> 1 targets" in printed
