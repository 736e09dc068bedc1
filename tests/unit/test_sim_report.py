"""The simulation report (topokeeper.sim.report) on a real simulator result: content, escaping, no network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.html_tree import Element, parse
from topokeeper.sim.report import render_report, write_report
from topokeeper.sim.simulator import SimulationResult

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sim-result-demo.json"
BUNDLE = "/* the Mermaid bundle */"
NONE = "\N{EN DASH}"  # an absent value
HOSTILE = '</pre><script>alert("x")</script><img src=x onerror=alert(1)> & "quoted"'


def _result() -> SimulationResult:
    return SimulationResult.model_validate_json(FIXTURE.read_text())


def _page(result: SimulationResult) -> Element:
    return parse(render_report(result, BUNDLE))


def _cells(row: Element) -> list[str]:
    return [cell.text for cell in row.find_all("td")]


def test_header_names_the_scenario_and_its_totals() -> None:
    facts = [item.text for item in _page(_result()).find_all("li")]
    for fact in ["cluster: demo", "Slurm: 26.05", "mode: enforce", "channel: ssm", "simulated time: 797.38 s"]:
        assert fact in facts
    assert "head node: slurmctld 26.05.5 in a Debian chroot" in facts
    totals = _result().totals
    for label, key in [
        ("events", "events_sent"),
        ("reconciles", "reconciles"),
        ("head-node writes", "head_node_writes"),
        ("reconfigures", "reconfigures"),
        ("apply failures", "apply_failures"),
        ("audit records", "audit_records"),
    ]:
        assert f"{label}: {totals[key]}" in facts
    assert {f"AWS calls: {sum(totals['aws_calls'].values())}", "converged: yes"} <= set(facts)


def test_every_step_has_a_section_with_its_facts_timeline_and_calls() -> None:
    result = _result()
    page = _page(result)
    assert len(page.find_all("section")) == len(result.steps) == 6
    for index, step in enumerate(result.steps):
        section = page.by_id(f"step-{index}")
        assert section.find_all("h3")[0].text == f"{index}. {step.step}"
        facts = {item.text for item in section.find_all("li")}
        assert f"time: {step.started_at:.2f} s → {step.ended_at:.2f} s" in facts
        assert {f"events sent: {step.events_sent}", f"reconciles: {step.reconciles}", f"alarm: {step.alarm}"} <= facts
        timeline, calls = section.find_all("table")
        assert [_cells(row) for row in timeline.find_all("tr")[1:]] == [
            [f"{entry['t']:.2f} s", entry["kind"], entry["text"]] for entry in step.timeline
        ]
        pairs = [cells[i : i + 2] for cells in map(_cells, calls.find_all("tr")[1:]) for i in range(0, len(cells), 2)]
        assert sorted(tuple(pair) for pair in pairs if pair != ["", ""]) == sorted(
            (operation, str(count)) for operation, count in step.aws_calls.items()
        )
    tamper, wait = page.by_id("step-4"), page.by_id("step-5")
    assert "converged: no" in {item.text for item in tamper.find_all("li")}
    last = result.steps[5]
    assert {f"converged: yes after {last.convergence_seconds:.2f} s", f"drift: {last.drift}"} <= {
        item.text for item in wait.find_all("li")
    }


def test_audit_table_has_every_record_of_every_step() -> None:
    result = _result()
    records = [(index, step.step, r) for index, step in enumerate(result.steps) for r in step.audit_records]
    (table,) = _page(result).find_all("table", "audit")
    rows = [_cells(row) for row in table.find_all("tr")[1:]]
    assert len(rows) == len(records) == result.totals["audit_records"] > 0
    for row, (index, step, record) in zip(rows, records, strict=True):
        before = record["before_sha256"][:12] if record["before_sha256"] else NONE
        assert row == [
            f"{index}. {step}",
            record["completed_at"],
            record["partition"],
            record["reason"],
            record["kind"],
            record["outcome"],
            str(record["node_count"]),
            str(record["nodes_added_count"]),
            str(record["nodes_removed_count"]),
            f"{before} → {record['after_sha256'][:12]}",
            record["channel"],
            record["delivery_reference"],
        ]


def test_audit_table_tells_plan_changes_from_drift_repairs_and_shows_errors() -> None:
    result = _result()
    result.steps[-1].audit_records[0].update(outcome="failed", error="scontrol reconfigure exited 1")
    (table,) = _page(result).find_all("table", "audit")
    rows = [_cells(row) for row in table.find_all("tr")[1:]]
    repairs = len(result.steps[-1].audit_records)  # the wait step repairs the tamper
    assert repairs >= 1
    assert [row[3] for row in rows] == ["plan-change"] * (len(rows) - repairs) + ["drift-repair"] * repairs
    assert rows[-repairs][5] == "failedscontrol reconfigure exited 1"


def test_live_topology_of_the_last_step_is_preformatted_per_partition() -> None:
    result = _result()
    live = result.steps[-1].live_topology
    blocks = _page(result).find_all("pre", "live")
    assert [block.text for block in blocks] == [live[p] or "(no topology entries)" for p in sorted(live)]
    assert blocks[0].text.startswith("SwitchName=root Level=3")


def test_every_partition_of_the_final_plan_has_its_own_mermaid_container() -> None:
    result = _result()
    containers = _page(result).find_all("pre", "mermaid")
    assert [c.text for c in containers] == [result.mermaid[p] for p in sorted(result.mermaid)]
    assert len(containers) == 3


def test_hostile_texts_from_aws_stay_text() -> None:
    result = _result()
    result.steps[1].timeline.append({"t": 1.0, "kind": "event", "text": HOSTILE})
    result.steps[-1].live_topology[HOSTILE] = HOSTILE
    result.steps[-1].audit_records[0]["delivery_reference"] = HOSTILE
    result.mermaid[HOSTILE] = f'flowchart TB\n  a["{HOSTILE}"]\n'
    html = render_report(result, BUNDLE)
    assert "<script>alert" not in html
    assert "<img" not in html
    page = parse(html)
    assert len(page.find_all("script")) == 2  # the bundle and its initialize call
    assert not page.find_all("img")
    timeline = page.by_id("step-1").find_all("table")[0]
    assert HOSTILE in [_cells(row)[2] for row in timeline.find_all("tr")[1:]]
    assert HOSTILE in [block.text for block in page.find_all("pre", "live")]
    assert HOSTILE in [h3.text for h3 in page.find_all("h3")]
    assert f'a["{HOSTILE}"]' in [c.text.splitlines()[1].strip() for c in page.find_all("pre", "mermaid")]
    assert HOSTILE in [_cells(row)[-1] for row in page.find_all("table", "audit")[0].find_all("tr")[1:]]


def test_page_loads_nothing_from_the_network() -> None:
    html = render_report(_result(), BUNDLE)
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", html, re.IGNORECASE)
    page = parse(html)
    references = [value for e in page.iter() for name, value in e.attrs.items() if name in {"src", "href"}]
    assert references and all(value.startswith("#step-") for value in references)  # in-page links only
    assert not page.find_all("link") and "@import" not in html and "url(" not in html


def test_mermaid_is_inlined_and_started_strictly() -> None:
    page = _page(_result())
    bundle, start = page.find_all("script")
    assert not bundle.attrs and bundle.text == BUNDLE
    assert start.text == 'mermaid.initialize({startOnLoad: true, securityLevel: "strict"});'


def test_an_inlined_bundle_cannot_end_its_script_element() -> None:
    page = parse(render_report(_result(), 'const s = "</SCRIPT><b>x</b>";'))
    bundle, _ = page.find_all("script")
    assert bundle.text == 'const s = "<\\/SCRIPT><b>x</b>";'


def test_write_report_inlines_the_mermaid_bundle_it_is_given(tmp_path: Path) -> None:
    # The pinned bundle itself (node_modules, after `npm ci`) is inlined and run in tests/e2e.
    mermaid = tmp_path / "mermaid.min.js"
    mermaid.write_text("/* mermaid */ globalThis.mermaid = {initialize() {}};\n", encoding="utf-8")
    path = write_report(_result(), tmp_path / "out", mermaid_path=mermaid)
    assert path == tmp_path / "out" / "report.html"
    (script, _) = parse(path.read_text(encoding="utf-8")).find_all("script")
    assert script.text == mermaid.read_text(encoding="utf-8")


def test_write_report_says_what_to_run_when_mermaid_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.js is missing: run `make install`"):
        write_report(_result(), tmp_path / "out", mermaid_path=tmp_path / "missing.js")
    assert not (tmp_path / "out").exists()
