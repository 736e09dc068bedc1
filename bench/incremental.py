"""Incremental (live node updates, issue 27) against whole-file applies (a reconfigure each), side by side on the
real slurmctld 26.05, with a probe of slurmctld's responsiveness during each run.

Each story (bench/latency.py's 1,000-node rolling scale-up over 5 minutes and 1,000-node burst in one minute,
HyperPod-style; a ParallelCluster-style rolling scale-up of 900 dynamic nodes,
bench/scenarios/parallelcluster-1000.yaml) runs once per report delay in each mode. "incremental" is topokeeper
as it ships: the head node applies a plan that only places, moves or removes nodes by ``scontrol update
NodeName= Topology=``, and the backend holds such writes back by neither the write interval nor max_wait_seconds
(the debounce waits at most 15 s for a quiet spell, LIVE_MAX_WAIT_SECONDS). "whole-file" is the
same topokeeper with the head node's live path switched off (TOPOKEEPER_APPLIER_WHOLE_FILE=1): every write is a
reconfigure, and the backend, seeing the head node reconfigure, paces as for reconfigures, as before issue 27 (its
first write after the creation goes at the live pace, before the result that tells).

The probe: while the steps after the cluster's creation play, a thread runs ``scontrol ping`` and ``squeue``
alternately every 100 ms of wall time against the run's slurmctld (inside its chroot), and counts the RPCs that
failed (a non-zero exit, or ``DOWN``) or took longer than 1 s. The simulator's clock is virtual: it jumps over the
idle simulated time, while slurmctld and the probe run in wall time. A reconfigure's stall is wall time too, so
the probe sees every one of them whole; what it cannot give is a rate per simulated minute (a run's wall time is
shorter than its simulated time). Each probe call is a process started in the chroot (nsenter, chroot, the client),
so its time includes that start, on a shared 2-core machine: the slow count is an upper bound.

Run (as root, one run at a time on the chroots: under flock /tmp/slurm-tests.lock):
    .venv/bin/python -m bench.incremental [--stories rolling,burst] [--delays 0,30] [--modes incremental,whole-file]
        [--out FILE] [--no-doc]; or --records FILE... to write the section from earlier runs' records.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

from bench.latency import STORIES as LATENCY_STORIES
from bench.latency import _seconds, api_floor_seconds, bench_arguments, record, run_bench, scenario_with_delay
from bench.performance_doc import ROOT, machine
from topokeeper.headnode.config_dir import WHOLE_FILE_ENV
from topokeeper.sim.head_node import ChrootHeadNode
from topokeeper.sim.simulator import StepResult, play
from topokeeper.sim.world import running

# bench/latency.py's HyperPod-style stories, and a ParallelCluster-style one (dynamic nodes bound as they power up).
STORIES = {**LATENCY_STORIES, "parallelcluster": ROOT / "bench" / "scenarios" / "parallelcluster-1000.yaml"}
MODES = ("incremental", "whole-file")
PROBE_PERIOD = 0.1
SLOW_RPC_SECONDS = 1.0
PROBE_TIMEOUT = 10.0
MAX_ERRORS_KEPT = 3
PROBES = (("scontrol", "ping"), ("squeue", "--noheader"))
# Issue 27's goals: rolling at delay 0 (p50, max, reconfigures after the first write), at 30 s (p50); the burst
# (max beyond the API floor, deliveries); the incremental runs' failed probe RPCs.
ROLLING_P50, ROLLING_MAX, ROLLING_P50_DELAYED, BURST_BEYOND_FLOOR, BURST_WRITES = 20.0, 45.0, 45.0, 30.0, 2
OUT = ROOT / "out" / "bench" / "incremental.json"


class Probe:
    """``scontrol ping`` / ``squeue`` every PROBE_PERIOD s of wall time against one chroot's slurmctld."""

    def __init__(self, head: ChrootHeadNode) -> None:
        self.head = head
        self.samples: list[tuple[float, bool]] = []  # (seconds, failed)
        self.errors: list[str] = []  # the first failures' messages
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = time.monotonic()
        while not self._stop.is_set():
            argv = PROBES[len(self.samples) % len(PROBES)]
            started = time.monotonic()
            try:
                done = subprocess.run(
                    self.head.controller.command(*argv),
                    capture_output=True,
                    text=True,
                    timeout=PROBE_TIMEOUT,
                    check=False,
                )
                failed = done.returncode != 0 or "DOWN" in done.stdout
                why = f"{' '.join(argv)}: exit {done.returncode}: {' | '.join((done.stderr or done.stdout).split())}"
            except subprocess.TimeoutExpired:
                failed, why = True, f"{' '.join(argv)}: no answer in {PROBE_TIMEOUT:g} s"
            if failed and len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(why[:200])
            self.samples.append((time.monotonic() - started, failed))
            tick += PROBE_PERIOD
            self._stop.wait(max(0.0, tick - time.monotonic()))
            tick = max(tick, time.monotonic() - PROBE_PERIOD)  # behind after a slow call: no burst to catch up

    def summary(self) -> dict[str, Any]:
        seconds = sorted(s for s, _ in self.samples)

        def at(q: float) -> float | None:
            return round(seconds[min(len(seconds) - 1, int(q * len(seconds)))], 3) if seconds else None

        return {
            "rpcs": len(self.samples),
            "failed": sum(1 for _, failed in self.samples if failed),
            "slow": sum(1 for s, failed in self.samples if s > SLOW_RPC_SECONDS and not failed),
            "p50": at(0.5),
            "p99": at(0.99),
            "max": round(seconds[-1], 3) if seconds else None,
            "errors": self.errors,
        }


