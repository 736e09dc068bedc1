"""Errors that reach the user as one line naming the offending field."""

from __future__ import annotations

from pydantic import ValidationError


class InputError(ValueError):
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
