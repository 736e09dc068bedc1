"""The simulation report: one self-contained HTML page an operator reads after ``make demo``.

Summary first (the scenario, the totals, one row per partition: kind, size, leaves or blocks, the largest
job one leaf or block fits, what moved), then where the story's jobs landed on slurmctld (the largest job one
leaf or block can start after each step, each job's leaves or blocks against the fewest it needs, leaves and
blocks grouped by free nodes), then a timeline per step, every ``UpdatePartitionTopology`` audit
record with what moved and why, the live ``scontrol show topology`` per partition, and per partition of the
final plan a Mermaid picture and its leaf or block table. It stays readable at 10,000 nodes: runs of
like timeline entries fold into one row, the picture shows switches and blocks with counts (collapsed
beyond ``MAX_BOXES``), and node lists open on demand. It opens without network access: Mermaid comes from
the npm package that ``make install`` brings and is inlined, and the page loads nothing else. Every text is
escaped: names and texts come from AWS.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any

from topokeeper.render.bundle import leaf_units
from topokeeper.render.narrate import largest_job, moves_text, nodes_text, triggers_text, unit_noun
from topokeeper.sim.placement_view import NO_SLURMCTLD
from topokeeper.sim.simulator import SimulationResult, StepResult
from topokeeper.wire import compress

# The IIFE build defines the global ``mermaid``; package.json pins the package, ``npm ci`` installs it.
MERMAID_JS = Path(__file__).resolve().parents[5] / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
REPORT_FILE = "report.html"
_SHORT_SHA = 12
_CALL_COLUMNS = 4
_NONE = "&ndash;"  # shown for an absent value
MAX_BOXES = 24  # boxes per partition picture before leaves or blocks are drawn as counts
_WIDE_FAN = 6  # children of one box beyond which a picture is drawn left to right
_RUN = 3  # consecutive timeline entries of one kind beyond this fold into one row
_LISTED = 200  # entries of a folded run listed on demand (result.json has them all)
_JOBS_SHOWN = 50  # rows of the placement section's job table (result.json has every job)

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1f2328; margin: 0 auto; padding: 1.5rem; max-width: 1400px; }
h1 { font-size: 1.5rem; margin: 0 0 .25rem; }
h2 { font-size: 1.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .25rem; margin-top: 2rem; }
h3 { font-size: 1rem; margin: 1.5rem 0 .25rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border: 1px solid #d0d7de; padding: .2rem .5rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
pre, .mono { font-family: ui-monospace, monospace; font-size: 12px; }
pre.live { background: #f6f8fa; border: 1px solid #d0d7de; padding: .5rem;
           white-space: pre-wrap; overflow-wrap: anywhere; }
pre.table { margin: .25rem 0 0; white-space: pre; overflow-x: auto; }
pre.mermaid { background: #fff; border: 1px solid #d0d7de; padding: .5rem; overflow-x: auto; }
.facts { display: flex; flex-wrap: wrap; gap: .25rem 1rem; margin: .25rem 0; padding: 0; list-style: none; }
.audit { font-size: 13px; }
.audit td, .audit th { white-space: nowrap; }
.wide { overflow-x: auto; }
.nowrap { white-space: nowrap; }
.calls td, .calls th { padding: .05rem .4rem; font-size: 12px; }
.yes { color: #1a7f37; font-weight: 600; }
.no { color: #cf222e; font-weight: 600; }
.na { color: #656d76; }
details > summary { cursor: pointer; color: #0969da; }
.hosts { font-family: ui-monospace, monospace; font-size: 12px; overflow-wrap: anywhere; max-width: 60rem; }
"""


