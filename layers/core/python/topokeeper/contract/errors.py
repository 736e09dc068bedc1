"""The package's one error hierarchy (outside the stdlib applier and agent, which keep their own).

Every failure the service layer has to decide about is one of three kinds:

- ``Retryable``: the same call may succeed later (throttling, a timeout, a conflicting write).
- ``Permanent``: it will fail the same way until someone changes something (access denied, a deleted
  resource, a disabled key); a queued message goes to the dead-letter queue with ``str(error)``.
- ``InputError`` (a ``Permanent``): bad input, naming the offending field.

Adapters translate AWS error codes into these (``topokeeper.adapters.aws``); the service layer never
sees botocore.
"""

from __future__ import annotations

import difflib
from collections import abc
from collections.abc import Iterable
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args, get_origin

if TYPE_CHECKING:  # pydantic is imported where it is used: the file-only head node's scontrol imports this
    from pydantic import BaseModel, ValidationError
    from pydantic_core import ErrorDetails


class TopokeeperError(Exception):
    """Base of every error the package raises on purpose.

    Adapters raise these for what AWS answered (a ``ClientError``: the call had no effect) or for what
    they refused before calling. A timeout or a lost connection is left as botocore raised it: the call
    may have taken effect, and the service layer must not assume otherwise (a delivery keeps its claim).
    """

    code: str | None = None  # the AWS error code, when AWS answered


class Retryable(TopokeeperError):
    """Try again later; ``code`` is the AWS error code when there is one."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Permanent(TopokeeperError):
    """Fails the same way until something outside changes; ``code`` is the AWS error code if any."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    """``text`` with each character ``str.isprintable`` refuses (a newline, a carriage return, an escape, a line
    separator) written as Python writes it in a string's repr (``\\n``, ``\\x1b``, ``\\u2028``), every other as
    it is: a name from the input can neither break an error's line nor pass for more lines of it."""
    if text.isprintable():
        return text
    return "".join(character if character.isprintable() else repr(character)[1:-1] for character in text)


def field_path(location: Iterable[int | str], prefix: str = "") -> str:
    """A pydantic location joined as ``prefix.a.b[2].c``, each name in it on one line (``one_line``)."""
    path = prefix
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{one_line(part)}" if path else one_line(part)
    return path


class InputError(Permanent, ValueError):
    """Bad input: ``field`` is a dotted path into the file or event it came from. Both parts are kept on one
    line (``one_line``), whatever names from the input they hold."""

    def __init__(self, field: str, message: str) -> None:
        field, message = one_line(field), one_line(message)
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @classmethod
    def from_validation(
        cls, error: ValidationError, prefix: str = "", model: type[BaseModel] | None = None
    ) -> InputError:
        """The first pydantic error, with its location joined as ``a.b[2].c`` (``field_path``); with the ``model``
        that was validated, an unknown key names the nearest one it accepts there."""
        first = error.errors()[0]
        message = first["msg"].removeprefix("Value error, ") + unknown_key_hint(first, model)
        return cls(field_path(first["loc"], prefix) or "input", message)


def unknown_key_hint(item: ErrorDetails, model: type[BaseModel] | None) -> str:
    """For a pydantic "extra inputs" error inside ``model``: ``: did you mean 'steps'?`` naming the nearest key
    it accepts at that place, else the keys it accepts there; "" for any other error."""
    if item["type"] != "extra_forbidden" or model is None or not item["loc"]:
        return ""
    keys = sorted(_keys_at(model, item["loc"][:-1]))
    nearest = difflib.get_close_matches(str(item["loc"][-1]), keys, n=1, cutoff=0.6)
    if nearest:
        return f": did you mean {nearest[0]!r}?"
    return f": expected one of {', '.join(keys)}" if keys else ""


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> set[str]:
    """The keys the mapping at ``loc`` inside ``model`` accepts (field names and aliases); empty where unknown."""
    from pydantic import BaseModel  # noqa: PLC0415 (see the imports)

    annotations: list[Any] = [model]
    for part in loc:
        inner: list[Any] = []
        for member in (m for annotation in annotations for m in _members(annotation)):
            origin = get_origin(member)
            if isinstance(member, type) and issubclass(member, BaseModel):
                inner += [f.annotation for name, f in member.model_fields.items() if part in (name, f.alias)]
            elif origin in (list, tuple, set, frozenset, abc.Sequence) and isinstance(part, int):
                inner += list(get_args(member)[:1])
            elif origin in (dict, abc.Mapping) and len(get_args(member)) == 2:
                inner.append(get_args(member)[1])
        annotations = inner
    keys: set[str] = set()
    for member in (m for annotation in annotations for m in _members(annotation)):
        if isinstance(member, type) and issubclass(member, BaseModel):
            keys |= {f.alias or name for name, f in member.model_fields.items()}
    return keys


def _members(annotation: Any) -> list[Any]:
    """The types an annotation may hold: Optional, unions and Annotated unwrapped."""
    if get_origin(annotation) is Annotated:
        return _members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


class ConcurrentUpdate(Retryable):
    """Another invocation changed the cluster state in between; retry with fresh state."""

    def __init__(self, message: str = "the cluster's state changed concurrently") -> None:
        super().__init__(message, code="ConditionalCheckFailedException")
