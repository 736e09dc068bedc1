"""The crash and fault matrix: the applier killed (SIGKILL) at every step of an apply on a real slurmctld.

The applier kills itself at a named step (``TOPOKEEPER_APPLIER_CRASH_AT``), so the cut is the same on
every run however slow the machine. After each kill: slurmctld serves the old or the new topology, never
a mix; slurmctld is then restarted from the files on disk (a reboot at that moment) and must start, at
every point (a new set is proved on a throw-away slurmctld before any rename, so a set slurmctld refuses
never reaches the disk; a proof killed mid-way leaves its throw-away, which the next apply stops); the next
verify recovers from the journal, the next apply converges, and a verify finds nothing. Write errors are
injected at each write (``TOPOKEEPER_APPLIER_FAULT_AT``); slurmctld is stopped during one apply; two
applies race. The recovery itself is killed in its reconfigure, and runs on a config tmpfs with no free page.

``make test`` runs a representative subset of the crash points on 26.05 and of the faults. ``make
reliability`` (TOPOKEEPER_RELIABILITY_FULL=1) runs every crash point on 26.05 and 24.11 and every fault, and
records each case (TOPOKEEPER_RELIABILITY_OUT) for docs/reliability.md
(tests/integration/slurm/reliability_report.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import gb200_nodes, node, p5_nodes
from tests.integration.head_node.test_applier_transaction import FAULT_POINTS
from tests.integration.slurm.test_applier_cloud_nodes_on_slurmctld import _leaf_of, _power
from tests.integration.slurm.test_applier_on_slurmctld import (
    _applier_command,
    _bundle,
    _cluster,
    _document,
    _plan,
    _run,
    _start,
    _with_content,
)
from tests.integration.slurm.test_applier_signed_bundles_on_slurmctld import _key_option
from tests.signing_support import sign
from topokeeper.domain.models import PartitionSettings
from topokeeper.headnode.bundle import parse_bundle
from topokeeper.headnode.config_dir import BACKUP_DIR, CRASH_ENV, FAULT_ENV, JOURNAL
from topokeeper.headnode.grouping import read_back
from topokeeper.headnode.proof import proof_dir_prefix
from topokeeper.headnode.scontrol import LiveTopologies
from topokeeper.headnode.signature import GENERATION_FILE
from topokeeper.render.bundle import RenderedPlan
from topokeeper.sim.slurm_chroot import HarnessError, SlurmController, installed_slurm_version
from topokeeper.wire import partition_topologies

pytestmark = pytest.mark.slurm

FULL = os.environ.get("TOPOKEEPER_RELIABILITY_FULL") == "1"
RECORDS = os.environ.get("TOPOKEEPER_RELIABILITY_OUT")


@dataclass(frozen=True)
class Scenario:
    """An apply from ``old`` to ``new`` on one Slurm version, killed at each of ``steps``."""

    name: str
    suite: str  # sid: 26.05, trixie: 24.11
    old: Callable[[], RenderedPlan]
    new: Callable[[], RenderedPlan]
    steps: tuple[str, ...]
    broken: bool = False  # slurmctld refuses ``new``: the rollback's crash points
    mixed: tuple[str, ...] = ()  # between two live node updates: slurmctld serves part of each until the next run


def _gb_only(version: str, **settings: PartitionSettings) -> RenderedPlan:
    return _plan({"gb": gb200_nodes(2)}, version, **settings)


# 26.05: gb turns from a block into a tree, so slurm.conf names block-gb until its own rename: three renames.
YAML_CHANGE = Scenario(
    "yaml-block-to-tree",
    "sid",
    lambda: _plan(_cluster()),
    lambda: _plan(_cluster(), gb=PartitionSettings(kind="tree")),
    (
        "during-proof",
        "after-journal",
        "after-temp:topology.yaml+union",
        "after-temp:slurm.conf",
        "after-temp:topology.yaml",
        "after-rename:topology.yaml+union",
        "after-rename:slurm.conf",
        "after-rename:topology.yaml",
        "during-reconfigure",
        "after-reconfigure",
    ),
)
# slurmctld refuses the new set (a switch defined twice; valid by hash): the points between the renames and
# the end of the forward reconfigure, where a kill used to leave the refused files for a restart to fail on.
YAML_REJECTED = Scenario(
    "yaml-rejected",
    "sid",
    lambda: _plan(_cluster()),
    lambda: _plan(_cluster(), gb=PartitionSettings(kind="tree")),
    (
        "after-rename:topology.yaml+union",
        "after-rename:slurm.conf",
        "after-rename:topology.yaml",
        "during-reconfigure",
    ),
    broken=True,
)
# 24.11: one cluster-wide plugin; each of tree's and block's topology.conf is fatal under the other's plugin, so
# slurm.conf names the flat plugin (which reads no topology.conf) while the file changes: three renames.
CONF_PLUGIN_SWITCH = Scenario(
    "conf-tree-to-block",
    "trixie",
    lambda: _gb_only("24.11", gb=PartitionSettings(kind="tree")),
    lambda: _gb_only("24.11"),
    (
        "during-proof",
        "after-journal",
        "after-temp:slurm.conf+flat",
        "after-temp:topology.conf",
        "after-temp:slurm.conf",
        "after-rename:slurm.conf+flat",
        "after-rename:topology.conf",
        "after-rename:slurm.conf",
        "during-reconfigure",
        "after-reconfigure",
    ),
)
CONF_REJECTED = Scenario(
    "conf-rejected",
    "trixie",
    lambda: _gb_only("24.11", gb=PartitionSettings(kind="tree")),
    lambda: _gb_only("24.11"),
    ("after-rename:topology.conf", "after-rename:slurm.conf", "during-reconfigure"),
    broken=True,
)


def _two_moves() -> RenderedPlan:
    """p5-003 to an existing leaf, p5-007 to a new leaf under a new intermediate switch: two live updates."""
    paths = {"p5-003": ("nn-spine0", "nn-agg0", "nn-leaf001"), "p5-007": ("nn-spine0", "nn-agg2", "nn-l9")}
    return _plan(_cluster(gpu=[node(n.name, path=paths.get(n.name, n.network_nodes)) for n in p5_nodes(8)]))


# 26.05, nodes moved within existing topologies: the files are written, then live node updates, no reconfigure.
YAML_INCREMENTAL = Scenario(
    "yaml-incremental",
    "sid",
    lambda: _plan(_cluster()),
    _two_moves,
    ("after-journal", "after-temp:topology.yaml", "after-rename:topology.yaml", "after-update:0", "after-update:1"),
    mixed=("after-update:0",),
)
# 26.05, the no-topology leaf loses its last two nodes: killed between their updates, it still holds one (not passed
# over as an emptied switch): the next run reloads the file, which lacks it.
YAML_EMPTIED = Scenario(
    "yaml-incremental-emptied",
    "sid",
    lambda: _plan(_cluster(gpu=[node(n.name) if n.name in ("p5-007", "p5-008") else n for n in p5_nodes(8)])),
    lambda: _plan(_cluster()),
    ("after-update:0", "after-update:1"),
    mixed=("after-update:0",),
)
SCENARIOS = [YAML_CHANGE, YAML_REJECTED, YAML_INCREMENTAL, YAML_EMPTIED]
SCENARIOS += [CONF_PLUGIN_SWITCH, CONF_REJECTED] if FULL else []
# make test: a kill in the proof, before the renames, between them, in the reconfigure; a refused set at both ends;
# every point of a live update.
FAST_STEPS = {
    YAML_CHANGE.name: ("during-proof", "after-temp:slurm.conf", "after-rename:slurm.conf", "during-reconfigure"),
    YAML_REJECTED.name: ("after-rename:topology.yaml+union", "during-reconfigure"),
    YAML_INCREMENTAL.name: YAML_INCREMENTAL.steps,
    YAML_EMPTIED.name: ("after-update:0",),
}
CASES = [
    pytest.param(s, step, id=f"{s.suite}-{s.name}-{step}")
    for s in SCENARIOS
    for step in s.steps
    if FULL or step in FAST_STEPS.get(s.name, ())
]


_DUPLICATE_SWITCH = "      - switch: nn-leaf000\n        nodes: p5-001\n"  # the file ends in tree-gpu's switches


def _record(kind: str, **fields: Any) -> None:
    if RECORDS:
        Path(RECORDS).parent.mkdir(parents=True, exist_ok=True)
        with open(RECORDS, "a") as handle:
            handle.write(json.dumps({"kind": kind, **fields}, sort_keys=True) + "\n")


def _root(request: pytest.FixtureRequest, suite: str) -> Path:
    root: Path = request.getfixturevalue("sid_root" if suite == "sid" else "trixie_root")
    return root


class _ChrootScontrol:
    """The applier's read-back, run from the test against the chroot's scontrol with a config of its own."""

    def __init__(self, controller: SlurmController, slurm_conf: str) -> None:
        self.controller, self.slurm_conf = controller, slurm_conf

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.controller.run("env", f"SLURM_CONF={self.slurm_conf}", "scontrol", *args, timeout=timeout)


def _client_config(controller: SlurmController, bundle: dict[str, Any]) -> str:
    """A client config dir holding the bundle's own topology file: ``scontrol show topology`` unpacks
    slurmctld's answer with the plugins of the topology file on the client's disk, which in a crash window
    is not the one slurmctld serves. Partition lines lose Topology= (the client does not need it)."""
    inner = f"{controller.inner_dir}/client-{bundle['plan_sha256'][:12]}"
    side = controller.root / inner.lstrip("/")
    side.mkdir(exist_ok=True)
    conf = re.sub(r" Topology=\S+", "", (controller.etc / "slurm.conf").read_text())
    plugin = bundle["topology_plugin"]
    (side / "slurm.conf").write_text(conf + (f"\nTopologyPlugin={plugin}\n" if plugin else ""))
    for name, entry in bundle["files"].items():
        (side / name).write_text(entry["content"])
    shutil.copy(controller.etc / "slurm.key", side / "slurm.key")
    return f"{inner}/slurm.conf"


def _serves(controller: SlurmController, bundle: dict[str, Any]) -> bool:
    """Whether slurmctld serves exactly this bundle's topologies and Topology= for its partitions."""
    scontrol = _ChrootScontrol(controller, _client_config(controller, bundle))
    listing = scontrol.run("-a", "-o", "show", "partition").stdout
    parsed = parse_bundle(json.dumps(bundle))
    _, drift = read_back(
        parsed,
        LiveTopologies(scontrol),  # type: ignore[arg-type]
        partition_topologies(listing),
    )
    return not drift