def _whole_file_script(self: ChrootHeadNode) -> list[str]:
    """ChrootHeadNode.script_command with the head node's live path switched off."""
    return self.controller.command("env", f"{WHOLE_FILE_ENV}=1", "sh", "-s", login=False)


def measure(story: str, delay: float, mode: str) -> dict[str, Any]:
    scenario = scenario_with_delay(STORIES[story], delay)
    started = time.monotonic()
    patch = mock.patch.object(ChrootHeadNode, "script_command", _whole_file_script)
    with patch if mode == "whole-file" else contextlib.nullcontext(), running(scenario, head_node="chroot") as world:
        assert isinstance(world.head, ChrootHeadNode)
        probe = Probe(world.head)
        created: list[float] = []

        def on_step(step: StepResult) -> None:
            if step.step == "create":  # the cluster's first write is a reconfigure in either mode
                created.append(step.ended_at)
                probe.start()

        try:
            result = play(world, scenario, lambda _: None, on_step)
        finally:
            probe.stop()
        # Counted after the creation, as the writes and reconfigures are (the creation's steps' own are not).
        applies = [e["text"] for e in world.timeline if e["kind"] == "apply" and created and e["t"] > created[0]]
    entry = record(story, delay, False, result, time.monotonic() - started)
    live = sum(1 for text in applies if "placed live" in text)
    refused = sum(1 for text in applies if "head node: applied" not in text and "head node: unchanged" not in text)
    return {**entry, "mode": mode, "live_applies": live, "refused_applies": refused, "probe": probe.summary()}


def goals(entry: dict[str, Any]) -> list[tuple[str, bool]]:
    """Issue 27's goals that apply to an incremental run; the whole-file runs are the baseline beside them."""
    if entry["mode"] != "incremental":
        return []
    if entry["max"] is None:
        return [("every node placed", False)]
    checks: list[tuple[str, float, float]] = [("failed probe RPCs", entry["probe"]["failed"], 0)]
    if entry["story"] == "parallelcluster":
        checks.append(("refused applies (stale_bindings and others)", entry.get("refused_applies", 0), 0))
    if entry["story"] != "burst" and not entry["topology_report_delay_seconds"]:
        checks += [("p50", entry["p50"], ROLLING_P50), ("max", entry["max"], ROLLING_MAX)]
        checks.append(("reconfigures after the first write", entry["reconfigures"], 0))
    elif entry["story"] != "burst":
        checks.append(("p50", entry["p50"], ROLLING_P50_DELAYED))
    else:
        floor = entry["api_floor_seconds"] + entry["topology_report_delay_seconds"]
        checks += [
            ("max - API floor", entry["max"] - floor, BURST_BEYOND_FLOOR),
            ("writes", entry["writes"], BURST_WRITES),
        ]
    return [
        (f"{name} <= {limit:g}" + ("" if value <= limit else f" ({value:g})"), value <= limit)
        for name, value, limit in checks
    ]


