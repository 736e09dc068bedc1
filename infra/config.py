"""The deployment settings from cdk.json context (or a ``-c topokeeper='{...}'`` override).

Validation is topokeeper.contract.config.Settings, the same model the Lambdas load from TOPOKEEPER_CONFIG;
this module only turns its errors into one line per problem that names the context key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aws_cdk import Duration
from pydantic import ValidationError

from infra.constants import CONFIG_FILE_CONTEXT_KEY, CONTEXT_KEY, EXAMPLES_CONTEXT_KEY
from topokeeper.contract.config import MAX_CONFIG_BYTES, Settings
from topokeeper.contract.constants import LOGIN_TARGET_GROUPS_ENV
from topokeeper.contract.errors import InputError, Permanent, field_path, one_line, unknown_key_hint
from topokeeper.contract.stack_spec import drift_alarm_period_seconds, login_environment_bytes


class ConfigError(Permanent, ValueError):
    """The deployment settings are missing or invalid; the message names the offending key."""


# Values from the shipped examples (cdk.json, the README): AWS's documentation accounts, example.com addresses,
# the sample head node. Deployed, they would name clusters and mailboxes that are not the operator's.
_PLACEHOLDERS = re.compile(
    r"(?<![0-9])(?:111122223333|123456789012|444455556666)(?![0-9])|@example\.(?:com|org|net)$|^i-0a1b2c3d4e5f60718$"
)


def read_context_config(raw: Any, config_file: Any) -> Any:
    """The settings object: from the file ``topokeeper:config-file`` names when set, else the inline context."""
    if config_file is None:
        return raw
    path = Path(str(config_file)).expanduser()
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"{CONFIG_FILE_CONTEXT_KEY}: cannot read {path}: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{CONFIG_FILE_CONTEXT_KEY}: {path} is not valid JSON: {one_line(str(error))}") from None
    if not isinstance(document, dict):
        kind = "null" if document is None else type(document).__name__
        raise ConfigError(f"{CONFIG_FILE_CONTEXT_KEY}: {path} holds {kind}, not the settings object {{...}}")
    return document


def refuse_placeholders(raw: Any) -> None:
    """One line for each example value left in the settings (a JSON object, or a JSON string from ``-c``)."""
    document = json.loads(raw) if isinstance(raw, str) else raw
    found = [
        f"{path}: {value!r} is an example value; set your own (or -c {EXAMPLES_CONTEXT_KEY}=true to synthesize "
        "the examples)"
        for path, value in _strings(document, CONTEXT_KEY)
        if _PLACEHOLDERS.search(value)
    ]
    if found:
        raise ConfigError("\n".join(found))


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, field_path([key], path))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


def load_settings(raw: Any) -> Settings:
    """Validate the context value: a JSON object from cdk.json, or a JSON string from ``-c``."""
    if raw is None:
        raise ConfigError(f"{CONTEXT_KEY}: missing; set it in cdk.json context or pass -c {CONTEXT_KEY}='{{...}}'")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{CONTEXT_KEY}: not valid JSON: {error}") from None
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as error:
        problems = [
            f"{field_path(item['loc'], CONTEXT_KEY)}: {one_line(item['msg'])}{unknown_key_hint(item, Settings)}"
            for item in error.errors(include_url=False)
        ]
        raise ConfigError("\n".join(problems)) from None
    drift_alarm_period(settings)  # checks drift_schedule and drift_alarm_periods
    size = len(settings.to_env().encode())
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{CONTEXT_KEY}: {size} bytes as TOPOKEEPER_CONFIG, over the {MAX_CONFIG_BYTES}-byte limit "
            "(Lambda allows 4 KB of environment variables per function); shorten or drop per-partition overrides"
        )
    # The ingest and drift functions also carry LOGIN_TARGET_GROUPS; the login settings themselves stay out.
    login = login_environment_bytes([cluster.name for cluster in settings.clusters if cluster.login.enabled])
    if size + login > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{CONTEXT_KEY}: {size} bytes as TOPOKEEPER_CONFIG and up to {login} as {LOGIN_TARGET_GROUPS_ENV} "
            f"(the login endpoints' target groups) exceed the {MAX_CONFIG_BYTES}-byte limit (Lambda allows 4 KB of "
            "environment variables per function); enable fewer login endpoints per stack"
        )
    return settings


def drift_alarm_period(settings: Settings) -> Duration:
    """The drift alarm's period (topokeeper.contract.stack_spec), or a ConfigError naming the context key."""
    try:
        return Duration.seconds(drift_alarm_period_seconds(settings))
    except InputError as error:
        raise ConfigError(f"{CONTEXT_KEY}.{error}") from None
