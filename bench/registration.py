"""Nodes placed as they register (issue 32): ParallelCluster's Slurm 25.11, a real slurmd per booting node.

The story (bench/scenarios/parallelcluster-registration-600.yaml): the resume program powers up 600 dynamic p5
nodes over 5 minutes; each instance runs the node-side step ``node_boot_seconds`` (simulated) after its launch,
reads its registration entry from the emulated plan bucket as ``node-start`` does (asking again every 5 s for at
most ``registration_wait_seconds``) and starts the node's real slurmd (25.11, built from ../shared/slurm/) with
``--conf topology=...``, or without one. The backend publishes an entry for each running instance of a plan and
sends the head node that plan's bundle, listing the nodes with entries as ``registering``; the head node writes
the files and leaves those still powering up to their slurmd.

Per booting node, measured on slurmctld itself: where it served the node just before its slurmd started and
just after it registered. "Placed at registration": the node was not yet where its entry says when its slurmd
started and was there as it registered (latency from registration 0 s). "Placed by the head node first": it was
there already, so a controller write by topokeeper (an ``scontrol update`` or a reconfigure) placed it: the
figure the goal wants at 0 for nodes with entries. A node without an entry in time registers unplaced, and its
latency from registration is the time until the live topology first showed it (simulated seconds, observed
after each head-node write). slurmd runs in wall time while the simulator's clock jumps over idle time.

Run (as root, one run at a time on the chroots: under flock /tmp/slurm-tests.lock):
    .venv/bin/python -m bench.registration [--out FILE] [--no-doc]; or --records FILE to write the section
    from an earlier run's record.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from bench.latency import _seconds
from bench.performance_doc import ROOT, machine, write_section
from topokeeper.sim.booting_nodes import Boot
from topokeeper.sim.latency import percentile
from topokeeper.sim.scenario import Scenario, load_scenario
from topokeeper.sim.simulator import play
from topokeeper.sim.world import running

SCENARIO = ROOT / "bench" / "scenarios" / "parallelcluster-registration-600.yaml"
OUT = ROOT / "out" / "bench" / "registration.json"
# Issue 32's goal for the nodes whose entry was there before their slurmd started.
P50_GOAL, MAX_GOAL = 0.0, 5.0


def slurmd_memory() -> dict[str, int]:
    """The running slurmd processes and their memory (MB): RSS summed (shared pages counted in each), and PSS
    (shared pages split among them): what 600 of them cost this machine."""
    count = rss = pss = 0
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            if (process / "comm").read_text().strip() != "slurmd":
                continue
            for line in (process / "smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                rss += int(value.split()[0]) if key == "Rss" else 0
                pss += int(value.split()[0]) if key == "Pss" else 0
        except (OSError, ValueError, IndexError):
            continue
        count += 1
    return {"slurmd": count, "rss_mb": rss // 1024, "pss_mb": pss // 1024}


def _from_registration(boot: Boot, appeared: float | None) -> float | None:
    """Seconds from the node's registration to its placement (0 when it was placed by then)."""
    if boot.placed_at_registration or boot.placed_by_head_node_first:
        return 0.0
    if appeared is None or boot.slurmd_started_at is None:
        return None
    return round(max(0.0, appeared - boot.slurmd_started_at), 3)


def _summary(values: list[float | None]) -> dict[str, Any]:
    placed = [value for value in values if value is not None]
    return {
        "nodes": len(values),
        "unplaced": len(values) - len(placed),
        "p50": percentile(placed, 0.5),
        "max": max(placed) if placed else None,
    }


def scenario_with(dynamic: int | None) -> Scenario:
    """The story, or the same with ``dynamic`` nodes powered up over the same 5 minutes (16 more stay down)."""
    scenario = load_scenario(SCENARIO)
    if dynamic is None:
        return scenario
    document = scenario.model_dump(mode="json")
    group = next(g for g in document["cluster"]["instance_groups"] if g.get("dynamic"))
    group["dynamic"] = dynamic + 16
    for step in document["steps"]:
        if step.get("scale"):
            step["scale"]["to"] = group["count"] + dynamic
    return Scenario.model_validate(document)