def _served(controller: SlurmController, old: dict[str, Any], new: dict[str, Any]) -> str:
    if "is UP" not in controller.run("scontrol", "ping").stdout:
        return "down"
    serves_old, serves_new = _serves(controller, old), _serves(controller, new)
    return "old" if serves_old and not serves_new else "new" if serves_new and not serves_old else "mix"


def _leftovers(controller: SlurmController) -> list[str]:
    """Temp files of a transaction, and the journal: none may outlive the next run."""
    names = [p.name for p in controller.etc.iterdir() if p.name.endswith((".topokeeper-new", ".topokeeper-old"))]
    journal = controller.etc / BACKUP_DIR / JOURNAL
    return names + ([JOURNAL] if journal.exists() else [])


def _crash(
    controller: SlurmController, bundle: dict[str, Any], step: str, *args: str, must_die: bool = True
) -> subprocess.CompletedProcess[str]:
    """Apply ``bundle``, killed at ``step`` (``must_die``: the run must reach it; a refused bundle may not)."""
    command = _applier_command(controller, "apply", bundle, *args)
    environment = {**os.environ, CRASH_ENV: step}
    run = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)
    if must_die:
        assert (run.returncode, run.stdout) == (-signal.SIGKILL, ""), run.stderr
    return run


def _restarts(controller: SlurmController) -> str:
    """Stop slurmctld and start it from the files on disk, as a reboot at that moment would: "" when it comes
    back up, else why not."""
    controller.stop()
    try:
        controller.start(timeout=20)
    except HarnessError as error:
        return str(error)
    return ""


