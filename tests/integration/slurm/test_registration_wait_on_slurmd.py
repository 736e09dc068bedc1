"""Nodes left to registration (issue 32): an apply whose bundle lists powering-up CLOUD nodes as ``registering``
(their instance has an entry) writes the files, runs no ``scontrol update`` for them, and their slurmd places them
as it registers. Real slurmctld and slurmd.

On 25.11 the node whose slurmd starts with its entry is placed at registration (the live topology shows it was
not moved before its slurmd started, and nodes_updated counts no update for it); verify reads in_sync while the
other one's slurmd has not come; once its wait is over (the record backdated, as the clock would) verify reads
drift and the next apply places it by ``scontrol update``. On 26.05 nothing is left: its slurmctld ignores a
resumed node's topology, so the apply updates them as before.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.slurm.test_applier_cloud_nodes_on_slurmctld import _leaf_of, _power
from tests.integration.slurm.test_applier_incremental_on_slurmctld import _gpu
from tests.integration.slurm.test_applier_on_slurmctld import (
    _applier_command,
    _bundle,
    _cluster,
    _document,
    _plan,
    _run,
    _start,
)
from topokeeper.headnode.config_dir import BACKUP_DIR, CRASH_ENV, WHOLE_FILE_ENV
from topokeeper.headnode.registered import REGISTRATION_FILE
from topokeeper.service.registration import placements, with_registering
from topokeeper.sim.slurm_chroot import HarnessError, SlurmController
from topokeeper.sim.slurmd_nodes import SlurmdNodes
from topokeeper.wire import EXIT_CODES, REGISTRATION_WAIT_SECONDS

pytestmark = pytest.mark.slurm

BOOTING, NEVER = "p5-003", "p5-007"  # NEVER's slurmd does not come
MOVES = {BOOTING: ("nn-spine0", "nn-agg0", "nn-leaf001"), NEVER: ("nn-spine0", "nn-agg2", "nn-l9")}


def _start_with_slurmd(controller: SlurmController, version: str) -> SlurmdNodes:
    first = _plan(_cluster(), version=version)
    daemons = SlurmdNodes(controller, [BOOTING, NEVER])
    controller.node_settings.update(daemons.node_settings())

    def with_daemons(text: str) -> str:
        daemons.install()
        return text + "".join(line + "\n" for line in daemons.daemon_lines())

    _start(controller, first, edit_conf=with_daemons)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    _power(controller, f"{BOOTING},{NEVER}", "POWER_UP", "POWERING_UP")  # resumed: its instance boots
    return daemons


def _moved(version: str, registering: list[str], **more: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """The plan that puts the booting nodes where their instances are, as delivered; {node: Topology= value}."""
    rendered = _plan(_cluster(gpu=_gpu(**MOVES, **more)), version=version)
    return with_registering(rendered.bundle, registering).document(), placements(rendered.bundle)


def _wait_registered(controller: SlurmController, daemons: SlurmdNodes, node: str) -> None:
    deadline = time.monotonic() + 120  # a bound, not a measure
    state = ""
    while time.monotonic() < deadline:
        state = controller.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.strip().splitlines()[:1]
        if state and state[0] == "idle":  # no '#' (powering up): registered
            return
        time.sleep(0.2)
    raise HarnessError(f"{node} did not register: {state!r}\n{daemons.log(node)[-1500:]}")


def _backdate(controller: SlurmController, node: str) -> None:
    """The wait over for ``node``: what the head node's clock does REGISTRATION_WAIT_SECONDS later."""
    path = controller.etc / BACKUP_DIR / REGISTRATION_FILE
    record = json.loads(path.read_text())
    record["until"][node] = time.time() - 1
    path.write_text(json.dumps(record))


