"""``hostfile``: a job's nodes in topology order, from saved ``scontrol show topology`` output (as 26.05 prints it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import head_node_program
from topokeeper.cli.main import main as cli_main
from topokeeper.computenode.hostfile import HostfileError, order_hosts, unit_order
from topokeeper.wire import parse_show_topology

# An upper switch's Nodes= lists every node below it; children are printed in config order, not sorted.
TREE = """\
SwitchName=spine Level=2 LinkSpeed=1 Nodes=n[1-12] Switches=aggB,aggA
SwitchName=aggB Level=1 LinkSpeed=1 Nodes=n[1,3,10-12] Switches=leafB2,leafB1
SwitchName=aggA Level=1 LinkSpeed=1 Nodes=n[2,4,9] Switches=leafA
SwitchName=leafB2 Level=0 LinkSpeed=1 Nodes=n[10-12]
SwitchName=leafB1 Level=0 LinkSpeed=1 Nodes=n[1,3]
SwitchName=leafA Level=0 LinkSpeed=1 Nodes=n[2,4,9]
"""
BLOCKS = """\
BlockName=b2 BlockIndex=0 Nodes=gb-[010-012] BlockSize=3
BlockName=b1 BlockIndex=1 Nodes=gb-[001-003] BlockSize=3
AggregatedBlock=b[2,1] BlockIndex=2 Nodes=gb-[001-003,010-012] BlockSize=6
"""


def test_leaves_come_in_switch_tree_order_depth_first() -> None:
    order = unit_order(parse_show_topology(TREE))
    assert order == [("leafB2", ["n10", "n11", "n12"]), ("leafB1", ["n1", "n3"]), ("leafA", ["n2", "n4", "n9"])]


def test_each_leaf_is_contiguous_and_nodes_keep_slurms_hostlist_order() -> None:
    ordered = order_hosts("n[1-4,9-12]", parse_show_topology(TREE))
    assert [host for host, _ in ordered] == ["n10", "n11", "n12", "n1", "n3", "n2", "n4", "n9"]
    assert [unit for _, unit in ordered] == ["leafB2"] * 3 + ["leafB1"] * 2 + ["leafA"] * 3


def test_blocks_come_in_printed_order_and_aggregated_blocks_are_not_units() -> None:
    ordered = order_hosts("gb-[001-002,011-012]", parse_show_topology(BLOCKS))
    assert ordered == [("gb-011", "b2"), ("gb-012", "b2"), ("gb-001", "b1"), ("gb-002", "b1")]


@pytest.mark.parametrize(
    ("nodelist", "message"),
    [
        ("n[1-", "not a Slurm hostlist: unbalanced '['"),
        ("n[a-b]", "not a Slurm hostlist: invalid range 'a-b'"),
        ("", "the node list is empty"),
        ("n1,n[1-2]", "names 1 node(s) twice: 'n1'"),
        (
            "n1,n99,evil\nname",
            "2 node(s) of the node list are in no leaf or block of the topology: 'n99', 'evil\\nname'",
        ),
    ],
)
def test_hostile_node_lists_get_one_clear_error(nodelist: str, message: str) -> None:
    with pytest.raises(HostfileError) as raised:
        order_hosts(nodelist, parse_show_topology(TREE))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topology.txt"
    path.write_text(text)
    return path


def test_the_cli_prints_one_host_a_line_or_a_rank_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = _write(tmp_path, TREE)
    assert cli_main(["hostfile", "n[1-3,10]", "--topology-file", str(topology)]) == 0
    assert capsys.readouterr().out == "n10\nn1\nn3\nn2\n"
    assert cli_main(["hostfile", "n[1-3,10]", "--topology-file", str(topology), "--format", "rankmap"]) == 0
    assert capsys.readouterr().out == "0 n10 leafB2\n1 n1 leafB1\n2 n3 leafB1\n3 n2 leafA\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no switch or block with nodes (a flat topology gives no order)"),
        ("SwitchName=s1 Level=0 Nodes=n[1-\n", "unreadable scontrol output: unbalanced '['"),
        ("SwitchName=s1 Level=x Nodes=n1\n", "unreadable scontrol output: invalid literal"),
    ],
)
def test_a_bad_topology_file_is_one_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    topology = _write(tmp_path, text)
    assert cli_main(["hostfile", "n1", "--topology-file", str(topology)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"topokeeper: error: hostfile: --topology-file {topology}: {message}")
    assert error.count("\n") == 1


def test_the_head_node_program_runs_it_on_a_compute_node(tmp_path: Path) -> None:
    """The .pyz alone (standard library only), with the job's environment as Slurm sets it."""
    topology = _write(tmp_path, BLOCKS)
    environment = {"SLURM_JOB_NODELIST": "gb-[001,010]", "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-I", str(head_node_program()), "hostfile", "--topology-file", str(topology)]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "gb-010\ngb-001\n", "")
    done = subprocess.run(command[:-2], capture_output=True, text=True, env={"PATH": "/nonexistent"}, check=False)
    assert done.returncode == 2
    assert done.stderr == (
        "topokeeper hostfile: error: no node list: give one, or run inside a job (SLURM_JOB_NODELIST is unset)\n"
    )


def test_the_docs_show_what_it_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/ranks-and-nccl.md: the scontrol output a real slurmctld printed, and the rank map it gives."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "ranks-and-nccl.md").read_text()
    topology = text[text.index("```text\n") + 8 : text.index("```", text.index("```text\n") + 8)]
    command = "topokeeper hostfile 'p5-[000-001,004-005,008,012]' --topology-file tree.txt --format rankmap"
    start = text.index(f"$ {command}\n") + len(command) + 3
    (tmp_path / "tree.txt").write_text(topology)
    argv = ["hostfile", "p5-[000-001,004-005,008,012]", "--topology-file", str(tmp_path / "tree.txt")]
    assert cli_main([*argv, "--format", "rankmap"]) == 0
    assert capsys.readouterr().out == text[start : text.index("```", start)]
