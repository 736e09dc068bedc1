"""What moved, in words: the lines of the simulator's timeline, ``simulate --show``, ``audit`` and the report,
and the leaf and block tables of ``show --leaves``, the timeline and the report.

Every line names the nodes, the partition and the reason; long node lists end in "and N more" and long
lines in a visible marker, never silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from topokeeper.domain.models import PLACEHOLDER_UNITS
from topokeeper.render.bundle import leaf_units
from topokeeper.wire import compress

LISTED_NODES = 8  # node names spelled out in one line; the count is always exact


def nodes_text(names: Sequence[str], limit: int = LISTED_NODES, total: int | None = None) -> str:
    """A hostlist of the first ``limit`` names, then how many more of ``total`` (default: all are listed)."""
    if not names:
        return "none"
    count = len(names) if total is None else total
    shown = compress(names[:limit])
    return shown if count <= min(limit, len(names)) else f"{shown} and {count - min(limit, len(names))} more"


def cut(line: str, width: int) -> str:
    """``line`` in at most about ``width`` characters, its end replaced by a marker saying how much was cut."""
    if len(line) <= width:
        return line
    return f"{line[:width]} [... {len(line) - width} more characters]"


def move_text(move: Mapping[str, Any]) -> str:
    return f"{move['node']} {move.get('before') or '(no leaf)'} -> {move.get('after') or '(no leaf)'}"


def moves_text(moves: Sequence[Mapping[str, Any]], count: int | None = None, limit: int = LISTED_NODES) -> str:
    """``ip-a us-1 -> us-2; ...`` for the first ``limit`` moves; ``count`` is the exact total when listed ones
    were cut (the audit record lists at most 200)."""
    total = len(moves) if count is None else count
    text = "; ".join(move_text(move) for move in moves[:limit])
    return text if total <= limit else f"{text}; and {total - limit} more"


def drift_text(moves: Sequence[Mapping[str, Any]], partitions: Mapping[str, Sequence[str]]) -> str:
    """What a drift check found moved, per partition: ``partition ml-p5: ip-a in nn-2 live, nn-1 in the plan``."""
    where = {node: name for name, nodes in partitions.items() for node in nodes}
    by_partition: dict[str, list[Mapping[str, Any]]] = {}
    for move in moves:
        by_partition.setdefault(where.get(move["node"], "(no partition)"), []).append(move)
    return "; ".join(
        f"partition {name}: "
        + ", ".join(
            f"{m['node']} in {m.get('before') or 'no leaf or block'} live, {m.get('after') or 'none'} in the plan"
            for m in found[:LISTED_NODES]
        )
        + (f" and {len(found) - LISTED_NODES} more" if len(found) > LISTED_NODES else "")
        for name, found in sorted(by_partition.items())
    )


def triggers_text(triggers: Iterable[Mapping[str, Any]], count: int) -> str:
    """The events behind a write, grouped: ``8 events: SageMaker HyperPod Cluster State Change (cluster
    InService) x8``; ``count`` is the exact number (the record lists a bounded number)."""
    groups = Counter((t["detail_type"], t.get("summary") or "") for t in triggers)
    parts = [f"{kind}{f' ({summary})' if summary else ''} x{n}" for (kind, summary), n in sorted(groups.items())]
    if not parts:
        return "no event (a scheduled check)"
    return f"{count} event(s): {', '.join(parts)}"


def record_text(record: Mapping[str, Any]) -> str:
    """One audit record as a sentence: partition, reason, outcome, nodes added/removed/moved, why."""
    added, removed = record["nodes_added"], record["nodes_removed"]
    what = f"{record['reason']} {record['outcome']} ({record['kind']}, {record['node_count']} nodes)"
    parts = [f"{record['partition']}: {what}"]
    if record["nodes_added_count"]:
        parts.append(f"+{record['nodes_added_count']} {_listed(added, record['nodes_added_count'])}")
    if record["nodes_removed_count"]:
        parts.append(f"-{record['nodes_removed_count']} {_listed(removed, record['nodes_removed_count'])}")
    moved_count = record.get("nodes_moved_count", 0)
    if moved_count:
        parts.append(f"moved {moved_count}: {moves_text(record['nodes_moved'], moved_count)}")
    if not (record["nodes_added_count"] or record["nodes_removed_count"] or moved_count):
        parts.append("no node added, removed or moved")
    why = (
        "repairs live drift"
        if record["reason"] == "drift-repair"
        else triggers_text(record["triggers"], record["trigger_count"])
    )
    parts.append(f"why: {why}")
    parts += [f"folded: {fold}" for fold in record.get("folds", [])]
    if record.get("error"):
        parts.append(f"error: {record['error']}")
    return "; ".join(parts)


def _listed(names: Sequence[str], count: int) -> str:
    return nodes_text(names, total=count)


def membership_changes(
    before: Mapping[str, tuple[str, str]], after: Mapping[str, tuple[str, str]], partition_of: Mapping[str, str]
) -> str:
    """What changed between two views of a cluster's nodes ({instance id: (host name, group)}), per partition:
    joined, left, and replaced (same host name, new instance)."""
    joined = {i: after[i] for i in after.keys() - before.keys()}
    left = {i: before[i] for i in before.keys() - after.keys()}
    replaced_hosts = {host for host, _ in joined.values()} & {host for host, _ in left.values()}
    changes: dict[str, dict[str, list[str]]] = {}

    def add(group: str, what: str, host: str) -> None:
        where = partition_of.get(group)
        label = f"partition {where}" if where else f"group {group} (no partition)"
        changes.setdefault(label, {}).setdefault(what, []).append(host)

    for host, group in joined.values():
        add(group, "replaced (new instance)" if host in replaced_hosts else "joined", host)
    for host, group in left.values():
        if host not in replaced_hosts:
            add(group, "left", host)
    if not changes:
        return "no node joined, left or was replaced since the last event"
    return "; ".join(
        f"{label}: " + ", ".join(f"{what} {nodes_text(sorted(hosts))}" for what, hosts in sorted(kinds.items()))
        for label, kinds in sorted(changes.items())
    )


# ----------------------------------------------------------------------------- leaf and block tables

LEAF_ROWS = 12  # leaves or blocks listed after one write in the timeline; the rest are counted


def unit_noun(partition: Mapping[str, Any], count: int = 1) -> str:
    """ "leaf" or "block" (plural for ``count`` other than 1) for a plan document partition."""
    if partition.get("blocks"):
        return "block" if count == 1 else "blocks"
    return "leaf" if count == 1 else "leaves"


def largest_job(partition: Mapping[str, Any]) -> int:
    """Nodes in the largest leaf or block: the largest job that runs inside one (0: flat). The placeholders
    (no-topology, no-ultraserver) hold nodes with no known place: none of them is such a leaf."""
    return max((len(nodes) for name, nodes in leaf_units(partition) if name not in PLACEHOLDER_UNITS), default=0)


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as left-aligned text columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


_LEAF_HEADER = ("PARTITION", "LEAF/BLOCK", "NODES", "HOSTLIST")


def leaf_table(partitions: Iterable[Mapping[str, Any]]) -> str:
    """Per plan document partition, each leaf switch or block with its size and full hostlist."""
    rows: list[tuple[str, ...]] = [_LEAF_HEADER]
    for partition in sorted(partitions, key=lambda p: str(p["name"])):
        rows += [(partition["name"], name, str(len(nodes)), compress(nodes)) for name, nodes in leaf_units(partition)]
    return "\n".join(columns(rows))


def partition_summary(partition: Mapping[str, Any]) -> str:
    """``ml-p5 tree: 20 nodes in 6 leaves, the largest job in one leaf 4 nodes``."""
    units = leaf_units(partition)
    text = f"{partition['name']} {partition['kind']}: {partition['node_count']} nodes"
    if not units:
        return f"{text}, no leaf or block"
    return (
        f"{text} in {len(units)} {unit_noun(partition, len(units))},"
        f" the largest job in one {unit_noun(partition)} {largest_job(partition)} nodes"
    )


def written_leaves(
    previous: Mapping[str, Any] | None,
    written: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    limit: int = LEAF_ROWS,
) -> str:
    """What one write did to the leaves and blocks, for the timeline: per partition it changed (one audit record
    each) its size, units and largest job, then the leaves and blocks whose nodes changed, with their full
    hostlists and the change (``new``, ``removed``, ``+2 -1``); the first ``limit`` rows, then how many more.
    Before is the ``previous`` plan document as written, except where a record names nodes it moved back
    from another live leaf (a drift repair): those were live there."""
    before_partitions = {p["name"]: p for p in (previous or {}).get("partitions", [])}
    after_partitions = {p["name"]: p for p in written["partitions"]}
    summaries, rows = [], []
    for record in sorted(records, key=lambda r: str(r["partition"])):
        name = record["partition"]
        partition = after_partitions.get(name)
        if partition is None:
            continue
        summaries.append(partition_summary(partition))
        placed = {n: u for u, nodes in leaf_units(before_partitions.get(name) or {}) for n in nodes}
        for move in record.get("nodes_moved", []):  # the record lists at most 200; its count is exact
            if move.get("before"):
                placed[move["node"]] = move["before"]
            else:
                placed.pop(move["node"], None)
        before: dict[str, set[str]] = {}
        for node, unit in placed.items():
            before.setdefault(unit, set()).add(node)
        after = {unit: set(nodes) for unit, nodes in leaf_units(partition)}
        for unit in sorted(before.keys() | after.keys()):
            old, new = before.get(unit, set()), after.get(unit, set())
            if old == new:
                continue
            change = " ".join(f"{sign}{len(nodes)}" for sign, nodes in (("+", new - old), ("-", old - new)) if nodes)
            change = "new" if unit not in before else "removed" if unit not in after else change
            rows.append((name, unit, str(len(new)), change, compress(sorted(new)) if new else "-"))
    if not summaries:
        return "no partition changed"
    lines = ["; ".join(summaries) + ("" if rows else "; no leaf or block changed")]
    if rows:
        lines += [
            f"  {line}" for line in columns([("PARTITION", "LEAF/BLOCK", "NODES", "CHANGE", "HOSTLIST"), *rows[:limit]])
        ]
    if len(rows) > limit:
        lines.append(f"  and {len(rows) - limit} more changed leaves or blocks")
    return "\n".join(lines)
