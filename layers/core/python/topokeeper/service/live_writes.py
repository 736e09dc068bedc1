"""Which writes cost slurmctld no reconfigure (issue 27): the head node brings the live topology to a new
topology.yaml by ``scontrol update NodeName= Topology=`` where Slurm allows it (headnode/incremental.py). The backend
paces such writes apart from reconfigures (``reconcile.held_back``), by asking the head node's own rule of the last
applied plan and the new one, and learns from each result whether the head node did take that path.
"""

from __future__ import annotations

from topokeeper.contract.ports import ApplyResult, Outcome, PendingDelivery, PlanStore
from topokeeper.render.bundle import Bundle
from topokeeper.wire import parse_slurm_version
from topokeeper.wire_updates import eligibility

REFUSED_FIELD = "live_write_refused"


def live_update_problem(previous: Bundle, new: Bundle, slurm_version: str) -> str:
    """Why a head node running ``slurm_version`` and serving ``previous`` would need a reconfigure to load ``new``
    ("" when it applies it by live node updates). The head node's own rule (headnode/incremental.py), asked of the
    two plans: their topology files, and slurm.conf, which changes when a partition's Topology= does."""
    other = (
        ["slurm.conf"]
        if (previous.partitions, previous.topology_plugin) != (new.partitions, new.topology_plugin)
        else []
    )
    old = previous.files.get(previous.slurm_format.value) if previous.slurm_format is new.slurm_format else None
    batches, why = eligibility(
        parse_slurm_version(slurm_version),
        new.slurm_format.value,
        other,
        None if old is None else old.content,
        new.files[new.slurm_format.value].content,
    )
    return why if batches is None else ""


def live_write_fields(
    plans: PlanStore, cluster: str, pending: PendingDelivery, result: ApplyResult, slurm_version: str | None
) -> dict[str, object]:
    """What an apply's result tells of the live path: it took it (clear any refusal), or it reconfigured for a
    change the rule says it applies live (its reason: later writes are paced as reconfigures until one goes live,
    so a head node where the updates fail does not reconfigure at the live writes' pace)."""
    if result.outcome is not Outcome.APPLIED or pending.repair:
        return {}
    if result.apply_path == "incremental":
        return {REFUSED_FIELD: None}
    if result.apply_path != "whole_file" or slurm_version is None or pending.previous_plan_sha256 is None:
        return {}
    previous = plans.bundle(cluster, pending.previous_plan_sha256)
    if live_update_problem(previous, plans.bundle(cluster, pending.handle.plan_sha256), slurm_version):
        return {}  # a reconfigure was due anyway
    return {REFUSED_FIELD: result.whole_file_reason or "the head node reconfigured"}
