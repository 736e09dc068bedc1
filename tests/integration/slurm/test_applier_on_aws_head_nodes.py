"""The applier on head nodes laid out as HyperPod's and ParallelCluster's, with a real slurmctld.

Both install Slurm under /opt/slurm and put /opt/slurm/bin on PATH only in login shells: SSM's
AWS-RunShellScript and a systemd unit find no scontrol on PATH (the harness covers Debian's, see
topokeeper.sim.slurm_chroot). HyperPod keeps its partitions in an Included file; ParallelCluster defines
each queue in /opt/slurm/etc/pcluster/ and names nodes <queue>-st|dy-<compute resource>-<n>, bound to
instances by NodeAddr. The applier runs here as the SSM channel runs it: its fixed script, fed to sh.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import APPLIER_RESULT_KEYS, gb200_nodes, p5_nodes, snapshot
from topokeeper.adapters.ssm_channel import build_commands
from topokeeper.cli.main import main
from topokeeper.contract.head_node_program import program_bytes, program_sha256
from topokeeper.contract.ports import ApplyResult
from topokeeper.domain.models import PlannerConfig
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import build_snapshot, parse_scontrol_nodes, parse_snapshot_document, with_node_table
from topokeeper.render.bundle import render
from topokeeper.sim.slurm_chroot import SlurmController, installed_slurm_series
from topokeeper.wire import parse_show_topology, sha256_text

pytestmark = pytest.mark.slurm

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _over_ssm(controller: SlurmController, mode: str, bundle: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The SSM channel's script, run by sh as root without a login shell, as the SSM agent runs it."""
    document = json.dumps(bundle, sort_keys=True)
    payload = {
        "mode": mode,
        "program": base64.b64encode(program_bytes()).decode("ascii"),  # inline: python3-minimal has no urllib
        "program_sha256": program_sha256(),
        "bundle": document,
        "bundle_sha256": sha256_text(document),
    }
    script = "\n".join(build_commands(payload)) + "\n"
    result = subprocess.run(
        controller.command("sh", "-s", login=False),
        input=script,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.stderr == ""
    output: dict[str, Any] = json.loads(result.stdout)
    assert set(output) >= APPLIER_RESULT_KEYS
    return result.returncode, output


def _no_scontrol_without_a_login_shell(controller: SlurmController) -> None:
    """The harness is what it claims: a login shell finds /opt/slurm/bin/scontrol, SSM's shell finds none."""
    assert controller.run("sh", "-c", "command -v scontrol").stdout.strip() == "/opt/slurm/bin/scontrol"
    assert controller.run("scontrol", "version", login=False).returncode != 0


def _parallelcluster_head_node(
    root: Path, controllers: Callable[..., SlurmController]
) -> tuple[dict[str, Any], SlurmController]:
    """The example cluster's Slurm side, started: its queues in pcluster/*.conf, static nodes at their IPs."""
    example = json.loads((EXAMPLES / "pcluster-p5-cluster.json").read_text())
    table = example["slurm"]["nodes"]
    statics = {n["name"]: n["address"] for n in table if "-st-" in n["name"]}
    q1 = [n["name"] for n in table if n["partitions"] == ["q1"]]
    cpu = [n["name"] for n in table if n["partitions"] == ["cpu"]]
    controller = controllers(root, style="parallelcluster")
    controller.prepare([*q1, *cpu], {"q1": (q1, None), "cpu": (cpu, None)}, addresses=statics)
    controller.start()
    return example, controller


def _bind(controller: SlurmController, name: str, address: str) -> None:
    """What clustermgtd does when it resumes a dynamic node on an instance."""
    host = "ip-" + address.replace(".", "-")
    controller.run("scontrol", "update", f"nodename={name}", f"nodeaddr={address}", f"nodehostname={host}", check=True)


def test_hyperpod_head_node_partitions_in_an_included_file(
    sid_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    rendered = render(plan(snapshot({"gpu": p5_nodes(8), "gb": gb200_nodes(1)}, version="26.05")))
    bundle = rendered.bundle.document()
    controller = controllers(sid_root, style="hyperpod")
    controller.prepare(rendered.plan.nodes, {p.partition: (p.nodes, None) for p in rendered.plan.partitions})
    controller.start()
    _no_scontrol_without_a_login_shell(controller)
    conf_before = (controller.etc / "slurm.conf").read_text()
    assert "Include /opt/slurm/etc/partitions.conf" in conf_before.splitlines()

    code, document = _over_ssm(controller, "apply", bundle)

    assert (code, document["outcome"], document["error"]) == (0, "applied", None)
    assert (document["scontrol"], document["config_dir"]) == ("/opt/slurm/bin/scontrol", "/opt/slurm/etc")
    assert (controller.etc / "slurm.conf").read_text() == conf_before
    partitions = (controller.etc / "partitions.conf").read_text().splitlines()
    assert "PartitionName=gpu Nodes=p5-[001-008] State=UP Topology=tree-gpu" in partitions
    assert controller.partition_topologies() == {"gpu": "tree-gpu", "gb": "block-gb", "dev": None}
    code, verified = _over_ssm(controller, "verify", bundle)
    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])


