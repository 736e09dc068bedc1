"""IAM's policy evaluation, for the statements the stack deploys: identity policies, resource policies (bucket,
queue) and KMS key policies, with AWS's logic between them.

No maintained evaluator fits: moto's own access control (``moto.iam.access_control``) matches identity policies'
actions only (its resources and conditions are a TODO) and nothing of resource or key policies; policyuniverse
expands actions and parliament lints, neither decides a request. So the rules are here, and only those the stack
uses: a condition operator or key outside them is an error, never a guess (``KNOWN_KEYS``, ``_OPERATORS``).

The logic (AWS's "policy evaluation logic", within one account):
- a matching explicit Deny in any policy refuses;
- otherwise S3, SQS and the rest allow when an identity policy or the resource policy allows;
- a KMS key allows only when its key policy does: naming the caller, or the account root (``arn:aws:iam::A:root``),
  which delegates to the caller's identity policies.
A resource policy's Allow for the account root grants nothing by itself: it delegates to IAM.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

Statement = Mapping[str, Any]
ContextValue = str | Sequence[str]

# The condition keys the emulator puts in a request's context; any other in a policy is an error.
KNOWN_KEYS = frozenset(
    {
        "aws:PrincipalArn",
        "aws:SecureTransport",
        "aws:SourceAccount",
        "aws:SourceArn",
        "events:source",
        "kms:ViaService",
        "s3:ResourceAccount",
        "s3:x-amz-server-side-encryption",
        "s3:x-amz-server-side-encryption-aws-kms-key-id",
        "s3:x-amz-server-side-encryption-customer-algorithm",
    }
)
_KEY_PREFIXES = ("ssm:resourceTag/",)
_STRING = ("StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringLike", "StringNotLike")
_ARN = ("ArnEquals", "ArnLike", "ArnNotEquals", "ArnNotLike")
_OPERATORS = frozenset({*_STRING, *_ARN, "Bool", "Null"})


@dataclass(frozen=True)
class Request:
    """One authorization question: ``principal`` (a role ARN, or a service principal such as
    ``events.amazonaws.com``) asks ``action`` on ``resource``, with the condition keys in ``context``."""

    principal: str
    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)
    account: str = ""  # the caller's account; a service principal has none


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str  # AWS's words after "because", e.g. "no identity-based policy allows the s3:GetObject action"


def _as_list(value: Any) -> list[Any]:
    return [value] if isinstance(value, str | bool) else list(value)


@cache
def _wildcard(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    """IAM's matching: * any run of characters, ? one character."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def matches(patterns: Sequence[str], value: str, *, ignore_case: bool = False) -> bool:
    return any(_wildcard(p, ignore_case).fullmatch(value) for p in patterns)


def _check_key(key: str) -> None:
    if key not in KNOWN_KEYS and not key.startswith(_KEY_PREFIXES):
        raise ValueError(f"the emulator does not evaluate the condition key {key}")


def _test(operator: str, wanted: list[Any], actual: list[str]) -> bool:
    """One operator on a present key: true when any value in the request matches any value in the policy."""
    negated = "Not" in operator
    positive = operator.replace("Not", "")
    if positive == "StringEquals":
        hit = any(a in [str(w) for w in wanted] for a in actual)
    elif positive in ("StringEqualsIgnoreCase", "Bool"):
        hit = any(a.lower() in [str(w).lower() for w in wanted] for a in actual)
    else:  # StringLike, ArnEquals, ArnLike: wildcards, case-sensitive
        hit = any(matches([str(w) for w in wanted], a) for a in actual)
    return not hit if negated else hit


def _condition_holds(operator: str, key: str, expected: Any, context: Mapping[str, ContextValue]) -> bool:
    _check_key(key)
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    if base not in _OPERATORS or (if_exists and base == "Null"):
        raise ValueError(f"the emulator does not evaluate the condition operator {operator}")
    wanted = _as_list(expected)
    present = key in context
    if base == "Null":  # "true": the key must be absent; "false": present
        return any(str(w).lower() == ("false" if present else "true") for w in wanted)
    if not present:
        # IAM: an absent key fails a positive operator and satisfies a negated one; ...IfExists satisfies both.
        return if_exists or "Not" in base
    return _test(base, wanted, [str(v) for v in _as_list(context[key])])


def conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, ContextValue]) -> bool:
    """Every operator and every key in it must hold (AND); the values listed for one key are alternatives (OR)."""
    return all(
        _condition_holds(operator, key, expected, context)
        for operator, tests in conditions.items()
        for key, expected in tests.items()
    )


def _principal_matches(principal: Any, request: Request, *, delegation: bool) -> bool:
    """Whether a resource policy's ``Principal`` names the caller. ``delegation``: whether the account root
    counts (it names every principal of the account, whose own identity policies must then allow)."""
    if principal == "*":
        return True
    for kind, values in principal.items():
        for value in _as_list(values):
            if kind == "Service" and value == request.principal:
                return True
            if kind != "AWS":
                continue
            if value in ("*", request.principal):
                return True
            if delegation and value in (request.account, f"arn:aws:iam::{request.account}:root"):
                return True
    return False


def statement_applies(statement: Statement, request: Request) -> bool:
    """Action, resource and conditions (not the principal) match the request."""
    if "NotAction" in statement:
        if matches(_as_list(statement["NotAction"]), request.action, ignore_case=True):
            return False
    elif not matches(_as_list(statement["Action"]), request.action, ignore_case=True):
        return False
    if "NotResource" in statement:
        if matches(_as_list(statement["NotResource"]), request.resource):
            return False
    elif not matches(_as_list(statement.get("Resource", "*")), request.resource):
        return False
    return conditions_hold(statement.get("Condition", {}), request.context)


def _effects(statements: Sequence[Statement], request: Request, principal_check: Any = None) -> set[str]:
    found = set()
    for statement in statements:
        if principal_check is not None and not principal_check(statement):
            continue
        if statement_applies(statement, request):
            found.add(statement["Effect"])
    return found


def decide(
    request: Request,
    identity: Sequence[Statement],
    resource_policy: Sequence[Statement] | None = None,
    *,
    key_policy: bool = False,
) -> Decision:
    """AWS's decision for a same-account request. ``resource_policy`` is the bucket's, queue's or key's
    statements (None: the resource has none); ``key_policy``: it is a KMS key policy, which must allow."""
    action = request.action
    own = _effects(identity, request)
    resource = resource_policy or []
    named = _effects(resource, request, lambda s: _principal_matches(s.get("Principal", {}), request, delegation=False))
    delegated = _effects(
        resource, request, lambda s: _principal_matches(s.get("Principal", {}), request, delegation=True)
    )
    if "Deny" in own:
        return Decision(False, "with an explicit deny in an identity-based policy")
    if "Deny" in delegated:
        return Decision(False, "with an explicit deny in a resource-based policy")
    if key_policy:
        root_allows = _effects(
            resource,
            request,
            lambda s: (
                _principal_matches(s.get("Principal", {}), request, delegation=True)
                and not _principal_matches(s.get("Principal", {}), request, delegation=False)
            ),
        )
        if "Allow" in named or ("Allow" in root_allows and "Allow" in own):
            return Decision(True, "")
        if "Allow" in root_allows:
            return Decision(False, f"no identity-based policy allows the {action} action")
        return Decision(False, f"no resource-based policy allows the {action} action")
    if "Allow" in own or "Allow" in named:
        return Decision(True, "")
    return Decision(False, f"no identity-based policy allows the {action} action")


def allows(statements: Sequence[Statement], action: str, resource: str, tags: Mapping[str, str]) -> bool:
    """Whether identity ``statements`` allow ``action`` on ``resource`` (an ARN) whose tags are ``tags``."""
    context = {f"ssm:resourceTag/{key}": value for key, value in tags.items()}
    return decide(Request("", action, resource, context), statements).allowed
