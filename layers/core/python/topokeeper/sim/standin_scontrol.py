"""A stand-in for ``scontrol`` on the file-only head node (``topokeeper.sim.file_head_node``). It is NOT Slurm.

No slurmctld runs. ``scontrol reconfigure`` plays slurmctld loading its config: it reads slurm.conf and
the topology file, refuses what slurmctld refuses where that matters to topokeeper (exit 1, the reasons
in the ``SlurmctldLogFile`` as slurmctld logs them, the previously loaded config stays), and otherwise
keeps a copy of the files as the loaded config. The other commands answer from that copy, in
slurmctld's one-line formats, for exactly what the applier, the agent and the simulator ask:

    scontrol version                     slurm VERSION (the scenario's)
    scontrol show config                 SLURM_CONF and SLURM_VERSION only
    scontrol -o [--future] show nodes    NodeName= and Partitions= of each node in slurm.conf
    scontrol [-a] -o show partition      PartitionName=, Default=, Nodes= and Topology=
    scontrol show topology [NAME]        switches (Level, LinkSpeed, every node below, child switches) and
                                         blocks (BlockIndex, Nodes, the base BlockSize) in file order,
                                         nodes slurm.conf does not define left out
    scontrol reconfigure

Slurm >= 25.05 reads topology.yaml (named topologies, ``Topology=`` per partition); older Slurm reads
topology.conf under ``TopologyPlugin``. Refused, as slurmctld 26.05 and 24.11 refuse them and with their
reasons (tests/integration/slurm/test_standin_scontrol.py holds it to the real ones): a topology file that
is missing, empty or does not parse; a topology entry without exactly one of tree, block and flat; a
duplicate switch or block name; a child switch that is not defined; switches that do not form a tree; a
bad hostlist; block sizes that are not the base size times a power of two; a partition ``Topology=``
naming no defined topology. Before 25.05 also: a key the topology plugin does not know, a block smaller
than the base size, an unknown plugin, and ``Topology=`` in slurm.conf, which makes every command fail
as the real client does.

Not modeled: scheduling, jobs, node states, daemons, aggregated blocks, block topologies without block
sizes, Include lines, every other slurm.conf key, and scontrol reading topology files itself (the real
``show topology`` fails while a broken file is on disk; the stand-in answers from what it loaded). It
refuses what it does not model (exit 1, "not modeled") rather than guess. Nothing here may be cited as
Slurm's behaviour: tests/integration/slurm prove that on a real slurmctld.

Run as ``python -m topokeeper.sim.standin_scontrol STATE_DIR ARGS...`` after ``write_state`` (the file-only
head node runs ``main`` without ``site``). It runs for every call the applier makes, so it imports little (no
yaml unless a topology.yaml is read), and ``reconfigure`` keeps the answers to the reads with what it loaded;
``topokeeper.sim.standin_reads`` answers those without importing this module.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TextIO

from topokeeper.sim import standin_state
from topokeeper.sim.standin_state import read_text
from topokeeper.wire import CONF_FORMAT, FIRST_YAML_VERSION, YAML_FORMAT, HostlistError, compress, expand

YAML_FILE, CONF_FILE = YAML_FORMAT, CONF_FORMAT
PLUGIN_FATAL = "fatal: Failed to initialize topology plugin"
_CONF_KEYS = {
    "topology/tree": {"switchname", "switches", "nodes", "linkspeed"},
    "topology/block": {"blockname", "nodes", "blocksizes"},
}
_FLAT_PLUGINS = (None, "topology/default")


class ConfigError(Exception):
    """A config slurmctld would not load: the lines it logs, the fatal one last."""

    def __init__(self, *lines: str) -> None:
        super().__init__(lines[-1])
        self.lines = lines


class Partition(NamedTuple):
    name: str
    nodes: tuple[str, ...]
    topology: str | None
    default: bool


class SlurmConf(NamedTuple):
    nodes: tuple[str, ...]  # the node table, in slurm.conf's order
    partitions: tuple[Partition, ...]
    plugin: str | None  # TopologyPlugin=


class Switch(NamedTuple):
    name: str
    children: tuple[str, ...]
    nodes: tuple[str, ...]
    link_speed: str


class Block(NamedTuple):
    name: str
    nodes: tuple[str, ...]


class Topology(NamedTuple):
    """A tree (switches), a block topology (blocks and the base block size), or flat (neither)."""

    name: str
    switches: tuple[Switch, ...] = ()
    blocks: tuple[Block, ...] = ()
    block_size: int = 0


class Loaded(NamedTuple):
    """What slurmctld serves once it has loaded a config."""

    conf: SlurmConf
    topologies: dict[str, Topology]  # by name (topology.yaml); empty before 25.05
    default: Topology  # what ``show topology`` without a name shows
    yaml_format: bool


# ------------------------------------------------------------------------------------------ slurm.conf


def parse_slurm_conf(text: str | None, path: str, *, yaml_format: bool) -> SlurmConf:
    if text is None:
        raise ConfigError(f'error: s_p_parse_file: unable to read "{path}": No such file or directory')
    nodes: dict[str, None] = {}  # an ordered set
    lines: dict[str, dict[str, str]] = {}  # partition -> its keys, lowercased
    plugin = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.split()[0].lower() == "include":
            raise ConfigError(f"error: {path} line {number}: Include is not modeled by the file-only stand-in")
        fields = _fields(line, f'error: Parse error in file {path} line {number}: "{raw.strip()}"')
        key, value = line.split()[0].split("=", 1)
        if key.lower() == "nodename" and value.upper() != "DEFAULT":
            nodes.update(dict.fromkeys(_hostlist(value, f"NodeName={value}")))
        elif key.lower() == "partitionname" and value.upper() != "DEFAULT":
            if "topology" in fields and not yaml_format:
                raise ConfigError(
                    "error: Parsing error at unrecognized key: Topology",
                    f'error: Parse error in file {path} line {number}: " Topology={fields["topology"]}"',
                )
            lines[value] = fields
        elif key.lower() == "topologyplugin":
            plugin = value
    partitions = tuple(
        Partition(
            name,
            tuple(nodes)
            if fields.get("nodes", "").upper() == "ALL"
            else _hostlist(fields.get("nodes", ""), f"partition {name}"),
            fields.get("topology"),
            fields.get("default", "NO").upper() == "YES",
        )
        for name, fields in lines.items()
    )
    return SlurmConf(tuple(nodes), partitions, plugin)


def _fields(line: str, parse_error: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if not sep:
            raise ConfigError(parse_error)
        fields[key.lower()] = value
    return fields


def _hostlist(expression: str, where: str) -> tuple[str, ...]:
    try:
        return tuple(expand(expression))
    except HostlistError:
        raise ConfigError(
            f"error: hostlist_create on {expression} error:", f"fatal: Invalid node name ({expression}) in {where}"
        ) from None


# ------------------------------------------------------------------------------------------ topology files


def parse_topology_yaml(text: str | None) -> tuple[dict[str, Topology], Topology]:
    """topology.yaml -> (topologies by name, the cluster default). No file: one flat default."""
    if text is None:
        return {}, Topology("")
    import yaml  # noqa: PLC0415 (here, not at the top: most calls need no YAML, and importing it is slow)

    try:
        # libyaml's parser when PyYAML has it (the same documents, several times faster); a file it refuses is
        # parsed again by the pure-Python parser, so the reason quoted is always that parser's.
        try:
            document = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe
        except yaml.YAMLError:
            document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(
            f"error: _yaml_to_data: YAML parser error: {' '.join(str(error).split())}",
            "error: Failed to load topology.yaml: Unable to convert Data type",
            PLUGIN_FATAL,
        ) from None
    if document is None:
        raise ConfigError("error: Failed to load topology.yaml: Unable to load file for reading", PLUGIN_FATAL)
    entries = [document] if isinstance(document, dict) else document  # one mapping is one topology
    if not isinstance(entries, list) or not entries or not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError("error: Failed to load topology.yaml: not a list of topologies", PLUGIN_FATAL)
    topologies: dict[str, Topology] = {}
    default: Topology | None = None
    for entry in entries:
        topology = _yaml_topology(entry)
        topologies.setdefault(topology.name, topology)  # of two with one name, slurmctld serves the first
        if entry.get("cluster_default") is True and default is None:
            default = topology
    return topologies, default or next(iter(topologies.values()))


def _yaml_topology(entry: dict[str, Any]) -> Topology:
    name = entry.get("topology")
    if not isinstance(name, str):
        raise ConfigError("error: Failed to load topology.yaml: a topology without a name", PLUGIN_FATAL)
    kinds = [kind for kind in ("tree", "block", "flat") if kind in entry]
    if len(kinds) != 1:
        raise ConfigError(
            f"error: topology {name} needs exactly one of tree, block and flat, not {kinds}", PLUGIN_FATAL
        )
    if kinds == ["flat"]:
        return Topology(name)
    body = entry[kinds[0]]
    if kinds == ["tree"]:
        items = _yaml_list(body, "switches", name)
        switches = [
            Switch(
                _yaml_text(item, "switch", name),
                _hostlist(_yaml_text(item, "children", name, ""), f"switch config ({item['switch']})"),
                _hostlist(_yaml_text(item, "nodes", name, ""), f"switch config ({item['switch']})"),
                link_speed="0",
            )
            for item in items
        ]
        return _tree(name, switches)
    blocks = [
        Block(_yaml_text(item, "block", name), _hostlist(_yaml_text(item, "nodes", name, ""), f"block {name}"))
        for item in _yaml_list(body, "blocks", name)
    ]
    sizes = body.get("block_sizes")
    if sizes is not None and not (isinstance(sizes, list) and all(type(size) is int for size in sizes)):
        raise ConfigError(f"fatal: Invalid BlockSizes value in topology {name}")
    return _blocks(name, blocks, sizes, yaml_format=True)


def _yaml_list(body: object, key: str, topology: str) -> list[dict[str, Any]]:
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ConfigError(f"error: topology {topology}: {key} is not a list of mappings", PLUGIN_FATAL)
    return items


def _yaml_text(item: dict[str, Any], key: str, topology: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"error: topology {topology}: {key} is not a string: {value!r}", PLUGIN_FATAL)
    return value


def parse_topology_conf(text: str | None, path: str, plugin: str | None) -> Topology:
    """topology.conf as the plugin in slurm.conf reads it (topology/default reads nothing: flat)."""
    if plugin in _FLAT_PLUGINS:
        return Topology("")
    if plugin not in _CONF_KEYS:
        raise ConfigError(f"error: cannot create topo context for {plugin}", PLUGIN_FATAL)
    unreadable = f"fatal: something wrong with opening/reading {path}"
    if text is None:
        raise ConfigError(f"{unreadable}: No such file or directory")
    switches: list[Switch] = []
    blocks: list[Block] = []
    sizes: list[int] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = _fields(line, f'error: Parse error in file {path} line {number}: "{raw.strip()}"')
        unknown = [key for key in fields if key not in _CONF_KEYS[plugin]]
        first = line.split("=", 1)[0].lower()
        if unknown or first not in ("switchname", "blockname", "blocksizes"):
            key = unknown[0] if unknown else first
            raise ConfigError(
                f"error: _parse_next_key: Parsing error at unrecognized key: {key}", f"{unreadable}: Invalid argument"
            )
        if first == "switchname":
            where = f"switch config ({fields['switchname']})"
            switches.append(
                Switch(
                    fields["switchname"],
                    _hostlist(fields.get("switches", ""), where),
                    _hostlist(fields.get("nodes", ""), where),
                    fields.get("linkspeed", "1"),
                )
            )
        elif first == "blockname":
            blocks.append(
                Block(fields["blockname"], _hostlist(fields.get("nodes", ""), f"block {fields['blockname']}"))
            )
        else:
            try:
                sizes = [int(size) for size in fields["blocksizes"].split(",")]
            except ValueError:
                raise ConfigError(f"fatal: Invalid BlockSizes value: {fields['blocksizes']}") from None
    if plugin == "topology/tree":
        return _tree("", switches)
    return _blocks("", blocks, sizes, yaml_format=False)


def _tree(name: str, switches: Sequence[Switch]) -> Topology:
    by_name: dict[str, Switch] = {}
    for switch in switches:
        if switch.name in by_name:
            raise ConfigError(f"fatal: Switch ({switch.name}) has already been defined")
        by_name[switch.name] = switch
    for switch in switches:
        for child in switch.children:
            if child not in by_name:
                raise ConfigError(f"fatal: Switch configuration {switch.name} has invalid child ({child})")
    _levels(by_name)  # refuses a cycle
    return Topology(name, switches=tuple(switches))


def _levels(switches: Mapping[str, Switch]) -> dict[str, int]:
    """Each switch's Level: 0 for a leaf, else one above its highest child."""
    levels: dict[str, int] = {}

    def level(name: str, path: frozenset[str]) -> int:
        if name in path:
            raise ConfigError("fatal: Switch configuration is not a tree")
        if name not in levels:
            children = switches[name].children
            levels[name] = 1 + max(level(child, path | {name}) for child in children) if children else 0
        return levels[name]

    for name in switches:
        level(name, frozenset())
    return levels