def render_report(result: SimulationResult, mermaid_js: str) -> str:
    """The whole report as one HTML document; ``mermaid_js`` is the Mermaid bundle to inline."""
    cluster = result.scenario["cluster"]
    title = f"topokeeper simulation: {cluster['name']}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{escape(title)}</h1>",
        *_header(result),
        '<h2 id="partitions">Partitions of the final plan</h2>',
        _partitions(result),
        '<h2 id="placement">Placement: where jobs landed (slurmctld)</h2>',
        *_placement(result),
        '<h2 id="timeline">Timeline</h2>',
        *(line for index, step in enumerate(result.steps) for line in _step(index, step)),
        '<h2 id="audit">Audit records (UpdatePartitionTopology)</h2>',
        *_audit(result.steps),
        '<h2 id="live">Live topology after the last step (scontrol show topology)</h2>',
        *_live(result.steps[-1].live_topology),
        '<h2 id="plan">Final plan per partition</h2>',
        f'<p>plan sha256 <span class="mono">{_text(result.desired["sha256"])}</span></p>',
        *(_diagrams(result.desired) if "partitions" in result.desired else _flowcharts(result.mermaid)),
        f"<script>{_inlinable(mermaid_js)}</script>",
        f"<script>{_START}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


# Started by hand so the page can say when every diagram is drawn (and how tall it then is, for tests).
_START = (
    'mermaid.initialize({startOnLoad: false, securityLevel: "strict"}); '
    "mermaid.run().finally(() => { document.body.dataset.renderedHeight = "
    "String(document.documentElement.scrollHeight); });"
)


