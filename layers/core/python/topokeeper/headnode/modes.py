"""The three modes: apply, dry-run and verify."""

from __future__ import annotations

import contextlib
import os
import time
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from topokeeper.headnode.bundle import Bundle, parse_bundle
from topokeeper.headnode.cloud import place_cloud_nodes, set_aside_powered_down, without_nodes
from topokeeper.headnode.config_dir import (
    BACKUP_DIR,
    BACKUP_NAME,
    JOURNAL,
    MANIFEST,
    O_DIRECTORY,
    O_NOFOLLOW,
    WHOLE_FILE_ENV,
    Budget,
    ConfigDir,
    Faults,
    exclusive_lock,
    open_backup_root,
    read_json,
    refuse_links,
    remove_own_temps,
)
from topokeeper.headnode.deferral import rebound, without_deferred
from topokeeper.headnode.diff import unified_diff
from topokeeper.headnode.disk import (
    Change,
    DiskState,
    disk_drift,
    disk_sha256,
    managed_by,
    planned_changes,
    read_disk_state,
    topology_path,
)
from topokeeper.headnode.failures import Failed, NotRegularFile, Refused
from topokeeper.headnode.grouping import grouping_drift, read_back, with_kinds
from topokeeper.headnode.incremental import kept_elsewhere, update_live
from topokeeper.headnode.output import new_result
from topokeeper.headnode.proof import prove, refused_message
from topokeeper.headnode.registered import (
    REGISTRATION_FILE,
    Waiting,
    placed_before,
    read_record,
    read_record_in,
    still_left,
    waiting,
    write_record,
)
from topokeeper.headnode.scontrol import (
    LiveTopologies,
    Scontrol,
    check_cluster_knows,
    configured_slurm_conf,
    find_scontrol,
    find_slurm_conf,
    live_partitions,
    reconfigure,
    show_partitions,
    slurm_version,
    slurmctld_up,
)
from topokeeper.headnode.signature import (
    GENERATION_FILE,
    accept_generation,
    check_generation,
    check_signature,
    last_generation,
    read_trusted_key,
)
from topokeeper.headnode.slurm_conf import SlurmConf
from topokeeper.headnode.steps import Step, ordered_steps
from topokeeper.headnode.transaction import Context, Transaction, files_problem, restored_message
from topokeeper.wire import (
    APPLIER_BUDGET_SECONDS,
    CONF_FORMAT,
    MIN_RECONFIGURE_SECONDS,
    RECONFIGURE_TIMEOUT,
    REGISTRATION_SERIES,
    YAML_FORMAT,
    compress,
    expand,
    format_for_version,
    node_rows,
    one_line,
    partition_nodes,
    partition_topologies,
)
from topokeeper.wire_updates import AddedSwitches, eligibility


def _record_drift(
    result: Dict[str, Any],
    scontrol: Scontrol,
    bundle: Bundle,
    disk_entries: Sequence[Dict[str, str]] = (),
    *,
    set_aside: bool = True,
    left: FrozenSet[str] = frozenset(),
) -> None:
    """Compare what is live with the bundle, by name and by grouping, into readback, drift and grouping_drift.

    Grouping entries come first: they are what matters on a cluster whose topology HyperPod writes, and
    what a cut list keeps. ``set_aside``: powered-down CLOUD nodes off the plan are not drift (cloud.py), while
    the files on disk are the plan's; where they differ (``disk_entries``), a live difference may be theirs.
    ``left``: nodes left to registration within their wait (registered.py), compared without them.
    """
    topologies: LiveTopologies = LiveTopologies(scontrol)
    if left:
        bundle, topologies = without_nodes(bundle, topologies, left, prune=True)
    aside: Dict[str, List[str]] = {}
    if set_aside and not disk_entries and bundle.slurm_format == YAML_FORMAT:  # dynamic topology: Slurm >= 25.05
        show_nodes = scontrol.output("-o", "--future", "show", "nodes")
        bundle, topologies, aside = set_aside_powered_down(bundle, topologies, show_nodes)
    listing = show_partitions(scontrol)
    partitions = partition_topologies(listing)
    result["readback"], named = read_back(bundle, topologies, partitions)
    for name, nodes in aside.items():
        result["readback"][name]["powered_down_elsewhere"] = nodes
    grouping, differing = grouping_drift(bundle, topologies, partitions, partition_nodes(listing))
    result["partition_topologies"] = partitions
    result["drift"] = grouping + with_kinds([*disk_entries, *named], bundle, differing)
    result["grouping_drift"] = bool(grouping)


