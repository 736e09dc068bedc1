"""Nodes slurmctld already serves where an apply is about to put them: placed at registration.

On Slurm 25.11 a compute node's slurmd may register with its topology (``slurmd --conf topology=...``, written by
the node's start action from the backend's registration entry), and slurmctld places it at once. Before an apply
changes anything, the nodes whose placement the new topology.yaml changes are compared with the live topology:
those already where the plan says were placed by someone else than this apply (the registration route), need no
``scontrol update``, and are reported as ``nodes_placed_before`` so the audit can say which route placed them.

The bundle's ``registering`` nodes (an entry was published for their instance) that slurmctld has not registered
yet are left to their slurmd: the files are written as always, with no ``scontrol update`` for them
(``nodes_left_to_registration``), and the backup root's registration.json records until when, so that the
apply and the entry race no more (the entry and the apply leave the backend in one reconcile, and the apply
usually arrives first). Verify sets them aside until then; the next apply after it places those still not where
the file says.
"""

from __future__ import annotations

import os
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Tuple

from topokeeper.headnode.bundle import Bundle
from topokeeper.headnode.cloud import unregistered
from topokeeper.headnode.config_dir import BACKUP_DIR, O_DIRECTORY, O_NOFOLLOW, Faults, read_json, write_json
from topokeeper.headnode.failures import Failed
from topokeeper.headnode.scontrol import LiveTopologies
from topokeeper.wire import REGISTRATION_WAIT_SECONDS, YAML_FORMAT, compress
from topokeeper.wire_updates import ParsedTopology, parse_topology_yaml, placements_by_node, switch_paths

REGISTRATION_FILE = "registration.json"  # in the backup root: {"until": {node: epoch seconds}}


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
    live = live_values(new or {}, topologies)
    return sorted(node for node, value in changed.items() if live.get(node, "") == value)


def live_values(parsed: Dict[str, ParsedTopology], topologies: LiveTopologies) -> Dict[str, str]:
    """{node: its live Topology= value} over the topologies of ``parsed`` (a topology.yaml), in its order."""
    live: Dict[str, List[str]] = {}
    for name, topology in parsed.items():
        if topology.kind == "flat":
            continue
        shown = topologies.get(name)
        paths = _live_paths(shown.units) if not shown.error else None
        for node, path in (paths or {}).items():
            live.setdefault(node, []).append("%s:%s" % (name, path))
    return {node: ",".join(values) for node, values in live.items()}


# -- nodes left to registration -------------------------------------------------------------------------------


class Waiting(NamedTuple):
    """What an apply leaves to registration and what it places because the wait is over."""

    left: Dict[str, float]  # node -> until when (epoch seconds) it is left to its slurmd's registration
    overdue: List[Tuple[str, str]]  # (hostlist, Topology=) for recorded nodes past their wait, not where planned


def read_record(backup_fd: int) -> Dict[str, float]:
    """{node: until} the last apply left to registration ({} when none, or unreadable: no node is then set aside)."""
    try:
        document = read_json(backup_fd, REGISTRATION_FILE)
    except (OSError, ValueError, Failed):
        return {}
    nodes = (document or {}).get("until")
    if not isinstance(nodes, dict):
        return {}
    return {str(n): float(t) for n, t in nodes.items() if isinstance(t, (int, float)) and not isinstance(t, bool)}


def read_record_in(config_dir: str) -> Dict[str, float]:
    """``read_record`` from a config directory's backup root, read-only (verify)."""
    try:
        fd = os.open(os.path.join(config_dir, BACKUP_DIR), os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
    except OSError:
        return {}
    try:
        return read_record(fd)
    finally:
        os.close(fd)


def write_record(backup_fd: int, left: Dict[str, float], faults: Faults) -> None:
    write_json(backup_fd, REGISTRATION_FILE, {"until": left}, faults, "registration")


def waiting(
    bundle: Bundle, record: Dict[str, float], show_nodes: str, topologies: LiveTopologies, now: float
) -> Waiting:
    """The bundle's registering nodes slurmctld has not registered yet and does not serve where planned, each
    until REGISTRATION_WAIT_SECONDS after the first apply left it; and batches placing the recorded nodes that
    are no longer left (past the wait, or registered without their topology) where the file says."""
    parsed = parse_topology_yaml(bundle.files[YAML_FORMAT]) or {}
    planned = placements_by_node(parsed) or {}
    live = live_values(parsed, topologies)
    down = unregistered(show_nodes)
    left: Dict[str, float] = {}
    for node in bundle.registering:
        # Never past the bound from now: a clock stepped back would otherwise stretch a recorded wait without limit.
        until = min(record.get(node, now + REGISTRATION_WAIT_SECONDS), now + REGISTRATION_WAIT_SECONDS)
        if node in down and until > now and planned.get(node) and live.get(node, "") != planned[node]:
            left[node] = until
    batches: Dict[str, List[str]] = {}
    for node in sorted(record):
        if node not in left and planned.get(node) and live.get(node, "") != planned[node]:
            batches.setdefault(planned[node], []).append(node)
    return Waiting(left, sorted((compress(nodes), value) for value, nodes in batches.items()))


def still_left(record: Dict[str, float], show_nodes: str, now: float) -> FrozenSet[str]:
    """The recorded nodes still within their wait and not registered: verify does not read them as drift."""
    down = unregistered(show_nodes)
    return frozenset(
        node for node, until in record.items() if now < until <= now + REGISTRATION_WAIT_SECONDS and node in down
    )