def _throwaways(controller: SlurmController) -> list[int]:
    """Throw-away slurmctlds (and their ``timeout`` guards) that a proof of this config dir left running."""
    marker = proof_dir_prefix(controller.config_dir_inner).encode()
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize(("scenario", "step"), CASES)
def test_a_kill_at_every_step_leaves_files_a_restart_loads_and_the_next_runs_converge(
    request: pytest.FixtureRequest, controllers, scenario: Scenario, step: str
) -> None:
    old_plan, new_plan = scenario.old(), scenario.new()
    old, new = _bundle(old_plan), _bundle(new_plan)
    if scenario.broken:  # a block or switch defined twice: valid by hash, fatal for slurmctld
        duplicate = "BlockName=us-0000 Nodes=gb-001\n" if scenario.suite == "trixie" else _DUPLICATE_SWITCH
        new = _with_content(new, new_plan.topology_text + duplicate)
    root = _root(request, scenario.suite)
    controller = controllers(root)
    _start(controller, old_plan)
    assert _run(controller, "apply", old)[1]["outcome"] == "applied"

    run = _crash(controller, new, step, must_die=False)
    killed = (run.returncode, run.stdout) == (-signal.SIGKILL, "")
    assert killed or scenario.broken, run.stderr
    assert bool(_throwaways(controller)) == (step == "during-proof")  # the kill left its throw-away running
    after_kill = _served(controller, old, new)
    assert after_kill in (("mix",) if step in scenario.mixed else ("old", "new"))

    assert _restarts(controller) == ""  # a reboot at that moment, at every point
    if scenario.broken:  # proved on a throw-away slurmctld first: refused before any rename, never killed there
        assert not killed
        document = _document(run.stdout)
        assert (run.returncode, document["outcome"], document["reconfigured"]) == (1, "rolled_back", False)
        assert "already been defined" in document["error"] or scenario.suite == "trixie", document["error"]

    code, verified = _run(controller, "verify", new)
    recovery = verified["recovery"] or {}
    assert not _leftovers(controller)
    after_verify = _served(controller, old, new)
    assert after_verify in ("old", "new")

    code, applied = _run(controller, "apply", new)
    if scenario.broken:
        assert (code, applied["outcome"]) == (1, "rolled_back")
        end = _served(controller, old, new)
        assert end == "old"
        assert _run(controller, "verify", old)[1]["outcome"] == "in_sync"
    else:
        assert (code, applied["outcome"]) in ((0, "applied"), (0, "unchanged"))
        end = _served(controller, old, new)
        assert end == "new"
        assert _run(controller, "verify", new)[1]["outcome"] == "in_sync"
    assert not _leftovers(controller)
    assert not _throwaways(controller)  # a killed proof's slurmctld is stopped by the next apply
    assert _restarts(controller) == ""
    _record(
        "crash",
        slurm=installed_slurm_version(root),
        scenario=scenario.name,
        step=step,
        order=scenario.steps.index(step),
        killed=killed,
        served_after_kill=after_kill,
        loads_after_restart=True,
        recovery=recovery.get("action", "none"),
        next_verify=verified["outcome"],
        next_apply=applied["outcome"],
        end=end,
    )