FIGURES = (
    ("head-node writes", lambda e: e["writes"]),
    ("of which applied live (no reconfigure)", lambda e: e["live_applies"]),
    ("reconfigures", lambda e: e["reconfigures"]),
    ("applies refused or failed", lambda e: e.get("refused_applies", "-")),
    ("p50 latency (s)", lambda e: _seconds(e["p50"])),
    ("p99 latency (s)", lambda e: _seconds(e["p99"])),
    ("max latency (s)", lambda e: _seconds(e["max"])),
    ("nodes placed / not placed", lambda e: f"{e['nodes']} / {e['unplaced']}"),
    ("probe RPCs (every 100 ms, wall time)", lambda e: e["probe"]["rpcs"]),
    ("failed probe RPCs", lambda e: e["probe"]["failed"]),
    (f"probe RPCs slower than {SLOW_RPC_SECONDS:g} s", lambda e: e["probe"]["slow"]),
    ("probe RPC p50 / p99 / max (s)", lambda e: " / ".join(str(e["probe"][k]) for k in ("p50", "p99", "max"))),
    ("first failed probe RPCs", lambda e: "; ".join(e["probe"].get("errors", [])).replace("|", "/") or "-"),
    ("simulated s / wall s", lambda e: f"{e['simulated_seconds']} / {e['wall_seconds']}"),
)


def section(entries: list[dict[str, Any]]) -> str:
    lines = [
        "## Incremental against whole-file applies",
        "",
        f"Generated by `bench/incremental.py` (`make bench`) on {machine()}.",
        f"Head node: {entries[0]['head_node'] if entries else '-'}.",
        "",
        *"\n\n".join((__doc__ or "").split("\n\n")[1:3]).splitlines(),
        "",
        "Counted after the cluster's creation (its first write is a reconfigure in both modes). Latency: as in the",
        "Latency section, from a node's launch to its first appearance in the live topology, simulated seconds.",
        "",
    ]
    titles = {
        "rolling": "Rolling scale-up (HyperPod-style): 1,000 nodes over 5 minutes",
        "burst": "Burst (HyperPod-style): 1,000 nodes in 1 minute",
        "parallelcluster": "Rolling scale-up (ParallelCluster-style): 900 dynamic nodes powered up over 5 minutes",
    }
    for story in STORIES:
        for delay in sorted({e["topology_report_delay_seconds"] for e in entries if e["story"] == story}):
            runs = {
                e["mode"]: e for e in entries if e["story"] == story and e["topology_report_delay_seconds"] == delay
            }
            shown = [runs.get(mode) for mode in MODES]
            lines += [f"### {titles[story]}, report delay {delay:.0f} s", ""]
            lines += ["| figure | " + " | ".join(MODES) + " |", "|---|" + "---:|" * len(MODES)]
            for label, value in FIGURES:
                lines.append(f"| {label} | " + " | ".join("-" if e is None else str(value(e)) for e in shown) + " |")
            for entry in shown:
                if entry is not None and goals(entry):
                    met = ", ".join(f"{goal}: {'met' if ok else 'NOT met'}" for goal, ok in goals(entry))
                    floor = api_floor_seconds(entry["nodes"] + entry["unplaced"])
                    lines += ["", f"Goals ({entry['mode']}; API floor {floor} s): {met}."]
            lines.append("")
    return "\n".join([*lines, *NOTES])


