"""slurm.conf: read and edit one key, keeping every other byte."""

from __future__ import annotations

import glob
import os
import re
from typing import (
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Set,
)

from topokeeper.headnode.config_dir import read_text
from topokeeper.headnode.failures import Failed, NotRegularFile, Refused

_KEY_VALUE = re.compile(r'([A-Za-z][A-Za-z0-9_]*)=("[^"]*"|\S*)')
_INCLUDE = re.compile(r"\s*include\s+(\S+)", re.IGNORECASE)
_MAX_INCLUDE_DEPTH = 8


class Entry(NamedTuple):
    """One ``Key=value`` on a line; ``start``/``end`` span the whole token."""

    key: str
    value: str
    start: int
    end: int


def strip_comment(line: str) -> str:
    """What Slurm parses of a line: up to a ``#`` that is not escaped by an odd number of backslashes."""
    backslashes = 0
    for index, char in enumerate(line):
        if char == "#" and backslashes % 2 == 0:
            return line[:index]
        backslashes = backslashes + 1 if char == "\\" else 0
    return line


def line_entries(line: str) -> List[Entry]:
    content = strip_comment(line)
    entries: List[Entry] = []
    for match in _KEY_VALUE.finditer(content):
        if match.start() > 0 and not content[match.start() - 1].isspace():
            continue
        value = match.group(2)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        entries.append(Entry(match.group(1), value, match.start(), match.end()))
    return entries


def _continues(line: str) -> bool:
    content = strip_comment(line).rstrip("\r")
    return (len(content) - len(content.rstrip("\\"))) % 2 == 1


def _remove_entry(line: str, entry: Entry) -> str:
    start, end = entry.start, entry.end
    while start > 0 and line[start - 1] in " \t":
        start -= 1
    if start == 0:  # nothing before it: drop the separator after it instead
        while end < len(line) and line[end] in " \t":
            end += 1
    return line[:start] + line[end:]


def set_key(line: str, key: str, value: Optional[str]) -> str:
    """Set ``key=value`` on one slurm.conf line, or remove the key when ``value`` is None.

    Slurm keys are case-insensitive, so an existing key keeps its own spelling. A new key goes after
    the last ``key=value``, before trailing spaces or a comment. Every other byte is kept.
    """
    matching = [entry for entry in line_entries(line) if entry.key.lower() == key.lower()]
    keep = matching[:1] if value is not None else []
    for entry in reversed(matching[len(keep) :]):
        line = _remove_entry(line, entry)
    if keep:
        first = keep[0]
        return line[: first.start] + "%s=%s" % (first.key, value) + line[first.end :]
    if value is None:
        return line
    entries = line_entries(line)
    end = entries[-1].end if entries else len(strip_comment(line).rstrip())
    return line[:end] + " %s=%s" % (key, value) + line[end:]


def _include_matches(pattern: str) -> List[str]:
    """The files an Include names: the path itself, or a glob's matches in sorted order (as glob(3) gives)."""
    if not glob.has_magic(pattern):
        return [pattern]
    return sorted(glob.glob(pattern))


class ConfLine(NamedTuple):
    path: str
    number: int  # physical line number (0-based) in that file
    entries: List[Entry]
    continues: bool  # ends with a backslash: Slurm joins the next line to it


class SlurmConf:
    """slurm.conf and the files it Includes from its own directory, in Slurm's reading order."""

    def __init__(self, path: str) -> None:
        self.directory = os.path.dirname(os.path.abspath(path))
        self._real_directory = os.path.realpath(self.directory)
        self.main = os.path.realpath(path)
        self.texts: Dict[str, str] = {}
        self.lines: List[ConfLine] = []
        self.not_followed: List[str] = []
        self._read(self.main, 0)

    def _read(self, path: str, depth: int) -> None:
        try:
            text = read_text(path)
        except NotRegularFile:
            raise  # refused as it is, naming the path (see modes.execute)
        except OSError as error:
            raise Failed("cannot read %s: %s" % (path, error.strerror)) from None
        self.texts[path] = text
        continued = False
        for index, line in enumerate(text.split("\n")):
            starts = not continued
            continued = _continues(line)
            if not starts:
                continue
            include = _INCLUDE.match(strip_comment(line))
            if include:
                self._include(include.group(1), depth)
            else:
                self.lines.append(ConfLine(path, index, line_entries(line), continued))

    def _include(self, target: str, depth: int) -> None:
        # Slurm resolves a relative Include against slurm.conf's directory; %c is the cluster name.
        pattern = os.path.join(self.directory, target)
        if "%" in target or depth >= _MAX_INCLUDE_DEPTH:
            self.not_followed.append(target)
            return
        for path in _include_matches(pattern):
            real = os.path.realpath(path)
            inside = os.path.commonpath([real, self._real_directory]) == self._real_directory
            if inside and os.path.isfile(real) and real not in self.texts:
                self._read(real, depth + 1)
            elif real not in self.texts:
                self.not_followed.append(target)

    def _lines_starting_with(self, key: str) -> List[ConfLine]:
        return [line for line in self.lines if line.entries and line.entries[0].key.lower() == key.lower()]

    def last_value(self, key: str) -> Optional[str]:
        """A global key's value: the last line that sets it wins, as in Slurm."""
        lines = self._lines_starting_with(key)
        return lines[-1].entries[0].value if lines else None

    def partition_lines(self, name: str) -> List[ConfLine]:
        return [line for line in self._lines_starting_with("PartitionName") if line.entries[0].value == name]

    def partition_names(self) -> Set[str]:
        names = {line.entries[0].value for line in self._lines_starting_with("PartitionName")}
        return {name for name in names if name.upper() != "DEFAULT"}

    def partition_topology(self, name: str) -> Optional[str]:
        lines = self.partition_lines(name)
        values = [entry.value for entry in lines[-1].entries if entry.key.lower() == "topology"] if lines else []
        return values[-1] if values else None

    def edited_texts(self, partitions: Mapping[str, Optional[str]], plugin: Optional[str]) -> Dict[str, str]:
        """The config files that change when each partition gets its Topology= (and the plugin is set)."""
        for line in self._lines_starting_with("PartitionName"):
            if line.entries[0].value.upper() == "DEFAULT" and any(e.key.lower() == "topology" for e in line.entries):
                raise Refused(
                    "%s line %d sets Topology= for every partition (PartitionName=DEFAULT); topokeeper sets it"
                    " per partition and cannot remove an inherited one" % (line.path, line.number + 1)
                )
        physical = {path: text.split("\n") for path, text in self.texts.items()}
        for name, value in sorted(partitions.items()):
            for line in self.partition_lines(name):
                if line.continues:
                    raise Refused(
                        "%s line %d: partition %s continues on the next line (trailing backslash);"
                        " topokeeper does not edit continued lines" % (line.path, line.number + 1, name)
                    )
                physical[line.path][line.number] = set_key(physical[line.path][line.number], "Topology", value)
        if plugin is not None:
            plugin_lines = self._lines_starting_with("TopologyPlugin")
            for line in plugin_lines:
                physical[line.path][line.number] = set_key(physical[line.path][line.number], "TopologyPlugin", plugin)
            if not plugin_lines:
                main = physical[self.main]
                if main[-1]:  # no newline at the end yet
                    main.append("")
                main[-1:] = ["TopologyPlugin=%s" % plugin, ""]
        edited = {path: "\n".join(lines) for path, lines in physical.items()}
        return {path: text for path, text in edited.items() if text != self.texts[path]}