def _applicable(result: Dict[str, Any], bundle: Bundle, state: DiskState) -> Bundle:
    """What an apply makes live: the signed plan without the nodes re-bound since (deferral.py), each left where
    the topology file on disk has it."""
    return without_deferred(bundle, result["deferred"], state.files[bundle.slurm_format])


def dry_run(result: Dict[str, Any], conf: SlurmConf, bundle: Bundle) -> None:
    state = read_disk_state(conf, bundle)
    bundle = _applicable(result, bundle, state)
    if disk_sha256(bundle, state) == bundle.plan_sha256:
        result["outcome"], result["diff"] = "unchanged", ""
        return
    changes, result["partitions_changed"] = planned_changes(conf, bundle, state)
    result["outcome"] = "would_apply"
    result["diff"] = "".join(unified_diff(change.old, change.new, change.path) for change in changes)


def verify(result: Dict[str, Any], conf: SlurmConf, bundle: Bundle, scontrol: Scontrol) -> None:
    left: FrozenSet[str] = frozenset()
    record = read_record_in(os.path.realpath(conf.directory)) if bundle.slurm_format == YAML_FORMAT else {}
    if record:  # nodes an apply left to registration, still within their wait: not drift yet
        left = still_left(record, scontrol.output("-o", "--future", "show", "nodes"), time.time())
        result["nodes_left_to_registration"] = sorted(left)
    _record_drift(result, scontrol, bundle, disk_drift(conf, bundle, read_disk_state(conf, bundle)), left=left)
    result["outcome"] = "drift" if result["drift"] else "in_sync"


@contextlib.contextmanager
def transaction_for(conf: SlurmConf, context: Context) -> Iterator[Transaction]:
    config = ConfigDir(conf.directory)
    try:
        backup_fd = open_backup_root(config)
        try:
            # What a kill left; the lock is held.
            remove_own_temps(backup_fd, (JOURNAL, GENERATION_FILE, REGISTRATION_FILE))
            log_path = conf.last_value("SlurmctldLogFile")
            yield Transaction(config, backup_fd, context, log_path)
        finally:
            os.close(backup_fd)
    finally:
        config.close()


def recover_leftover(result: Dict[str, Any], conf_path: str, context: Context, bundle: Optional[Bundle]) -> None:
    """Before a verify or an apply (``bundle``) asks slurmctld anything: finish or undo an apply a kill cut off
    (only when its journal is there), so that a slurmctld that is down does not stop it."""
    conf = SlurmConf(conf_path)
    if not os.path.lexists(os.path.join(os.path.realpath(conf.directory), BACKUP_DIR, JOURNAL)):
        return
    lock = exclusive_lock(conf.directory, min(context.lock_timeout, context.budget.left()))
    with lock, transaction_for(conf, context) as transaction:
        if bundle is not None:
            _check_replay(transaction, bundle, context)
        transaction.recover(result)


def _check_replay(transaction: Transaction, bundle: Bundle, context: Context) -> None:
    """A signed apply bundle older than the recorded generation is refused before anything acts (only reads)."""
    if context.signed:
        recorded = os.path.join(transaction.config.path, BACKUP_DIR, GENERATION_FILE)
        check_generation(bundle, last_generation(transaction.backup_fd, recorded))


def _read_back_reconfigured(result: Dict[str, Any], transaction: Transaction, bundle: Bundle) -> None:
    """After a reconfigure: the powered-up CLOUD nodes it left on their dynamic topology are put where the file
    says (cloud.py), then the read-back is judged."""
    failed, before = "", result["nodes_updated"]
    if bundle.slurm_format == YAML_FORMAT:
        topology = bundle.files[bundle.slurm_format]
        failed = place_cloud_nodes(transaction.scontrol, topology, result, transaction.faults.crash)
    _record_drift(result, transaction.scontrol, bundle)
    if result["drift"] and result["nodes_updated"] > before and not failed:
        # The switches slurmctld made for their old paths outlive the moves (checked on 26.05), emptied: no drift
        # (grouping.emptied_switches). Any other difference: every CLOUD node's topology now equals the file's, so
        # one more reload builds exactly the file.
        code, message = transaction.faults.crash_during(
            "during-cloud-reconfigure",
            lambda: reconfigure(transaction.scontrol, transaction.log_path, transaction.budget.left()),
        )
        if code == 0:
            _record_drift(result, transaction.scontrol, bundle)
        else:
            failed = "the reconfigure after re-placing powered-up CLOUD nodes exited %d: %s" % (code, message)
    _judge_read_back(result)
    if failed and result["drift"]:
        result["error"] += "; %s" % failed