def _blocks(name: str, blocks: Sequence[Block], sizes: Sequence[int] | None, *, yaml_format: bool) -> Topology:
    seen: set[str] = set()
    for block in blocks:
        if block.name in seen:
            raise ConfigError(f"fatal: Block ({block.name}) has already been defined")
        seen.add(block.name)
    if not sizes:
        # slurmctld derives a base size then; which one is not modeled (topokeeper always writes the sizes).
        raise ConfigError(
            f"error: block topology {name or CONF_FILE} without block sizes is not modeled by the stand-in"
        )
    base = sizes[0]
    for size in sizes:
        ratio = size // base if base > 0 else 0
        if ratio < 1 or size % base or ratio & (ratio - 1):  # the base size times a power of two
            raise ConfigError(
                f"fatal: Invalid BlockSizes value in topology {name}"
                if yaml_format
                else f"fatal: Invalid BlockSizes value: {size}"
            )
    small = [block for block in blocks if len(block.nodes) < base]
    if small and not yaml_format:  # 25.05 and later accept a block smaller than the base size
        raise ConfigError(f"fatal: Block configuration ({small[0].name}) children count lower than bblock_node_cnt")
    return Topology(name, blocks=tuple(blocks), block_size=base)


def load(files: Mapping[str, str | None], conf_path: str, version: tuple[int, int]) -> Loaded:
    """slurmctld loading slurm.conf and its topology file (``files``: name -> text, None when missing)."""
    yaml_format = version >= FIRST_YAML_VERSION
    conf = parse_slurm_conf(files["slurm.conf"], conf_path, yaml_format=yaml_format)
    if not yaml_format:
        topology_path = os.path.join(os.path.dirname(conf_path), CONF_FILE)
        return Loaded(conf, {}, parse_topology_conf(files[CONF_FILE], topology_path, conf.plugin), yaml_format)
    topologies, default = parse_topology_yaml(files[YAML_FILE])
    for partition in conf.partitions:
        if partition.topology is not None and partition.topology not in topologies:
            raise ConfigError(
                "error: Invalid partition topology",
                f"fatal: read_slurm_conf reading {conf_path}: Requested topology configuration is not available",
            )
    return Loaded(conf, topologies, default, yaml_format)


