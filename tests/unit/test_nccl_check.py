"""``topokeeper nccl-check``: the kit's scripts, and the verdict on outputs written in nccl-tests' format (its
``src/common.cu`` prints the ``# Using devices`` rank lines, the table header, one row per size, then ``# Out of
bounds values : N OK`` and ``# Avg bus bandwidth    : %g``). No GPU ran here: the outputs are made to that format."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from topokeeper.cli.main import main
from topokeeper.wire import compress, expand

SNAPSHOT = Path(__file__).resolve().parents[2] / "examples" / "mixed-cluster.json"

_HEADER = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
{ranks}#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
"""  # noqa: E501, W291 - nccl-tests' own lines, trailing spaces included
_ROW = "  {size:10d}  {count:12d}     float     sum      -1  {time:7.1f}  {bw:6.2f}  {bw:6.2f}      0  {time:7.1f}  {bw:6.2f}  {bw:6.2f}      0\n"  # noqa: E501


def nccl_output(hosts: list[str], busbw: float, wrong: int = 0) -> str:
    ranks = "".join(
        f"#  Rank {rank:2d} Group  0 Pid {1000 + rank:6d} on {host} device  0 [0000:04:00] NVIDIA H100 80GB HBM3\n"
        for rank, host in enumerate(hosts)
    )
    rows = "".join(_ROW.format(size=8 << i, count=2 << i, time=100.0 + i, bw=busbw) for i in range(0, 30, 6))
    verdict = "FAILED" if wrong else "OK"
    return (
        _HEADER.format(ranks=ranks)
        + rows
        + f"# Out of bounds values : {wrong} {verdict}\n# Avg bus bandwidth    : {busbw:g} \n#\n"
    )


@pytest.fixture
def kit(tmp_path: Path) -> Path:
    """The kit for the example's ml-p5 (four leaves of 4 nodes, and a no-topology node) and ml-p6e (two blocks
    of 18); its flat partition gets none."""
    out = tmp_path / "kit"
    assert main(["nccl-check", "--snapshot", str(SNAPSHOT), "--out", str(out)]) == 0
    return out


def _runs(kit: Path) -> list[dict[str, str]]:
    runs: list[dict[str, str]] = json.loads((kit / "manifest.json").read_text())["runs"]
    return runs


def _fill(kit: Path, slow: dict[str, float] | None = None) -> None:
    for run in _runs(kit):
        busbw = (slow or {}).get(run["unit"], 300.0 if run["kind"] != "reference" else 150.0)
        (kit / run["output"]).write_text(nccl_output(expand(run["nodes"]), busbw))


def test_one_script_per_leaf_and_block_and_a_reference_across_two(kit: Path) -> None:
    runs = _runs(kit)
    kinds = sorted((run["partition"], run["kind"]) for run in runs)
    assert kinds == [("ml-p5", "leaf")] * 4 + [("ml-p5", "reference")] + [("ml-p6e", "block")] * 2 + [
        ("ml-p6e", "reference")
    ]
    for run in runs:
        script = (kit / run["output"].replace(".out", ".sbatch")).read_text()
        assert f"#SBATCH --nodelist={run['nodes']}\n" in script
        assert f"#SBATCH --nodes={len(expand(run['nodes']))}\n" in script
        assert f"#SBATCH --output={run['output']}\n" in script
        assert script.rstrip().endswith("srun all_reduce_perf -b 8 -e 8G -f 2 -g 1")
        assert "#SBATCH --ntasks-per-node=8\n" in script and "--gpus-per-node" not in script  # GRES: asked for
    block_reference = (kit / "nccl-ml-p6e-reference.sbatch").read_text()
    assert "#SBATCH --nodes=18\n#SBATCH" in block_reference and "#SBATCH --segment=9\n" in block_reference
    assert "--segment" not in (kit / "nccl-ml-p5-reference.sbatch").read_text()
    reference = next(run for run in runs if run["partition"] == "ml-p5" and run["kind"] == "reference")
    leaves = [set(expand(run["nodes"])) for run in runs if run["partition"] == "ml-p5" and run["kind"] == "leaf"]
    assert sum(1 for leaf in leaves if leaf & set(expand(reference["nodes"]))) == 2


def test_the_command_is_quoted_word_by_word(tmp_path: Path, kit: Path) -> None:
    out = tmp_path / "kit2"
    command = "/opt/nccl tests/all_reduce_perf -b 8 $(reboot) ;x"
    assert (
        main(
            ["nccl-check", "--snapshot", str(SNAPSHOT), "--out", str(out), "--command", command, "--gpus-per-node", "4"]
        )
        == 0
    )
    script = next(out.glob("*.sbatch")).read_text()
    line = script.rstrip().splitlines()[-1]
    assert shlex.split(line) == ["srun", "/opt/nccl", "tests/all_reduce_perf", "-b", "8", "$(reboot)", ";x"]
    assert "'$(reboot)'" in line
    assert "#SBATCH --gpus-per-node=4\n" in script