def _judge_read_back(result: Dict[str, Any]) -> None:
    result["outcome"] = "failed" if result["drift"] else "applied"
    if result["drift"]:
        result["error"] = (
            "slurmctld loaded the new config but the read-back differs from the plan (%d differences, see"
            " drift and readback); not rolled back, the previous files are in %s"
            % (len(result["drift"]), result["backup_dir"])
        )


def _newest_backup_of(transaction: Transaction, plan_sha256: str) -> Optional[Dict[str, Any]]:
    """A journal that undoes the apply that wrote this plan's files: its backup, newest first."""
    names = sorted((n for n in os.listdir(transaction.backup_fd) if BACKUP_NAME.match(n)), reverse=True)
    for name in names:
        try:
            fd = os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW, dir_fd=transaction.backup_fd)
        except OSError:
            continue
        try:
            manifest = read_json(fd, MANIFEST)
        except (OSError, ValueError, Failed):
            manifest = None
        finally:
            os.close(fd)
        if manifest and manifest.get("plan_sha256") == plan_sha256 and files_problem(manifest.get("files")) is None:
            return {"plan_sha256": plan_sha256, "backup": name, "files": manifest["files"], "steps": []}
    return None


def _reload_disk(transaction: Transaction, result: Dict[str, Any], bundle: Bundle) -> None:
    """The files equal the plan but slurmctld serves something else (a cut-off apply, an earlier failed
    read-back): load them, and put back the files before them if slurmctld refuses."""
    code, message = reconfigure(
        transaction.scontrol, transaction.log_path, transaction.budget.left() - RECONFIGURE_TIMEOUT
    )
    result["reconfigured"], result["reconfigure_exit_code"] = True, code
    if code == 0:
        _read_back_reconfigured(result, transaction, bundle)
        return
    journal = _newest_backup_of(transaction, bundle.plan_sha256)
    if journal is None:
        result["outcome"] = "failed"
        result["error"] = (
            "the files on disk equal the plan but slurmctld refuses them (%s) and no backup of the files before"
            " them is left; slurmctld keeps its running config" % message
        )
        return
    result["backup_dir"] = os.path.join(transaction.config.path, BACKUP_DIR, journal["backup"])
    errors, again, again_message = transaction.roll_back(journal)
    result["outcome"] = "failed" if errors or again else "rolled_back"
    result["error"] = "the files on disk equal the plan but slurmctld refuses them (%s); %s%s" % (
        message,
        restored_message(errors),
        " but %s" % again_message if again else " and live",
    )


def _write_targets(config: ConfigDir, conf_path: str, conf: SlurmConf, bundle: Bundle) -> List[str]:
    """slurm.conf as named (not resolved) and the topology file: an apply refuses either as a link."""
    return [os.path.join(config.path, os.path.basename(conf_path)), topology_path(conf, bundle.slurm_format)]


def _proved(result: Dict[str, Any], conf: SlurmConf, steps: Sequence[Step], context: Context) -> bool:
    """Whether a throw-away slurmctld loads the new set; before any file is replaced, so that no kill can leave
    files that a restarted slurmctld refuses (it would stay down). A refusal changes nothing: rolled_back."""
    seconds = context.budget.left() - RECONFIGURE_TIMEOUT - MIN_RECONFIGURE_SECONDS
    refused = prove(conf, steps, context.scontrol.path, context.faults, max(seconds, 1.0))
    if refused:
        result["outcome"], result["error"] = "rolled_back", refused_message(refused)
    return not refused


def _without(batches: Sequence[Tuple[str, str]], placed: Set[str]) -> List[Tuple[str, str]]:
    """The update batches minus the nodes slurmctld already serves where planned (placed at registration)."""
    if not placed:
        return list(batches)
    kept = [(compress(n for n in expand(hostlist) if n not in placed), value) for hostlist, value in batches]
    return [(hostlist, value) for hostlist, value in kept if hostlist]


