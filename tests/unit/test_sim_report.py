"""The simulation report (topokeeper.sim.report) on a real simulator result: content, escaping, no network."""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

import pytest

from tests.helpers import powered_down_pcluster
from tests.html_tree import Element, parse
from tests.readme_examples import blocks, matches_shown
from tests.report_at_scale import HOSTILE_JOB_NAME, synthetic_result
from topokeeper.cli.planning import plan_from_files
from topokeeper.sim.report import MAX_BOXES, partition_flowchart, render_report, write_report
from topokeeper.sim.simulator import SimulationResult

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sim-result-demo.json"
BUNDLE = "/* the Mermaid bundle */"
NONE = "\N{EN DASH}"  # an absent value
HOSTILE = '</pre><script>alert("x")</script><img src=x onerror=alert(1)> & "quoted"'


def _result() -> SimulationResult:
    return SimulationResult.model_validate_json(FIXTURE.read_text())


def _page(result: SimulationResult) -> Element:
    return parse(render_report(result, BUNDLE))


def _shown(text: str) -> str:
    """A timeline entry's text as its cell reads: a table after the first line is a <pre> of its own."""
    return text.replace("\n", "", 1)


def _cells(row: Element) -> list[str]:
    return [cell.text for cell in row.find_all("td")]


def test_header_names_the_scenario_and_its_totals() -> None:
    facts = [item.text for item in _page(_result()).find_all("li")]
    totals = _result().totals
    for fact in ["cluster: demo", "Slurm: 26.05", "mode: enforce", "channel: ssm"]:
        assert fact in facts
    assert f"simulated time: {totals['simulated_seconds']:.2f} s" in facts
    assert "head node: slurmctld 26.05.5 in a Debian chroot" in facts
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
    assert len(page.find_all("section")) == len(result.steps) == 7
    for index, step in enumerate(result.steps):
        section = page.by_id(f"step-{index}")
        assert section.find_all("h3")[0].text == f"{index}. {step.step}"
        facts = {item.text for item in section.find_all("li")}
        assert f"time: {step.started_at:.2f} s → {step.ended_at:.2f} s" in facts
        assert {f"events sent: {step.events_sent}", f"reconciles: {step.reconciles}", f"alarm: {step.alarm}"} <= facts
        timeline, calls = section.find_all("table")
        rows = iter(_cells(row) for row in timeline.find_all("tr")[1:])
        for run in _runs(step.timeline):
            if len(run) <= 3:
                for entry in run:
                    assert next(rows) == [f"{entry['t']:.2f} s", entry["kind"], _shown(entry["text"])]
            else:  # a run of like entries is one row: the first, the others on demand
                row = next(rows)
                assert row[:2] == [f"{run[0]['t']:.2f} s → {run[-1]['t']:.2f} s", f"{run[0]['kind']} x{len(run)}"]
                assert row[2].startswith(_shown(run[0]["text"]) + f"the other {len(run) - 1}")
                assert all(_shown(entry["text"]) in row[2] for entry in run)
        assert next(rows, None) is None
        pairs = [cells[i : i + 2] for cells in map(_cells, calls.find_all("tr")[1:]) for i in range(0, len(cells), 2)]
        assert sorted(tuple(pair) for pair in pairs if pair != ["", ""]) == sorted(
            (operation, str(count)) for operation, count in step.aws_calls.items()
        )
    tamper, wait = page.by_id("step-5"), page.by_id("step-6")
    assert "converged: no" in {item.text for item in tamper.find_all("li")}
    last = result.steps[6]
    assert {f"converged: yes after {last.convergence_seconds:.2f} s", f"drift: {last.drift}"} <= {
        item.text for item in wait.find_all("li")
    }


def _runs(timeline: list[dict]) -> list[list[dict]]:
    runs: list[list[dict]] = []
    for entry in timeline:
        if runs and runs[-1][0]["kind"] == entry["kind"]:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def test_a_run_of_like_entries_folds_into_one_row() -> None:
    result = _result()
    page = _page(result)
    folded = 0
    for index, step in enumerate(result.steps):
        runs = _runs(step.timeline)
        rows = page.by_id(f"step-{index}").find_all("table")[0].find_all("tr")[1:]
        # A run of more than three entries of one kind is one row (sim/report.py); a shorter run keeps its rows.
        assert len(rows) == len(step.timeline) - sum(len(run) - 1 for run in runs if len(run) > 3)
        folded += sum(1 for run in runs if len(run) > 3)
    assert folded  # the demo has such runs (its submit step's job lines)


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
            str(record.get("nodes_moved_count", 0)),
            row[10],
            row[11],
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


