"""Nodes slurmctld already serves where an apply is about to put them: placed at registration.

On Slurm 25.11 a compute node's slurmd may register with its topology (``slurmd --conf topology=...``, written by
the node's start action from the backend's registration entry), and slurmctld places it at once. Before an apply
changes anything, the nodes whose placement the new topology.yaml changes are compared with the live topology:
those already where the plan says were placed by someone else than this apply (the registration route), need no
``scontrol update``, and are reported as ``nodes_placed_before`` so the audit can say which route placed them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from topokeeper.headnode.scontrol import LiveTopologies
from topokeeper.wire import parse_topology_yaml, placements_by_node, switch_paths


def _live_paths(units: Dict[str, Dict[str, object]]) -> Optional[Dict[str, str]]:
    """{node: path} of one live topology (``parse_show_topology`` units): an upper switch's Nodes= lists every node
    under it, so only leaves (no child switch) place nodes."""
    if any(unit["kind"] == "block" for unit in units.values()):
        return {node: name for name, unit in units.items() for node in unit["nodes"]}  # type: ignore[attr-defined]
    tree: Dict[str, Tuple[List[str], List[str]]] = {}
    for name, unit in units.items():
        children = list(unit["switches"])  # type: ignore[call-overload]
        tree[name] = ([] if children else list(unit["nodes"]), children)  # type: ignore[call-overload]
    return switch_paths(tree)


def placed_before(old_text: Optional[str], new_text: str, topologies: LiveTopologies) -> List[str]:
    """The nodes whose placement differs between the old and new topology.yaml that slurmctld already serves
    exactly where the new one says (every topology they are in), sorted; [] when either file is not topokeeper's."""
    new = parse_topology_yaml(new_text)
    old = parse_topology_yaml(old_text) if old_text else {}
    after = placements_by_node(new) if new is not None else None
    before = placements_by_node(old) if old is not None else None
    if after is None or before is None:
        return []
    changed = {node: value for node, value in after.items() if before.get(node) != value}
    if not changed:
        return []
    live: Dict[str, List[str]] = {}
    for name, parsed in (new or {}).items():
        if parsed.kind == "flat":
            continue
        shown = topologies.get(name)
        paths = _live_paths(shown.units) if not shown.error else None
        for node, path in (paths or {}).items():
            live.setdefault(node, []).append("%s:%s" % (name, path))
    return sorted(node for node, value in changed.items() if ",".join(live.get(node, [])) == value)
