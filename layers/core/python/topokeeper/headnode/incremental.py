"""Bringing the live topology to a new topology.yaml without a reconfigure, where Slurm allows it.

Slurm >= 25.05 moves a node live with ``scontrol update NodeName=<hostlist> Topology=<t>:<path>,<t2>:<block>``:
the value is the node's whole placement (every topology it is in; a topology left out drops the node from it,
src/interfaces/topology.c), tree paths are written from the top switch down and create missing switches
under an existing one, and a block must exist (refused otherwise since 25.11). Proven on 25.11 and 26.05 in
the project's chroots, so only from 25.11. Anything the updates cannot express (a new topology or block, a
changed block order or block_sizes, a removed or re-parented switch, a file this parser does not read)
takes the whole-file path with reconfigure.
"""

from __future__ import annotations

import time
from typing import (
    Callable,
    Dict,
    Sequence,
    Tuple,
)

from topokeeper.headnode.failures import Failed
from topokeeper.headnode.scontrol import Scontrol
from topokeeper.wire import RECONFIGURE_TIMEOUT, expand, one_line


def update_live(
    scontrol: Scontrol, batches: Sequence[Tuple[str, str]], result: Dict[str, object], crash: Callable[[str], None]
) -> bool:
    """Run one ``scontrol update`` per batch (an argv, no shell); False at the first refusal, said in
    result["whole_file_reason"]. result["nodes_updated"] counts the nodes of the batches slurmctld accepted."""
    done = 0
    for index, (hostlist, value) in enumerate(batches):
        if scontrol.deadline is not None and scontrol.deadline - time.monotonic() < 2 * RECONFIGURE_TIMEOUT:
            # The fallback's reconfigure, and a rollback after it, keep their share of the budget.
            result["whole_file_reason"] = "too little of the time budget left for %d more live update(s)" % (
                len(batches) - index
            )
            return False
        try:
            run = scontrol.run("update", "NodeName=%s" % hostlist, "Topology=%s" % value)
        except Failed as error:  # a timeout: the reconfigure still loads the files
            result["whole_file_reason"] = str(error)
            return False
        if run.returncode != 0:
            why = one_line(run.stderr or run.stdout) or "exit %d" % run.returncode
            result["whole_file_reason"] = "scontrol update NodeName=%s Topology=%s: %s" % (hostlist, value, why)
            return False
        done += len(expand(hostlist))
        result["nodes_updated"] = done
        crash("after-update:%d" % index)
    return True
