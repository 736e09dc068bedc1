"""The documentation's examples as data: the code blocks of README.md and the pages in docs/, the topokeeper
commands in them, and a matcher for shown output, so tests can run them and the pages cannot drift from the
code."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Written by make bench and make reliability, not by hand: they show no commands to run.
GENERATED = ("performance.md", "reliability.md")
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")  # a block in a list item is indented
_PROGRAMS = ("topokeeper", ".venv/bin/topokeeper")


def pages() -> list[Path]:
    """README.md, then every hand-written page in docs/."""
    docs = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED)
    return [README, *docs]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    page: Path
    line: int  # in its page
    text: str
    argv: tuple[str, ...]  # after the program name
    block: int  # index of its block in blocks()

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path | None = None) -> list[Block]:
    """The code blocks of one page, or of every page in order."""
    if page is None:
        return [block for each in pages() for block in blocks(each)]
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        indent, end = fence.group(1), index + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        body = tuple(line[len(indent) :] if line.startswith(indent) else line for line in lines[index + 1 : end])
        found.append(Block(page, index + 1, fence.group(2), body))
        index = end + 1
    return found


def _argv(text: str) -> tuple[str, ...] | None:
    """A command line's arguments, placeholders made concrete: ``<the stack's key>`` -> PLACEHOLDER,
    ``[--dry-run]`` -> ``--dry-run``; a redirection ends it."""
    text = re.sub(r"<[^<>]*>", "PLACEHOLDER", text)
    text = re.sub(r"\[(--[\w-]+)\]", r"\1", text)
    words = shlex.split(text, comments=True)
    if not words or words[0] not in _PROGRAMS:
        return None
    words = words[1:]
    for stop in (">", "|", "&&"):
        if stop in words:
            words = words[: words.index(stop)]
    return tuple(words)


def commands() -> list[Command]:
    """Every topokeeper command in a bash or sh block of every page (continuation lines joined)."""
    found = []
    for number, block in enumerate(blocks()):
        if block.lang not in ("bash", "sh"):
            continue
        pending, start = "", 0
        for offset, line in enumerate(block.lines):
            if not pending:
                start = block.line + 1 + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            whole, pending = pending + line, ""
            argv = _argv(whole.strip())
            if argv is not None:
                found.append(Command(block.page, start, whole.strip(), argv, number))
    return found


def shown_pattern(shown: list[str] | tuple[str, ...]) -> re.Pattern[str]:
    """Shown output as a pattern of the whole output: ``...`` inside a line is any text, a line of just
    ``...`` any number of lines; the rest is literal."""
    parts = []
    for line in shown:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def matches_shown(shown: list[str] | tuple[str, ...], output: str) -> bool:
    return shown_pattern(shown).fullmatch(output if output.endswith("\n") else output + "\n") is not None
