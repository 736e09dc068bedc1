"""``topokeeper-head-node.pyz hostfile``: a job's nodes in topology order (``topokeeper.computenode.hostfile``),
from the live topology the job's partition uses (``scontrol show topology``, found and asked as the applier does).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Dict, Mapping, NoReturn, Optional, Sequence

from topokeeper.computenode.hostfile import (
    HostfileError,
    add_arguments,
    job_nodelist,
    order_hosts,
    read_topology_file,
    render,
    with_nodes,
)
from topokeeper.headnode.failures import Failed
from topokeeper.headnode.scontrol import LiveTopologies, Scontrol, configured_slurm_conf, find_scontrol, live_partitions
from topokeeper.wire import one_line

if TYPE_CHECKING:
    import argparse

EXIT_BAD_INPUT = 2


def live_units(
    environ: Mapping[str, str], scontrol_path: Optional[str], topology: Optional[str], partition: Optional[str]
) -> Dict[str, Dict[str, object]]:
    """The live topology of ``topology``, else of ``partition``'s Topology=, else the cluster default."""
    scontrol = Scontrol(environ, find_scontrol(scontrol_path, configured_slurm_conf(environ), environ))
    if topology is None and partition:
        partitions = live_partitions(scontrol)
        if partition not in partitions:
            raise HostfileError("partition %r is not known to slurmctld" % partition[:80])
        topology = partitions[partition]
    live = LiveTopologies(scontrol).get(topology)
    if live.error:
        raise HostfileError(live.error)
    return with_nodes(live.units, "scontrol show topology %s" % (topology or "(the cluster default)"))


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    import argparse  # noqa: PLC0415 - only when the program runs

    environment = os.environ if environ is None else environ

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise HostfileError("usage: %s" % message)

    parser = _Parser(
        prog="topokeeper-head-node.pyz hostfile",
        description="Print a job's nodes in topology order: each leaf switch or block together.",
    )
    add_arguments(parser, live=True)
    try:
        args = parser.parse_args(argv)
        print(hostfile_text(args, environment), end="")
    except (HostfileError, Failed) as error:
        print("topokeeper hostfile: error: %s" % one_line(str(error)), file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def hostfile_text(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    nodelist = job_nodelist(args.nodelist, environ)
    if args.topology_file is not None:
        units = read_topology_file(args.topology_file)
    else:
        partition = args.partition or environ.get("SLURM_JOB_PARTITION")
        units = live_units(environ, args.scontrol, args.topology, partition)
    return render(order_hosts(nodelist, units), args.format)