@pytest.mark.parametrize("mode", ["verify", "apply"])
def test_a_recovery_while_slurmctld_is_down_keeps_its_direction_restarts_nothing_and_says_recovered(
    sid_root: Path, controllers, mode: str
) -> None:
    """Killed between the renames, then slurmctld down (a reboot before it starts): the next verify or apply
    finishes the renames from the journal (the proof accepted these files, so an unreachable slurmctld is no
    reason to roll back), starts nothing itself, and answers ``recovered``, not ``failed``; an apply applies
    nothing more (nothing can be read back). slurmctld then starts on the new files and the next apply
    changes nothing."""
    old_plan, new_plan = YAML_CHANGE.old(), YAML_CHANGE.new()
    old, new = _bundle(old_plan), _bundle(new_plan)
    controller = controllers(sid_root)
    _start(controller, old_plan)
    assert _run(controller, "apply", old)[1]["outcome"] == "applied"
    killed = _crash(controller, new, "after-rename:slurm.conf")
    assert killed.returncode == -signal.SIGKILL
    controller.stop()

    code, recovered = _run(controller, mode, new)

    assert (code, recovered["outcome"]) == (1, "recovered"), recovered["error"]
    assert recovered["recovery"]["action"] == "rolled_forward", recovered["recovery"]
    assert "slurmctld is not running" in recovered["error"]
    assert not _leftovers(controller)
    assert controller.current_pid() is None  # the applier started nothing
    assert _restarts(controller) == ""
    assert _served(controller, old, new) == "new"
    code, applied = _run(controller, "apply", new)
    assert (code, applied["outcome"], applied["recovery"]) == (0, "unchanged", None)
    _record(
        "fault",
        fault=f"slurmctld down after a kill between the renames, then {mode} (then slurmctld started)",
        outcome=f"{recovered['outcome']}, recovery rolled_forward",
        live="new",  # once slurmctld starts: the test restarts it and reads it back
        next_apply=applied["outcome"],
    )


