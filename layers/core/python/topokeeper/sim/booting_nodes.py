"""ParallelCluster's dynamic nodes booting with a real slurmd each (scenario ``slurmd: true``, issue 32).

ParallelCluster's resume program launches a dynamic node's instance and binds the node to it, and slurmctld
holds the node powering up (``idle#``) until its slurmd registers. Here ``ParallelCluster`` launches and binds,
``resumed`` powers the node up in slurmctld (``State=POWER_UP``; its ResumeProgram stays /bin/true: the launch is
the simulator's), and ``node_boot_seconds`` of simulated time later the instance runs the node-side step: it
reads its registration entry from the plans bucket as ``topokeeper-head-node.pyz node-start`` does (the same key
and ``wire.parse_registration``), asking again until ``registration_wait_seconds``, then starts the node's slurmd
(``SlurmdNodes``) with that topology, or without one. slurmd runs in real time, so the step waits (bounded, real
time) until slurmctld has the node registered; the timeline then says whether the head node's apply had already
placed the powering-up node, or slurmctld placed it as it registered.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from topokeeper.adapters.aws import client
from topokeeper.sim.head_node import ChrootHeadNode
from topokeeper.sim.parallelcluster import Instance
from topokeeper.sim.slurm_chroot import HarnessError
from topokeeper.sim.slurmd_nodes import SlurmdNodes
from topokeeper.sim.stack import BUCKET
from topokeeper.wire import RegistrationError, parse_registration, parse_show_topology, registration_key

if TYPE_CHECKING:
    from topokeeper.sim.world import World

POLL_SECONDS = 5.0  # how often the node-side step asks for its entry again (simulated time)
REGISTER_SECONDS = 60.0  # real-time bound on a started slurmd registering (a harness failure past it)


@dataclass
class Boot:
    """What one node's boot saw: its entry (if it was there in time), and where slurmctld had the node just
    before and just after its slurmd registered."""

    instance: Instance
    resumed_at: float
    slurmd_started_at: float | None = None
    entry: str | None = None
    entry_error: str | None = None
    leaf_before_slurmd: str | None = None  # where slurmctld served the node just before its slurmd started
    leaf_after_registration: str | None = None

    @property
    def node(self) -> str:
        return self.instance.slurm_name

    @property
    def entry_leaf(self) -> str | None:
        return self.entry.rsplit(":", 1)[-1] if self.entry else None

    @property
    def placed_by_head_node_first(self) -> bool:
        """The head node's apply reached the powering-up node before its slurmd registered."""
        return self.entry_leaf is not None and self.leaf_before_slurmd == self.entry_leaf

    @property
    def placed_at_registration(self) -> bool:
        return (
            self.entry_leaf is not None
            and not self.placed_by_head_node_first
            and self.leaf_after_registration == self.entry_leaf
        )


class BootingNodes:
    """The slurmd side of a ParallelCluster world's dynamic nodes: ``extra_lines`` for slurm.conf (call before the
    head node starts), ``install`` after, then ``resumed`` for each node the resume program launched."""

    def __init__(self, world: World, head: ChrootHeadNode, nodes: list[str]) -> None:
        self.world = world
        self.head = head
        self.controller = controller = head.controller
        self.daemons = SlurmdNodes(controller, nodes)
        controller.node_settings.update(self.daemons.node_settings())
        self.boots: list[Boot] = []

    def extra_lines(self) -> list[str]:
        return self.daemons.daemon_lines()

    def install(self) -> None:
        self.daemons.install()

    def resumed(self, instance: Instance) -> None:
        """slurmctld powers the node up; the instance boots and runs the node-side step later."""
        if instance.slurm_name not in self.daemons.ports:
            return  # a static node: bound in slurm.conf, no booting slurmd modelled
        self.controller.run("scontrol", "update", f"NodeName={instance.slurm_name}", "State=POWER_UP", check=True)
        now = self.world.clock.monotonic()
        boot = Boot(instance, now)
        self.boots.append(boot)
        self.world.agenda.add(now + self.world.scenario.timing.node_boot_seconds, lambda: self._node_start(boot))

    def _node_start(self, boot: Boot) -> None:
        """The node-side step: its entry if there, else ask again until the bound, then start slurmd."""
        timing = self.world.scenario.timing
        now = self.world.clock.monotonic()
        entry = self._read_entry(boot)
        bound = boot.resumed_at + timing.node_boot_seconds + timing.registration_wait_seconds
        if entry is None and boot.entry_error is None and now + POLL_SECONDS <= bound:
            self.world.agenda.add(now + POLL_SECONDS, lambda: self._node_start(boot))
            return
        boot.entry = entry
        boot.leaf_before_slurmd = self._leaf(boot.node)
        boot.slurmd_started_at = now
        self.daemons.start(boot.node, entry)
        self._wait_for_registration(boot.node)
        boot.leaf_after_registration = self._leaf(boot.node)
        # slurmctld takes a registering cloud node's NodeAddr from where it registered from: a real instance
        # registers from its own private IP, these slurmd from 127.0.0.1, so the instance's binding is put back.
        self.head.bind(boot.node, boot.instance.private_ip, boot.instance.hostname)
        self.world.note("node", _boot_text(boot))

    def _read_entry(self, boot: Boot) -> str | None:
        """The entry's topology, None while there is none; a refused entry is noted and never asked again."""
        key = registration_key(self.world.cluster.name, boot.instance.instance_id)
        s3 = client("s3")
        try:
            with self.world.emulator.calls.uncounted():  # the node's read, not topokeeper's backend
                body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except s3.exceptions.NoSuchKey:
            return None
        try:
            return parse_registration(body, self.world.cluster.name, boot.instance.instance_id).topology
        except RegistrationError as error:
            boot.entry_error = str(error)
            return None

    def _wait_for_registration(self, node: str) -> None:
        deadline = time.monotonic() + REGISTER_SECONDS
        state = ""
        while time.monotonic() < deadline:
            state = self.controller.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.strip()
            if state and not state.endswith(("#", "~")) and "powering" not in state:
                return
            time.sleep(0.2)
        raise HarnessError(f"{node}'s slurmd did not register: state {state!r}\n{self.daemons.log(node)[-1500:]}")

    def _leaf(self, node: str) -> str | None:
        """The leaf (or block) slurmctld serves the node in, in any partition's topology (None: in none)."""
        for name in sorted({t for t in self.controller.partition_topologies().values() if t}):
            units = parse_show_topology(self.controller.show_topology(name))
            # A switch lists every node below it: the leaf is the level-0 one.
            for unit_name, unit in units.items():
                nodes = unit["nodes"]
                if unit.get("level", 0) == 0 and isinstance(nodes, list) and node in nodes:
                    return unit_name
        return None


def _boot_text(boot: Boot) -> str:
    given = f"with topology {boot.entry}" if boot.entry else f"without an entry ({boot.entry_error or 'none in time'})"
    if boot.placed_by_head_node_first:
        where = f"the head node's apply had already placed it in {boot.entry_leaf} while it was powering up"
    elif boot.placed_at_registration:
        where = f"slurmctld placed it in {boot.entry_leaf} as it registered, no controller write"
    else:
        where = f"registered, served in {boot.leaf_after_registration or 'no leaf'} (the head node places it)"
    return f"{boot.node}: slurmd started {given}; {where}"