def test_audit_table_names_the_nodes_and_the_triggers() -> None:
    result = _result()
    create, replace = result.steps[0].audit_records[0], result.steps[3].audit_records[0]
    replace.update(
        nodes_moved=[{"node": "ip-10-1-10-141", "before": "us-a", "after": "us-b"}],
        nodes_moved_count=1,
        folds=["Slurm 24.11 has one cluster-wide topology: block partition ml-p6e is folded into the cluster tree"],
    )
    rows = [_cells(row) for row in _page(result).find_all("table", "audit")[0].find_all("tr")[1:]]
    first = rows[0]
    assert first[10].startswith(f"+{create['nodes_added_count']} ") and create["nodes_added"][-1] in first[10]
    assert first[11].startswith(f"{create['trigger_count']} event(s): ")
    assert "SageMaker HyperPod Cluster State Change" in first[11]
    moved = next(row for row in rows if row[2] == "ml-p6e" and row[0].startswith("3."))
    assert moved[9] == "1" and "moved 1: ip-10-1-10-141 us-a -> us-b" in moved[10]
    assert "folded: Slurm 24.11 has one cluster-wide topology" in moved[10]
    assert all(row[11] == "repairs live drift" for row in rows if row[3] == "drift-repair")


def test_the_summary_has_one_row_per_partition_with_its_largest_leaf_or_block() -> None:
    result = _result()
    table = _page(result).find_all("table")[0]
    rows = {cells[0]: cells for cells in map(_cells, table.find_all("tr")[1:])}
    assert sorted(rows) == sorted(p["name"] for p in result.desired["partitions"])
    for partition in result.desired["partitions"]:
        units = partition.get("blocks") or [s for s in partition.get("switches", []) if not s["switches"]]
        row = rows[partition["name"]]
        assert row[1:3] == [partition["kind"], str(partition["node_count"])]
        assert row[4] == (str(max(len(u["nodes"]) for u in units)) if units else NONE)


def test_a_partitions_row_counts_no_placeholder_leaf_and_shows_its_own_warnings(tmp_path: Path) -> None:
    """Powered-down nodes under no-topology are no job's leaf; the warning about them is in their row."""
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(powered_down_pcluster()))
    desired = plan_from_files(snapshot, None, None).plan_document()
    page = _page(_result().model_copy(update={"desired": desired}))
    table = page.find_all("table")[0]
    rows = {cells[0]: cells for cells in map(_cells, table.find_all("tr")[1:])}
    assert rows["q1"][2:5] == ["16", "3 leaves", "4"]  # no-topology is a leaf Slurm reads, not one a job fits in
    assert (
        rows["q1"][7] == "10 Slurm node(s) with no instance (powered down?) planned without topology: q1-dy-p5-[3-12]"
    )
    assert rows["cpu"][7] == NONE
    # The one warning about no partition is listed under the table as the whole cluster's.
    assert "warnings about the whole cluster:" in [p.text for p in page.find_all("p")]
    assert "instance i-05c1a000000000007 (10.0.1.30) is no Slurm node's NodeAddr; left out" in [
        item.text for item in page.find_all("li")
    ]


def test_live_topology_of_the_last_step_is_preformatted_per_partition() -> None:
    result = _result()
    live = result.steps[-1].live_topology
    blocks = _page(result).find_all("pre", "live")
    assert [block.text for block in blocks] == [live[p] or "(no topology entries)" for p in sorted(live)]
    assert blocks[0].text.startswith("SwitchName=root Level=3")


def test_every_partition_of_the_final_plan_has_its_own_mermaid_container() -> None:
    result = _result()
    containers = _page(result).find_all("pre", "mermaid")
    partitions = sorted(result.desired["partitions"], key=lambda p: p["name"])
    assert [c.text for c in containers] == [partition_flowchart(p) for p in partitions]
    assert len(containers) == 3
    for container, partition in zip(containers, partitions, strict=True):
        for unit in partition.get("blocks") or [s for s in partition.get("switches", []) if not s["switches"]]:
            assert f"{unit['name']} · {len(unit['nodes'])} nodes" in container.text  # counts, not cut names