def _note_placed_before(result: Dict[str, Any], bundle: Bundle, changes: Sequence[Change], context: Context) -> None:
    """Before anything changes: the nodes this apply would place that slurmctld already serves there."""
    topology = [change for change in changes if os.path.basename(change.path) == bundle.slurm_format]
    if not topology or bundle.slurm_format != YAML_FORMAT:
        return
    try:
        found = placed_before(topology[0].old, bundle.files[bundle.slurm_format], LiveTopologies(context.scontrol))
    except Failed:  # a slow read only loses the route's name: the apply places the nodes anyway
        return
    result["nodes_placed_before"] = found


def _leave_to_registration(result: Dict[str, Any], bundle: Bundle, transaction: Transaction) -> Waiting:
    """Before anything changes: the registering nodes this apply leaves to their slurmd, and batches for the
    recorded ones it places now (registered.py); the record rewritten when it changes."""
    record = read_record(transaction.backup_fd) if bundle.slurm_format == YAML_FORMAT else {}
    if slurm_version(result["slurm_version"])[:2] not in REGISTRATION_SERIES:
        bundle = bundle._replace(registering=())  # no slurmctld there places a resumed node at registration
    if not record and not bundle.registering:
        return Waiting({}, [])
    now = time.time()
    try:
        show_nodes = transaction.scontrol.output("-o", "--future", "show", "nodes")
        found = waiting(bundle, record, show_nodes, LiveTopologies(transaction.scontrol), now)
    except Failed:  # a slow read: nothing is left to registration, this apply places every node
        return Waiting({}, [])
    # Left by an earlier apply, placed by this one: the audit names this apply's route for them, not registration.
    placed = result["nodes_placed_after_wait"] = sorted(
        node for hostlist, _ in found.overdue for node in expand(hostlist)
    )
    # They stay recorded, their wait over, until an apply finds them placed: one killed before it placed them
    # would otherwise leave the next to take them for newly left, their wait started again.
    kept = {**found.left, **{node: min(record[node], now) for node in placed}}
    if kept != record:
        try:
            write_record(transaction.backup_fd, kept, transaction.faults)
        except OSError:  # unrecorded, verify would read them as drift: placed now instead
            return Waiting({}, found.overdue)
    transaction.faults.crash("after-registration-record")
    result["nodes_left_to_registration"] = sorted(found.left)
    if found.left:  # the backend comes back when the first wait ends (relative: the clocks may differ)
        result["registration_wait_seconds"] = round(min(found.left.values()) - now, 1)
    return found


def _incremental(
    result: Dict[str, Any],
    bundle: Bundle,
    changes: Sequence[Change],
    context: Context,
    wait: Optional[Waiting] = None,
) -> Optional[Callable[[], bool]]:
    """What brings slurmctld to the new files by live node updates, then reads back as verify does; None (and
    result["whole_file_reason"]) when only a reconfigure can."""
    if context.faults.whole_file_only:
        result["whole_file_reason"] = "%s=1 asks for the whole-file path" % WHOLE_FILE_ENV
        return None
    topology = [change for change in changes if os.path.basename(change.path) == bundle.slurm_format]
    others = [os.path.basename(change.path) for change in changes if change not in topology]
    added: AddedSwitches = {}
    batches, why = eligibility(
        slurm_version(result["slurm_version"]),
        bundle.slurm_format,
        others,
        topology[0].old if topology else None,
        bundle.files[bundle.slurm_format],
        added=added,
    )
    if batches is not None:
        why = kept_elsewhere(added, LiveTopologies(context.scontrol))
        batches = None if why else batches
    if batches is None:
        result["whole_file_reason"] = why
        return None
    wait = wait or Waiting({}, [])
    planned = _without(batches, set(result["nodes_placed_before"]) | set(wait.left))
    planned += _without(wait.overdue, {node for hostlist, _ in batches for node in expand(hostlist)})
    left = frozenset(wait.left)

    def live_update() -> bool:
        if not update_live(context.scontrol, planned, result, context.faults.crash):
            return False
        # Strict: a node the updates left off the file, powered down or not, is for the reconfigure to place
        # (but those left to registration, within their wait).
        _record_drift(result, context.scontrol, bundle, set_aside=False, left=left)
        if result["drift"]:
            result["whole_file_reason"] = "after %d live update(s) slurmctld differs from the plan (%d differences)" % (
                len(planned),
                len(result["drift"]),
            )
            return False
        result["apply_path"] = "incremental"
        return True

    return live_update


