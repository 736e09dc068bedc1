"""The agent's config file; its schema is ``topokeeper.wire.AgentConfig``, which the install script writes."""

from __future__ import annotations

import json

from topokeeper.wire import AgentConfig, AgentConfigError, agent_config_from_document


def load_config(path: str) -> AgentConfig:
    """Read the JSON config; every error (AgentConfigError) starts with the file's path and names the key."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError) as error:
        raise AgentConfigError(f"{path}: {error}") from error
    try:
        return agent_config_from_document(document)
    except AgentConfigError as error:
        raise AgentConfigError(f"{path}: {error}") from error
