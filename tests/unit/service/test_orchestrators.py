"""The orchestrator registry names a reconcile and a drift check for every orchestrator, and each name resolves."""

from __future__ import annotations

from topokeeper.contract.config import Orchestrator
from topokeeper.service import drift, eks, reconcile
from topokeeper.service.orchestrators import PROVIDERS, drift_checker, reconciler


def test_every_orchestrator_has_a_provider() -> None:
    assert set(PROVIDERS) == set(Orchestrator)


def test_head_node_clusters_and_eks_clusters_go_to_their_own_code() -> None:
    for slurm in (Orchestrator.HYPERPOD, Orchestrator.EC2):
        assert reconciler(slurm) is reconcile.reconcile_slurm
        assert drift_checker(slurm) is drift.check_slurm_drift
    assert reconciler(Orchestrator.EKS) is eks.reconcile_eks
    assert drift_checker(Orchestrator.EKS) is eks.check_eks_drift
