"""The simulation report: one self-contained HTML page an operator reads after ``make demo``.

It shows the scenario and totals, a timeline per step, every ``UpdatePartitionTopology`` audit record,
the live ``scontrol show topology`` per partition and a Mermaid picture of each partition of the final
plan. It opens without network access: Mermaid comes from the npm package that ``make install`` brings
and is inlined, and the page loads nothing else. Every text is escaped: names and texts come from AWS.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any

from topokeeper.sim.simulator import SimulationResult, StepResult

# The IIFE build defines the global ``mermaid``; package.json pins the package, ``npm ci`` installs it.
MERMAID_JS = Path(__file__).resolve().parents[5] / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
REPORT_FILE = "report.html"
_SHORT_SHA = 12
_CALL_COLUMNS = 4
_NONE = "&ndash;"  # shown for an absent value

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
pre.mermaid { background: #fff; border: 1px solid #d0d7de; padding: .5rem; overflow-x: auto; }
.facts { display: flex; flex-wrap: wrap; gap: .25rem 1rem; margin: .25rem 0; padding: 0; list-style: none; }
.audit { font-size: 13px; }
.audit td, .audit th { white-space: nowrap; }
.wide { overflow-x: auto; }
.calls td, .calls th { padding: .05rem .4rem; font-size: 12px; }
.yes { color: #1a7f37; font-weight: 600; }
.no { color: #cf222e; font-weight: 600; }
.na { color: #656d76; }
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
        '<h2 id="timeline">Timeline</h2>',
        *(line for index, step in enumerate(result.steps) for line in _step(index, step)),
        '<h2 id="audit">Audit records (UpdatePartitionTopology)</h2>',
        *_audit(result.steps),
        '<h2 id="live">Live topology after the last step (scontrol show topology)</h2>',
        *_live(result.steps[-1].live_topology),
        '<h2 id="plan">Final plan per partition</h2>',
        f'<p>plan sha256 <span class="mono">{_text(result.desired["sha256"])}</span></p>',
        *_diagrams(result.mermaid),
        f"<script>{_inlinable(mermaid_js)}</script>",
        '<script>mermaid.initialize({startOnLoad: true, securityLevel: "strict"});</script>',
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


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
    timeline = _table(
        ["t", "kind", "what happened"],
        ([_seconds(entry["t"]), _text(entry["kind"]), _text(entry["text"])] for entry in step.timeline),
        numeric={0},
    )
    return [
        f'<section id="step-{index}">',
        f"<h3>{index}. {escape(step.step)}</h3>",
        _facts(facts),
        timeline,
        _calls(step.aws_calls),
        "</section>",
    ]


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
    headers += ["before → after sha256", "channel", "delivery reference"]
    rows = [_audit_row(index, step.step, record) for index, step in enumerate(steps) for record in step.audit_records]
    if not rows:
        return ["<p>No audit records.</p>"]
    return [f'<div class="wide">{_table(headers, rows, css="audit", numeric={6, 7, 8})}</div>']


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
        f'<span class="mono">{shas}</span>',
        _text(record["channel"]),
        f'<span class="mono">{_text(record["delivery_reference"])}</span>',
    ]


def _short(sha256: str | None) -> str:
    return _text(sha256[:_SHORT_SHA] if sha256 else None)


def _live(topology: Mapping[str, str]) -> list[str]:
    lines = []
    for partition, text in sorted(topology.items()):
        lines.append(f"<h3>{escape(partition)}</h3>")
        lines.append(f'<pre class="live">{escape(text) if text else "(no topology entries)"}</pre>')
    return lines


def _diagrams(mermaid: Mapping[str, str]) -> list[str]:
    lines = []
    for partition, flowchart in sorted(mermaid.items()):
        lines.append(f"<h3>{escape(partition)}</h3>")
        # Mermaid reads the container's text with entities decoded, so escaped labels render as written.
        lines.append(f'<pre class="mermaid">{escape(flowchart)}</pre>')
    return lines