def _files_unchanged(result: Dict[str, Any], transaction: Transaction, bundle: Bundle, context: Context) -> None:
    """The files on disk are the plan's: unchanged only when slurmctld serves the plan too; else load the files
    (with rollback). Nodes left to registration past their wait are placed live first."""
    wait = _leave_to_registration(result, bundle, transaction)
    if wait.overdue:  # if the update fails, the reload below places them
        update_live(context.scontrol, wait.overdue, result, context.faults.crash)
    _record_drift(result, context.scontrol, bundle, left=frozenset(wait.left))
    if not result["drift"]:
        if result["nodes_updated"] and not result["reconfigured"]:
            result["apply_path"] = "incremental"  # the overdue nodes, placed live
        changed = result["reconfigured"] or result["nodes_updated"]
        result["outcome"] = "applied" if changed else "unchanged"
    elif result["reconfigured"]:  # the recovery just loaded them
        _read_back_reconfigured(result, transaction, bundle)
    else:
        _reload_disk(transaction, result, bundle)


def apply(result: Dict[str, Any], conf_path: str, bundle: Bundle, context: Context) -> None:
    conf = SlurmConf(conf_path)  # read again under the lock: another apply may just have changed it
    try:
        with transaction_for(conf, context) as transaction:
            _check_replay(transaction, bundle, context)  # a replay is refused before the recovery acts
            # First: a cut-off apply is finished before this one writes anything, even generation.json (a full
            # disk must not block the recovery, which itself needs no new block).
            transaction.recover(result)
            if context.signed:
                where = os.path.join(transaction.config.path, BACKUP_DIR)
                accept_generation(transaction.backup_fd, where, bundle, context.faults)
            conf = SlurmConf(conf_path)
            refuse_links(transaction.config, _write_targets(transaction.config, conf_path, conf, bundle))
            state = read_disk_state(conf, bundle)
            result["before_sha256"] = result["after_sha256"] = disk_sha256(bundle, state)
            bundle = _applicable(result, bundle, state)  # read under the lock, as what it keeps comes from disk
            if result["before_sha256"] == bundle.plan_sha256:
                _files_unchanged(result, transaction, bundle, context)
                return
            changes, result["partitions_changed"] = planned_changes(conf, bundle, state)
            steps = ordered_steps(conf, bundle, changes, transaction.config)
            if not _proved(result, conf, steps, context):
                return
            _note_placed_before(result, bundle, changes, context)
            wait = _leave_to_registration(result, bundle, transaction)
            live_update = _incremental(result, bundle, changes, context, wait)
            if transaction.run(steps, bundle.plan_sha256, result, live_update):
                if result["apply_path"] == "incremental":  # its read-back is done already
                    _judge_read_back(result)
                else:
                    _read_back_reconfigured(result, transaction, bundle)
    finally:  # measured, never assumed: also when the read-back itself fails
        if result["reconfigured"] and result["apply_path"] is None:
            result["apply_path"] = "whole_file"
        if result["reconfigured"]:  # the reload placed them as the file says: none is left to registration
            result["nodes_left_to_registration"], result["registration_wait_seconds"] = [], None
        with contextlib.suppress(Failed, OSError):
            result["after_sha256"] = disk_sha256(bundle, read_disk_state(SlurmConf(conf_path), bundle))


