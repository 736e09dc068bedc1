"""Wall time of a simulated 1,000-node scale-up (goal: seconds to a minute of wall time for five simulated
minutes), and what it cost: writes, reconciles, AWS calls by operation, convergence.

Run: .venv/bin/python bench/simulate_scale.py [--scenario FILE]   (root: the head node is a real slurmctld)
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from topokeeper.sim.commands import SCENARIOS
from topokeeper.sim.scenario import load_scenario
from topokeeper.sim.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", type=Path, default=SCENARIOS / "scale-1000.yaml")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    started = time.monotonic()
    result = simulate(load_scenario(args.scenario))
    wall = time.monotonic() - started
    print(f"{args.scenario.name}: {wall:.1f} s wall for {result.totals['simulated_seconds']:.0f} s simulated")
    for step in result.steps:
        calls = sum(step.aws_calls.values())
        print(
            f"  {step.step:<8} nodes {step.nodes:>5}  events {step.events_sent:>5}  reconciles {step.reconciles:>3}"
            f"  writes {step.head_node_writes:>2}  AWS calls {calls:>6}  converged {step.converged}"
            f" in {step.convergence_seconds}s"
        )
    top = sorted(result.totals["aws_calls"].items(), key=lambda item: -item[1])[:8]
    print("  AWS calls:", ", ".join(f"{name} {count}" for name, count in top))


if __name__ == "__main__":
    main()
