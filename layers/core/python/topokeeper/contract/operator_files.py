"""The files the operator commands read and write: every failure is one ``InputError`` naming the flag and
the file, never a traceback. Operator-only (it needs PyYAML): the Lambda layer does not ship it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic_core import from_json

from topokeeper.contract.errors import InputError

YAML_SUFFIXES = frozenset({".yaml", ".yml"})


def _kind(document: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean"}.get(type(document), f"the value {document!r}")


def read_mapping(path: Path, flag: str, *, always_yaml: bool = False) -> dict[str, Any]:
    """The mapping in ``path``: YAML for a ``.yaml``/``.yml`` name (or ``always_yaml``), else JSON.

    An empty YAML file (or one of comments only) is an empty mapping; any other non-mapping, such as ``[]``
    or ``0``, is refused rather than read as empty."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InputError(flag, f"cannot read {path}: {error.strerror}") from error
    is_yaml = always_yaml or path.suffix in YAML_SUFFIXES
    if not is_yaml:
        # pydantic-core's parser: json.loads' values from the bytes, faster and without a decoded copy (a
        # 100,000-node snapshot is 66 MB). What it refuses takes the way below, which names the error.
        try:
            document = from_json(raw)
        except ValueError:
            pass
        else:
            return _mapping(document, path, flag, is_yaml)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(flag, f"{path} is not UTF-8 text (byte {error.start} is {raw[error.start]:#04x})") from error
    syntax_errors: tuple[type[Exception], ...] = (json.JSONDecodeError,)
    if is_yaml:
        import yaml  # noqa: PLC0415 (only here: plan reads a JSON snapshot without PyYAML's ~15 ms import)

        syntax_errors = (yaml.YAMLError,)
    try:
        document = yaml.safe_load(text) if is_yaml else json.loads(text)
    except syntax_errors as error:
        syntax = "YAML" if is_yaml else "JSON"
        raise InputError(flag, f"{path} is not valid {syntax}: {str(error).splitlines()[0]}") from error
    except RecursionError as error:  # the parsers recurse per nesting level
        raise InputError(flag, f"{path} is nested too deeply") from error
    return _mapping(document, path, flag, is_yaml)


def _mapping(document: Any, path: Path, flag: str, is_yaml: bool) -> dict[str, Any]:
    if document is None and is_yaml:
        return {}
    if not isinstance(document, dict):
        raise InputError(flag, f"{path} must hold a mapping, not {_kind(document)}")
    return document


def prepare_out_dir(out: Path, flag: str = "--out") -> None:
    """Create the output directory (and its parents), or refuse it in one line."""
    if out.exists() and not out.is_dir():
        raise InputError(flag, f"{out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(flag, f"{out}: cannot create the directory: {error.strerror}") from error


def check_out_file(path: Path, flag: str = "--out") -> None:
    """Refuse, before any work is done, an output file that cannot be written where it is named."""
    if path.is_dir():
        raise InputError(flag, f"{path} is a directory, not a file")
    if not path.parent.is_dir():
        raise InputError(flag, f"{path}: cannot create the file: {path.parent} is not a directory")


def write_text_file(path: Path, text: str | bytes, flag: str = "--out") -> None:
    """Write ``path`` whole or not at all (a temporary file next to it, then a rename); bytes as they are."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        if isinstance(text, bytes):
            temporary.write_bytes(text)
        else:
            temporary.write_text(text)
        temporary.replace(path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise InputError(flag, f"{path}: cannot write: {error.strerror}") from error


def write_files(out: Path, files: Mapping[str, str | bytes], flag: str = "--out") -> list[Path]:
    """Write each named file into ``out``, creating it first; the paths written, sorted."""
    prepare_out_dir(out, flag)
    for name, content in files.items():
        write_text_file(out / name, content, flag)
    return [out / name for name in sorted(files)]
