"""Lambda: each handler's cold import in Python 3.14, the layer assets zipped, and the applier's cost on the head node.

Run: .venv/bin/python -m bench.lambda_cold_start [--runs 15] [--nodes 20000] [--no-slurm]
Writes docs/performance/lambda.md (generated, never edited by hand: `make bench`).

- Cold import: a fresh python3.14 (the interpreter the layer build compiles with, infra.layers.find_layer_python)
  runs ``import handler`` with the function's asset, the core layer and a Powertools stand-in on its path, every
  file dated as CDK zips it and no bytecode written (PYTHONDONTWRITEBYTECODE, as on Lambda's read-only /opt).
  The OS file cache is warm: Lambda's first read of its own disk is not measured. The stand-in is the pinned
  requirements-powertools.txt for this machine; whether the AWS-managed layer ships bytecode is not known here, so
  it is measured both ways.
- Sizes: each asset zipped as CDK does (deflate at zlib's default level, every entry dated 1980-01-01).
- Head node: the applier (with the scontrol calls it makes) against the real slurmctld in the sid chroot with
  ``--nodes`` nodes, its CPU time and peak resident memory from wait4's rusage (root: chroot).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from bench.child_usage import wait_measured
from bench.performance_doc import ROOT, machine, write_section
from infra.constants import CORE_LAYER_SOURCE, FUNCTION_ASSET_EXCLUDE, FUNCTION_NAMES, FUNCTIONS_DIR
from infra.layers import LayerPython, build_core_layer, find_layer_python
from tests.infra.lambda_layout import copy_as_unzipped, powertools_standin
from topokeeper.sim.slurm_chroot import ensure_chroot

GOAL_IMPORT_MS = 300
GOAL_CORE_ZIP_BYTES = 5 * 1024 * 1024
CDK_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def asset_files(directory: Path, exclude: tuple[str, ...] = ()) -> list[Path]:
    """The files of ``directory`` an asset keeps, as CDK's glob exclusion picks them (minimatch, matchBase): a
    pattern without a slash matches any name of the path below ``directory`` (not above it), and a wildcard
    matches no leading dot."""

    def excluded(name: str) -> bool:
        return any(fnmatch(name, p) and (p.startswith(".") or not name.startswith(".")) for p in exclude)

    files = (p for p in directory.rglob("*") if p.is_file())
    return sorted(p for p in files if not any(excluded(name) for name in p.relative_to(directory).parts))


def zipped_size(directory: Path, exclude: tuple[str, ...] = ()) -> int:
    """The asset's zip as CDK writes it (yazl: deflate, zlib's default level, a fixed date), without the files
    and folders the asset excludes (glob patterns, as the construct gives them)."""
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "asset.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
            for path in asset_files(directory, exclude):
                entry = zipfile.ZipInfo(path.relative_to(directory).as_posix(), CDK_ZIP_DATE)
                zipped.writestr(entry, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)
        return archive.stat().st_size


# What Lambda's Python runtime has imported when it imports the handler (awslambdaric: bootstrap.py's imports, and
# the ThreadPoolExecutor of lambda_runtime_client.py); the figures start after them, as a cold start's import does.
RUNTIME_PRELOAD = "import importlib, json, logging, os, sys, time, traceback\nimport concurrent.futures\n"
PRELOADED = "-- the runtime's modules imported --"


def _import_program(path: list[Path], statement: str = "import handler", preload: str = RUNTIME_PRELOAD) -> str:
    return (
        f"import sys, time; sys.path[:0] = {[str(p) for p in path]!r}\n"
        f"{preload}sys.stderr.write({PRELOADED!r} + '\\n')\n"
        "cpu, wall = time.process_time(), time.perf_counter()\n"
        f"{statement}\n"
        "sys.stdout.write(f'{time.process_time() - cpu} {time.perf_counter() - wall}')\n"
    )


# The libraries alone: every module of another distribution that ``import handler`` loads, in the order it loaded
# them, with the standard library they import (what is left of a handler's figure is the package's own).
_LOADED_LIBRARIES = (
    RUNTIME_PRELOAD + "before = set(sys.modules)\n"
    "import handler\n"
    "import json\n"
    "skip = {'handler', 'topokeeper', *sys.stdlib_module_names}\n"
    "print(json.dumps([m for m in sys.modules if m not in before and m.split('.')[0] not in skip]))\n"
)


def libraries_statement(python: LayerPython, path: list[Path]) -> str:
    """A statement importing the libraries ``import handler`` loads, without the handler or the package."""
    program = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}\n" + _LOADED_LIBRARIES
    ran = python.run("-c", program, environment={"PYTHONDONTWRITEBYTECODE": "1"})
    if ran.returncode != 0:
        raise RuntimeError(ran.stderr[-2000:])
    modules = json.loads(ran.stdout.splitlines()[-1])
    return f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)"


def import_seconds(
    python: LayerPython, path: list[Path], runs: int, statement: str = "import handler", preload: str = RUNTIME_PRELOAD
) -> tuple[float, float]:
    """The least CPU and wall seconds of ``statement`` (``import handler``) over ``runs`` fresh interpreters: other
    work on a shared machine only ever adds to a run (a median of 5 moved +-30 ms with the machine's load)."""
    cpu, wall = [], []
    for _ in range(runs):
        program = _import_program(path, statement, preload)
        ran = python.run("-c", program, environment={"PYTHONDONTWRITEBYTECODE": "1"})
        if ran.returncode != 0:
            raise RuntimeError(ran.stderr[-2000:])
        cpu_seconds, wall_seconds = map(float, ran.stdout.split())
        cpu.append(cpu_seconds)
        wall.append(wall_seconds)
    return min(cpu), min(wall)


def import_instructions(python: LayerPython, path: list[Path]) -> int | None:
    """Instructions ``import handler`` executes (valgrind's count, the same in every run whatever the machine's
    load), without the interpreter's own start and exit; None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    counts = []
    for statement in ("pass", "import handler"):
        head = f"import os, sys; sys.path[:0] = {[str(p) for p in path]!r}\n{RUNTIME_PRELOAD}"
        program = f"{head}{statement}\nos._exit(0)\n"
        ran = subprocess.run(
            [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
             *python.command, "-S", "-c", program],
            env={"PATH": os.environ.get("PATH", os.defpath), "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        refs = next(line for line in ran.stderr.splitlines() if "I refs:" in line or "I   refs:" in line)
        counts.append(int(refs.rsplit(":", 1)[1].replace(",", "")))
    return counts[1] - counts[0]


def import_breakdown(python: LayerPython, path: list[Path]) -> Counter[str]:
    """Self time (us) by top-level package, from one ``-X importtime`` run."""
    ran = python.run("-X", "importtime", "-c", _import_program(path), environment={"PYTHONDONTWRITEBYTECODE": "1"})
    if ran.returncode != 0:
        raise RuntimeError(ran.stderr[-2000:])
    by_package: Counter[str] = Counter()
    for line in ran.stderr.split(PRELOADED, 1)[1].splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        by_package[name.split(".")[0]] += int(self_us)
    return by_package


def cold_imports(python: LayerPython, runs: int, scratch: Path) -> dict[str, Any]:
    core = build_core_layer() / "python"
    layers = {
        "core with bytecode": copy_as_unzipped(core, scratch / "core-pyc" / "python"),
        "core without": scratch / "core-py" / "python",
    }
    shutil.copytree(core, layers["core without"], ignore=shutil.ignore_patterns("__pycache__"))
    powertools = {"with": powertools_standin(python), "without": scratch / "powertools-py"}
    shutil.copytree(powertools_standin(), powertools["without"], ignore=shutil.ignore_patterns("__pycache__"))
    configurations = [
        ("without", "core without", "without"),
        ("core only", "core with bytecode", "without"),
        ("both", "core with bytecode", "with"),
    ]
    fresh = "both, nothing preloaded"
    load = os.getloadavg()[0]
    results: dict[str, Any] = {"configurations": [*(c[0] for c in configurations), fresh], "handlers": {}}
    for name in FUNCTION_NAMES:
        row = {}
        for label, core_key, powertools_key in configurations:
            path = [FUNCTIONS_DIR / name, layers[core_key], powertools[powertools_key]]
            row[label] = import_seconds(python, path, runs)
        both = [FUNCTIONS_DIR / name, layers["core with bytecode"], powertools["with"]]
        row[fresh] = import_seconds(python, both, runs, preload="")
        row["libraries"] = import_seconds(python, both, runs, libraries_statement(python, both))
        row["breakdown"] = import_breakdown(python, both).most_common(4)
        row["instructions"] = import_instructions(python, both)
        results["handlers"][name] = row
        print(name, {k: v for k, v in row.items() if k != "breakdown"}, flush=True)
    results["load"] = sorted((load, os.getloadavg()[0]))
    results["sizes"] = {
        "core layer with bytecode": zipped_size(core.parent),
        "core layer without bytecode": zipped_size(layers["core without"].parent),
        **{f"function {name}": zipped_size(FUNCTIONS_DIR / name, FUNCTION_ASSET_EXCLUDE) for name in FUNCTION_NAMES},
    }
    return results


def agent_cycles(bundle: bytes, cluster: str) -> dict[str, Any]:
    """Two cycles of the shipped agent against S3 and EventBridge in moto: the first fetches ``bundle`` and runs
    the applier (the tests' fake one, so that the agent's own cost shows), the second finds it unchanged (304)."""
    import boto3  # noqa: PLC0415 - only for this part
    from moto.server import ThreadedMotoServer  # noqa: PLC0415

    from tests.agent_support import FakeApplier, agent_command, agent_program, write_config  # noqa: PLC0415
    from topokeeper.wire import agent_bundle_key  # noqa: PLC0415

    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", **{k.lower(): v for k, v in keys.items()})
        s3.create_bucket(Bucket="topo-bundles")
        s3.put_object(Bucket="topo-bundles", Key=agent_bundle_key(cluster), Body=bundle)
        with tempfile.TemporaryDirectory() as scratch:
            config = write_config(
                Path(scratch) / "agent.json", FakeApplier(Path(scratch) / "applier"), Path(scratch) / "state",
                cluster=cluster, endpoint_url=url,
            )  # fmt: skip
            program = agent_program(Path(scratch) / "program")
            argv, environment = agent_command(program, "--config", str(config), "--once")
            environment.update(keys)
            cycles = {name: wait_measured(argv, environment)[0] for name in ("fetch and apply", "unchanged (304)")}
    finally:
        server.stop()
    return cycles


def applier_on_head_node(nodes: int) -> dict[str, Any]:
    from bench.scale import mixed_cluster  # noqa: PLC0415 - only with the chroot
    from topokeeper.contract.head_node_program import PROGRAM_NAME, write_program  # noqa: PLC0415
    from topokeeper.engine.planner import plan  # noqa: PLC0415
    from topokeeper.render.bundle import render  # noqa: PLC0415
    from topokeeper.sim.head_node import ChrootHeadNode  # noqa: PLC0415

    cluster = mixed_cluster(nodes)
    rendered = render(plan(cluster))
    head = ChrootHeadNode(cluster.slurm_version.format, "lambda-bench")
    measured: dict[str, Any] = {"nodes": nodes, "slurm": head.description}
    started = time.monotonic()
    head.start({p.name: [n.name for n in p.nodes] for p in cluster.partitions})
    measured["start_seconds"] = time.monotonic() - started
    try:
        controller = head.controller
        inner = controller.inner_dir
        bundle = json.dumps(rendered.bundle.document())
        measured["bundle_bytes"] = len(bundle)
        (head.root / inner.lstrip("/") / "bundle.json").write_text(bundle)
        write_program(head.root / inner.lstrip("/") / PROGRAM_NAME)
        for mode in ("apply", "verify"):
            argv = controller.command("python3", f"{inner}/{PROGRAM_NAME}", mode, f"{inner}/bundle.json")
            usage, stdout = wait_measured(argv)
            measured[mode] = usage | {"outcome": json.loads(stdout.strip().splitlines()[-1]).get("outcome")}
        # The reconfigure alone (the apply above ran one): slurmctld's own work is in its wall time only.
        measured["reconfigure"] = wait_measured(controller.command("scontrol", "reconfigure"))[0]
    finally:
        head.stop()
    measured["agent"] = agent_cycles(bundle.encode(), cluster.cluster_name)
    return measured


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def section(python: LayerPython, imports: dict[str, Any], head: dict[str, Any] | None, runs: int) -> str:
    sizes = imports["sizes"]
    core = sizes["core layer with bytecode"]
    lines = [
        "<!-- generated by bench/lambda_cold_start.py (make bench); do not edit -->",
        "## Lambda",
        "",
        f"Generated by `bench/lambda_cold_start.py` (`make bench`) on {machine()}. Compiled and measured with "
        f"Python {python.version} (the runtime's version; Debian's, from the sid chroot unless "
        "$TOPOKEEPER_LAYER_PYTHON or a python3.14 on PATH said otherwise).",
        "",
        f"### Cold import of each handler (`import handler`, least of {runs} fresh interpreters: CPU ms (wall ms))",
        "",
        "As Lambda's Python runtime imports a handler: after its own modules (awslambdaric's bootstrap imports "
        "importlib, json, logging, os, sys, time and traceback, and its runtime client concurrent.futures, before "
        "it imports the handler), which every figure but the last column has imported before its clock starts; "
        "the last column is the same import in an interpreter with nothing imported, as this section measured "
        "before (logging and traceback alone are ~20 ms of it under 3.14). The runtime imports a few more modules "
        "than these (decimal and datetime among them): the figures run a little high, never low. "
        "Layers as Lambda unpacks them: files dated as CDK zips them, no bytecode written. Powertools: the pinned "
        "requirements-powertools.txt for this machine, standing in for the AWS-managed layer, measured with and "
        f"without bytecode. Goal: under {GOAL_IMPORT_MS} ms. CPU time is the figure to read: this machine is shared "
        "(2 cores, several sessions), so wall time runs long. The file cache is warm (Lambda's first disk read is "
        "not in these figures), and this machine's core is not Lambda's.",
        "",
        "The import runs in Lambda's init phase, which AWS describes as getting a full vCPU for on-demand "
        'functions (for up to 10 s), whatever the memory (serverlessland.com, "Effectively running Java on '
        "Serverless\"). What the first invocation does next (building the clients) runs at the memory's share, "
        "one vCPU at 1,769 MB: ingest has 256 MB (infra/functions.py), about a seventh of one; result 1,024 MB.",
        "",
        "Each handler loads at init what its common path runs (tests/unit/test_handler_imports.py): its use case "
        "and the adapters its deps make (topokeeper.wiring.runtime.FUNCTION_ADAPTERS), the login endpoints' modules "
        "only "
        "when the stack has one; ingest loads no planner, renderer or other function's use case, result no planner "
        "input, discovery or other use case; botocore makes the clients, so no function imports boto3 (and its "
        "s3transfer). Reconcile answers its SQS FIFO batch with topokeeper.wiring.fifo_batch (Powertools' "
        "SqsFifoPartialProcessor semantics, checked against it in tests/unit/test_fifo_batch.py), not Powertools' "
        "batch utility, which loads asyncio and the data classes of every event source. Each handler imports with "
        "the cyclic collector off and freezes what it loaded (`gc.freeze`: objects that live as long as the "
        "execution environment, which no later collection scans either). Built on first use instead (pydantic's "
        "`defer_build`): the event detail models (an event validates one of them, ~1 ms), the Kueue audit record "
        "(EKS clusters) and the login models (login endpoints). "
        '"Of which libraries" imports, after the runtime\'s modules, every module of '
        "another distribution the handler loads (Powertools, pydantic, botocore and what they import): the rest is "
        "the package's own (its pydantic models, built at import, are most of it).",
        "",
        "Instructions (both): what valgrind counts for `import handler` (interpreter start, the runtime's modules "
        "and exit taken out), the "
        f"same in every run whatever else the machine runs; the CPU figures move with the machine's load (its "
        f"1-minute load average was {imports['load'][0]:.1f} to {imports['load'][1]:.1f} while they were taken).",
        "",
        "| handler | no bytecode | core layer bytecode | core + Powertools bytecode (both) | of which libraries "
        "(both) | instructions (both), millions | most self time ms (both) | both, nothing imported before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    *preloaded, fresh = imports["configurations"]
    for name, row in imports["handlers"].items():
        cells = [f"{_ms(row[label][0])} ({_ms(row[label][1])})" for label in preloaded]
        cells.append(f"{_ms(row['libraries'][0])} ({_ms(row['libraries'][1])})")
        cells.append("n/a" if row["instructions"] is None else f"{row['instructions'] / 1e6:,.0f}")
        breakdown = ", ".join(f"{package} {us / 1000:.0f}" for package, us in row["breakdown"])
        lines.append(f"| {name} | {' | '.join(cells)} | {breakdown} | {_ms(row[fresh][0])} ({_ms(row[fresh][1])}) |")
    lines += [
        "",
        "### Assets, zipped as CDK zips them",
        "",
        "| asset | bytes zipped |",
        "|---|---|",
        *(f"| {asset} | {size:,} |" for asset, size in sizes.items()),
        "",
        f"Core layer with bytecode: {core / 1024**2:.2f} MiB of the {GOAL_CORE_ZIP_BYTES / 1024**2:.0f} MiB goal "
        f"({'within' if core <= GOAL_CORE_ZIP_BYTES else 'over'}); bytecode adds "
        f"{(core - sizes['core layer without bytecode']) / 1024**2:.2f} MiB. botocore keeps the data of the services "
        f"the functions call, the newest API version of each, no examples "
        f"({CORE_LAYER_SOURCE.relative_to(ROOT)}/requirements.txt pins the wheels).",
    ]
    if head is not None:
        lines += [
            "",
            f"### The applier on the head node: {head['nodes']:,} nodes ({head['slurm']})",
            "",
            f"The bundle is {head['bundle_bytes']:,} B; slurmctld started with every node in "
            f"{head['start_seconds']:.1f} s. CPU and peak memory from wait4: the applier and the scontrol calls it "
            "makes (peak: the largest of those processes); slurmctld's own work is not in them (the reconfigure's "
            "wall time holds it). The one measurement of these at 20,000 nodes (docs/performance/scale.md cites it).",
            "",
            "| run | wall s | CPU s | peak RSS MB | outcome |",
            "|---|---|---|---|---|",
            *(
                f"| applier {mode} | {head[mode]['seconds']:.2f} | {head[mode]['cpu']:.2f} | "
                f"{head[mode]['max_rss_mb']:.0f} | {head[mode]['outcome']} |"
                for mode in ("apply", "verify")
            ),
            f"| `scontrol reconfigure` alone | {head['reconfigure']['seconds']:.2f} | "
            f"{head['reconfigure']['cpu']:.2f} | {head['reconfigure']['max_rss_mb']:.0f} | exit 0 |",
            "",
            "The pull agent (`python3 topokeeper-head-node.pyz agent --once`, this machine's Python, S3 and "
            "EventBridge in moto): its own work, with the tests' fake applier in place of the one above.",
            "",
            "| agent cycle | wall s | CPU s | peak RSS MB |",
            "|---|---|---|---|",
            *(
                f"| {cycle} | {usage['seconds']:.2f} | {usage['cpu']:.2f} | {usage['max_rss_mb']:.0f} |"
                for cycle, usage in head["agent"].items()
            ),
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--no-slurm", action="store_true", help="skip the applier on the real slurmctld (root only)")
    args = parser.parse_args()
    if os.geteuid() == 0:
        ensure_chroot("sid")  # its python3.14 compiles and runs the layer; its slurmctld is the head node
    python = find_layer_python()
    if python is None:
        sys.exit("no Python 3.14: run as root (the sid chroot has one) or set TOPOKEEPER_LAYER_PYTHON")
    with tempfile.TemporaryDirectory() as scratch:
        imports = cold_imports(python, args.runs, Path(scratch))
    head = None if args.no_slurm or os.geteuid() != 0 else applier_on_head_node(args.nodes)
    print(f"wrote {write_section('lambda', section(python, imports, head, args.runs))}")


if __name__ == "__main__":
    main()
