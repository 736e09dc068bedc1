"""`topokeeper placement` on 20,000 nodes and 10,000 jobs, the whole process (goal: under 5 s).

Run: .venv/bin/python -m bench.placement_scaling [--nodes 20000] [--jobs 10000] [--no-write]
The files are in slurmctld 26.05's own shape: each job and node is a copy of one that slurmctld printed for
docs/placement.md's example (examples/placement/), with its id, partition, state, nodes and size changed. A tree
partition (leaves of 16) holds three fifths of the nodes, a block partition (blocks of 18) the rest; seven in ten
jobs run (1 to 32 nodes), the others wait, asking for one leaf or a segment.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tempfile
from pathlib import Path

from bench.child_usage import wait_measured
from bench.performance_doc import machine, write_section
from topokeeper.wire import compress

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "placement"
GOAL_SECONDS = 5.0


def _number(value: int) -> dict[str, object]:
    return {"set": True, "infinite": False, "number": value}


def _topologies(names: list[str], tree: int) -> tuple[str, str]:
    leaves = [names[start : start + 16] for start in range(0, tree, 16)]
    tree_lines = [
        f"SwitchName=spine Level=1 LinkSpeed=1 Nodes={compress(names[:tree])} Switches=leaf[0-{len(leaves) - 1}]"
    ]
    tree_lines += [f"SwitchName=leaf{i} Level=0 LinkSpeed=1 Nodes={compress(leaf)}" for i, leaf in enumerate(leaves)]
    blocks = [names[start : start + 18] for start in range(tree, len(names), 18)]
    block_lines = [f"BlockName=b{i} BlockIndex={i} Nodes={compress(b)} BlockSize=18" for i, b in enumerate(blocks)]
    return "\n".join(tree_lines) + "\n", "\n".join(block_lines) + "\n"


def write_files(folder: Path, node_count: int, job_count: int) -> list[str]:
    """The three inputs in ``folder``; the command line's arguments after ``placement``."""
    rng = random.Random(7)  # noqa: S311 (a repeatable fleet, not a secret)
    squeue = json.loads((EXAMPLE / "squeue.json").read_text())
    node_template = json.loads((EXAMPLE / "nodes.json").read_text())["nodes"][0]
    job_template = next(job for job in squeue["jobs"] if job["job_state"][0] == "RUNNING")
    names = [f"n{i:05d}" for i in range(node_count)]
    tree = node_count * 3 // 5 // 16 * 16
    nodes, jobs, cursor = [], [], 0
    for index, name in enumerate(names):
        node = copy.deepcopy(node_template)
        node.update(name=name, partitions=["train" if index < tree else "nvl"], state=["IDLE", "CLOUD", "POWERED_DOWN"])
        nodes.append(node)
    for job_id in range(1, job_count + 1):
        job = copy.deepcopy(job_template)
        size = rng.choice((1, 2, 4, 8, 16, 18, 32))
        partition = "train" if rng.random() < 0.6 else "nvl"
        job.update(job_id=job_id, partition=partition, node_count=_number(size), name=f"\x1b[31m$(job {job_id})")
        if rng.random() < 0.7 and cursor + size <= node_count:
            taken = names[cursor : cursor + size]
            cursor += size
            for name in taken:
                nodes[int(name[1:])]["state"] = ["ALLOCATED", "CLOUD"]
            job.update(job_state=["RUNNING"], nodes=compress(taken), state_reason="None")
        else:
            job.update(job_state=["PENDING"], nodes="", state_reason="Resources", required_switches=1)
            job.update(segment_size=size if partition == "nvl" and size <= 18 else 0)
        jobs.append(job)
    squeue["jobs"] = jobs
    (folder / "squeue.json").write_text(json.dumps(squeue, separators=(",", ":")))
    (folder / "nodes.json").write_text(json.dumps({"nodes": nodes}, separators=(",", ":")))
    tree_text, block_text = _topologies(names, tree)
    (folder / "tree.txt").write_text(tree_text)
    (folder / "block.txt").write_text(block_text)
    files = ["--squeue", str(folder / "squeue.json"), "--nodes", str(folder / "nodes.json")]
    return [*files, "--topology", str(folder / "tree.txt"), "--topology", str(folder / "block.txt")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance/ alone")
    options = parser.parse_args()
    program = "import sys; from topokeeper.cli.main import run; sys.argv[0] = 'topokeeper'; run()"
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        arguments = write_files(Path(directory), options.nodes, options.jobs)
        sizes = {name: (Path(directory) / name).stat().st_size for name in ("squeue.json", "nodes.json")}
        for label, extra in (
            ("the partition table", []),
            ("--units --json", ["--units", "--json"]),
            ("--job 1", ["--job", "1"]),
        ):
            best = min(
                (wait_measured([sys.executable, "-c", program, "placement", *arguments, *extra])[0] for _ in range(3)),
                key=lambda usage: usage["seconds"],
            )
            rows.append(f"| `placement` {label} | {best['seconds']:.2f} s | {best['max_rss_mb']:.0f} MB |")
            print(rows[-1])
    section = "\n".join(
        [
            "## Placement",
            "",
            f"Generated by `bench/placement_scaling.py` (`make bench`) on {machine()}",
            "",
            f"`topokeeper placement` on {options.nodes:,} nodes and {options.jobs:,} jobs, the whole process (best of"
            f" three; goal: under {GOAL_SECONDS:.0f} s). Input in slurmctld 26.05's shape: `squeue --json`"
            f" {sizes['squeue.json'] / 1e6:.0f} MB, `scontrol show nodes --json` {sizes['nodes.json'] / 1e6:.0f} MB.",
            "",
            "| Command | Wall time | Peak RSS |",
            "| --- | --- | --- |",
            *rows,
        ]
    )
    if not options.no_write:
        print(f"wrote {write_section('placement', section)}")


if __name__ == "__main__":
    main()