def write_report(result: SimulationResult, out_dir: Path, *, mermaid_path: Path = MERMAID_JS) -> Path:
    """Write ``out_dir/report.html`` and return its path."""
    if not mermaid_path.is_file():
        raise FileNotFoundError(
            f"the report's Mermaid bundle {mermaid_path} is missing: run `make install` "
            "(npm ci installs the mermaid package pinned in package.json)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT_FILE
    path.write_text(render_report(result, mermaid_path.read_text(encoding="utf-8")), encoding="utf-8")
    return path


def _inlinable(script: str) -> str:
    # "</script" inside the bundle would end the element early; "<\/" means the same in any JS context.
    return re.sub(r"</(script)", r"<\\/\1", script, flags=re.IGNORECASE)


def _text(value: Any) -> str:
    return _NONE if value is None or value == "" else escape(str(value))


def _seconds(value: float | None) -> str:
    return _NONE if value is None else f"{value:.2f} s"


def _converged(value: bool | None, seconds: float | None = None) -> str:
    if value is None:
        return '<span class="na">not measured (verify mode)</span>'
    if not value:
        return '<span class="no">no</span>'
    return '<span class="yes">yes</span>' + ("" if seconds is None else f" after {_seconds(seconds)}")


def _facts(facts: Iterable[tuple[str, str]]) -> str:
    """Label -> already escaped HTML value, as one wrapped line of facts."""
    items = "".join(f"<li>{escape(label)}: <b>{value}</b></li>" for label, value in facts)
    return f'<ul class="facts">{items}</ul>'


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, css: str = "", numeric: set[int]) -> str:
    """Escaped headers, cells already escaped HTML; columns in ``numeric`` are right-aligned."""
    head = "".join(f"<th>{escape(header)}</th>" for header in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="number">{cell}</td>' if i in numeric else f"<td>{cell}</td>" for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    attribute = f' class="{css}"' if css else ""
    return f"<table{attribute}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _header(result: SimulationResult) -> list[str]:
    cluster, totals = result.scenario["cluster"], result.totals
    scenario = [
        ("cluster", _text(cluster["name"])),
        ("Slurm", _text(cluster["slurm_version"])),
        ("mode", _text(cluster["mode"])),
        ("channel", _text(cluster["channel"])),
        ("head node", _text(result.head_node)),
    ]
    counts = [
        ("simulated time", _seconds(totals["simulated_seconds"])),
        ("events", _text(totals["events_sent"])),
        ("reconciles", _text(totals["reconciles"])),
        ("head-node writes", _text(totals["head_node_writes"])),
        ("reconfigures", _text(totals["reconfigures"])),
        ("apply failures", _text(totals["apply_failures"])),
        ("audit records", _text(totals["audit_records"])),
        ("AWS calls", _text(sum(totals["aws_calls"].values()))),
        ("converged", _converged(totals["converged"])),
    ]
    return [_facts(scenario), _facts(counts)]


def _step(index: int, step: StepResult) -> list[str]:
    facts = [
        ("time", f"{_seconds(step.started_at)} → {_seconds(step.ended_at)}"),
        ("events sent", _text(step.events_sent)),
        ("lost", _text(step.events_lost)),
        ("duplicated", _text(step.events_duplicated)),
        ("reconciles", _text(step.reconciles)),
        ("writes", _text(step.head_node_writes)),
        ("reconfigures", _text(step.reconfigures)),
        ("apply failures", _text(step.apply_failures)),
        ("converged", _converged(step.converged, step.convergence_seconds)),
        ("drift", _text(step.drift)),
        ("alarm", _text(step.alarm)),
        ("AWS calls", _text(sum(step.aws_calls.values()))),
    ]
    timeline = _table(["t", "kind", "what happened"], _timeline_rows(step.timeline), numeric={0})
    return [
        f'<section id="step-{index}">',
        f"<h3>{index}. {escape(step.step)}</h3>",
        _facts(facts),
        timeline,
        _calls(step.aws_calls),
        "</section>",
    ]


def _timeline_rows(timeline: list[dict[str, Any]]) -> Iterable[list[str]]:
    """One row per entry; a run of more than ``_RUN`` entries of one kind is one row: the first entry, and the
    rest on demand."""
    runs: list[list[dict[str, Any]]] = []
    for entry in timeline:
        if runs and runs[-1][0]["kind"] == entry["kind"]:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    for run in runs:
        if len(run) <= _RUN:
            yield from ([_seconds(e["t"]), _text(e["kind"]), _entry(e["text"])] for e in run)
            continue
        first, last = run[0], run[-1]
        listed = "".join(f"<li>{_seconds(e['t'])} {_entry(e['text'])}</li>" for e in run[1:_LISTED])
        more = f"<li>and {len(run) - _LISTED} more (result.json has every one)</li>" if len(run) > _LISTED else ""
        yield [
            f"{_seconds(first['t'])} → {_seconds(last['t'])}",
            f"{_text(first['kind'])} x{len(run)}",
            f"{_entry(first['text'])}<details><summary>the other {len(run) - 1}</summary><ul>{listed}{more}</ul>"
            "</details>",
        ]


def _entry(text: str) -> str:
    """A timeline entry's text; the lines after its first (a leaf and block table) as preformatted text."""
    first, _, table = text.partition("\n")
    return _text(first) + (f'<pre class="table">{escape(table)}</pre>' if table else "")


def _calls(calls: Mapping[str, int]) -> str:
    """AWS calls by operation in a few side-by-side column pairs, read top to bottom, to keep it short."""
    if not calls:
        return '<p class="na">No AWS calls.</p>'
    cells = [[_text(operation), _text(count)] for operation, count in sorted(calls.items())]
    height = -(-len(cells) // _CALL_COLUMNS)  # ceiling division
    columns = [cells[start : start + height] for start in range(0, len(cells), height)]
    blank = ["", ""]  # pads the last column pair, so every row has every cell
    rows = [
        [cell for column in columns for cell in (column[row] if row < len(column) else blank)] for row in range(height)
    ]
    return _table(
        ["AWS operation", "calls"] * len(columns),
        rows,
        css="calls",
        numeric={pair * 2 + 1 for pair in range(len(columns))},
    )


def _audit(steps: list[StepResult]) -> list[str]:
    headers = ["step", "completed_at", "partition", "reason", "kind", "outcome", "nodes", "+added", "-removed"]
    headers += ["moved", "what moved", "why", "before → after sha256", "channel", "delivery reference"]
    rows = [_audit_row(index, step.step, record) for index, step in enumerate(steps) for record in step.audit_records]
    if not rows:
        return ["<p>No audit records.</p>"]
    return [f'<div class="wide">{_table(headers, rows, css="audit", numeric={6, 7, 8, 9})}</div>']


def _audit_row(index: int, step: str, record: Mapping[str, Any]) -> list[str]:
    outcome = _text(record["outcome"])
    if record["error"]:
        outcome += f"<br><small>{_text(record['error'])}</small>"
    shas = f"{_short(record['before_sha256'])} → {_short(record['after_sha256'])}"
    return [
        f'<a href="#step-{index}">{index}. {escape(step)}</a>',
        _text(record["completed_at"]),
        _text(record["partition"]),
        _text(record["reason"]),
        _text(record["kind"]),
        outcome,
        _text(record["node_count"]),
        _text(record["nodes_added_count"]),
        _text(record["nodes_removed_count"]),
        _text(record.get("nodes_moved_count", 0)),
        _what_moved(record),
        _why(record),
        f'<span class="mono">{shas}</span>',
        _text(record["channel"]),
        f'<span class="mono">{_text(record["delivery_reference"])}</span>',
    ]


def _what_moved(record: Mapping[str, Any]) -> str:
    """Added, removed and moved nodes: a short line, every listed name on demand."""
    parts = []
    for sign, key in (("+", "nodes_added"), ("-", "nodes_removed")):
        count = record[f"{key}_count"]
        if count:
            parts.append(_on_demand(f"{sign}{count} {nodes_text(record[key], 3, count)}", compress(record[key]), count))
    moved, count = record.get("nodes_moved", []), record.get("nodes_moved_count", 0)
    if count:
        parts.append(_on_demand(f"moved {count}: {moves_text(moved, count, 1)}", moves_text(moved, count, len(moved))))
    for fold in record.get("folds", []):
        parts.append(f"<small>folded: {_text(fold)}</small>")
    return "<br>".join(parts) or '<span class="na">no node added, removed or moved</span>'


def _on_demand(summary: str, full: str, count: int | None = None) -> str:
    if summary == full:
        return _text(summary)
    listed = "" if count is None else f" ({count} in all; the record lists at most 200)"
    return f'<details><summary>{_text(summary)}</summary><div class="hosts">{_text(full)}{listed}</div></details>'


def _why(record: Mapping[str, Any]) -> str:
    if record["reason"] == "drift-repair":
        return "repairs live drift"
    return _text(triggers_text(record["triggers"], record["trigger_count"]))


def _short(sha256: str | None) -> str:
    return _text(sha256[:_SHORT_SHA] if sha256 else None)


def _live(topology: Mapping[str, str]) -> list[str]:
    lines = []
    for partition, text in sorted(topology.items()):
        count = len(text.splitlines())
        lines.append(
            f"<details><summary>{escape(partition)}: {count} line{'' if count == 1 else 's'}</summary>"
            f'<pre class="live">{escape(text) if text else "(no topology entries)"}</pre></details>'
        )
    return lines


# ----------------------------------------------------------------------------- placement (sim/placement_view)


def _placement(result: SimulationResult) -> list[str]:
    """The largest job per partition after each step, every job the story submitted (where it landed, or why it
    waits) and, after the last step, each partition's leaves or blocks grouped by free nodes: a row per free
    count, not per leaf, so 10,000 nodes stay a short table."""
    seen = [(index, step) for index, step in enumerate(result.steps) if step.placement]
    if not seen:
        submits = any("submit" in step for step in result.scenario.get("steps", []))
        if submits and "no slurmctld" in result.head_node:
            return [f"<p>{_text(NO_SLURMCTLD)}; the real head node (<code>make demo</code> as root) shows them.</p>"]
        return ["<p>No jobs in this story.</p>"]
    last = seen[-1][1].placement or {}
    partitions = [item["partition"] for item in last["partitions"] if item["kind"]]
    by_step = [
        [f'<a href="#step-{index}">{index}. {escape(step.step)}</a>']
        + [_largest(step.placement or {}, partition) for partition in partitions]
        for index, step in seen
    ]
    lines = ["<h3>Largest job one leaf or block can start now, after each step</h3>"]
    lines.append(_table(["step", *partitions], by_step, numeric=set(range(1, len(partitions) + 1))))
    lines += _jobs(seen)
    for item in last["partitions"]:
        lines += _free_units(item)
    return lines


def _largest(placement: Mapping[str, Any], partition: str) -> str:
    item = next((item for item in placement["partitions"] if item["partition"] == partition), None)
    if item is None:
        return _NONE
    largest, cold = item["largest_placeable"], item["largest_placeable_without_resume"]
    return _text(largest) + (f" <small>({_text(cold)} without resuming)</small>" if cold != largest else "")


def _jobs(seen: list[tuple[int, StepResult]]) -> list[str]:
    """Each job as the last step that saw it left it (a job that ended keeps its last row)."""
    latest: dict[str, tuple[int, str, Mapping[str, Any]]] = {}
    for index, step in seen:
        for job in (step.placement or {})["jobs"]:
            latest[job["job"]] = (index, step.step, job)
    rows = []
    for index, step_name, job in list(latest.values())[:_JOBS_SHOWN]:
        asked = " ".join(f"--{key}={job[key]}" for key in ("switches", "segment") if job[key])
        if job["state"] == "PENDING":
            where = f"pending: {_text(job['reason'])}" + ("; <b>on topology</b>" if job["on_topology"] else "")
            spans = _NONE
        else:
            units = ", ".join(_text(f"{place['unit'] or '-'} ({place['nodes']})") for place in job["placed"])
            more = job["placed_count"] - len(job["placed"])
            where = units + (f" and {more} more" if more > 0 else "")
            beyond = ' <span class="no">beyond need</span>' if job["beyond_need"] else ""
            spans = f"{_text(job['spans'])} of the fewest {_text(job['fewest'])}{beyond}"
        rows.append(
            [
                _text(job["job"]),
                _text(job["name"]),
                _text(job["partition"]),
                _text(job["nodes"]),
                f'<span class="mono nowrap">{_text(asked or None)}</span>',
                f'{_text(job["state"].lower())} <small>after <a href="#step-{index}">{escape(step_name)}</a></small>',
                spans,
                where,
            ]
        )
    headers = ["job", "name", "partition", "nodes", "asked", "state", "leaves / blocks spanned", "where"]
    shown = "" if len(latest) <= _JOBS_SHOWN else f"<p>{len(latest)} jobs; the first {_JOBS_SHOWN} shown.</p>"
    return ["<h3>Jobs</h3>", _table(headers, rows, numeric={3}) + shown]


def _free_units(item: Mapping[str, Any]) -> list[str]:
    name, kind = _text(item["partition"]), item["kind"]
    if not kind:
        return [f"<h3>{name}: no leaf or block</h3>", f"<p>{_text(item['outside_topology'])} nodes, no topology.</p>"]
    noun = "blocks" if kind == "block" else "leaves"
    facts = [
        ("largest job now", _text(item["largest_placeable"])),
        ("without resuming powered-down nodes", _text(item["largest_placeable_without_resume"])),
        ("free nodes", _text(item["free"])),
        (f"free in {noun} too small for the typical job", _text(item["stranded_free"])),
        ("fragmentation", _text(item["fragmentation"])),
        ("jobs spread beyond need", _text(item["jobs_spread_beyond_need"])),
        ("pending on topology", _text(item["pending_on_topology"])),
    ]
    rows = []
    for group in item["by_free"]:
        listed = ", ".join(group["names"])
        more = group["units"] - len(group["names"])
        names = listed + (f" and {more} more (result.json lists {len(group['names'])})" if more > 0 else "")
        rows.append(
            [
                _text(group["free"]),
                _text(group["units"]),
                _text(group["nodes"]),
                _on_demand(f"{group['units']} {noun}", names) if group["units"] > 1 else _text(names),
            ]
        )
    table = _table(["free nodes", noun, "nodes in them", noun], rows, numeric={0, 1, 2})
    return [f"<h3>{name}: {noun} by free nodes ({kind})</h3>", _facts(facts), table]


# ----------------------------------------------------------------------------- partitions of the final plan


def _partitions(result: SimulationResult) -> str:
    if "partitions" not in result.desired:  # EKS: Kueue Topologies, drawn as the layer map below
        return f"<p>{_NONE}</p>"
    moved: dict[str, int] = {}
    records: dict[str, int] = {}
    for step in result.steps:
        for record in step.audit_records:
            records[record["partition"]] = records.get(record["partition"], 0) + 1
            moved[record["partition"]] = moved.get(record["partition"], 0) + record.get("nodes_moved_count", 0)
    rows = []
    for partition in sorted(result.desired["partitions"], key=lambda p: p["name"]):
        leaves = leaf_units(partition)
        rows.append(
            [
                f'<a href="#plan-{escape(partition["name"])}">{escape(partition["name"])}</a>',
                _text(partition["kind"]),
                _text(partition["node_count"]),
                _text(f"{len(leaves)} {unit_noun(partition, len(leaves))}" if leaves else None),
                _text(largest_job(partition) or None),
                _text(records.get(partition["name"], 0)),
                _text(moved.get(partition["name"], 0)),
                "<br>".join(_text(w) for w in partition.get("warnings", [])) or _NONE,
            ]
        )
    headers = ["partition", "kind", "nodes", "leaves / blocks", "largest job in one leaf / block", "audit records"]
    headers += ["nodes moved", "warnings"]
    warnings = "".join(f"<li>{_text(w)}</li>" for w in result.desired.get("warnings", []))
    # Below the table, what concerns no one partition (each row's own warnings are in its row).
    listed = f"<p>warnings about the whole cluster:</p><ul>{warnings}</ul>" if warnings else ""
    return _table(headers, rows, numeric={2, 4, 5, 6}) + listed


def _flowcharts(mermaid: Mapping[str, str]) -> list[str]:
    """Flowcharts already drawn (the EKS layer map), one per name."""
    lines = []
    for name, flowchart in sorted(mermaid.items()):
        lines.append(f"<h3>{escape(name)}</h3>")
        # Mermaid reads the container's text with entities decoded, so escaped labels render as written.
        lines.append(f'<pre class="mermaid">{escape(flowchart)}</pre>')
    return lines


def _diagrams(desired: Mapping[str, Any]) -> list[str]:
    lines = []
    for partition in sorted(desired["partitions"], key=lambda p: p["name"]):
        name = escape(partition["name"])
        lines.append(f'<h3 id="plan-{name}">{name}</h3>')
        # Mermaid reads the container's text with entities decoded, so escaped labels render as written.
        lines.append(f'<pre class="mermaid">{escape(partition_flowchart(partition))}</pre>')
        leaves = leaf_units(partition)
        if leaves:
            rows = [
                [_text(unit), _text(len(nodes)), f'<span class="hosts">{_text(compress(nodes))}</span>']
                for unit, nodes in leaves
            ]
            table = _table([unit_noun(partition), "nodes", "hostlist"], rows, numeric={1})
            lines.append(
                f"<details><summary>{len(leaves)} {unit_noun(partition, len(leaves))} and their nodes</summary>"
                f"{table}</details>"
            )
        else:
            lines.append(_on_demand(f"{partition['node_count']} nodes", compress(partition["nodes"])))
    return lines


def _label(text: str) -> str:
    """A Mermaid label: its own quotes as entities (the whole chart is HTML-escaped after)."""
    return text.replace('"', "#quot;")


def partition_flowchart(partition: Mapping[str, Any]) -> str:
    """A plan document partition as a Mermaid flowchart of switches and blocks with their node counts. Beyond
    ``MAX_BOXES`` boxes, the lowest switch levels (or the blocks) are drawn as counts per parent."""
    title = f"{partition['name']} · {partition['kind']} · {partition['node_count']} nodes"
    if partition.get("blocks"):
        boxes = _block_boxes(partition)
    elif partition.get("switches"):
        boxes = _switch_boxes(partition["switches"])
    else:
        boxes = [f'    flat["flat (cluster default) · {partition["node_count"]} nodes"]']
    fans = Counter(line.split()[0] for line in boxes if " --> " in line or " -.- " in line)
    # Siblings sit side by side: a wide fan drawn top-down is a strip, drawn left to right a column.
    direction = "LR" if max(fans.values(), default=0) > _WIDE_FAN else "TB"
    return (
        "\n".join(
            [
                f"flowchart {direction}",
                f'  subgraph p["{_label(title)}"]',
                f"    direction {direction}",
                *boxes,
                "  end",
            ]
        )
        + "\n"
    )


def _block_boxes(partition: Mapping[str, Any]) -> list[str]:
    sizes = ",".join(str(size) for size in partition.get("block_sizes", []))
    lines = [f'    sizes[/"block_sizes {_label(sizes)}"/]']
    blocks = partition["blocks"]
    if len(blocks) <= MAX_BOXES:
        for number, block in enumerate(blocks):
            lines.append(f'    b{number}[["{_label(block["name"])} · {len(block["nodes"])} nodes"]]')
            lines.append(f"    sizes -.- b{number}")
        return lines
    by_size: dict[int, int] = {}
    for block in blocks:
        by_size[len(block["nodes"])] = by_size.get(len(block["nodes"]), 0) + 1
    for number, (size, count) in enumerate(sorted(by_size.items(), reverse=True)):
        lines.append(f'    g{number}[["{count} blocks of {size} node{"s" if size != 1 else ""}"]]')
        lines.append(f"    sizes -.- g{number}")
    return lines


def _switch_boxes(switches: list[dict[str, Any]]) -> list[str]:
    by_name = {s["name"]: s for s in switches}
    children = {child for s in switches for child in s.get("switches", [])}
    levels = [[s["name"] for s in switches if s["name"] not in children]]
    while True:
        below = [child for name in levels[-1] for child in by_name[name].get("switches", []) if child in by_name]
        if not below:
            break
        levels.append(below)
    depth, shown = 0, len(levels[0])  # the deepest level whose boxes, with those above, fit MAX_BOXES
    while depth + 1 < len(levels) and shown + len(levels[depth + 1]) <= MAX_BOXES:
        depth += 1
        shown += len(levels[depth])
    ids = {name: f"s{number}" for number, name in enumerate(name for level in levels[: depth + 1] for name in level)}
    lines = []
    for name, box in ids.items():
        nodes = by_name[name].get("nodes", [])
        label = f"{name} · {len(nodes)} nodes" if nodes and not by_name[name].get("switches") else name
        lines.append(
            f'    {box}["{_label(label)}"]' if by_name[name].get("switches") else f'    {box}(["{_label(label)}"])'
        )
    for name, box in ids.items():
        for child in by_name[name].get("switches", []):
            if child in ids:
                lines.append(f"    {box} --> {ids[child]}")
    if depth + 1 < len(levels):  # the levels below as counts per switch of the last level shown
        for number, name in enumerate(levels[depth]):
            leaves, nodes = _below(name, by_name)
            lines.append(f'    c{number}(["{leaves} leaves · {nodes} nodes"])')
            lines.append(f"    {ids[name]} --> c{number}")
    return lines


def _below(name: str, by_name: Mapping[str, Mapping[str, Any]]) -> tuple[int, int]:
    """(leaf switches, nodes) under a switch."""
    stack, leaves, nodes = [name], 0, 0
    while stack:
        switch = by_name[stack.pop()]
        children = [child for child in switch.get("switches", []) if child in by_name]
        if not children:
            leaves, nodes = leaves + 1, nodes + len(switch.get("nodes", []))
        stack += children
    return leaves, nodes
