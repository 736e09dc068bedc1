"""Plan + render time for 1k, 10k and 100k nodes (goal: 10k nodes under 1 s, linear growth).

Run: .venv/bin/python bench/plan_scaling.py [--sizes 1000,10000,100000] [--repeat 3]
The cluster is two thirds p5 (tree: 16 nodes to a leaf, 16 leaves to an aggregation switch) and one
third p6e-gb200 (block: 18-node UltraServers), with HyperPod-style host names.
"""

from __future__ import annotations

import argparse
import time

from topokeeper.domain.models import ClusterSnapshot, Node, Partition, SlurmVersion
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render


def synthetic_cluster(size: int) -> ClusterSnapshot:
    tree_count = size * 2 // 3
    p5 = [
        Node(
            name=f"ip-10-{1 + i // 65000}-{i // 250 % 260}-{i % 250}",
            instance_id=f"i-0{i:016x}",
            instance_type="p5.48xlarge",
            partition="p5",
            network_nodes=(f"nn-s{i // 4096:016x}", f"nn-a{i // 256:016x}", f"nn-l{i // 16:016x}"),
        )
        for i in range(tree_count)
    ]
    gb = [
        Node(
            name=f"ip-10-{100 + i // 65000}-{i // 250 % 260}-{i % 250}",
            instance_id=f"i-1{i:016x}",
            instance_type="p6e-gb200.36xlarge",
            partition="gb200",
            network_nodes=(f"nn-gs{i // 2304:015x}", f"nn-ga{i // 144:015x}", f"nn-gl{i // 18:015x}"),
            ultraserver_id=f"us-{i // 18:016x}",
        )
        for i in range(size - tree_count)
    ]
    return ClusterSnapshot(
        cluster_name="bench",
        slurm_version=SlurmVersion.parse("26.05"),
        partitions=(Partition(name="gb200", nodes=tuple(gb)), Partition(name="p5", nodes=tuple(p5))),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'nodes':>8}  {'plan s':>8}  {'render s':>8}  {'total s':>8}  {'us/node':>8}  bytes")
    for size in (int(s) for s in args.sizes.split(",")):
        snapshot = synthetic_cluster(size)
        best = (float("inf"), 0.0, 0.0)
        for _ in range(args.repeat):
            start = time.perf_counter()
            planned = plan(snapshot)
            middle = time.perf_counter()
            files = render(planned).files()
            end = time.perf_counter()
            best = min(best, (end - start, middle - start, end - middle))
        total, planning, rendering = best
        size_bytes = sum(len(text) for text in files.values())
        print(
            f"{size:>8}  {planning:>8.3f}  {rendering:>8.3f}  {total:>8.3f}  {total / size * 1e6:>8.1f}  {size_bytes}"
        )


if __name__ == "__main__":
    main()
