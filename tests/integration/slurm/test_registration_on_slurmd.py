"""A CLOUD node resumed by slurmctld, whose slurmd registers with a topology of its own (issue 32).

Real slurmctld and real slurmd: slurmctld runs the ResumeProgram, which starts the node's slurmd with
``--conf "topology=..."`` (``SlurmdNodes``). On 25.11 (ParallelCluster's series) the node is placed as it
registers, in a leaf created under the existing spine. On 26.05 the same node registers and is not placed
(slurmd-supplied fields apply there only when boot_time > last_response, and resuming sets last_response),
and ``scontrol update NodeName= Topology=`` places it: the fallback the backend uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from topokeeper.sim.slurm_chroot import HarnessError, SlurmController
from topokeeper.sim.slurmd_nodes import SlurmdNodes
from topokeeper.wire import parse_show_topology

pytestmark = pytest.mark.slurm

TOPOLOGY_YAML = """---
- topology: tt
  cluster_default: true
  tree:
    switches:
      - switch: spine1
        children: leafA
      - switch: leafA
        nodes: c1
"""
BOOTING = "c5"
PATH = "tt:spine1:leafD"
UNRESUMED = "c6"  # its slurmd starts while slurmctld still has it powered down


def _controller(root: Path, controllers: Callable[..., SlurmController]) -> tuple[SlurmController, SlurmdNodes]:
    controller = controllers(root)
    daemons = SlurmdNodes(controller, [BOOTING, UNRESUMED])
    partitions = {"q": (["c1", BOOTING, UNRESUMED], None)}
    controller.prepare(["c1"], partitions, [*daemons.conf_lines(), "TopologyPlugin=topology/tree"])
    controller.write_file("topology.yaml", TOPOLOGY_YAML)
    daemons.install()
    daemons.set_topology(BOOTING, PATH)
    controller.start()
    return controller, daemons


def _resume_and_wait_for_registration(controller: SlurmController, daemons: SlurmdNodes) -> None:
    """Power the node up as a job would (slurmctld runs the ResumeProgram, which starts its slurmd)."""
    controller.run("scontrol", "update", f"NodeName={BOOTING}", "State=POWER_UP", check=True)
    _wait_for_registration(controller, daemons, BOOTING)


def _wait_for_registration(controller: SlurmController, daemons: SlurmdNodes, node: str) -> None:
    """Wait (a bound, not a measure) until the node's slurmd registered."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = controller.run("sinfo", "-h", "-p", "q", "-N", "-n", node, "-o", "%T").stdout.strip()
        if state == "idle":  # no '#' (powering up) or '~' (powered down): registered
            return
        time.sleep(0.2)
    raise HarnessError(
        f"{node} did not register: state {state!r}\n{daemons.log(node)[-2000:]}\n{controller.log_tail()}"
    )


def _leaf_of(controller: SlurmController, node: str) -> str | None:
    units = parse_show_topology(controller.show_topology("tt"))
    # A switch lists every node below it: the leaf is the level-0 one.
    return next((name for name, unit in units.items() if unit["level"] == 0 and node in unit["nodes"]), None)


def test_on_25_11_a_resumed_cloud_node_is_placed_as_it_registers(
    slurm2511_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    controller, daemons = _controller(slurm2511_root, controllers)
    assert _leaf_of(controller, BOOTING) is None
    _resume_and_wait_for_registration(controller, daemons)
    assert f"--conf topology={PATH}" in _slurmd_command_line(controller)
    assert _leaf_of(controller, BOOTING) == "leafD"
    assert "leafD" in parse_show_topology(controller.show_topology("tt"))["spine1"]["switches"]
    controller.run("scontrol", "reconfigure", check=True)  # a powered-up cloud node keeps its place
    assert _leaf_of(controller, BOOTING) == "leafD"
    # A slurmd started while its node is powered down (the simulator's way to boot one) is placed too.
    daemons.start(UNRESUMED, "tt:spine1:leafE")
    _wait_for_registration(controller, daemons, UNRESUMED)
    assert _leaf_of(controller, UNRESUMED) == "leafE"


def test_on_26_05_a_resumed_cloud_node_is_not_placed_and_scontrol_update_places_it(
    sid_slurmd_root: Path, controllers: Callable[..., SlurmController]
) -> None:
    controller, daemons = _controller(sid_slurmd_root, controllers)
    _resume_and_wait_for_registration(controller, daemons)
    assert f"--conf topology={PATH}" in _slurmd_command_line(controller)
    assert _leaf_of(controller, BOOTING) is None
    controller.run("scontrol", "update", f"NodeName={BOOTING}", f"Topology={PATH}", check=True)
    assert _leaf_of(controller, BOOTING) == "leafD"


def _slurmd_command_line(controller: SlurmController) -> str:
    """The running slurmd's command line: proof that it was started with the topology (not just that one exists)."""
    pidfile = controller.root / controller.inner_dir.lstrip("/") / "slurmd" / f"{BOOTING}.pid"
    pid = int(pidfile.read_text().strip())
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