def test_on_25_11_a_registering_node_is_placed_by_its_slurmd_and_one_whose_slurmd_never_comes_by_a_later_apply(
    slurm2511_root: Path, controllers
) -> None:
    controller = controllers(slurm2511_root)
    daemons = _start_with_slurmd(controller, "25.11")
    bundle, values = _moved("25.11", [BOOTING, NEVER])

    code, document = _run(controller, "apply", bundle)

    assert (document["error"], code, document["outcome"], document["apply_path"]) == (None, 0, "applied", "incremental")
    assert (document["nodes_left_to_registration"], document["nodes_updated"]) == ([BOOTING, NEVER], 0)
    assert 0 < document["registration_wait_seconds"] <= REGISTRATION_WAIT_SECONDS  # when the backend comes back
    assert document["nodes_placed_after_wait"] == []
    assert (_leaf_of(controller, BOOTING), _leaf_of(controller, NEVER)) == ("nn-leaf000", "nn-leaf001")  # not moved
    code, verified = _run(controller, "verify", bundle)
    assert (code, verified["outcome"], verified["drift"]) == (0, "in_sync", [])
    assert verified["nodes_left_to_registration"] == [BOOTING, NEVER]

    daemons.start(BOOTING, values[BOOTING])  # what node-start's drop-in makes of its entry
    _wait_registered(controller, daemons, BOOTING)
    assert _leaf_of(controller, BOOTING) == "nn-leaf001"  # placed by slurmctld as it registered

    _backdate(controller, NEVER)
    code, verified = _run(controller, "verify", bundle)
    assert (code, verified["outcome"], verified["nodes_left_to_registration"]) == (EXIT_CODES["drift"], "drift", [])
    later, _ = _moved("25.11", [BOOTING, NEVER], **{"p5-001": ("nn-spine0", "nn-agg0", "nn-leaf001")})
    code, document = _run(controller, "apply", later)

    assert (document["error"], code, document["outcome"], document["apply_path"]) == (None, 0, "applied", "incremental")
    assert (document["nodes_left_to_registration"], document["nodes_updated"]) == ([], 2)  # p5-001 and NEVER
    assert (document["registration_wait_seconds"], document["nodes_placed_after_wait"]) == (None, [NEVER])
    assert (_leaf_of(controller, NEVER), _leaf_of(controller, "p5-001")) == ("nn-l9", "nn-leaf001")
    assert _run(controller, "verify", later)[1]["outcome"] == "in_sync"


def test_on_26_05_nothing_is_left_to_registration_and_the_apply_updates_them(
    sid_slurmd_root: Path, controllers
) -> None:
    controller = controllers(sid_slurmd_root)
    _start_with_slurmd(controller, "26.05")
    bundle, _ = _moved("26.05", [BOOTING, NEVER])  # listed anyway: the head node knows 26.05 does not place them

    code, document = _run(controller, "apply", bundle)

    assert (document["error"], code, document["outcome"], document["apply_path"]) == (None, 0, "applied", "incremental")
    assert (document["nodes_left_to_registration"], document["nodes_updated"]) == ([], 2)
    assert (_leaf_of(controller, BOOTING), _leaf_of(controller, NEVER)) == ("nn-leaf001", "nn-l9")
    assert _run(controller, "verify", bundle)[1]["outcome"] == "in_sync"


def test_on_25_11_an_apply_that_reloads_the_file_leaves_no_node_to_registration_and_says_no_wait(
    slurm2511_root: Path, controllers
) -> None:
    # The whole-file path (as a plan only a reconfigure loads takes it): the reload places the booting nodes as the
    # file says, so none is left, and the document must not send the backend back for a wait that holds no node.
    controller = controllers(slurm2511_root)
    _start_with_slurmd(controller, "25.11")
    bundle, _ = _moved("25.11", [BOOTING, NEVER])
    command = _applier_command(controller, "apply", bundle)

    ran = subprocess.run(
        command, env={**os.environ, WHOLE_FILE_ENV: "1"}, capture_output=True, text=True, timeout=300, check=False
    )
    document = _document(ran.stdout)

    assert (document["error"], ran.returncode, document["outcome"]) == (None, 0, "applied")
    assert (document["apply_path"], document["reconfigured"]) == ("whole_file", True)
    assert (document["nodes_left_to_registration"], document["registration_wait_seconds"]) == ([], None)
    assert (_leaf_of(controller, BOOTING), _leaf_of(controller, NEVER)) == ("nn-leaf001", "nn-l9")


def test_on_25_11_a_kill_after_the_record_and_before_an_overdue_node_is_placed_leaves_it_to_the_next_apply(
    slurm2511_root: Path, controllers
) -> None:
    # The same plan again when NEVER's wait ended (the backend's registration check): the record is rewritten, then
    # NEVER is placed by scontrol update. Killed in between, the next apply must still know NEVER was left and
    # place it the same way (live, listed in nodes_placed_after_wait for the audit), not by a reconfigure.
    controller = controllers(slurm2511_root)
    _start_with_slurmd(controller, "25.11")
    bundle, _ = _moved("25.11", [BOOTING, NEVER])
    assert _run(controller, "apply", bundle)[1]["nodes_left_to_registration"] == [BOOTING, NEVER]
    _backdate(controller, NEVER)
    command = _applier_command(controller, "apply", bundle)
    killed = subprocess.run(
        command, env={**os.environ, CRASH_ENV: "after-registration-record"}, capture_output=True, check=False
    )
    assert (killed.returncode, killed.stdout) == (-signal.SIGKILL, b""), killed.stderr

    code, document = _run(controller, "apply", bundle)

    assert (document["error"], code, document["outcome"], document["apply_path"]) == (None, 0, "applied", "incremental")
    assert (document["reconfigured"], document["nodes_placed_after_wait"]) == (False, [NEVER])
    assert (document["nodes_left_to_registration"], _leaf_of(controller, NEVER)) == ([BOOTING], "nn-l9")
