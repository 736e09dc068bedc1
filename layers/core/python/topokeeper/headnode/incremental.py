"""Bringing the live topology to a new topology.yaml without a reconfigure, where Slurm allows it.

Slurm >= 25.05 moves a node live with ``scontrol update NodeName=<hostlist> Topology=<t>:<path>,<t2>:<block>``:
the value is the node's whole placement (every topology it is in; a topology left out drops the node from it,
src/interfaces/topology.c), tree paths are written from the top switch down and create missing switches
under an existing one, and a block must exist (refused otherwise since 25.11). Proven on 25.11 and 26.05 in
the project's chroots, so only from 25.11.

No switch is deleted at run time: an update only clears the node's bit in its old leaf and the switches above it
(src/plugins/topology/tree/topology_tree.c, topology_p_add_rm_node); the switch table is built from the file only,
at a reconfigure or restart. A switch whose last nodes move out stays listed, ``Nodes=`` empty, in its parent's
``Switches=``, holds no job, and a node can be put back in it by name; the next reconfigure, reading a file
without it, drops it (checked on 25.11.7 and 26.05.5). So a plan that removes switches is applied live when the
removed ones form whole subtrees below a kept top switch: the file is written without them, the updates empty
them (every node under one changes its path), and the read-back passes over a live switch the plan lacks only
while it and every switch below it hold no node (grouping.emptied_switches). The placeholder leaf ``no-topology``
(nodes EC2 has not described yet) losing its last node is the common case.

Anything the updates cannot express (a new topology or block, a changed block order or block_sizes, a removed
top switch, a re-parented switch, a file this parser does not read) takes the whole-file path with reconfigure.
"""

from __future__ import annotations

import time
from typing import (
    Callable,
    Dict,
    Optional,
    Sequence,
    Tuple,
)

from topokeeper.headnode.failures import Failed
from topokeeper.headnode.scontrol import LiveTopologies, Scontrol
from topokeeper.wire import RECONFIGURE_TIMEOUT, expand, one_line
from topokeeper.wire_updates import AddedSwitches


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


def kept_elsewhere(added: AddedSwitches, topologies: LiveTopologies) -> str:
    """Why the updates cannot create a switch the plan adds ("" when they can): slurmctld still keeps one of that
    name, emptied by an earlier apply, under another parent. An update finds each switch of its path by name
    wherever it is (topology_tree.c, topology_p_add_rm_node), so it would put the nodes there. ``added``:
    plan_updates' switches the updates create, with their parents in the plan."""
    for name, planned in added.items():
        if not planned:
            continue
        try:
            live = topologies.get(name)
        except Failed:  # a slow read: the read-back after the updates still compares
            return ""
        live_parents: Dict[str, str] = {}
        for parent, unit in live.units.items():
            children = unit.get("switches")
            if isinstance(children, list):
                live_parents.update((str(child), parent) for child in children)
        for switch in sorted(switch for switch in planned if switch in live.units):
            if live_parents.get(switch) != planned[switch]:
                return "topology %s: slurmctld still keeps switch %s under %s, the plan puts it under %s" % (
                    name,
                    switch,
                    _shown(live_parents.get(switch)),
                    _shown(planned[switch]),
                )
    return ""


def _shown(parent: Optional[str]) -> str:
    return parent or "no switch"