def _old_applied(
    controller: SlurmController, edit_conf: Callable[[str], str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """slurmctld started on YAML_CHANGE's old plan, applied by the applier: (the old bundle, the new one)."""
    old_plan = YAML_CHANGE.old()
    _start(controller, old_plan, edit_conf=edit_conf)
    old = _bundle(old_plan)
    assert _run(controller, "apply", old)[1]["outcome"] == "applied"
    return old, _bundle(YAML_CHANGE.new())


def _config_files(controller: SlurmController, but: Path | None = None) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in controller.etc.iterdir() if p.is_file() and p != but}


FAULT_CASES = [(point, error) for point in FAULT_POINTS for error in ("ENOSPC", "EACCES")]
if not FULL:
    FAULT_CASES = [("temp:slurm.conf", "ENOSPC"), ("rename:topology.yaml", "EACCES")]


@pytest.mark.parametrize(("point", "error"), FAULT_CASES, ids=[f"{p}={e}" for p, e in FAULT_CASES])
def test_a_write_error_at_each_write_keeps_the_last_good_config_live(
    sid_root: Path, controllers, point: str, error: str
) -> None:
    controller = controllers(sid_root)
    old, new = _old_applied(controller)
    files = _config_files(controller)

    command = _applier_command(controller, "apply", new)
    environment = {**os.environ, FAULT_ENV: f"{point}={error}"}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)
    document = _document(result.stdout)

    assert (result.returncode, document["outcome"], document["reconfigured"]) == (1, "failed", False)
    assert os.strerror(getattr(errno, error)) in document["error"]
    assert _config_files(controller) == files
    assert _served(controller, old, new) == "old"
    assert not _leftovers(controller)
    code, applied = _run(controller, "apply", new)
    assert (code, applied["outcome"], _served(controller, old, new)) == (0, "applied", "new")
    _record("fault", fault=f"{error} at {point}", outcome=document["outcome"], live="old", next_apply="applied")