# ------------------------------------------------------------------------------------------ answers


def show_topology(loaded: Loaded, name: str | None) -> tuple[str, str]:
    """``scontrol show topology [NAME]`` -> (stdout, stderr); it exits 0 either way, as scontrol does."""
    if loaded.yaml_format:
        topology = loaded.default if name is None else loaded.topologies.get(name)
        if topology is None:
            return "", "slurm_load_topo error: Requested topology configuration is not available\n"
        return _lines(_units(topology, loaded)), ""
    units = _units(loaded.default, loaded)
    if name is not None:
        # Before 25.05 NAME is a switch or block, or a node: every unit that lists it.
        units = [(unit, nodes, line) for unit, nodes, line in units if name in (unit, *nodes)]
        if not units:
            return "", f"scontrol: error: Topology information contains no switch or node named {name}\n"
    return _lines(units), ""


def _units(topology: Topology, loaded: Loaded) -> list[tuple[str, list[str], str]]:
    """(name, nodes shown, line) per switch or block, in file order."""
    known = set(loaded.conf.nodes)
    units = []
    if topology.switches:
        switches = {switch.name: switch for switch in topology.switches}
        levels = _levels(switches)
        for switch in topology.switches:
            # 24.11 lists a switch's own nodes as configured; 26.05, and every switch's nodes from below, only
            # the nodes slurm.conf defines.
            own = switch.nodes if not loaded.yaml_format else [node for node in switch.nodes if node in known]
            nodes = sorted({*own, *(node for node in _below(switch, switches) if node in known)})
            fields = [f"SwitchName={switch.name}", f"Level={levels[switch.name]}", f"LinkSpeed={switch.link_speed}"]
            fields.append(f"Nodes={compress(nodes)}")
            if switch.children:
                fields.append(f"Switches={','.join(switch.children)}")
            units.append((switch.name, nodes, " ".join(fields)))
    for index, block in enumerate(topology.blocks):
        nodes = [node for node in block.nodes if node in known]
        line = f"BlockName={block.name} BlockIndex={index} Nodes={compress(nodes)} BlockSize={topology.block_size}"
        units.append((block.name, nodes, line))
    return units


