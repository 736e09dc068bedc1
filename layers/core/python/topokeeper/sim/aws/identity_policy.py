"""An identity policy as IAM evaluates it, for the few calls the emulator authorizes (SSM SendCommand).

moto authorizes nothing. Where a test names the caller's policy statements (the stack's, synthesized), the
emulator refuses what IAM would: a request is allowed when every resource it touches is allowed by an Allow
statement whose conditions hold, and no Deny statement matches. Only the condition operators and keys the
stack uses are understood; any other is an error, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_OPERATORS = ("StringEquals", "StringLike")
_RESOURCE_TAG = "ssm:resourceTag/"


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _wildcard(pattern: str) -> re.Pattern[str]:
    """IAM's matching: * any run of characters, ? one character, case-sensitive."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


def _matches(patterns: list[str], value: str, *, ignore_case: bool = False) -> bool:
    flags = re.IGNORECASE if ignore_case else 0
    return any(re.fullmatch(_wildcard(p).pattern, value, flags) for p in patterns)


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], tags: Mapping[str, str]) -> bool:
    for operator, tests in conditions.items():
        if operator not in _OPERATORS:
            raise ValueError(f"the emulator does not evaluate the condition operator {operator}")
        for key, expected in tests.items():
            if not key.startswith(_RESOURCE_TAG):
                raise ValueError(f"the emulator does not evaluate the condition key {key}")
            actual = tags.get(key[len(_RESOURCE_TAG) :])
            if actual is None:
                return False  # a missing key fails every positive string condition
            wanted = _as_list(expected)
            if not (actual in wanted if operator == "StringEquals" else _matches(wanted, actual)):
                return False
    return True


def allows(statements: Sequence[Mapping[str, Any]], action: str, resource: str, tags: Mapping[str, str]) -> bool:
    """Whether the statements allow ``action`` on ``resource`` (an ARN) whose tags are ``tags``."""
    allowed = False
    for statement in statements:
        if "NotAction" in statement or "NotResource" in statement:
            raise ValueError("the emulator does not evaluate NotAction or NotResource")
        if not _matches(_as_list(statement["Action"]), action, ignore_case=True):
            continue
        if not _matches(_as_list(statement["Resource"]), resource):
            continue
        if not _conditions_hold(statement.get("Condition", {}), tags):
            continue
        if statement["Effect"] == "Deny":
            return False
        allowed = True
    return allowed
