"""What a verify of the head node's files means for the cluster: the result and drift functions both say it."""

from __future__ import annotations

from typing import Literal

from topokeeper.contract.config import Mode
from topokeeper.contract.ports import ApplyResult, Outcome


def live_status(result: ApplyResult, mode: Mode) -> Literal["in_sync", "drift", "pending", "unknown"]:
    if result.outcome is Outcome.PENDING:
        return "pending"
    if result.outcome is Outcome.IN_SYNC:
        return "in_sync"
    if result.outcome is Outcome.DRIFT:
        # In verify mode another writer (HyperPod) owns the files and names things its own way: only a
        # different grouping of nodes is drift. In enforce mode the files are ours, names included.
        if mode is Mode.VERIFY and result.grouping_drift is False:
            return "in_sync"
        return "drift"
    return "unknown"