def test_a_big_partition_is_drawn_as_counts_beyond_max_boxes() -> None:
    switches = [{"name": "root", "switches": [f"agg{a}" for a in range(20)], "nodes": []}]
    switches += [{"name": f"agg{a}", "switches": [f"leaf{a}-{i}" for i in range(10)], "nodes": []} for a in range(20)]
    switches += [
        {"name": f"leaf{a}-{i}", "switches": [], "nodes": [f"n{a}-{i}-{k}" for k in range(4)]}
        for a in range(20)
        for i in range(10)
    ]
    chart = partition_flowchart({"name": "big", "kind": "tree", "node_count": 800, "switches": switches})
    assert chart.count("[") <= 2 * MAX_BOXES  # root and one count box per aggregation switch
    assert chart.count('"10 leaves · 40 nodes"') == 20 and "leaf0-0" not in chart
    blocks = [{"name": f"us-{b}", "nodes": [f"g{b}-{k}" for k in range(18 if b else 5)]} for b in range(100)]
    chart = partition_flowchart(
        {"name": "gb", "kind": "block", "node_count": 1787, "blocks": blocks, "block_sizes": [18]}
    )
    assert '"99 blocks of 18 nodes"' in chart and '"1 blocks of 5 nodes"' in chart


def test_hostile_texts_from_aws_stay_text() -> None:
    result = _result()
    result.steps[1].timeline.append({"t": 1.0, "kind": "event", "text": HOSTILE})
    result.steps[-1].live_topology[HOSTILE] = HOSTILE
    result.steps[-1].audit_records[0]["delivery_reference"] = HOSTILE
    result.desired["partitions"][0]["switches"][0]["name"] = HOSTILE
    html = render_report(result, BUNDLE)
    assert "<script>alert" not in html
    assert "<img" not in html
    page = parse(html)
    assert len(page.find_all("script")) == 2  # the bundle and its initialize call
    assert not page.find_all("img")
    timeline = page.by_id("step-1").find_all("table")[0]
    assert HOSTILE in [_cells(row)[2] for row in timeline.find_all("tr")[1:]]
    assert HOSTILE in [block.text for block in page.find_all("pre", "live")]
    assert f"{HOSTILE}: 1 line" in [summary.text for summary in page.find_all("summary")]
    label = HOSTILE.replace('"', "#quot;")
    assert f's0["{label}"]' in [c.text.splitlines()[3].strip() for c in page.find_all("pre", "mermaid")]
    assert HOSTILE in [_cells(row)[-1] for row in page.find_all("table", "audit")[0].find_all("tr")[1:]]


def test_page_loads_nothing_from_the_network() -> None:
    html = render_report(_result(), BUNDLE)
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", html, re.IGNORECASE)
    page = parse(html)
    references = [value for e in page.iter() for name, value in e.attrs.items() if name in {"src", "href"}]
    assert references and all(value.startswith(("#step-", "#plan-")) for value in references)  # in-page links only
    assert not page.find_all("link") and "@import" not in html and "url(" not in html


def test_mermaid_is_inlined_and_started_strictly() -> None:
    page = _page(_result())
    bundle, start = page.find_all("script")
    assert not bundle.attrs and bundle.text == BUNDLE
    assert start.text.startswith('mermaid.initialize({startOnLoad: false, securityLevel: "strict"}); mermaid.run()')


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


def test_the_timeline_tables_the_leaves_and_blocks_each_write_changed() -> None:
    result = _result()
    index, replace = next((i, s) for i, s in enumerate(result.steps) if s.step == "replace")
    (move,) = replace.audit_records[0]["nodes_moved"]
    (table,) = _page(result).by_id(f"step-{index}").find_all("pre", "table")
    lines = table.text.splitlines()
    assert lines[0].split() == ["PARTITION", "LEAF/BLOCK", "NODES", "CHANGE", "HOSTLIST"]
    assert ["ml-p6e", move["after"], "1", "new", move["node"]] in [line.split() for line in lines]
    assert any(line.split()[1:4] == [move["before"], "17", "-1"] for line in lines[1:])


# ----------------------------------------------------------------------------- placement (where jobs landed)


