"""The renames of an apply, in an order whose every prefix slurmctld can load."""

from __future__ import annotations

import os
import re
from typing import (
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from topokeeper.headnode.bundle import Bundle
from topokeeper.headnode.config_dir import ConfigDir
from topokeeper.headnode.disk import Change
from topokeeper.headnode.slurm_conf import SlurmConf, set_key
from topokeeper.wire import YAML_FORMAT


class Step(NamedTuple):
    """One file of the transaction: written to ``temp`` first, then renamed over ``path`` in order."""

    label: str  # names its crash points: after-temp:<label>, after-rename:<label>
    path: str  # relative to the config directory
    temp: str
    text: str
    like: os.stat_result


def _union_yaml(old: str, new: str) -> Optional[str]:
    """``new`` plus the topologies of ``old`` that ``new`` lacks (after it, so ``new``'s cluster default stays
    first), or None when a file is not a block-style list of ``- topology: NAME`` entries."""
    old_entries, new_entries = _yaml_entries(old), _yaml_entries(new)
    if old_entries is None or new_entries is None:
        return None
    kept = [text for name, text in old_entries if name not in {name for name, _ in new_entries}]
    return new + ("" if new.endswith("\n") else "\n") + "".join(kept) if kept else None


_YAML_ITEM_NAME = re.compile(r"(?:- |  )topology:\s*(\S+)\s*$")


def _yaml_entries(text: str) -> Optional[List[Tuple[str, str]]]:
    entries: List[Tuple[Optional[str], List[str]]] = []
    for line in text.splitlines(True):
        if line.startswith("- "):
            entries.append((None, []))
        elif not entries:
            if line.strip() and line.strip() != "---" and not line.lstrip().startswith("#"):
                return None
            continue
        elif line.strip() and not line[0].isspace() and not line.startswith("#"):
            return None
        name, lines = entries[-1]
        found = _YAML_ITEM_NAME.match(line) if name is None else None
        entries[-1] = (found.group(1) if found else name, [*lines, line])
    if any(name is None for name, _ in entries):
        return None
    return [(str(name), "".join(lines)) for name, lines in entries]


def yaml_topology_names(text: Optional[str]) -> Optional[Set[str]]:
    entries = _yaml_entries(text or "")
    return None if entries is None else {name for name, _ in entries}


_PLUGIN_LINE = re.compile(r"^\s*TopologyPlugin\s*=", re.IGNORECASE)
_FLAT_PLUGIN = "topology/default"  # reads no topology.conf (24.11's name; 25.05 reads topology.yaml instead)


def _without_plugin(confs: Sequence[Change], old: Optional[str], new: Optional[str]) -> List[Tuple[Change, str]]:
    """Between tree and block (one plugin for the cluster before 25.05), each topology.conf is fatal under the
    other's plugin: the conf files that set the new plugin, set to the flat one instead, come first. Empty
    when the plugin does not change between two that read topology.conf."""
    if old == new or not {old, new} <= {"topology/tree", "topology/block"}:
        return []
    flat = []
    for change in confs:
        lines = change.new.split("\n")
        edited = [set_key(line, "TopologyPlugin", _FLAT_PLUGIN) if _PLUGIN_LINE.match(line) else line for line in lines]
        if edited != lines:
            flat.append((change, "\n".join(edited)))
    return flat


def ordered_steps(conf: SlurmConf, bundle: Bundle, changes: Sequence[Change], config: ConfigDir) -> List[Step]:
    """The renames in an order whose every prefix slurmctld can load.

    topology.yaml first when it defines every name slurm.conf uses now; else a union of the old and new
    topologies first, slurm.conf second, the new file last. topology.conf: the file first (the old plugin
    ignores or reads it), slurm.conf second; switching the plugin between tree and block (each file is fatal
    with the other's plugin): slurm.conf with the flat plugin first, the file, then slurm.conf.
    """
    topology = [change for change in changes if os.path.basename(change.path) == bundle.slurm_format]
    confs = [change for change in changes if change not in topology]

    def step(change: Change, text: str, label: str) -> Step:
        relative = config.relative(change.path)
        directory, name = os.path.split(relative)
        temp = os.path.join(directory, ".%s.%s.topokeeper-new" % (name, os.urandom(4).hex()))
        return Step(label, relative, temp, text, change.written_like)

    conf_steps = [step(change, change.new, os.path.basename(change.path)) for change in confs]
    if not topology:
        return conf_steps
    change = topology[0]
    final = step(change, change.new, bundle.slurm_format)
    flat = _without_plugin(confs, conf.last_value("TopologyPlugin"), bundle.topology_plugin)
    if bundle.slurm_format != YAML_FORMAT and flat:
        return [*(step(c, text, os.path.basename(c.path) + "+flat") for c, text in flat), final, *conf_steps]
    if bundle.slurm_format == YAML_FORMAT and confs:
        names = conf.partition_names()
        used_now = {conf.partition_topology(name) for name in names} - {None}
        used_next = {bundle.partitions.get(name, conf.partition_topology(name)) for name in names} - {None}
        if not used_now <= (yaml_topology_names(change.new) or set()):
            union = _union_yaml(change.old or "", change.new)
            if union is not None:
                return [step(change, union, bundle.slurm_format + "+union"), *conf_steps, final]
            if used_next <= (yaml_topology_names(change.old) or set()):
                return [
                    *conf_steps,
                    final,
                ]  # a file we cannot merge: the old one defines every name slurm.conf will use
    return [final, *conf_steps]