def measure(dynamic: int | None = None) -> dict[str, Any]:
    scenario = scenario_with(dynamic)
    started = time.monotonic()
    with running(scenario, head_node="chroot") as world:
        result = play(world, scenario, lambda _: None)
        memory = slurmd_memory()  # every booted node's slurmd still runs
        assert world.booting is not None
        boots = list(world.booting.boots)
    scale = next(step for step in result.steps if step.step == "scale")
    launched = {**scale.node_latencies}  # name -> seconds from launch to the live topology
    routes: dict[str, set[str]] = {}
    for step in result.steps[1:]:  # after the creation, which places the powered-down nodes in no-topology
        for audit in step.audit_records:
            for route, nodes in audit["placed_by"].items():
                routes.setdefault(route, set()).update(nodes)
    with_entry = [boot for boot in boots if boot.entry is not None]
    rest = [boot for boot in boots if boot.entry is None]

    def appeared(boot: Boot) -> float | None:
        seconds = launched.get(boot.node)
        return None if seconds is None else boot.resumed_at + seconds

    return {
        "scenario": SCENARIO.name + ("" if dynamic is None else f" with {dynamic} dynamic nodes powered up"),
        "head_node": result.head_node,
        "booted": len(boots),
        "with_entry": len(with_entry),
        "placed_at_registration": sum(1 for boot in with_entry if boot.placed_at_registration),
        "placed_by_head_node_first": sum(1 for boot in with_entry if boot.placed_by_head_node_first),
        "with_entry_elsewhere": sum(1 for b in with_entry if b.leaf_after_registration != b.entry_leaf),
        "entry_latency": _summary([_from_registration(boot, appeared(boot)) for boot in with_entry]),
        "rest_latency": _summary([_from_registration(boot, appeared(boot)) for boot in rest]),
        "rest_errors": sorted({boot.entry_error or "none in time" for boot in rest}),
        "routes": {route: len(nodes & {boot.node for boot in boots}) for route, nodes in sorted(routes.items())},
        "writes": sum(step.head_node_writes for step in result.steps if step.step != "create"),
        "reconfigures": sum(step.reconfigures for step in result.steps if step.step != "create"),
        "memory": memory,
        "simulated_seconds": round(result.steps[-1].ended_at - result.steps[0].started_at, 1),
        "wall_seconds": round(time.monotonic() - started, 1),
    }


def goals(entry: dict[str, Any]) -> list[tuple[str, bool]]:
    latency = entry["entry_latency"]
    if latency["p50"] is None:
        return [("a node with an entry placed", False)]
    checks = [
        ("p50 from registration", latency["p50"], P50_GOAL),
        ("max from registration", latency["max"], MAX_GOAL),
        ("controller writes for nodes with entries", entry["placed_by_head_node_first"], 0),
        ("nodes with entries not placed", latency["unplaced"] + entry["with_entry_elsewhere"], 0),
    ]
    return [
        (f"{name} <= {limit:g}" + ("" if value <= limit else f" ({value:g})"), value <= limit)
        for name, value, limit in checks
    ]


def section(entry: dict[str, Any]) -> str:
    entries, rest = entry["entry_latency"], entry["rest_latency"]
    memory = entry["memory"]
    rows = [
        ("dynamic nodes booted (a real slurmd each)", entry["booted"]),
        ("with their entry before slurmd started", entry["with_entry"]),
        ("of which placed at registration", entry["placed_at_registration"]),
        ("of which placed by the head node first (a controller write)", entry["placed_by_head_node_first"]),
        ("of which not where their entry says after registering", entry["with_entry_elsewhere"]),
        (
            "with an entry: latency from registration p50 / max (s)",
            f"{_seconds(entries['p50'])} / {_seconds(entries['max'])}",
        ),
        ("without an entry in time (the rest)", rest["nodes"]),
        (
            "the rest: latency from registration p50 / max (s), not placed",
            f"{_seconds(rest['p50'])} / {_seconds(rest['max'])}, {rest['unplaced']}",
        ),
        ("audit placed_by over the booted nodes", ", ".join(f"{k} {v}" for k, v in entry["routes"].items())),
        ("head-node writes / reconfigures after the creation", f"{entry['writes']} / {entry['reconfigures']}"),
        ("slurmd processes, RSS / PSS (MB)", f"{memory['slurmd']}, {memory['rss_mb']} / {memory['pss_mb']}"),
        ("simulated s / wall s", f"{entry['simulated_seconds']} / {entry['wall_seconds']}"),
    ]
    met = ", ".join(f"{goal}: {'met' if ok else 'NOT met'}" for goal, ok in goals(entry))
    return "\n".join(
        [
            "## Registration: nodes placed as they register (Slurm 25.11)",
            "",
            f"Generated by `bench/registration.py` (`make bench`) on {machine()}.",
            f"Head node: {entry['head_node']}. This run: {entry['scenario']}, {entry['booted']} dynamic nodes booted.",
            "",
            *"\n\n".join((__doc__ or "").split("\n\n")[1:3]).splitlines(),
            "",
            "| figure | value |",
            "|---|---:|",
            *(f"| {label} | {value} |" for label, value in rows),
            "",
            f"Goals (issue 32): {met}.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-doc", action="store_true", help="print, but do not write docs/performance.md")
    parser.add_argument("--out", type=Path, default=OUT, help="where the run's record goes (JSON)")
    parser.add_argument("--records", type=Path, help="render this record instead of running")
    parser.add_argument("--dynamic", type=int, help="power up this many dynamic nodes instead of 600")
    args = parser.parse_args()
    if args.records:
        print(f"wrote {write_section('registration', section(json.loads(args.records.read_text())))}")
        return
    logging.disable(logging.CRITICAL)
    entry = measure(args.dynamic)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(entry, indent=2) + "\n")
    print(json.dumps(entry))
    if not args.no_doc:
        print(f"wrote {write_section('registration', section(entry))}")


if __name__ == "__main__":
    main()