def _section(html: str) -> Element:
    start, end = html.index('<h2 id="placement">'), html.index('<h2 id="timeline">')
    return parse(f"<html><body>{html[start:end]}</body></html>")


def test_the_placement_section_shows_the_largest_job_per_step_and_where_each_job_landed() -> None:
    result = _result()  # demo.yaml on the real slurmctld: six jobs, the last one's name hostile
    section = _section(render_report(result, BUNDLE))
    largest, jobs, *units = section.find_all("table")
    header = [cell.text for cell in largest.find_all("th")]
    assert header == ["step", "ml-p5", "ml-p6e"]  # partitions with leaves or blocks
    by_step = {_cells(row)[0]: _cells(row)[1:] for row in largest.find_all("tr")[1:]}
    assert by_step["1. submit"][0].startswith("1") and by_step["2. scale"][0].startswith("4")  # before / after
    rows = [_cells(row) for row in jobs.find_all("tr")[1:]]
    submitted = result.steps[1].placement
    assert submitted is not None and len(rows) == len(submitted["jobs"]) == 6
    names = [row[1] for row in rows]
    assert names[-1] == "eval; $(reboot) <script>alert(1)</script>"  # as text: parsed back from escaped HTML
    assert not section.find_all("script")
    assert rows[4][6] == "2 of the fewest 2" or "beyond need" in rows[4][6]  # moe: 24 nodes, 18 per UltraServer
    # Each partition's leaves or blocks grouped by free nodes: the counts add up to every leaf or block.
    assert len(units) == 2
    final = result.steps[-1].placement
    assert final is not None
    for table, item in zip(units, [i for i in final["partitions"] if i["kind"]], strict=True):
        counts = [int(_cells(row)[1]) for row in table.find_all("tr")[1:]]
        assert sum(counts) == sum(group["units"] for group in item["by_free"])


def test_the_placement_section_escapes_job_names_and_stays_short_at_10000_nodes() -> None:
    result = synthetic_result(10_000)  # 60 jobs, one leaf or block each; the first one's name hostile
    html = render_report(result, BUNDLE)
    assert HOSTILE_JOB_NAME not in html and escape(HOSTILE_JOB_NAME) in html
    section = _section(html)
    assert not section.find_all("img")
    _, jobs, *units = section.find_all("table")
    assert len(jobs.find_all("tr")) == 1 + 50 and "60 jobs; the first 50 shown." in section.text
    final = result.steps[-1].placement
    assert final is not None
    p5 = next(item for item in final["partitions"] if item["partition"] == "ml-p5")
    leaves = sum(group["units"] for group in p5["by_free"])
    assert leaves > 1900  # about 8,000 p5 nodes, 4 to a leaf: a few rows, the exact count in each
    (p5_table, _) = units
    rows = [_cells(row) for row in p5_table.find_all("tr")[1:]]
    assert len(rows) == len(p5["by_free"]) <= 5 and sum(int(row[1]) for row in rows) == leaves
    assert f"and {p5['by_free'][0]['units'] - 200} more" in rows[0][3]  # names listed up to 200, counted all


def test_without_slurmctld_the_placement_section_says_why_it_is_empty() -> None:
    result = _result()
    result.head_node = "file-only stand-in for Slurm 26.05 (no slurmctld)"
    for step in result.steps:
        step.placement = None
    text = _section(render_report(result, BUNDLE)).text
    assert "no slurmctld on the file-only head node: no jobs submitted, no placement figures" in text
    result.scenario["steps"] = [step for step in result.scenario["steps"] if "submit" not in step]
    assert "No jobs in this story." in _section(render_report(result, BUNDLE)).text


def test_the_placement_pages_demo_lines_are_the_fixtures() -> None:
    """docs/placement.md "In the demo" shows lines of the demo on slurmctld: the fixture's run (regenerated with
    the demo, see tests/e2e/test_simulate_json.py) prints them."""
    page = Path(__file__).parents[2] / "docs" / "placement.md"
    (shown,) = [block for block in blocks(page) if any("] placement largest job" in line for line in block.lines)]
    printed = "".join(
        f"[t={entry['t']:8.1f}s] {entry['kind']:<8} {entry['text']}".replace("\n", "\n" + " " * 22) + "\n"
        for step in _result().steps
        for entry in step.timeline
    )
    assert matches_shown(shown.lines, printed), f"{shown.where} no longer matches the demo fixture"
