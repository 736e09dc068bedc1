"""Which code reconciles and checks the clusters of each orchestrator: one registry, as topograph registers its
providers. HyperPod Slurm and EC2/ParallelCluster clusters have a head node that receives a bundle
(``reconcile.reconcile_slurm``, ``drift.check_slurm_drift``); HyperPod EKS clusters get Kueue objects in the plan
bucket (``eks``). A provider is named here as ``module:function`` and imported the first time a cluster of its
orchestrator is reconciled or checked: a function's init loads no provider it does not run, and no provider
imports the code that dispatches to it (``controller``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from topokeeper.contract.config import ClusterConfig, Orchestrator
from topokeeper.contract.ports import ClusterState, ReconcileRequest, Trigger

if TYPE_CHECKING:
    from topokeeper.service.drift import DriftReport
    from topokeeper.service.reconcile import ControllerDeps, ReconcileReport, Verdict

    ReconcileCluster = Callable[
        [ClusterConfig, ClusterState, ReconcileRequest, ControllerDeps, Verdict], ReconcileReport
    ]
    CheckDrift = Callable[[ClusterConfig, ControllerDeps, list[Trigger]], DriftReport]


@dataclass(frozen=True)
class Provider:
    """Where an orchestrator's two steps live, each as ``module:function``."""

    reconcile: str  # (cluster, state, request, deps, verdict) -> ReconcileReport, once the reconcile proceeds
    check_drift: str  # (cluster, deps, requested_by) -> DriftReport
    # Its reconcile judges a write held back by the write interval alone (``Verdict.live_write_in``): a head node
    # applies some changes live, with no reconfigure to space.
    live_writes: bool = False


HEAD_NODE = Provider(
    "topokeeper.service.reconcile:reconcile_slurm", "topokeeper.service.drift:check_slurm_drift", live_writes=True
)
PROVIDERS: dict[Orchestrator, Provider] = {
    Orchestrator.HYPERPOD: HEAD_NODE,
    Orchestrator.EC2: HEAD_NODE,
    Orchestrator.EKS: Provider("topokeeper.service.eks:reconcile_eks", "topokeeper.service.eks:check_eks_drift"),
}


def _load(reference: str) -> object:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def reconciler(orchestrator: Orchestrator) -> ReconcileCluster:
    return cast("ReconcileCluster", _load(PROVIDERS[orchestrator].reconcile))


def writes_live(orchestrator: Orchestrator) -> bool:
    return PROVIDERS[orchestrator].live_writes


def drift_checker(orchestrator: Orchestrator) -> CheckDrift:
    return cast("CheckDrift", _load(PROVIDERS[orchestrator].check_drift))