def _below(switch: Switch, switches: Mapping[str, Switch]) -> set[str]:
    nodes: set[str] = set()
    for child in switch.children:
        nodes.update(switches[child].nodes, _below(switches[child], switches))
    return nodes


def _lines(units: Iterable[tuple[str, list[str], str]]) -> str:
    return "".join(f"{line}\n" for _, _, line in units)


def show_partitions(conf: SlurmConf) -> str:
    lines = []
    for partition in conf.partitions:
        topology = f" Topology={partition.topology}" if partition.topology else ""
        nodes = compress(partition.nodes) if partition.nodes else "(null)"
        default = "YES" if partition.default else "NO"
        lines.append(f"PartitionName={partition.name} Default={default} Nodes={nodes}{topology}\n")
    return "".join(lines)


def show_nodes(conf: SlurmConf) -> str:
    members = [(partition.name, set(partition.nodes)) for partition in conf.partitions]
    lines = []
    for node in conf.nodes:
        partitions = ",".join(name for name, nodes in members if node in nodes)
        lines.append(f"NodeName={node} Partitions={partitions}\n")
    return "".join(lines)


# ------------------------------------------------------------------------------------------ the command


def write_state(state_dir: str, *, slurm_version: str, slurm_conf: str, log_file: str) -> None:
    """The stand-in's state before slurmctld's first load: what ``main`` needs to answer."""
    state = {"slurm_version": slurm_version, "slurm_conf": slurm_conf, "log_file": log_file, "loaded": None}
    standin_state.write_state(state_dir, state)


