"""The deployment settings from cdk.json context (or a ``-c topokeeper='{...}'`` override).

Validation is topokeeper.contract.config.Settings, the same model the Lambdas load from TOPOKEEPER_CONFIG;
this module only turns its errors into one line per problem that names the context key.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Duration
from pydantic import ValidationError

from infra.constants import CONTEXT_KEY
from topokeeper.contract.config import MAX_CONFIG_BYTES, Settings
from topokeeper.contract.constants import LOGIN_TARGET_GROUPS_ENV
from topokeeper.contract.errors import InputError, Permanent, field_path, one_line, unknown_key_hint
from topokeeper.contract.stack_spec import drift_alarm_period_seconds, login_environment_bytes


class ConfigError(Permanent, ValueError):
    """The deployment settings are missing or invalid; the message names the offending key."""


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
