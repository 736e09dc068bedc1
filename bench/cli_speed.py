"""The CLI's own speed: every command's ``--help`` and ``plan`` at 10,000 nodes, each the whole process.

Goal (issue 30 item 11): each offline command answers ``--help`` in under 0.25 s and ``plan`` at 10,000 nodes
takes under 0.4 s on this 2-core machine. Stated next to the figures, never asserted (the machine is shared).

Run: .venv/bin/python -m bench.cli_speed [--runs 15] [--nodes 10000] [--no-doc]
Each command line runs ``--runs`` times as a child process of the installed ``topokeeper`` script (after one
uncounted run that writes its bytecode, as an installed package has it): wall time (median and 90th percentile)
and CPU time (user + system, median, from wait4). Writes the "CLI" section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.performance_doc import machine, write_section
from bench.plan_scaling import CHILD_ENV, TOPOKEEPER, run_plan, write_snapshot

GOAL_HELP_SECONDS, GOAL_PLAN_SECONDS = 0.25, 0.4
# Every command line, and whether it is offline (needs no AWS call: the goal is for these).
COMMAND_LINES: tuple[tuple[tuple[str, ...], bool], ...] = (
    ((), True),
    (("plan",), True),
    (("show",), True),
    (("head-node-program",), True),
    (("hostfile",), True),
    (("nccl-check",), True),
    (("cost",), True),
    (("verify",), True),
    (("kueue",), True),
    (("labels",), True),
    (("simulate",), True),
    (("demo",), True),
    (("emulator",), True),
    (("login", "install-script"), True),
    (("agent", "install-script"), True),  # KMS only with --signing-key or --deployment
    (("snapshot",), False),
    (("diff",), False),
    (("drift",), False),
    (("audit",), False),
    (("apply",), False),
    (("preflight",), False),
    (("login", "rotate-host-keys"), False),
    (("login", "install-run-command"), False),
)


def run_help(words: tuple[str, ...]) -> tuple[float, float]:
    """Wall and CPU seconds of one ``topokeeper WORDS --help``."""
    started = time.perf_counter()
    child = subprocess.Popen([str(TOPOKEEPER), *words, "--help"], stdout=subprocess.DEVNULL, env=CHILD_ENV)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"topokeeper {' '.join(words)} --help failed")
    return wall, usage.ru_utime + usage.ru_stime


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


@dataclass(frozen=True)
class Figures:
    median: float  # wall seconds
    p90: float
    cpu: float  # median CPU seconds

    @classmethod
    def of(cls, runs: list[tuple[float, ...]]) -> Figures:
        walls, cpus = [run[0] for run in runs], [run[1] for run in runs]
        return cls(statistics.median(walls), p90(walls), statistics.median(cpus))

    def text(self) -> str:
        return f"{self.median:>7.3f} {self.p90:>7.3f} {self.cpu:>7.3f}"


@dataclass(frozen=True)
class Row:
    words: tuple[str, ...]
    offline: bool
    figures: Figures
    imports: float


def import_seconds(words: tuple[str, ...]) -> float:
    """Seconds ``topokeeper WORDS --help`` spends importing (``python -X importtime``, every module's own time)."""
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", str(TOPOKEEPER), *words, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=CHILD_ENV,
    )
    lines = [line for line in completed.stderr.splitlines() if line.startswith("import time:") and "[us]" not in line]
    return sum(int(line.split("|")[0].removeprefix("import time:")) for line in lines) / 1e6


def _goal(offline: bool, value: float, goal: float) -> str:
    if not offline:
        return "- (reaches AWS)"
    return "met" if value < goal else "missed"


def section(rows: list[Row], plan: Figures, nodes: int, runs: int, load: str) -> str:
    lines = [
        "## CLI",
        "",
        f"Measured on {machine()}, by `bench/cli_speed.py`; load average when it started: {load} (the machine is"
        " shared: wall time runs above CPU time when it is busy). Each command line is the whole process of the"
        f" installed `topokeeper` script, {runs} runs after one that writes the bytecode; wall time median and 90th"
        f" percentile, CPU time median. Goal (issue 30): every offline command's `--help` under {GOAL_HELP_SECONDS:g}"
        f" s and `plan` at 10,000 nodes under {GOAL_PLAN_SECONDS:g} s, in wall time (the goal column reads the"
        " median). Imports: the modules' own times in one `python -X importtime` run (which adds its own cost).",
        "",
        "| command | offline | wall median s | wall p90 s | CPU s | imports s | goal |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        shown, figures = " ".join(("topokeeper", *row.words, "--help")), row.figures
        lines.append(
            f"| `{shown}` | {'yes' if row.offline else 'no'} | {figures.median:.3f} | {figures.p90:.3f} |"
            f" {figures.cpu:.3f} | {row.imports:.3f} | {_goal(row.offline, figures.median, GOAL_HELP_SECONDS)} |"
        )
    lines.append(
        f"| `topokeeper plan` at {nodes:,} nodes | yes | {plan.median:.3f} | {plan.p90:.3f} | {plan.cpu:.3f}"
        f" | - | {_goal(True, plan.median, GOAL_PLAN_SECONDS) if nodes == 10_000 else '-'} |"
    )
    lines += [
        "",
        "How: `cli.main.COMMANDS` lists every command with its line of `--help` and the function that registers it,"
        " so the parser is built with only the command run imported (`--help` alone imports no command);"
        " the offline commands import pydantic, the planner and the file readers where they run, not for their"
        " `--help`. `tests/unit/test_cli_imports.py` checks that no pydantic, boto3, botocore, Powertools, moto or"
        " other command is loaded by those `--help` runs (it reads `sys.modules`, it times nothing), and that an"
        " offline run loads no AWS SDK (botocore's errors are translated only when a command loaded it). Before"
        " this (2026-12-04, this bench on the same machine at a load of 2.3, wall medians): `topokeeper --help`"
        " 0.53 s, the offline commands' `--help` 0.19-0.42 s (`cost` 0.42 s, `verify` 0.38 s), as each imported"
        " every command module, or pydantic and the planner, or boto3; `plan` at 10,000 nodes 0.315 s.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--no-doc", action="store_true", help="print only; do not write docs/performance")
    args = parser.parse_args()
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    rows: list[Row] = []
    print(f"{'command':<40} {'median':>7} {'p90':>7} {'CPU':>7} {'imports':>7}")
    for words, offline in COMMAND_LINES:
        run_help(words)  # writes the bytecode
        row = Row(words, offline, Figures.of([run_help(words) for _ in range(args.runs)]), import_seconds(words))
        rows.append(row)
        print(f"{' '.join(words) or '(none)':<40} {row.figures.text()} {row.imports:>7.3f}")
    with tempfile.TemporaryDirectory(prefix="cli-bench-") as scratch:
        directory = Path(scratch)
        snapshot = write_snapshot(args.nodes, directory)
        run_plan(snapshot, directory / "out-warm-up")
        plan = Figures.of([run_plan(snapshot, directory / f"out-{attempt}")[:2] for attempt in range(args.runs)])
    print(f"{f'plan at {args.nodes:,} nodes':<40} {plan.text()}")
    if not args.no_doc:
        print(f"wrote {write_section('cli', section(rows, plan, args.nodes, args.runs, load))}")


if __name__ == "__main__":
    main()