def execute(
    mode: str,
    bundle_text: str,
    lock_timeout: float,
    environ: Mapping[str, str],
    scontrol_path: Optional[str] = None,
    *,
    trusted_key: Optional[str] = None,
) -> Dict[str, Any]:
    result = new_result(mode)
    started = time.monotonic()
    budget = Budget(APPLIER_BUDGET_SECONDS)
    try:
        bundle = parse_bundle(bundle_text)
        result["plan_sha256"] = bundle.plan_sha256
        if trusted_key is not None:
            check_signature(bundle, mode, read_trusted_key(trusted_key))
            result["signature"], result["generation"] = "verified", bundle.generation
        scontrol = Scontrol(environ, find_scontrol(scontrol_path, configured_slurm_conf(environ), environ))
        result["scontrol"] = scontrol.path
        scontrol.deadline = budget.deadline
        context = Context(scontrol, budget, Faults(environ), lock_timeout, trusted_key is not None)
        conf_path = find_slurm_conf(environ, scontrol)
        scontrol.env["SLURM_CONF"] = conf_path  # scontrol reads the very file this edits
        result["config_dir"] = os.path.dirname(os.path.abspath(conf_path))
        version = slurm_version(scontrol.output("version"))
        result["slurm_version"] = "%d.%02d.%d" % version
        result["slurm_format"] = format_for_version(version)
        if bundle.slurm_format != result["slurm_format"]:
            raise Refused(
                "the bundle is rendered as %s, but Slurm %s reads %s"
                % (bundle.slurm_format, result["slurm_version"], result["slurm_format"])
            )
        if mode in ("verify", "apply"):  # an apply cut off by a kill: finished or undone first
            recover_leftover(result, conf_path, context, bundle if mode == "apply" else None)
            if _recovered_while_down(result, scontrol, mode):
                return _finished(result, started)
        conf = SlurmConf(conf_path)
        result["before_sha256"] = result["after_sha256"] = disk_sha256(bundle, read_disk_state(conf, bundle))
        result["partition_topologies"] = live_partitions(scontrol)
        # --future also lists FUTURE nodes, which slurmctld knows too.
        rows = result["slurm_nodes"] = node_rows(scontrol.output("-o", "--future", "show", "nodes"))
        result["managed_by"] = managed_by(conf)
        if mode == "apply" and result["managed_by"] and result["managed_by"] != bundle.replace_managed:
            raise Refused(
                "%s is generated by ParallelCluster, which rewrites it on update-cluster; topokeeper replaces it"
                " only when the cluster is configured to (replace_parallelcluster_topology); verify or dry-run"
                " only" % topology_path(conf, CONF_FORMAT)
            )
        if mode == "verify":
            verify(result, conf, bundle, scontrol)
        else:
            result["powered_down"], result["deferred"] = rebound(bundle, rows)
            _applicable(result, bundle, read_disk_state(conf, bundle))  # a whole refusal comes before the lock
            check_cluster_knows(conf, bundle, {row[0] for row in rows})
            if mode == "dry-run":
                config = ConfigDir(conf.directory)
                try:  # what apply would refuse, dry-run refuses too
                    refuse_links(config, _write_targets(config, conf_path, conf, bundle))
                finally:
                    config.close()
                dry_run(result, conf, bundle)
            else:
                with exclusive_lock(conf.directory, min(lock_timeout, budget.left())):
                    apply(result, conf_path, bundle, context)
    except (Refused, NotRegularFile) as error:
        result["outcome"], result["error"] = error.outcome, one_line(str(error))
    except Failed as error:
        result["outcome"], result["error"] = "failed", one_line(str(error))
    except Exception as error:  # stdout must stay one JSON document, never a traceback
        result["outcome"] = "failed"
        result["error"] = one_line("internal error: %s: %s" % (type(error).__name__, error))
    return _finished(result, started)


def _finished(result: Dict[str, Any], started: float) -> Dict[str, Any]:
    result["duration_seconds"] = round(time.monotonic() - started, 3)
    return result


def _recovered_while_down(result: Dict[str, Any], scontrol: Scontrol, mode: str) -> bool:
    """A recovery that left a whole set on disk (an error raises) while slurmctld is not running: ``recovered``,
    not a failure. Nothing is started: whatever runs slurmctld starts it, and it loads these files. An apply
    stops there: nothing can be checked against, or read back from, a slurmctld that is down."""
    recovery = result.get("recovery")
    if not recovery or result["reconfigure_exit_code"] in (0, None) or slurmctld_up(scontrol):
        return False
    result["outcome"] = "recovered"
    result["error"] = (
        "a cut-off apply was %s from its journal; slurmctld is not running, so nothing was loaded or verified:"
        " it loads the files on disk when it starts (the applier starts nothing)%s"
        % (recovery.get("action"), "; this bundle was not applied, send it again then" if mode == "apply" else "")
    )
    return True
