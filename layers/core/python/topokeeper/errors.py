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

from pydantic import ValidationError


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


class InputError(Permanent, ValueError):
    """Bad input: ``field`` is a dotted path into the file or event it came from."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @classmethod
    def from_validation(cls, error: ValidationError, prefix: str = "") -> InputError:
        """The first pydantic error, with its location joined as ``a.b[2].c``."""
        first = error.errors()[0]
        path = prefix
        for part in first["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            else:
                path += f".{part}" if path else str(part)
        message = first["msg"].removeprefix("Value error, ")
        return cls(path or "input", message)


class ConcurrentUpdate(Retryable):
    """Another invocation changed the cluster state in between; retry with fresh state."""

    def __init__(self, message: str = "the cluster's state changed concurrently") -> None:
        super().__init__(message, code="ConditionalCheckFailedException")
