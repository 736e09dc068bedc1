"""A unified diff without difflib (python3-minimal has none)."""

from __future__ import annotations

import bisect
from typing import (
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
)

from topokeeper.headnode.failures import hashable


def text_lines(text: Optional[str]) -> List[str]:
    """A file's lines without newlines (a final newline adds no empty line)."""
    lines = text.split("\n") if text else []
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _longest_increasing(pairs: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """The longest subsequence of ``pairs`` (ordered by their second index) whose first index increases."""
    tails: List[int] = []  # tails[k]: the smallest first index that ends an increasing run of length k + 1
    tail_at: List[int] = []  # where in pairs that run ends
    previous: List[int] = []  # per pair: the pair before it in its run, or -1
    for position, (first, _) in enumerate(pairs):
        k = bisect.bisect_left(tails, first)
        if k == len(tails):
            tails.append(first)
            tail_at.append(position)
        else:
            tails[k], tail_at[k] = first, position
        previous.append(tail_at[k - 1] if k else -1)
    run: List[Tuple[int, int]] = []
    position = tail_at[-1] if tail_at else -1
    while position >= 0:
        run.append(pairs[position])
        position = previous[position]
    return run[::-1]


def line_diff(old: Sequence[str], new: Sequence[str]) -> List[Tuple[str, str]]:
    """Edits from ``old`` to ``new`` as (" " | "-" | "+", line).

    Lines that occur exactly once in each file anchor the match, as in patience diff (topology files
    are mostly unique lines: switch names, node lists); between anchors, common leading and trailing
    lines are kept and the rest is replaced. Written here because python3-minimal has no difflib.
    """
    edits: List[Tuple[str, str]] = []

    def gap(old_lo: int, old_hi: int, new_lo: int, new_hi: int) -> None:
        while old_lo < old_hi and new_lo < new_hi and old[old_lo] == new[new_lo]:
            edits.append((" ", old[old_lo]))
            old_lo, new_lo = old_lo + 1, new_lo + 1
        tail = 0
        while old_hi - tail > old_lo and new_hi - tail > new_lo and old[old_hi - tail - 1] == new[new_hi - tail - 1]:
            tail += 1
        edits.extend(("-", line) for line in old[old_lo : old_hi - tail])
        edits.extend(("+", line) for line in new[new_lo : new_hi - tail])
        edits.extend((" ", line) for line in old[old_hi - tail : old_hi])

    old_count: Dict[str, int] = {}
    old_at: Dict[str, int] = {}
    for index, line in enumerate(old):
        old_count[line], old_at[line] = old_count.get(line, 0) + 1, index
    new_count: Dict[str, int] = {}
    for line in new:
        new_count[line] = new_count.get(line, 0) + 1
    anchors = [(old_at[line], j) for j, line in enumerate(new) if new_count[line] == 1 and old_count.get(line) == 1]
    old_pos = new_pos = 0
    for i, j in _longest_increasing(anchors):
        gap(old_pos, i, new_pos, j)
        edits.append((" ", old[i]))
        old_pos, new_pos = i + 1, j + 1
    gap(old_pos, len(old), new_pos, len(new))
    return edits


def _hunk_range(start: int, length: int) -> str:
    return "%d,%d" % (start + 1 if length else start, length)


def unified_diff(old: Optional[str], new: str, path: str, context: int = 3) -> str:
    """A unified diff of one file (``old`` None: the file does not exist yet)."""
    edits = line_diff(text_lines(old), text_lines(new))
    old_before: List[int] = []  # lines of old and new before each edit, for the hunk headers
    new_before: List[int] = []
    old_seen = new_seen = 0
    groups: List[List[int]] = []  # [first, last] changed edit of each hunk
    for index, (op, _) in enumerate(edits):
        old_before.append(old_seen)
        new_before.append(new_seen)
        old_seen += op != "+"
        new_seen += op != "-"
        if op != " ":
            if groups and index - groups[-1][1] <= 2 * context:
                groups[-1][1] = index
            else:
                groups.append([index, index])
    if not groups:
        return ""
    out = ["--- %s\n" % ("/dev/null" if old is None else path), "+++ %s\n" % path]
    for first, last in groups:
        low, high = max(first - context, 0), min(last + context + 1, len(edits))
        hunk = edits[low:high]
        old_length = sum(op != "+" for op, _ in hunk)
        new_length = sum(op != "-" for op, _ in hunk)
        out.append(
            "@@ -%s +%s @@\n" % (_hunk_range(old_before[low], old_length), _hunk_range(new_before[low], new_length))
        )
        out.extend(op + hashable(line) + "\n" for op, line in hunk)
    return "".join(out)