def test_all_alike_is_no_verdict(kit: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(kit)
    assert main(["nccl-check", "--results", str(kit)]) == 0
    out = capsys.readouterr().out
    assert "SLOW" not in out and "scontrol" not in out
    assert "threshold: 10% below the partition's median" in out


def test_a_slow_leaf_is_flagged_with_its_nodes_and_the_drain_command(
    kit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _runs(kit)
    slow_leaf = next(run for run in runs if run["kind"] == "leaf")
    _fill(kit, {slow_leaf["unit"]: 250.0})  # 16.7% below the median of 300
    assert main(["nccl-check", "--results", str(kit), "--json"]) == 3
    document = json.loads(capsys.readouterr().out)
    flagged = [row for row in document["runs"] if row["flagged"]]
    assert [(row["unit"], row["suspect_nodes"]) for row in flagged] == [(slow_leaf["unit"], slow_leaf["nodes"])]
    assert document["drain_command"] == (
        f"scontrol update NodeName={slow_leaf['nodes']} State=DRAIN "
        "Reason='topokeeper nccl-check: bus bandwidth more than 10% below the partition median'"
    )
    # Within the threshold: not flagged.
    assert main(["nccl-check", "--results", str(kit), "--threshold", "20"]) == 0


def _error(kit: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["nccl-check", "--results", str(kit)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    return error


def test_truncated_garbled_and_mixed_up_outputs_are_one_error_naming_the_file(
    kit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fill(kit)
    runs = _runs(kit)
    first, second = kit / runs[0]["output"], kit / runs[1]["output"]
    whole = first.read_text()

    first.write_text(whole[: whole.index("# Out of bounds")])
    assert f"{first}: truncated: no '# Out of bounds values' and '# Avg bus bandwidth' lines" in _error(kit, capsys)

    first.write_text(whole.replace("     float     sum", "     flo@t", 1))
    assert f"{first}:" in _error(kit, capsys) and "not an nccl-tests table row" in _error(kit, capsys)

    first.write_text(whole.replace("# Avg bus bandwidth    : 300", "# Avg bus bandwidth    : nan"))
    assert f"{first}: the average bus bandwidth is not a finite number" in _error(kit, capsys)

    first.write_text(second.read_text())  # another leaf's output under this leaf's name
    assert f"{first}: ran on nodes not of leaf {runs[0]['unit']} ('" in _error(kit, capsys)

    first.write_text(nccl_output(expand(runs[0]["nodes"])[1:], 300.0))
    assert f"{first}: ran on 3 of leaf {runs[0]['unit']}'s 4 nodes" in _error(kit, capsys)

    first.write_text(whole.replace("# Using devices", "").replace(" on ip-", " at ip-"))
    assert f"{first}: no '#  Rank N ... on HOST device' lines" in _error(kit, capsys)

    first.write_text("srun: error: Unable to allocate resources\n")
    assert f"{first}: no nccl-tests table header" in _error(kit, capsys)

    first.unlink()
    assert f"{first}: cannot read it" in _error(kit, capsys)


def test_host_names_that_are_no_slurm_node_names_cannot_be_checked_and_pass(
    kit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fill(kit)
    first = kit / _runs(kit)[0]["output"]
    first.write_text(nccl_output(["compute-a.ec2.internal", "compute-b"], 300.0))
    assert main(["nccl-check", "--results", str(kit)]) == 0


def test_a_tampered_manifest_never_reaches_a_command(kit: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads((kit / "manifest.json").read_text())
    manifest["runs"][0]["nodes"] = "p5-001,evil;reboot"  # a hostlist, but no Slurm name
    (kit / "manifest.json").write_text(json.dumps(manifest))
    assert "runs[0]: not a safe Slurm name" in _error(kit, capsys)


def test_the_suspects_are_the_nodes_slow_groups_share(kit: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node in two partitions: its leaf is slow in both, and only the nodes both slow leaves hold are suspects."""
    manifest = json.loads((kit / "manifest.json").read_text())
    leaves = [run for run in manifest["runs"] if run["kind"] == "leaf"]
    first, second, third = (expand(leaf["nodes"]) for leaf in leaves[:3])
    other = [(first[:2] + second[:2]), second[2:] + third[:2], third[2:] + first[2:]]
    for number, nodes in enumerate(other):
        unit = f"o{number}"
        entry = {"partition": "other", "unit": unit, "kind": "leaf", "nodes": ",".join(nodes)}
        manifest["runs"].append({**entry, "output": f"nccl-other-{unit}.out"})
    (kit / "manifest.json").write_text(json.dumps(manifest))
    _fill(kit, {leaves[0]["unit"]: 200.0, "o0": 200.0})
    assert main(["nccl-check", "--results", str(kit), "--json"]) == 3
    document = json.loads(capsys.readouterr().out)
    flagged = {row["unit"]: expand(row["suspect_nodes"]) for row in document["runs"] if row["flagged"]}
    assert flagged == {leaves[0]["unit"]: first[:2], "o0": first[:2]}
    assert document["drain_command"].startswith(f"scontrol update NodeName={compress(first[:2])} State=DRAIN ")


DOCS = Path(__file__).resolve().parents[2] / "docs" / "ranks-and-nccl.md"


def _shown(command: str) -> str:
    """The output docs/ranks-and-nccl.md shows under ``$ command``, up to the block's end."""
    text = DOCS.read_text()
    start = text.index(f"$ {command}\n") + len(command) + 3
    return text[start : text.index("```", start)]


def test_the_docs_show_what_the_verdict_prints(kit: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(kit, {"nn-5038da95330ba16ed": 241.5})
    assert main(["nccl-check", "--results", str(kit)]) == 3
    assert capsys.readouterr().out == _shown("topokeeper nccl-check --results nccl-kit")


@pytest.mark.parametrize("command", ['all_reduce_perf "-b 8', "", "   "], ids=["unclosed-quote", "empty", "blank"])
def test_a_command_that_is_no_command_is_one_error_naming_the_option(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """shlex.split raised through the CLI (a traceback), and an empty command wrote 'srun ' into every script."""
    out = tmp_path / "kit3"
    code = main(["nccl-check", "--snapshot", str(SNAPSHOT), "--out", str(out), "--command", command])
    assert code != 0
    assert "--command" in capsys.readouterr().err
    assert not out.exists()
