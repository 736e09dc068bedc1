"""Validation of every name that reaches a Slurm file.

Slurm's parsers split on commas, brackets, '=', '#', whitespace and (in YAML) ':', so a name from AWS
that carried one of those could rewrite the file. Names are therefore restricted to a conservative
charset and to Slurm's 64-character limit (HOST_NAME_MAX; SwitchName "cannot be longer than 64").
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

MAX_SLURM_NAME_LENGTH = 64
# Slurm's hostlist reads a name's trailing digits as an unsigned long; a larger number is mangled.
MAX_NUMERIC_SUFFIX = 2**64 - 1
_SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TRAILING_DIGITS = re.compile(r"(\d+)$")
# A name that passes check_slurm_name for sure: at most 64 safe characters, not ending in 20 digits (19 digits
# never exceed MAX_NUMERIC_SUFFIX). One regex instead of three steps, for the 100,000 names of a large snapshot.
_PLAIN_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?<![0-9]{20})"
_PLAIN_SLURM_NAME = re.compile(_PLAIN_PATTERN)
_PLAIN_SLURM_NAME_LINES = re.compile(rf"(?:{_PLAIN_PATTERN}\n)*")


def check_slurm_name(value: str) -> str:
    """Return ``value`` if it is safe as a Slurm node, switch, block, partition or topology name."""
    if len(value) > MAX_SLURM_NAME_LENGTH:
        raise ValueError(f"longer than {MAX_SLURM_NAME_LENGTH} characters: {value[:70]!r}...")
    if not _SLURM_NAME.fullmatch(value):
        raise ValueError(f"not a safe Slurm name (letters, digits, '.', '_', '-'; starting alphanumeric): {value!r}")
    suffix = _TRAILING_DIGITS.search(value)
    if suffix and int(suffix.group(1)) > MAX_NUMERIC_SUFFIX:
        raise ValueError(f"trailing number is too large for Slurm's hostlist (max {MAX_NUMERIC_SUFFIX}): {value!r}")
    return value


def is_plain_slurm_name(value: object) -> bool:
    """True only for a ``str`` that ``check_slurm_name`` accepts unchanged (False says nothing: check it)."""
    return type(value) is str and _PLAIN_SLURM_NAME.fullmatch(value) is not None


def all_plain_slurm_names(values: list[object]) -> bool:
    """``all(map(is_plain_slurm_name, values))`` in one regex over them all (100,000 names in milliseconds)."""
    return each_line_matches(_PLAIN_SLURM_NAME_LINES, values)


def each_line_matches(lines: re.Pattern[str], values: list[object]) -> bool:
    """Whether every value is a ``str`` without a newline and ``lines``, a pattern ``(?:X\\n)*``, matches them all
    written one a line: X matches each value, in one regex call."""
    if not {*map(type, values)} <= {str}:
        return False
    text = "\n".join(values) + "\n"  # type: ignore[arg-type]
    return text.count("\n") == len(values) and lines.fullmatch(text) is not None


SlurmName = Annotated[str, AfterValidator(check_slurm_name)]