def test_slurmctld_down_during_an_apply_changes_nothing_and_the_next_apply_converges(
    sid_root: Path, controllers
) -> None:
    controller = controllers(sid_root)
    old, new = _old_applied(controller)
    files = _config_files(controller)
    controller.stop()

    code, document = _run(controller, "apply", new)

    assert (code, document["outcome"], document["reconfigured"]) == (1, "failed", False)
    assert "Unable to contact slurm controller" in document["error"]
    assert _config_files(controller) == files
    controller.start()
    assert _served(controller, old, new) == "old"
    code, applied = _run(controller, "apply", new)
    assert (code, applied["outcome"], _served(controller, old, new)) == (0, "applied", "new")
    _record("fault", fault="slurmctld down", outcome=document["outcome"], live="old", next_apply="applied")


def test_two_applies_at_once_serialize_on_the_lock(sid_root: Path, controllers) -> None:
    controller = controllers(sid_root)
    old, new = _old_applied(controller)

    commands = [_applier_command(controller, "apply", new) for _ in range(2)]
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    documents = [_document(process.communicate(timeout=300)[0]) for process in processes]

    assert sorted(d["outcome"] for d in documents) == ["applied", "unchanged"]
    assert _served(controller, old, new) == "new"
    assert not _leftovers(controller)
    _record("fault", fault="two applies at once", outcome="applied + unchanged", live="new", next_apply="unchanged")


PAGE = 4096
FULL_DISK_PAGES = list(range(5)) if FULL else [2]


@contextlib.contextmanager
def _tiny_config_disk(controller: SlurmController) -> Iterator[Callable[[str], str]]:
    """A 256 KiB tmpfs as the config dir (mounted before slurmctld starts, so its namespace sees it too):
    a real full disk, not a simulated one."""

    def mount(conf: str) -> str:
        key = (controller.etc / "slurm.key").read_bytes()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(controller.etc)], check=True)
        (controller.etc / "slurm.key").write_bytes(key)
        (controller.etc / "slurm.key").chmod(0o600)
        return conf

    try:
        yield mount
    finally:
        controller.stop()
        subprocess.run(["umount", str(controller.etc)], check=False)


def _fill(directory: Path, pages_left: int, name: str = "filler") -> Path:
    """Leave exactly ``pages_left`` free pages on the filesystem of ``directory``."""
    filler = directory / name
    free = os.statvfs(directory)
    filler.write_bytes(b"\0" * ((free.f_bavail - pages_left) * free.f_frsize))
    return filler


@pytest.mark.parametrize("pages_left", FULL_DISK_PAGES)
def test_a_really_full_config_disk_keeps_the_last_good_config_live(
    sid_root: Path, controllers, pages_left: int
) -> None:
    controller = controllers(sid_root)
    with _tiny_config_disk(controller) as mount:
        old, new = _old_applied(controller, edit_conf=mount)
        filler = _fill(controller.etc, pages_left)
        files = _config_files(controller, but=filler)

        code, document = _run(controller, "apply", new)

        assert (code, document["outcome"], document["reconfigured"]) == (1, "failed", False)
        assert "No space left on device" in document["error"]
        assert _config_files(controller, but=filler) == files
        assert _served(controller, old, new) == "old"
        assert not _leftovers(controller)
        filler.unlink()
        code, applied = _run(controller, "apply", new)
        assert (code, applied["outcome"], _served(controller, old, new)) == (0, "applied", "new")
    _record(
        "fault",
        fault=f"a full config disk (tmpfs, {pages_left} pages free): {document['error'][:90]}",
        outcome=document["outcome"],
        live="old",
        next_apply="applied",
    )