# Why the figures are what they are (worked out on 2026-12-04 from the runs above and runs of the same stories with
# other live waits); the arithmetic uses the emulator's costs: one DescribeInstanceTopology call a second, a sweep
# of a type 100 instances a page, SSM's delivery 2 s.
NOTES = [
    "### What the goals cost",
    "",
    "- A write the head node applies live waits for the debounce's quiet spell at most 15 s",
    "  (`LIVE_MAX_WAIT_SECONDS`), not `max_wait_seconds` (30 s). A rolling scale-up is never quiet for the debounce,",
    "  so with 30 s every write waited the whole max wait plus the write before it (a write every 33-36 s), and a node",
    "  about half of that plus its cycle's DescribeInstanceTopology calls (1-5 s) and the delivery: p50 23.2 s.",
    "  A node waits about half the live wait, plus EC2's report delay and its cycle's calls: with 20 s the",
    "  ParallelCluster-style run at delay 30 s had a p50 of 46.0 s (goal 45), with 15 s 43.7 s (2026-12-04, both",
    "  after the emulator fix below). The price: about four commands a minute while changes last, not three.",
    "- The burst's \"<= 2 deliveries\" and the rolling scale-up's p50 at delay 30 s cannot both be met by a pacing",
    "  that does not wait longer when nodes arrive faster. Two deliveries for a burst of 60 s leave one while",
    "  nodes still arrive (the other must read the facts after the last launch): while changes keep coming,",
    "  deliveries must be 30 s or more apart (a live wait W gives one every W plus its cycle; a second one before",
    "  60 s makes three). A rolling scale-up also keeps changes coming, and at delay 30 s a node waits about the",
    "  delay, half the spacing and its cycle (30 + W / 2 + 3 s): a p50 <= 45 s needs W <= 24 s. Measured:",
    "  ParallelCluster-style at delay 30 s, W = 20 s gave a p50 of 46.0 s; the burst at delay 0, W = 30 s gave",
    "  2 deliveries, 27 s 3, 24 s 3, 20 s 3, 15 s (as shipped) 4. A wait that grows with the arrival rate would",
    "  meet both only by being fitted to these two stories, and would hold a faster scale-up's nodes back longer.",
    "- The burst's max is the other side of its deliveries. With 2, the node launched just after the first read",
    "  (at R1) waits for the second: today that read comes after the debounce's quiet (10 s after the last",
    "  launch) and sweeps the type (11 pages at 1,000 instances, 11 s), then the delivery (2 s): 83 - R1 s,",
    "  while the first node waits R1 + R1 / 6 (its sweep) + 2 s. The best R1 gives about 45 s, 35 s beyond the",
    "  floor (measured with W = 30 s: 48.3 s). Meeting 30 s beyond it with 2 deliveries would also need the",
    "  facts read while the burst arrives (so a delivery costs no sweep) and its end told sooner than the",
    "  debounce. topokeeper keeps the latency goals (the runs above), its deliveries within the SSM",
    "  bound (`MIN_LIVE_WRITE_SECONDS`: at most 6 commands a minute, one in flight).",
    "- At delay 30 s the burst's later deliveries are topology retries: each reconcile that finds newly reported",
    "  nodes writes them live.",
    "- The `no-topology` placeholder switch leaving the plan (delay 30 s: the last node EC2 had not reported;",
    "  ParallelCluster-style: the last powered-down dynamic node powered up) cost one reconfigure until 2026-12-04",
    "  (`topology tree-q1 removes switches (no-topology)`). Fixed: slurmctld keeps a switch emptied by `scontrol",
    "  update` (it deletes none at run time) until its next reconfigure, so the plan is applied live and the",
    "  read-back passes over the empty switch (headnode/incremental.py).",
    "- Until 2026-12-04 the emulator started an EC2 instance's report delay at the first DescribeInstanceTopology",
    "  that saw it, not at its launch (HyperPod nodes were right): a ParallelCluster-style node waited the delay",
    "  plus the time to topokeeper's first question, up to a live wait more (p50 55.3 s at delay 30 s). It now",
    "  counts from LaunchTime, as the Latency section defines the delay.",
    "- ParallelCluster-style: the re-bound-node deferral works (no apply refused). An apply that deferred a node",
    "  marks its partition to be written again even when the next plan is the same (`deferred_partitions`); that",
    "  follow-up is paced as the live write the head node makes of it, while a drift repair (`repair_partitions`)",
    "  keeps the reconfigure pacing. Before that split (2026-12-04 20:04) the follow-ups were paced as repairs, the",
    "  writes came 60-65 s apart though each was applied live: p50 34.3 s, max 68.7 s at delay 0 (68.3 s and",
    "  108.7 s at delay 30 s).",
    "- The probe's failed RPCs before 2026-12-04 were no slurmctld disruption: the simulator's HyperPod stand-in",
    "  rewrote slurm.conf in place (its NodeName lines, with each membership change, before a head-node command),",
    "  and a client reading it meanwhile failed on `slurm.conf is empty` or a cut hostlist line. It now replaces",
    "  the file whole. (That stand-in's own `scontrol reconfigure` after each such rewrite is HyperPod's, not",
    "  topokeeper's, and is not counted in the reconfigures above.)",
    "",
]


def _line(entry: dict[str, Any]) -> str:
    return (
        f"{entry['story']:<8} delay {entry['topology_report_delay_seconds']:>3.0f}s {entry['mode']:<12}"
        f" p50 {_seconds(entry['p50']):>6} max {_seconds(entry['max']):>6} writes {entry['writes']:>3}"
        f" live {entry['live_applies']:>3} reconfigures {entry['reconfigures']:>3} probe {json.dumps(entry['probe'])}"
        f" ({entry['wall_seconds']} s wall)"
    )


def main() -> None:
    parser = bench_arguments(__doc__ or "", STORIES, OUT)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()

    def runs(story: str, delay: float) -> Iterator[dict[str, Any]]:
        for mode in args.modes.split(","):
            yield measure(story, delay, mode)

    run_bench(args, "incremental", section, runs, _line)


if __name__ == "__main__":
    main()