def _reconfigure(state: dict[str, Any], state_dir: str, version: tuple[int, int], stderr: TextIO) -> int:
    conf_path = state["slurm_conf"]
    topology_file = YAML_FILE if version >= FIRST_YAML_VERSION else CONF_FILE
    topology_path = os.path.join(os.path.dirname(conf_path), topology_file)
    files = {"slurm.conf": read_text(conf_path), topology_file: read_text(topology_path)}
    try:
        loaded = load(files, conf_path, version)
    except ConfigError as error:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with open(state["log_file"], "a") as log:
            log.writelines(f"[{stamp}] {line}\n" for line in error.lines)
        stderr.write("slurm_reconfigure error: Unspecified error\n")
        return 1
    standin_state.write_state(state_dir, {**state, "loaded": files, "answers": _answers(loaded)})
    return 0


def _answers(loaded: Loaded) -> dict[str, Any]:
    """What the reads ask of a loaded config, computed once when it loads (as slurmctld builds its tables then):
    ``main`` answers these from the state without parsing slurm.conf or the topology file again (every
    ``scontrol`` is a process of its own). Other topology names are computed when asked."""
    return {
        "partition": show_partitions(loaded.conf),
        "nodes": show_nodes(loaded.conf),
        "topology": show_topology(loaded, None),
        "named topology": {name: show_topology(loaded, name) for name in loaded.topologies},
    }


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    slurm_conf: str | None = None,
) -> int:
    """``scontrol ARGS`` for ``argv`` = STATE_DIR ARGS...; in process (the simulator's own reads of the file-only
    head node) it writes to ``stdout`` and ``stderr`` and takes ``slurm_conf`` for $SLURM_CONF."""
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    state_dir, *arguments = sys.argv[1:] if argv is None else argv
    state = standin_state.read_state(state_dir)
    major, minor = state["slurm_version"].split(".")[:2]
    version = (int(major), int(minor))
    yaml_format = version >= FIRST_YAML_VERSION
    conf_path = (os.environ.get("SLURM_CONF") if slurm_conf is None else slurm_conf) or state["slurm_conf"]
    conf_text = read_text(conf_path)
    try:  # every scontrol reads slurm.conf first, and stops when it cannot (the text loaded last did parse)
        if conf_text is None or conf_text != (state["loaded"] or {}).get("slurm.conf"):
            parse_slurm_conf(conf_text, conf_path, yaml_format=yaml_format)
    except ConfigError as error:
        stderr.writelines(f"scontrol: {line}\n" for line in error.lines)
        stderr.write("scontrol: fatal: Unable to process configuration file\n")
        return 1
    options = {argument for argument in arguments if argument.startswith("-")}
    words = [argument for argument in arguments if not argument.startswith("-")]
    modeled = options <= standin_state.OPTIONS
    answer = standin_state.loaded_answer(state, arguments)  # version, show config, the reads computed at load
    if answer is not None:
        stdout.write(answer[0])
        stderr.write(answer[1])
    elif modeled and words == ["reconfigure"]:
        return _reconfigure(state, state_dir, version, stderr)
    elif modeled and state["loaded"] is None:
        stderr.write("Unable to contact slurm controller (connect failure)\n")
        return 1
    elif modeled and words[:2] == ["show", "topology"] and len(words) == 3:
        # A name that is no topology (before 25.05: a switch, block or node).
        shown, complaint = show_topology(load(state["loaded"], state["slurm_conf"], version), words[2])
        stdout.write(shown)
        stderr.write(complaint)
    else:
        stderr.write(f"scontrol (topokeeper's file-only stand-in): not modeled: {' '.join(arguments)}\n")
        return 1
    return 0


