"""Scale: the largest cluster each limit allows and a simulated 20,000-node cluster.

Run: .venv/bin/python -m bench.scale [--simulate] [--head-node file|chroot]
(The planner at 1k-100k, as the whole `topokeeper plan` process: bench/plan_scaling.py.)
Writes docs/performance/scale.md (generated, never edited by hand: `make bench`). The limits are computed with
the real code (planner, renderer, SSM command builder, audit record builder, EventBridge sizing) on a synthetic
mixed cluster; the simulated run plays bench/scenarios/scale-20000.yaml through the real functions on the
emulator, whose DynamoDB refuses items over 400 KB and whose EventBridge refuses PutEvents over 256 KB.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.performance_doc import machine
from topokeeper.adapters.audit_trail import PUT_EVENTS_MAX_BYTES, fitted_detail, put_events_entry_size
from topokeeper.adapters.ec2 import ASKED_KEY, PAGE_WITH_IDS, SWEEP_PAGE
from topokeeper.adapters.ssm_channel import INLINE_LIMIT_BYTES, build_commands, command_size
from topokeeper.contract import stack_spec
from topokeeper.contract.constants import AUDIT_DETAIL_TYPE, AUDIT_SOURCE
from topokeeper.contract.head_node_program import program_bytes, program_sha256
from topokeeper.contract.ports import Channel, DeliveryHandle, Outcome, PendingDelivery
from topokeeper.domain.models import ClusterSnapshot, Node, Partition, SlurmVersion
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import RenderedPlan, render
from topokeeper.service.audit import build_records
from topokeeper.wire import sha256_text
from topokeeper.wiring.runtime import AFTER_DISCOVERY_SECONDS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "performance" / "scale.md"
SCENARIO = ROOT / "bench" / "scenarios" / "scale-20000.yaml"
DYNAMODB_ITEM_BYTES = 400 * 1024
S3_PUT_BYTES = 5 * 1024**3
ASSUMED_CALL_SECONDS = 0.05  # one ListClusterNodes page or BatchGetItem, as the limit below assumes
# The mix of bench/scenarios/scale-20000.yaml: share, partition, instance type, layers (None: no topology).
MIX = (
    (0.30, "ml-p5", "p5.48xlarge", 3, 16),
    (0.20, "ml-p5en", "p5en.48xlarge", 3, 16),
    (0.20, "ml-b200", "p6-b200.48xlarge", 4, 8),
    (0.20, "ml-gb200", "p6e-gb200.36xlarge", 3, 18),
    (0.10, "cpu", "m5.4xlarge", 0, 0),
)


def mixed_cluster(size: int) -> ClusterSnapshot:
    """``size`` nodes in the scenario's mix, HyperPod-style host names, a leaf per ``per_leaf`` nodes."""
    partitions = []
    start = 0
    for index, (share, name, instance_type, layers, per_leaf) in enumerate(MIX):
        count = size - start if index == len(MIX) - 1 else round(size * share)
        nodes = []
        for i in range(count):
            n = start + i
            network: tuple[str, ...] = ()
            if layers:
                leaf = i // per_leaf
                network = tuple(
                    f"nn-{index}{level}{leaf // (16 ** (layers - 1 - level)):015x}" for level in range(layers)
                )
            nodes.append(
                Node(
                    name=f"ip-10-{1 + n // 65000}-{n // 250 % 260}-{n % 250}",
                    instance_id=f"i-{index}{n:016x}",
                    instance_type=instance_type,
                    partition=name,
                    network_nodes=network,
                    ultraserver_id=f"us-{i // 18:016x}" if "gb200" in instance_type else None,
                )
            )
        partitions.append(Partition(name=name, nodes=tuple(nodes)))
        start += count
    return ClusterSnapshot(
        cluster_name="bench", slurm_version=SlurmVersion.parse("26.05"), partitions=tuple(partitions)
    )


def inline_command_bytes(rendered: RenderedPlan) -> int:
    """SsmChannel's command with the bundle inline (the head-node program rides along)."""
    program = base64.b64encode(program_bytes()).decode("ascii")
    document = json.dumps(rendered.bundle.document(), sort_keys=True)
    payload = {"mode": "apply", "program": program, "program_sha256": program_sha256(), "bundle": document,
               "bundle_sha256": sha256_text(document)}  # fmt: skip
    return command_size(build_commands(payload))