@pytest.mark.parametrize("mode", ["verify", "apply"])
def test_a_full_config_disk_does_not_block_the_recovery_of_a_cut_off_apply(
    sid_root: Path, controllers, mode: str
) -> None:
    """Killed with every new file renamed into place but not yet loaded, then the tmpfs filled to zero free pages
    (tmpfs reserves nothing, not even for root): the next signed run still rolls the apply forward, since that
    needs no new data block. What does need one (recording a newer generation) fails in one line naming the file,
    and succeeds once there is space."""
    controller = controllers(sid_root)
    old_plan, new_plan = YAML_CHANGE.old(), YAML_CHANGE.new()
    old, new = _bundle(old_plan), _bundle(new_plan)
    with _tiny_config_disk(controller) as mount:
        _start(controller, old_plan, edit_conf=mount)
        option = _key_option(controller)
        assert _run(controller, "apply", sign(old, 1), *option)[1]["outcome"] == "applied"
        _crash(controller, sign(new, 2), "after-rename:topology.yaml", *option)
        assert _served(controller, old, new) == "old"
        fillers = [_fill(controller.etc, 0)]

        code, document = _run(controller, mode, sign(new, 2, purpose=mode), *option)

        assert (document["recovery"] or {}).get("action") == "rolled_forward", document["error"]
        assert (code, document["outcome"]) == (0, "in_sync" if mode == "verify" else "applied")
        assert _served(controller, old, new) == "new"
        assert not _leftovers(controller)

        fillers.append(_fill(controller.etc, 0, "filler-2"))  # whatever the recovery freed
        # The same bundle again (a retried command) has its generation recorded already: nothing to write.
        code, again = _run(controller, "apply", sign(new, 2), *option)
        assert (code, again["outcome"]) == (0, "unchanged"), again["error"]
        files = {name: data for name, data in _config_files(controller).items() if not name.startswith("filler")}
        code, refused = _run(controller, "apply", sign(old, 3), *option)
        recorded = os.path.join(refused["config_dir"], BACKUP_DIR, GENERATION_FILE)
        assert (code, refused["outcome"], refused["reconfigured"]) == (1, "failed", False)
        assert recorded in refused["error"] and "No space left on device" in refused["error"], refused["error"]
        assert {name: data for name, data in _config_files(controller).items() if name in files} == files
        assert _served(controller, old, new) == "new"
        for filler in fillers:
            filler.unlink()
        code, applied = _run(controller, "apply", sign(old, 3), *option)
        assert (code, applied["outcome"], _served(controller, old, new)) == (0, "applied", "old")
        assert not _leftovers(controller)
    _record(
        "fault",
        fault=f"a full config disk (tmpfs, 0 pages free) after a kill between renames and reconfigure, then {mode}",
        outcome=f"{document['outcome']}, recovery rolled_forward",
        live="new",
        next_apply="applied",
    )


# The first kill leaves every new file in place (after the last rename, or in the forward reconfigure).
RECOVERY_CUTS = [(YAML_CHANGE, "after-rename:topology.yaml")]
if FULL:
    RECOVERY_CUTS += [(YAML_CHANGE, "during-reconfigure")]
    RECOVERY_CUTS += [(CONF_PLUGIN_SWITCH, step) for step in ("after-rename:slurm.conf", "during-reconfigure")]


