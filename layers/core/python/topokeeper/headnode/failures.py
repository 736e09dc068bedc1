"""The head-node program's refusals and failures, and the small text helpers its messages use."""

from __future__ import annotations

import errno
from typing import (
    Optional,
)


class Refused(Exception):
    """The bundle, or this cluster, rules the plan out. Nothing is written."""

    outcome = "refused"


class StaleBindings(Refused):
    """A node the plan named has another NodeAddr now (re-bound): plan again."""

    outcome = "stale_bindings"


class Failed(Exception):
    """The applier could not finish (scontrol missing or failing, lock busy, I/O error)."""


class NotRegularFile(OSError):
    """A FIFO, a directory, a link or a device where the applier reads or locks a regular file. An OSError, so
    whatever handles a failed read handles it; uncaught, the run ends refused: no retry helps until someone
    removes it."""

    outcome = "refused"

    def __init__(self, path: str, found: str) -> None:
        super().__init__(errno.EINVAL, "%s, not a regular file" % found, path)

    def __str__(self) -> str:
        return "%s is %s: topokeeper reads and locks only regular files; remove it" % (self.filename, self.strerror)


def shown_value(value: Optional[str]) -> str:
    return "(none)" if value is None else value


def hashable(text: str) -> str:
    """Disk text fit to hash or print: undecodable bytes become U+FFFD (such a file never equals a bundle's)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class BadSignature(Refused):
    """The bundle's signature is missing, malformed or not made by the trusted key."""

    outcome = "bad_signature"


class Replayed(Refused):
    """A validly signed bundle older than the last one this head node applied."""

    outcome = "replayed"
