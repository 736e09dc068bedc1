"""`topokeeper labels` and `topokeeper kueue` for 1k, 10k and 100k EKS nodes (goal: 10k nodes under 2 s end to end).

Run: .venv/bin/python -m bench.kueue_scaling [--sizes 1000,10000] [--repeat 3]
The fleet is p5 (3 layers, 16 nodes to a layer-3 domain) and p6-b200 (4 layers, 8 to a layer-4 domain), read
from a NodeList file plus a snapshot file, as `--snapshot S --nodes N` does.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

from tests.unit.kueue import fleets
from topokeeper.cli.main import main


def run(size: int, repeat: int) -> None:
    snapshot = fleets.eks_snapshot(
        5,
        "bench",
        [
            fleets.group("p5", "p5.48xlarge", size * 3 // 5, per_domain=16, fanout=8),
            fleets.group("b200", "p6-b200.48xlarge", size - size * 3 // 5, per_domain=8, fanout=4, depth=4),
        ],
    )
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "s.json").write_text(json.dumps(snapshot))
        (folder / "n.json").write_text(json.dumps(fleets.node_list(snapshot)))
        inputs = ["--snapshot", str(folder / "s.json"), "--nodes", str(folder / "n.json")]
        for command in (
            ["labels", *inputs],
            ["labels", *inputs, "--json"],
            ["kueue", *inputs, "--out", str(folder / "o")],
        ):
            best = float("inf")
            for _ in range(repeat):
                started = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):
                    assert main(command) == 0
                best = min(best, time.perf_counter() - started)
            name = " ".join(command[:1] + (["--json"] if "--json" in command else []))
            print(f"{size:>7} nodes  {name:<14} {best:6.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    for count in (int(text) for text in options.sizes.split(",")):
        run(count, options.repeat)