def largest(fits: Callable[[int], bool], low: int = 1, high: int = 10_000_000) -> int:
    """The largest size that fits (bisection; ``fits`` is monotone)."""
    if not fits(low):
        return 0
    while high - low > max(1, low // 100):  # to 1%
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def cold_records(rendered: RenderedPlan) -> list[dict[str, Any]]:
    """The audit records of a cold create (every node added), as the result function builds them."""
    desired = json.loads(rendered.files()["plan.json"])
    now = datetime(2026, 1, 1, tzinfo=UTC)
    handle = DeliveryHandle(channel=Channel.SSM, cluster="bench", plan_sha256=rendered.sha256, reference="r" * 36,
                            target="mi-" + "0" * 17, sent_at=now)  # fmt: skip
    delivery = PendingDelivery(handle=handle, generation=1)
    records = build_records(cluster_name="bench", previous=None, desired=desired, delivery=delivery,
                            outcome=Outcome.APPLIED, error=None, completed_at=now)  # fmt: skip
    return [record.document() for record in records]


def limits(size: int) -> tuple[list[tuple[str, str, str, str]], dict[str, Any]]:
    rendered = render(plan(mixed_cluster(size)))
    bundle_bytes = len(json.dumps(rendered.bundle.document(), sort_keys=True).encode())
    gzipped = len(gzip.compress(json.dumps(rendered.bundle.document(), sort_keys=True).encode()))
    records = cold_records(rendered)
    record_bytes = max(len(json.dumps(r, sort_keys=True).encode()) for r in records)
    entry = {"Source": AUDIT_SOURCE, "DetailType": AUDIT_DETAIL_TYPE, "Resources": []}
    room = PUT_EVENTS_MAX_BYTES - 1 - put_events_entry_size({**entry, "Detail": ""})
    event_bytes = max(
        put_events_entry_size({**entry, "Detail": json.dumps(fitted_detail(r, room), sort_keys=True)}) for r in records
    )
    inline = inline_command_bytes(rendered)
    inline_max = largest(
        lambda n: inline_command_bytes(render(plan(mixed_cluster(n)))) <= INLINE_LIMIT_BYTES, 10, 20_000
    )
    per_node = bundle_bytes / size
    budget = stack_spec.RECONCILE_TIMEOUT_SECONDS - AFTER_DISCOVERY_SECONDS
    new_per_invocation = budget * PAGE_WITH_IDS
    # Cold, each topology-capable type is swept in pages of 100 (CPU nodes are never asked); by ids, 20 a page.
    counts = [round(size * share) for share, _, _, layers, _ in MIX if layers]
    cold_calls = sum(-(-count // SWEEP_PAGE) for count in counts)
    cold_by_ids = -(-sum(counts) // PAGE_WITH_IDS)
    started = time.perf_counter()
    render(plan(mixed_cluster(size))).files()
    plan_seconds = time.perf_counter() - started
    # A warm reconcile at N nodes: ListClusterNodes and BatchGetItem (100 a call each) plus planning.
    warm_max = int(budget / (2 * ASSUMED_CALL_SECONDS / 100 + plan_seconds / size))
    rows = [
        ("DynamoDB item (400 KB)",
         f"largest audit record {record_bytes:,} B; state <= 1 verify report (200 KiB) + 40 triggers",
         "no limit: node lists cut at 200 names (counts exact), 1 node-facts item per instance", "n/a"),
        ("EventBridge PutEvents (256 KB)", f"largest entry {event_bytes:,} B", "no limit: records are cut to fit",
         "n/a"),
        ("SSM inline payload (48,000 of 64 KB)", f"{inline:,} B inline", f"{inline_max:,} nodes inline; larger go by "
         "the S3 path (a presigned URL, constant size)", "S3 path" if inline > INLINE_LIMIT_BYTES else "inline"),
        ("S3 bundle (5 GB a PUT)", f"{bundle_bytes:,} B ({per_node:.0f} B/node, {gzipped:,} B gzipped)",
         f"{int(S3_PUT_BYTES / per_node):,} nodes", "fits"),
        (f"Function timeout ({stack_spec.RECONCILE_TIMEOUT_SECONDS} s, discovery stops {AFTER_DISCOVERY_SECONDS} s "
         "before)", f"plan+render {plan_seconds:.2f} s here",
         f"{new_per_invocation:,} new instances by ids, or {budget * SWEEP_PAGE:,} of a type swept, per invocation "
         "(the rest continues); a warm reconcile "
         f"serves ~{warm_max:,} nodes (assuming {ASSUMED_CALL_SECONDS * 1000:.0f} ms a list/cache call)", "fits"),
        ("DescribeInstanceTopology (1 call/s)",
         f"cold create: {cold_calls:,} calls swept by type ({cold_by_ids:,} by ids)",
         f"{PAGE_WITH_IDS * 3600:,} new instances an hour by ids, {SWEEP_PAGE * 3600:,} swept (a type's sweep "
         "counts all the account's instances of it)",
         f"{cold_calls / 60:.0f} min, {-(-cold_calls // budget)} invocation(s) if each type's sweep fits"),
    ]  # fmt: skip
    return rows, {"bundle_bytes": bundle_bytes, "plan_seconds": plan_seconds}


def simulate_20k(head_node: str, wall_minutes: float) -> dict[str, Any]:  # noqa: PLR0915 - one measured run
    """Play the 20,000-node scenario for at most ``wall_minutes`` of wall time: the cold create in chunks of
    simulated time (each measured), then the story's steps while time remains. Measures what the functions
    sent and stored."""
    from moto.dynamodb.models import dynamodb_backends  # noqa: PLC0415 - only for this part

    from topokeeper.adapters.aws import SEND_COMMAND_CONFIG, client  # noqa: PLC0415
    from topokeeper.sim.scenario import load_scenario  # noqa: PLC0415
    from topokeeper.sim.simulator import Story  # noqa: PLC0415
    from topokeeper.sim.stack import BUCKET  # noqa: PLC0415
    from topokeeper.sim.world import running  # noqa: PLC0415

    logging.disable(logging.CRITICAL)
    scenario = load_scenario(SCENARIO)
    measured: dict[str, Any] = {"put_events": 0, "send_command": 0, "reconcile_seconds": [], "chunks": [],
                                "steps": [], "converged": False}  # fmt: skip
    started = time.monotonic()
    out_of_time = lambda: time.monotonic() - started > wall_minutes * 60  # noqa: E731
    with running(scenario, head_node=head_node) as world:

        def put_events(params: dict[str, Any], **_: Any) -> None:
            size = sum(put_events_entry_size(entry) for entry in params.get("Entries", []))
            measured["put_events"] = max(measured["put_events"], size)

        def send_command(params: dict[str, Any], **_: Any) -> None:
            size = command_size(params.get("Parameters", {}).get("commands", []))
            measured["send_command"] = max(measured["send_command"], size)

        client("events").meta.events.register("provide-client-params.events.PutEvents", put_events)
        # SendCommand goes through its own client (no automatic retry): measure that one.
        client("ssm", None, SEND_COMMAND_CONFIG).meta.events.register(
            "provide-client-params.ssm.SendCommand", send_command
        )
        invoke = world.functions.invoke

        def timed(function: str, event: Any) -> Any:
            begun = world.clock.monotonic()
            try:
                return invoke(function, event)
            finally:
                if function == stack_spec.RECONCILE:
                    measured["reconcile_seconds"].append(world.clock.monotonic() - begun)

        world.functions.invoke = timed  # type: ignore[method-assign]
        backend = dynamodb_backends[world.emulator.account_id][world.emulator.region]

        def items() -> list[Any]:
            return [item for table in backend.tables.values() for item in table.all_items()]

        while not out_of_time():
            world.settle(until=world.clock.monotonic() + 300)
            described = sum(
                1
                for item in items()
                if item.range_key.value.startswith("NODE#") and ASKED_KEY not in item.attrs["facts"].value
            )
            measured["chunks"].append(
                (round(world.clock.monotonic()), len(measured["reconcile_seconds"]), world.counters.head_node_writes,
                 world.emulator.calls["DescribeInstanceTopology"], described)
            )  # fmt: skip
            if world.is_quiet():
                measured["converged"] = True
                break
        measured["cold_create_wall"] = time.monotonic() - started
        story = Story(world, lambda _: None)
        for index, step in enumerate(scenario.steps, start=1):
            if not measured["converged"] or out_of_time():
                break
            result = story.play(index, step)
            if result is not None:
                measured["steps"].append(
                    (result.step, result.nodes, result.events_sent, result.reconciles, result.head_node_writes,
                     result.converged, result.convergence_seconds, sum(result.aws_calls.values()))
                )  # fmt: skip
        measured["steps_wall"] = time.monotonic() - started - measured["cold_create_wall"]
        stored = items()
        measured["items"] = len(stored)
        measured["largest_item"] = max(item.size() for item in stored)
        s3 = client("s3")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="payloads/").get("Contents", [])]
        measured["s3_payloads"] = len(keys)  # topokeeper.contract.constants.ssm_payload_key
        measured["head_node"] = world.head.description
        measured["simulated"] = world.clock.monotonic()
    measured["wall"] = time.monotonic() - started
    return measured


def write(limit_rows: list[tuple[str, str, str, str]], simulated: dict[str, Any] | None, size: int) -> None:
    lines = [
        "<!-- generated by bench/scale.py (make bench); do not edit -->",
        "## Scale",
        "",
        f"Machine: {machine()}. Shared with other work while measured: times are upper bounds.",
        "",
        f"### The largest cluster each limit allows (computed at {size:,} nodes, the 20,000-node mix)",
        "",
        "| limit | at this size | largest cluster | 20,000 nodes |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in limit_rows),
        "",
    ]
    if simulated is not None:
        longest = max(simulated["reconcile_seconds"], default=0.0)
        state = "converged" if simulated["converged"] else "not converged when the wall-time budget ran out"
        lines += [
            f"### 20,000 nodes simulated ({SCENARIO.relative_to(ROOT)}, head node: {simulated['head_node']})",
            "",
            f"{simulated['wall']:.0f} s of wall time for {simulated['simulated']:.0f} s simulated (cold create "
            f"{simulated['cold_create_wall']:.0f} s, the steps {simulated['steps_wall']:.0f} s); cold "
            f"create {state}. Longest reconcile invocation {longest:.0f} s of simulated time (timeout "
            f"{stack_spec.RECONCILE_TIMEOUT_SECONDS} s: an invocation over its timeout fails the run; AWS calls "
            f"cost simulated time outside it) over {len(simulated['reconcile_seconds'])} "
            f"invocations. Largest DynamoDB item {simulated['largest_item']:,} B of {simulated['items']:,} items "
            f"(limit {DYNAMODB_ITEM_BYTES:,}); largest PutEvents request {simulated['put_events']:,} B (limit "
            f"{PUT_EVENTS_MAX_BYTES:,}); largest SendCommand commands {simulated['send_command']:,} B (inline limit "
            f"{INLINE_LIMIT_BYTES:,}); bundles sent by the S3 path: {simulated['s3_payloads']}.",
            "",
            "Cold create, every 300 s of simulated time:",
            "",
            "| simulated s | reconciles | writes | DescribeInstanceTopology calls | instances described (cached) |",
            "|---|---|---|---|---|",
            *("| " + " | ".join(f"{v:,}" for v in row) + " |" for row in simulated["chunks"]),
            "",
        ]
        if simulated["steps"]:
            lines += [
                "| step | nodes | events | reconciles | writes | converged | in s | AWS calls |",
                "|---|---|---|---|---|---|---|---|",
                *("| " + " | ".join(str(v) for v in row) + " |" for row in simulated["steps"]),
                "",
            ]
    # Measured once, by bench/lambda_cold_start.py: the applier and `scontrol reconfigure` on the real slurmctld.
    lines += ["The applier and `scontrol reconfigure` on the real slurmctld with 20,000 nodes: see the Lambda "
              "section (`bench/lambda_cold_start.py`, docs/performance/lambda.md).", ""]  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print(OUT.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--simulate", action="store_true", help="also play the 20,000-node scenario (minutes)")
    parser.add_argument("--wall-minutes", type=float, default=60, help="the simulation's wall-time budget")
    parser.add_argument("--head-node", default="file", choices=("file", "chroot"))
    args = parser.parse_args()
    size = 20_000
    limit_rows, _ = limits(size)
    simulated = simulate_20k(args.head_node, args.wall_minutes) if args.simulate else None
    write(limit_rows, simulated, size)


if __name__ == "__main__":
    main()
