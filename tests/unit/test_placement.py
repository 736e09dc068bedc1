"""Placement figures from facts (``topokeeper.domain.placement``) and ``topokeeper placement`` on files: the largest
job one leaf or block can start, spread against need, fragmentation, jobs waiting on topology, and hostile strings
kept out of every output. (That the figures are Slurm's own answer: tests/integration/slurm/
test_placement_on_slurmctld.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topokeeper.cli.main import main
from topokeeper.cli.placement import safe
from topokeeper.domain.placement import (
    Facts,
    Job,
    Node,
    PlacementError,
    assign_topologies,
    facts_from_compact,
    figures,
    job_document,
    node_class,
    topology_from_text,
)

TREE = """\
SwitchName=spine Level=1 LinkSpeed=1 Nodes=n[01-12] Switches=leaf[1-3]
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=n[01-04]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=n[05-08]
SwitchName=leaf3 Level=0 LinkSpeed=1 Nodes=n[09-12]
"""
IDLE_DOWN = ("IDLE", "CLOUD", "POWERED_DOWN")
NOW = 1_000_000


def _node(name: str, *states: str) -> Node:
    return Node(name=name, states=states or IDLE_DOWN, partitions=("gpu",))


def _facts(nodes: list[Node], jobs: list[Job]) -> Facts:
    topology = topology_from_text("gpu-tree", TREE)
    return Facts(jobs=tuple(jobs), nodes=tuple(nodes), topologies=assign_topologies(nodes, [topology]), now=NOW)


def _cluster() -> Facts:
    """leaf1: job 1 on 3 nodes, 1 powered down; leaf2: 2 idle powered up, 1 drained, 1 powered down; leaf3: job 2
    on 3 nodes, 1 powered down. Job 3 (4 nodes, one leaf) and job 4 (8 nodes) pending."""
    nodes = [_node(f"n{i:02d}") for i in range(1, 13)]
    allocated = ("ALLOCATED", "CLOUD")
    for index in (0, 1, 2, 9, 10, 11):
        nodes[index] = _node(nodes[index].name, *allocated)
    nodes[4] = _node("n05", "IDLE")
    nodes[5] = _node("n06", "IDLE")
    nodes[6] = _node("n07", "IDLE", "DRAIN")
    jobs = [
        Job("1", "gpu", "RUNNING", ("n01", "n02", "n03"), 3, since=NOW - 50),
        Job("2", "gpu", "RUNNING", ("n10", "n11", "n12"), 3, since=NOW - 40),
        Job("3", "gpu", "PENDING", (), 4, switches=1, reason="Resources", since=NOW - 600),
        Job("4", "gpu", "PENDING", (), 8, reason="Resources", since=NOW - 30),
    ]
    return _facts(nodes, jobs)


def test_node_classes_follow_slurms_state_and_flags() -> None:
    assert node_class(["IDLE"]) == "idle"
    assert node_class(list(IDLE_DOWN)) == "powered_down"
    assert node_class(["IDLE", "CLOUD", "NOT_RESPONDING", "POWERING_UP"]) == "unavailable"
    assert node_class(["IDLE", "DRAIN", "POWERED_DOWN"]) == "drained"
    assert node_class(["DOWN", "CLOUD", "POWERED_DOWN"]) == "down"
    assert node_class(["ALLOCATED", "CLOUD", "POWERED_DOWN"]) == "allocated"
    assert node_class(["MIXED"]) == "mixed"


def test_the_largest_job_in_one_leaf_counts_powered_down_nodes_and_says_so() -> None:
    (gpu,) = figures(_cluster())
    assert [(unit.name, unit.free) for unit in gpu.units] == [("leaf1", 1), ("leaf2", 3), ("leaf3", 1)]
    assert (gpu.largest, gpu.largest_without_resume, gpu.largest_units) == (3, 2, ("leaf2",))
    assert gpu.free == 5
    # The typical job (median of 3, 3, 4, 8) is 3 nodes: the one free node in leaf1 and in leaf3 cannot hold it.
    assert (gpu.typical_job_nodes, gpu.stranded_free, gpu.fragmentation) == (3, 2, 0.4)


def test_a_job_spread_beyond_need_and_one_waiting_on_topology() -> None:
    facts = _cluster()
    spread = Job("5", "gpu", "RUNNING", ("n04", "n08"), 2, since=NOW)
    facts = _facts(
        [n if n.name not in ("n04", "n08") else _node(n.name, "ALLOCATED") for n in facts.nodes],
        [*facts.jobs, spread],
    )
    (gpu,) = figures(facts)
    assert [(s.job_id, s.units, s.fewest, s.beyond_need) for s in gpu.spread] == [
        ("1", ("leaf1",), 1, False),
        ("2", ("leaf3",), 1, False),
        ("5", ("leaf1", "leaf2"), 1, True),
    ]
    pending = {p.job_id: p for p in gpu.pending}
    assert (pending["3"].seconds, pending["3"].reason) == (600, "Resources")
    assert gpu.free == 3 and not pending["3"].on_topology  # 3 free: too few anywhere, topology is not the cause
    assert not pending["4"].on_topology  # no --switches: it waits for nodes
    document = job_document(facts, "5")
    assert (document["spans"], document["fewest"], document["beyond_need"]) == (2, 1, True)
    assert document["placed"] == [
        {"unit": "leaf1", "nodes": 1, "hostlist": "n04"},
        {"unit": "leaf2", "nodes": 1, "hostlist": "n08"},
    ]


def test_pending_on_topology_when_the_partition_has_the_nodes_but_no_leaf_does() -> None:
    (gpu,) = figures(_cluster())  # 5 free, at most 3 in one leaf
    pending = {p.job_id: p for p in gpu.pending}
    assert pending["3"].on_topology and not pending["4"].on_topology
    segment = Job("6", "gpu", "PENDING", (), 4, segment=2, since=NOW - 5)
    (gpu,) = figures(_facts(list(_cluster().nodes), [segment]))
    # Segments of 2: leaf2 gives one (3 free), leaf1 and leaf3 none (1 free each): waits on topology.
    assert [p.on_topology for p in gpu.pending] == [True]


def test_a_partition_without_topology_and_nodes_outside_it() -> None:
    nodes = [_node("n01"), Node("x1", IDLE_DOWN, ("gpu",))]
    (gpu,) = figures(_facts(nodes, []))
    assert gpu.largest == 1 and gpu.outside["powered_down"] == 1 and gpu.typical_job_nodes is None
    other = Node("y1", IDLE_DOWN, ("cpu",))
    cpu = figures(_facts([*nodes, other], []))[0]
    assert (cpu.partition, cpu.topology, cpu.largest, cpu.outside["powered_down"]) == ("cpu", None, 0, 1)


def test_figures_are_deterministic_whatever_the_input_order() -> None:
    facts = _cluster()
    shuffled = Facts(jobs=facts.jobs[::-1], nodes=facts.nodes[::-1], topologies=facts.topologies, now=NOW)
    assert figures(shuffled) == figures(facts)


# --- the command on files --------------------------------------------------------------------------------------

HOSTILE = "\x1b[31m$(touch /tmp/pwned)`id`<script>alert(1)</script>\nline2"


def _files(tmp_path: Path, partition: str = "gpu") -> list[str]:
    jobs = [
        {
            "job_id": 7,
            "name": HOSTILE,
            "comment": HOSTILE,
            "user_name": HOSTILE,
            "partition": partition,
            "job_state": ["RUNNING"],
            "node_count": {"set": True, "infinite": False, "number": 2},
            "nodes": "n[04,08]",
            "required_switches": 0,
            "state_reason": "None",
            "start_time": {"set": True, "infinite": False, "number": NOW - 10},
        },
        {
            "job_id": 8,
            "name": HOSTILE,
            "partition": partition,
            "job_state": ["PENDING"],
            "node_count": {"set": True, "infinite": False, "number": 4},
            "nodes": "",
            "required_switches": 1,
            "state_reason": "Resources",
            "eligible_time": {"set": True, "infinite": False, "number": NOW - 90},
        },
    ]
    nodes = [{"name": f"n{i:02d}", "state": list(IDLE_DOWN), "partitions": [partition]} for i in range(1, 13)]
    for item in nodes:
        if item["name"] in ("n04", "n08"):
            item["state"] = ["ALLOCATED", "CLOUD"]
    (tmp_path / "squeue.json").write_text(json.dumps({"jobs": jobs, "last_update": {"number": NOW}}))
    (tmp_path / "nodes.json").write_text(json.dumps({"nodes": nodes}))
    (tmp_path / "tree.txt").write_text(TREE)
    return ["placement", "--squeue", str(tmp_path / "squeue.json"), "--nodes", str(tmp_path / "nodes.json"),
            "--topology", f"gpu-tree={tmp_path / 'tree.txt'}"]  # fmt: skip


@pytest.mark.parametrize(
    "extra", [[], ["--units"], ["--job", "7"], ["--job", "8"], ["--json"], ["--json", "--job", "7"]]
)
def test_hostile_names_never_reach_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    assert main([*_files(tmp_path), *extra]) == 0
    out = capsys.readouterr().out
    for fragment in ("\x1b", "$(", "`", "<script", "touch", "line2"):
        assert fragment not in out


def test_a_hostile_partition_name_is_escaped_in_tables_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    partition = "gpu\x1b[2J<b>$(id)\n"
    assert main([*_files(tmp_path, partition), "--units"]) == 0
    table = capsys.readouterr().out
    assert "\x1b" not in table and "<b>" not in table and "$(" not in table
    assert "gpu\\x1b[2J\\x3cb\\x3e\\x24\\x28id\\x29\\x0a" in table
    assert main([*_files(tmp_path, partition), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["partitions"][0]["partition"] == partition  # JSON's own escaping, the value intact


def test_the_three_questions_in_one_table_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _files(tmp_path)
    assert main(files) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "PARTITION", "TOPOLOGY", "LARGEST", "NO-RESUME", "IN", "FREE", "STRANDED", "FRAG", "SPREAD-BEYOND",
        "PENDING-TOPO", "WAIT-S",
    ]  # fmt: skip
    assert lines[1].split() == ["gpu", "gpu-tree", "4", "0", "leaf3", "10", "0", "0.00", "1", "0", "0"]
    assert main([*files, "--job", "7"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "job 7  partition gpu  RUNNING  2 nodes  spans 2 of the fewest 1 (beyond need)",
        "LEAF/BLOCK  NODES  HOSTLIST",
        "leaf1       1      n04",
        "leaf2       1      n08",
    ]
    assert main([*files, "--job", "8"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "job 8  partition gpu  PENDING  4 nodes  asked --switches=1 --segment=0",
        "REASON     PENDING-S  ON-TOPOLOGY  LARGEST-NOW",
        "Resources  90         False        4",
    ]


def test_bad_files_get_one_line_naming_the_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _files(tmp_path)
    document = json.loads((tmp_path / "squeue.json").read_text())
    del document["jobs"][1]["partition"]
    (tmp_path / "squeue.json").write_text(json.dumps(document))
    assert main(files) == 2
    error = capsys.readouterr().err
    assert error == f"topokeeper: error: placement: --squeue {tmp_path}/squeue.json: jobs[1] has no 'partition'\n"
    files = _files(tmp_path)
    assert main([*files[:-2], "--job", "99"]) == 2  # and without a topology, a job not there
    assert capsys.readouterr().err.endswith("job 99 is not in the squeue output\n")
    (tmp_path / "nodes.json").write_text("[]")
    assert main(files) == 2
    assert "--nodes" in capsys.readouterr().err


def test_safe_keeps_names_and_escapes_the_rest() -> None:
    assert safe("p5-[001-004]") == "p5-[001-004]"
    assert safe("a\nb") == "a\\x0ab"
    assert safe(None) == "-"
    assert len(safe("x" * 500)) == 64


def test_unreadable_topology_is_named() -> None:
    with pytest.raises(PlacementError, match="topology t: no switch or block with nodes"):
        topology_from_text("t", "nothing here\n")


# --- the head node's compact facts ------------------------------------------------------------------------------


def test_head_node_parsers_take_each_nodes_own_fields_and_the_reason_last() -> None:
    from topokeeper.headnode.placement import parse_jobs, parse_nodes, squeue_argv

    assert squeue_argv(segment=False)[-1] == (
        "JobID:0|,Partition:0|,State:0|,NumNodes:0|,NodeList:0|,ReqSwitch:0|,EligibleTime:0|,StartTime:0|,Reason:0"
    )
    # A drain reason is anyone's text with a health check: its State= and Partitions= are not the node's.
    nodes = parse_nodes(
        "NodeName=n01 State=IDLE+DRAIN Partitions=gpu Reason=State=IDLE Partitions=evil [root@2026]\n"
        "NodeName=n02 State=IDLE+CLOUD+POWERED_DOWN Partitions=gpu,dev\n"
        "NodeName=n03 State=IDLE+CLOUD+POWERED_DOWN Partitions=gpu,dev\n"
    )
    assert nodes == [["IDLE+CLOUD+POWERED_DOWN", "gpu,dev", "n[02-03]"], ["IDLE+DRAIN", "gpu", "n01"]]
    jobs = parse_jobs(
        "7|gpu|CONFIGURING|2|n[04,08]|0|N/A|1796401306|1796401309|None\n"
        "8|gpu|PENDING|4||1|N/A|1796401300|N/A|ReqNodeNotAvail, a|b\x1b[2J\n"
        "squeue: warning: something\n",
        segment=True,
    )
    assert jobs == [
        ["7", "gpu", "CONFIGURING", 2, "n[04,08]", 0, 0, 1796401309, "None"],
        ["8", "gpu", "PENDING", 4, "", 1, 0, 1796401300, "ReqNodeNotAvail, a|b\x1b[2J"],
    ]


def test_compact_facts_refused_in_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"schema": "topokeeper.placement-facts/1", "error": "scontrol ping: down"}))
    assert main(["placement", "--facts", str(facts)]) == 2
    assert capsys.readouterr().err == (
        f"topokeeper: error: placement: --facts {facts}: the head node could not read slurmctld: scontrol ping: down\n"
    )
    facts.write_text(json.dumps({"schema": "topokeeper.placement-facts/1", "jobs": [[1]]}))
    assert main(["placement", "--facts", str(facts)]) == 2
    assert f"--facts {facts}: malformed facts" in capsys.readouterr().err


def test_compact_facts_naming_more_hosts_than_any_cluster_are_refused_before_they_are_built() -> None:
    # 267 bytes of ranges (a forged object in the bucket): each under the per-hostlist bound, together 4 million
    # names, which would exhaust the drift function's memory before any exception could be caught.
    huge = ["IDLE", "p", f"n[0-{(1 << 20) - 1}]"]
    document = {
        "schema": "topokeeper.placement-facts/1",
        "now": 0,
        "topology_kinds": {},
        "topologies": {},
        "nodes": [huge] * 4,
        "jobs": [],
        "partition_topologies": {},
    }
    with pytest.raises(PlacementError, match="names more than 1048576 hosts"):
        facts_from_compact(document, "forged")
    document["nodes"] = [["IDLE", "p", "n[0-9]"]]
    assert len(facts_from_compact(document, "fine").nodes) == 10