@pytest.mark.parametrize(
    ("scenario", "first_kill"), RECOVERY_CUTS, ids=[f"{s.suite}-{s.name}-{step}" for s, step in RECOVERY_CUTS]
)
def test_a_kill_during_the_recoverys_own_reconfigure_keeps_rolling_forward(
    request: pytest.FixtureRequest, controllers, scenario: Scenario, first_kill: str
) -> None:
    """The recovery of a complete, loadable new config is killed in its own reconfigure, and slurmctld restarted
    (a reboot): it starts, and the next run still rolls forward (docs/reference.md: complete new files are rolled
    forward), never back to the old files."""
    old_plan, new_plan = scenario.old(), scenario.new()
    old, new = _bundle(old_plan), _bundle(new_plan)
    root = _root(request, scenario.suite)
    controller = controllers(root)
    _start(controller, old_plan)
    assert _run(controller, "apply", old)[1]["outcome"] == "applied"
    _crash(controller, new, first_kill)
    _crash(controller, new, "during-recovery-reconfigure")
    after_kill = _served(controller, old, new)
    assert after_kill in ("old", "new")
    assert _restarts(controller) == ""

    code, verified = _run(controller, "verify", new)

    assert (verified["recovery"] or {}).get("action") == "rolled_forward", verified["recovery"]
    assert (code, verified["outcome"]) == (0, "in_sync")
    assert _served(controller, old, new) == "new"
    assert not _leftovers(controller)
    code, applied = _run(controller, "apply", new)
    assert (code, applied["outcome"]) == (0, "unchanged")
    _record(
        "crash",
        slurm=installed_slurm_version(root),
        scenario=f"{scenario.name} (its recovery killed)",
        step=f"{first_kill}, then during-recovery-reconfigure",
        order=len(scenario.steps),
        served_after_kill=after_kill,
        loads_after_restart=True,
        recovery="rolled_forward",
        next_verify=verified["outcome"],
        next_apply=applied["outcome"],
        end="new",
    )


# 26.05, a whole-file apply with two powered-up CLOUD nodes on a dynamic topology: after its reconfigure, two
# live updates put them where the file says (headnode/cloud.py). Killed before or between them, the next apply
# (its files equal the plan, slurmctld differs; or it finds the journal) reloads the files and places them;
# killed after the last, slurmctld already serves the file. The switches of their old paths stay, emptied, which
# the read-back passes over, so the reconfigure modes.py keeps for any other difference left after the updates
# ("during-cloud-reconfigure") is not reached here.
CLOUD_STEPS = ("after-reconfigure", "cloud-after-update:0", "cloud-after-update:1")


@pytest.mark.parametrize("step", [s for s in CLOUD_STEPS if FULL or s == "cloud-after-update:0"])
def test_a_kill_around_the_cloud_node_updates_after_a_reconfigure_ends_with_live_equal_to_the_file(
    sid_root: Path, controllers, step: str
) -> None:
    first, moved, three_blocks = _plan(_cluster()), _two_moves(), _plan(_cluster(gb=gb200_nodes(3)))
    controller = controllers(sid_root)
    _start(controller, three_blocks)
    assert _run(controller, "apply", _bundle(first))[1]["outcome"] == "applied"
    _power(controller, "p5-[003,007]", "POWER_UP", "!POWERED_DOWN")
    assert _run(controller, "apply", _bundle(moved))[1]["apply_path"] == "incremental"

    _crash(controller, _bundle(three_blocks), step)
    after_kill = _served(controller, _bundle(moved), _bundle(three_blocks))  # the new files, those nodes not yet
    # No restart first: the harness's slurmctld starts clean (-c), which would place them from the files.
    code, verified = _run(controller, "verify", _bundle(three_blocks))
    code, applied = _run(controller, "apply", _bundle(three_blocks))

    assert (applied["error"], code) == (None, 0), applied["drift"]
    # Killed after the last update, slurmctld already serves the file: nothing left to do.
    assert applied["outcome"] == ("unchanged" if step == CLOUD_STEPS[-1] else "applied")
    assert (_leaf_of(controller, "p5-003"), _leaf_of(controller, "p5-007")) == ("nn-leaf000", "nn-leaf001")
    assert _run(controller, "verify", _bundle(three_blocks))[1]["outcome"] == "in_sync"
    assert _restarts(controller) == ""
    assert not _leftovers(controller)
    _record(
        "crash",
        slurm=installed_slurm_version(sid_root),
        scenario="yaml-cloud-nodes",
        step=step,
        order=CLOUD_STEPS.index(step),
        killed=True,
        served_after_kill=after_kill,
        loads_after_restart=True,
        recovery=(verified["recovery"] or {}).get("action", "none"),
        next_verify=verified["outcome"],
        next_apply=applied["outcome"],
        end="new",
    )