def test_parallelcluster_head_node_is_planned_with_its_own_node_names(
    yaml_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    """Names from the head node's `scontrol show nodes --json`; the plan lands in pcluster/*.conf. On 25.11 (the
    series ParallelCluster runs) Slurm itself is in /opt/slurm, built with sysconfdir /opt/slurm/etc."""
    example, controller = _parallelcluster_head_node(yaml_root, controllers)
    _no_scontrol_without_a_login_shell(controller)
    for name, address in (("q1-dy-p5-1", "10.0.1.20"), ("q1-dy-p5-2", "10.0.1.21")):  # clustermgtd's resume
        _bind(controller, name, address)
    live_table = json.loads(controller.run("scontrol", "show", "nodes", "--json", check=True).stdout)["nodes"]
    example["slurm"] = {"version": installed_slurm_series(yaml_root), "nodes": live_table}
    rendered = render(plan(build_snapshot(parse_snapshot_document(example), PlannerConfig())))
    assert "instance i-05c1a000000000007 (10.0.1.30) is no Slurm node's NodeAddr; left out" in rendered.plan.warnings
    before = {path: path.read_text() for path in controller.etc.rglob("*.conf")}

    code, document = _over_ssm(controller, "apply", rendered.bundle.document())

    assert (code, document["outcome"], document["error"]) == (0, "applied", None)
    assert document["scontrol"] == "/opt/slurm/bin/scontrol"
    queue_file = controller.etc / "pcluster" / "slurm_parallelcluster_q1_partition.conf"
    changed = {path for path, text in before.items() if path.read_text() != text}
    assert changed == {queue_file}
    assert queue_file.read_text().splitlines()[-1] == "PartitionName=q1 Nodes=q1_nodes State=UP Topology=tree-q1"
    live = parse_show_topology(controller.show_topology("tree-q1"))
    assert live["no-topology"]["nodes"] == ["q1-dy-p5-3", "q1-dy-p5-4"]  # powered down: still under a switch
    assert live["nn-0a1b2c3d4e5f60101"]["nodes"] == ["q1-st-p5-1", "q1-st-p5-2"]
    assert live["nn-0a1b2c3d4e5f60102"]["nodes"] == ["q1-dy-p5-1", "q1-dy-p5-2", "q1-st-p5-3", "q1-st-p5-4"]
    code, verified = _over_ssm(controller, "verify", rendered.bundle.document())
    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])