def slurmctld_main(argv: Sequence[str] | None = None) -> int:
    """``slurmctld -D ... -f CONF`` for the applier's proof (``topokeeper.headnode.proof``): STATE_DIR ARGS...
    Loads CONF and the topology file beside it as ``reconfigure`` does, and logs as slurmctld does to the
    ``SlurmctldLogFile`` CONF names: the refusal, or that it runs as the primary controller. It exits at once
    rather than serving anything (the proof only waits for that line)."""
    state_dir, *arguments = sys.argv[1:] if argv is None else argv
    state = standin_state.read_state(state_dir)
    major, minor = state["slurm_version"].split(".")[:2]
    version = (int(major), int(minor))
    conf_path = arguments[arguments.index("-f") + 1]
    topology_file = YAML_FILE if version >= FIRST_YAML_VERSION else CONF_FILE
    files = {
        "slurm.conf": read_text(conf_path),
        topology_file: read_text(os.path.join(os.path.dirname(conf_path), topology_file)),
    }
    logs = [
        line.split("=", 1)[1].strip()
        for line in (files["slurm.conf"] or "").splitlines()
        if line.lower().startswith("slurmctldlogfile=")
    ]
    try:
        load(files, conf_path, version)
        lines: Sequence[str] = ("Running as primary controller",)
        code = 0
    except ConfigError as error:
        lines, code = error.lines, 1
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with open(logs[-1] if logs else os.devnull, "a") as log:
        log.writelines(f"[{stamp}] {line}\n" for line in lines)
    return code


if __name__ == "__main__":
    sys.exit(main())