def test_the_cli_preview_names_parallelcluster_nodes_from_the_head_nodes_own_table(
    sid_root: Path, controllers: Callable[..., SlurmController], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """snapshot --slurm-nodes with this slurmctld's `scontrol show nodes --json` (the part of the snapshot that
    is not AWS's), then verify --bundle-out: the bundle's dry-run on the head node knows every node it names."""
    example, controller = _parallelcluster_head_node(sid_root, controllers)
    _bind(controller, "q1-dy-p5-1", "10.0.1.20")
    nodes = tmp_path / "nodes.json"
    nodes.write_text(controller.run("scontrol", "show", "nodes", "--json", check=True).stdout)
    table = parse_scontrol_nodes(json.loads(nodes.read_text()), "--slurm-nodes")  # what snapshot --slurm-nodes does
    del example["slurm"]  # what snapshot reads from AWS
    snapshot_file = tmp_path / "snapshot.json"
    aws = parse_snapshot_document(example)
    snapshot_file.write_text(with_node_table(aws, table.nodes, table.version).model_dump_json(exclude_none=True))
    assert main(["verify", "--snapshot", str(snapshot_file), "--bundle-out", str(tmp_path / "out")]) == 0
    assert "Slurm 26.05 -> topology.yaml" in capsys.readouterr().out  # the head node's version, from the table
    bundle = json.loads((tmp_path / "out" / "bundle.json").read_text())
    assert {"q1-st-p5-1", "q1-dy-p5-1", "q1-dy-p5-3"} <= set(bundle["nodes"])

    code, document = _over_ssm(controller, "dry-run", bundle)

    assert (code, document["outcome"], document["error"]) == (0, "would_apply", None)


def _planner(example: dict[str, Any], version: str) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    def planned(nodes: list[dict[str, Any]]) -> dict[str, Any]:
        example["slurm"] = {"version": version, "nodes": nodes}
        return render(plan(build_snapshot(parse_snapshot_document(example), PlannerConfig()))).bundle.document()

    return planned


def _live_table(controller: SlurmController) -> list[dict[str, Any]]:
    return list(json.loads(controller.run("scontrol", "show", "nodes", "--json", check=True).stdout)["nodes"])


def test_a_dynamic_node_rebound_between_plan_and_apply_is_deferred_and_the_replan_places_it(
    sid_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    """The binding loop on a real slurmctld: a plan names nodes from the head node's table; clustermgtd
    re-binds a dynamic node before the plan lands; the applier applies every other node and defers that one
    (the first write: no file had it, so it is in no switch), with the fresh table; the plan made from that
    table places it."""
    example, controller = _parallelcluster_head_node(sid_root, controllers)
    table = example["slurm"]["nodes"]
    planned = _planner(example, "26.05")
    _bind(controller, "q1-dy-p5-1", "10.0.1.20")
    first = planned(_live_table(controller))
    assert first["bindings"]["q1-dy-p5-1"] == "10.0.1.20"
    _bind(controller, "q1-dy-p5-1", "10.0.1.30")  # powered down, then resumed on another instance (leaf ...0101)

    code, partial = _over_ssm(controller, "apply", first)

    assert (code, partial["outcome"], partial["error"]) == (0, "applied", None)
    assert partial["deferred"] == [["q1-dy-p5-1", "10.0.1.20", "10.0.1.30"]]
    assert partial["after_sha256"] != first["plan_sha256"]  # the subset of the signed plan, not all of it
    live = parse_show_topology(controller.show_topology("tree-q1"))
    assert live["nn-0a1b2c3d4e5f60102"]["nodes"] == ["q1-st-p5-3", "q1-st-p5-4"]  # not where the plan put it
    assert all("q1-dy-p5-1" not in unit["nodes"] for unit in live.values())  # type: ignore[operator]
    fresh = ApplyResult.model_validate(partial).node_table()
    assert fresh is not None and [r.name for r in fresh] == sorted(n["name"] for n in table)
    assert {r.name: (r.address, r.partitions) for r in fresh}["q1-dy-p5-3"] == ("q1-dy-p5-3", ["q1"])  # powered down
    second = planned([record.model_dump() for record in fresh])
    assert second["bindings"]["q1-dy-p5-1"] == "10.0.1.30" and second["plan_sha256"] != first["plan_sha256"]

    code, applied = _over_ssm(controller, "apply", second)

    assert (code, applied["outcome"], applied["error"], applied["deferred"]) == (0, "applied", None, [])
    assert applied["after_sha256"] == second["plan_sha256"]
    live = parse_show_topology(controller.show_topology("tree-q1"))
    assert live["nn-0a1b2c3d4e5f60101"]["nodes"] == ["q1-dy-p5-1", "q1-st-p5-1", "q1-st-p5-2"]


@pytest.mark.parametrize("version", ["26.05", "24.11"])
def test_nodes_rebound_while_a_plan_is_on_its_way_stay_where_they_are_and_the_others_are_applied(
    version: str, sid_root: Path, trixie_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    """A rolling scale-up on ParallelCluster: between plan and apply the resume program binds one more node and
    another is resumed on a new instance. The applier places the node whose binding holds (26.05: by a live update,
    no reconfigure; 24.11: topology.conf, reconfigured) and leaves the re-bound one where slurmctld has it; the
    read-back agrees, and the file on disk is what a restart would load."""
    root = sid_root if version == "26.05" else trixie_root
    example, controller = _parallelcluster_head_node(root, controllers)
    planned = _planner(example, version)
    name = "tree-q1" if version == "26.05" else None
    _bind(controller, "q1-dy-p5-1", "10.0.1.20")
    code, first = _over_ssm(controller, "apply", planned(_live_table(controller)))
    assert (code, first["outcome"], first["deferred"]) == (0, "applied", [])
    _bind(controller, "q1-dy-p5-1", "10.0.1.30")  # resumed on the instance of leaf ...0101
    _bind(controller, "q1-dy-p5-2", "10.0.1.21")  # resumed on an instance of leaf ...0102
    second = planned(_live_table(controller))
    _bind(controller, "q1-dy-p5-1", "10.0.1.40")  # and again, before the plan lands: an instance EC2 told nothing of

    code, partial = _over_ssm(controller, "apply", second)

    assert (code, partial["outcome"], partial["error"]) == (0, "applied", None)
    assert partial["deferred"] == [["q1-dy-p5-1", "10.0.1.30", "10.0.1.40"]]
    assert partial["apply_path"] == ("incremental" if version == "26.05" else "whole_file")
    assert partial["reconfigured"] is (version != "26.05")
    live = parse_show_topology(controller.show_topology(name))
    assert live["nn-0a1b2c3d4e5f60101"]["nodes"] == ["q1-st-p5-1", "q1-st-p5-2"]  # not where the plan put q1-dy-p5-1
    assert live["nn-0a1b2c3d4e5f60102"]["nodes"] == ["q1-dy-p5-1", "q1-dy-p5-2", "q1-st-p5-3", "q1-st-p5-4"]
    controller.run("scontrol", "reconfigure", check=True)  # the file holds the same subset
    assert parse_show_topology(controller.show_topology(name)) == live
    _, verified = _over_ssm(controller, "verify", second)  # against the whole plan: the deferred node differs
    assert verified["outcome"] == "drift"

    code, placed = _over_ssm(controller, "apply", planned(_live_table(controller)))

    assert (code, placed["outcome"], placed["deferred"]) == (0, "applied", [])
    live = parse_show_topology(controller.show_topology(name))
    assert "q1-dy-p5-1" not in live["nn-0a1b2c3d4e5f60102"]["nodes"]  # no instance EC2 knows: no-topology


def test_a_topology_parallelcluster_generated_is_reported_and_never_replaced(
    sid_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    """ParallelCluster's own topology.conf (block topology for p6e-gb200 capacity blocks, its generator's
    header): apply refuses naming the file and writes nothing; verify reports managed_by."""
    example, controller = _parallelcluster_head_node(sid_root, controllers)
    example["slurm"] = {"version": "26.05"}
    bundle = render(plan(build_snapshot(parse_snapshot_document(example), PlannerConfig()))).bundle.document()
    topology = controller.etc / "topology.conf"
    topology.write_text(
        "# This file is automatically generated by pcluster\n\nBlockName=Block1 Nodes=q1-st-p5-[1-4]\nBlockSizes=4\n"
    )
    before = {path: path.read_text() for path in controller.etc.rglob("*.conf")}

    code, refused = _over_ssm(controller, "apply", bundle)

    assert (code, refused["outcome"], refused["managed_by"]) == (2, "refused", "parallelcluster")
    assert refused["error"].startswith("/opt/slurm/etc/topology.conf is generated by ParallelCluster")
    assert {path: path.read_text() for path in controller.etc.rglob("*.conf")} == before
    _, verified = _over_ssm(controller, "verify", bundle)
    assert verified["managed_by"] == "parallelcluster" and verified["outcome"] in ("drift", "in_sync")


def _power_down(controller: SlurmController, name: str) -> None:
    """What ParallelCluster does when a dynamic node powers down: its address and host name become its own name."""
    controller.run("scontrol", "update", f"nodename={name}", f"nodeaddr={name}", f"nodehostname={name}", check=True)


def test_a_planned_node_powering_down_before_the_apply_is_not_stale_and_the_plan_is_written(
    sid_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    """A dynamic node bound to an instance when planned powers down before the plan lands (NodeAddr back to its
    NodeName): no instance is misplaced, so the apply writes the plan and names the node in powered_down; a
    node re-bound to another address is still stale (the test above)."""
    example, controller = _parallelcluster_head_node(sid_root, controllers)
    _bind(controller, "q1-dy-p5-1", "10.0.1.20")
    example["slurm"] = {
        "version": "26.05",
        "nodes": json.loads(controller.run("scontrol", "show", "nodes", "--json", check=True).stdout)["nodes"],
    }
    bundle = render(plan(build_snapshot(parse_snapshot_document(example), PlannerConfig()))).bundle.document()
    assert bundle["bindings"]["q1-dy-p5-1"] == "10.0.1.20"
    _power_down(controller, "q1-dy-p5-1")

    code, document = _over_ssm(controller, "apply", bundle)

    assert (code, document["outcome"], document["error"]) == (0, "applied", None)
    assert document["powered_down"] == ["q1-dy-p5-1"]
    rows = {row[0]: row[1] for row in document["slurm_nodes"]}
    assert rows["q1-dy-p5-1"] == "q1-dy-p5-1"
    live = parse_show_topology(controller.show_topology("tree-q1"))
    assert "q1-dy-p5-1" in live["nn-0a1b2c3d4e5f60102"]["nodes"]  # where the plan put it: harmless without an instance
    _, verified = _over_ssm(controller, "verify", bundle)
    assert (verified["outcome"], verified["drift"]) == ("in_sync", [])


PCLUSTER_BLOCK_TOPOLOGY = (
    "# This file is automatically generated by pcluster\n\nBlockName=Block1 Nodes=q1-st-p5-[1-4]\nBlockSizes=4\n"
)


def test_enforce_chosen_explicitly_replaces_parallelclusters_topology_and_repairs_its_regeneration(
    trixie_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    """Slurm 24.11 reads one topology.conf, so taking over means replacing ParallelCluster's. A bundle delivered for
    a cluster configured with replace_parallelcluster_topology says replace_managed: the apply replaces the file
    (ParallelCluster's kept in the backup) and touches no pcluster/*.conf (24.11 has no Topology= per partition);
    when update-cluster writes its file again, verify reports the file as drift and the next apply repairs it."""
    example, controller = _parallelcluster_head_node(trixie_root, controllers)
    example["slurm"] = {
        "version": "24.11",
        "nodes": json.loads(controller.run("scontrol", "show", "nodes", "--json", check=True).stdout)["nodes"],
    }
    rendered = render(plan(build_snapshot(parse_snapshot_document(example), PlannerConfig())))
    assert rendered.bundle.slurm_format.value == "topology.conf"
    topology = controller.etc / "topology.conf"
    topology.write_text(PCLUSTER_BLOCK_TOPOLOGY)
    pcluster_files = {path: path.read_text() for path in (controller.etc / "pcluster").glob("*.conf")}
    replacing = rendered.bundle.model_copy(update={"replace_managed": "parallelcluster"}).document()

    code, applied = _over_ssm(controller, "apply", replacing)

    assert (code, applied["outcome"], applied["error"]) == (0, "applied", None)
    assert applied["managed_by"] == "parallelcluster"  # what it found, and replaced
    assert topology.read_text() == rendered.bundle.files["topology.conf"].content
    assert any(path.read_text() == PCLUSTER_BLOCK_TOPOLOGY for path in controller.etc.rglob(".topokeeper-backup/*/*"))
    assert {path: path.read_text() for path in pcluster_files} == pcluster_files
    _, verified = _over_ssm(controller, "verify", replacing)
    assert (verified["outcome"], verified["drift"], verified["managed_by"]) == ("in_sync", [], None)

    topology.write_text(PCLUSTER_BLOCK_TOPOLOGY)  # update-cluster regenerates its file
    _, regenerated = _over_ssm(controller, "verify", replacing)
    assert (regenerated["outcome"], regenerated["managed_by"]) == ("drift", "parallelcluster")
    assert [(entry["what"], entry["name"]) for entry in regenerated["drift"]] == [("file", "topology.conf")]
    code, refused = _over_ssm(controller, "apply", rendered.bundle.document())  # without the choice: never replaced
    assert (code, refused["outcome"]) == (2, "refused") and topology.read_text() == PCLUSTER_BLOCK_TOPOLOGY

    code, repaired = _over_ssm(controller, "apply", replacing)

    assert (code, repaired["outcome"], repaired["error"]) == (0, "applied", None)
    assert topology.read_text() == rendered.bundle.files["topology.conf"].content
    _, verified = _over_ssm(controller, "verify", replacing)
    assert (verified["outcome"], verified["managed_by"]) == ("in_sync", None)
