"""The wire contract: what the head-node programs and the rest of the package must agree on, written once.

Standard library only and Python 3.8-compatible: the head-node programs import it on the node, where nothing
else of the package is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional

# --- the pull agent ---

# Each cluster's agent reports with its own source, AGENT_SOURCE.<cluster>, which its IAM policy enforces
# (events:source): the source, not the detail, says which cluster a report is about. The bare AGENT_SOURCE is
# what agents before per-cluster sources sent; it only ever counts as an outdated agent.
AGENT_SOURCE = "topokeeper.agent"
AGENT_APPLY_DETAIL_TYPE = "Topology Apply Result"
AGENT_VERIFY_DETAIL_TYPE = "Topology Verify Result"
AGENT_DETAIL_TYPES = (AGENT_APPLY_DETAIL_TYPE, AGENT_VERIFY_DETAIL_TYPE)


def agent_source(cluster: str) -> str:
    """The event source only ``cluster``'s agent may send (its IAM policy's events:source condition)."""
    return AGENT_SOURCE + "." + cluster


def agent_source_cluster(source: str) -> Optional[str]:
    """The cluster an agent source belongs to; None for the legacy shared source and for other sources."""
    prefix = AGENT_SOURCE + "."
    if not source.startswith(prefix):
        return None
    return source[len(prefix) :] or None


# Where the agent channel puts a cluster's desired bundle in the plans bucket and the agent polls it:
# ``bundle.json`` to apply, ``verify.json`` to verify against only, ``verify-request.json`` to ask for a verify.
AGENT_KEY_PREFIX = "clusters"
# enforce: the agent applies bundle.json; verify: it only ever verifies against verify.json (HyperPod or
# ParallelCluster manages the topology).
AGENT_MODES = ("enforce", "verify")


def _agent_key(cluster: str, name: str, prefix: str) -> str:
    return "/".join(part for part in (prefix.strip("/"), cluster, name) if part)


def agent_bundle_key(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    return _agent_key(cluster, "bundle.json", prefix)


def agent_verify_key(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    return _agent_key(cluster, "verify.json", prefix)


def agent_verify_request_key(cluster: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    """Where the backend asks the agent for a verify at once (HyperPod changed the topology itself)."""
    return _agent_key(cluster, "verify-request.json", prefix)


def agent_desired_key(cluster: str, mode: str, prefix: str = AGENT_KEY_PREFIX) -> str:
    """The object the agent polls in ``mode``."""
    return agent_bundle_key(cluster, prefix) if mode == "enforce" else agent_verify_key(cluster, prefix)


# How long the agent lets one applier run, and how long a SIGTERM'd applier gets before SIGKILL: the same
# values as the applier's CHANNEL_TIMEOUT_SECONDS and TERMINATE_GRACE_SECONDS. When the applier's constants
# move into this module the lead keeps one name for each (the values stay).
APPLIER_TIMEOUT_SECONDS = 600.0
APPLIER_TERMINATE_GRACE_SECONDS = 15.0


@dataclass(frozen=True)
class AgentConfig:
    """The agent's config file (``/etc/topokeeper/agent.json``): written by ``topokeeper agent install-script``,
    read by the agent. Every key is a field; a key that is not one is an error."""

    cluster: str
    bucket: str
    region: str
    prefix: str = AGENT_KEY_PREFIX
    mode: str = "enforce"
    event_bus: str = "default"
    endpoint_url: Optional[str] = None  # one endpoint for S3 (path style) and EventBridge: tests, emulators
    poll_interval_seconds: float = 60.0
    verify_interval_seconds: float = 900.0
    applier: Optional[str] = None  # the applier program; None: applier.py beside the agent program
    state_dir: str = "/var/lib/topokeeper"
    applier_timeout_seconds: float = APPLIER_TIMEOUT_SECONDS
    request_timeout_seconds: float = 15.0
    # The applier's --trusted-key file: bundles must be signed by the stack's key (the install script writes it).
    trusted_key: Optional[str] = None

    @property
    def key(self) -> str:
        return agent_desired_key(self.cluster, self.mode, self.prefix)


_REQUIRED_AGENT_KEYS = ("cluster", "bucket", "region")


class AgentConfigError(ValueError):
    """The config document breaks the schema; the message names the key."""


def agent_config_from_document(document: Any) -> AgentConfig:
    """The config a JSON document describes; unknown keys and wrong types are errors that name the key."""
    if not isinstance(document, dict):
        raise AgentConfigError("expected a JSON object")
    known = {f.name: f for f in fields(AgentConfig)}
    for name in document:
        if name not in known:
            raise AgentConfigError(f"unknown key {name!r}")
    for name in _REQUIRED_AGENT_KEYS:
        if name not in document:
            raise AgentConfigError(f"missing key {name!r}")
    for name, value in document.items():
        _check_agent_value(name, known[name].type, value)
    if document.get("mode", "enforce") not in AGENT_MODES:
        raise AgentConfigError(f"mode must be one of {', '.join(AGENT_MODES)}")
    return AgentConfig(**document)


def agent_config_document(config: AgentConfig) -> Dict[str, Any]:
    """The JSON document of ``config`` (every field that is set), which agent_config_from_document reads back."""
    values: Mapping[str, Any] = {f.name: getattr(config, f.name) for f in fields(AgentConfig)}
    return {name: value for name, value in values.items() if value is not None}


def _check_agent_value(name: str, kind: Any, value: Any) -> None:
    # ``kind`` is the annotation as text (postponed annotations): "float", "str" or "Optional[str]".
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise AgentConfigError(f"{name} must be a number >= 0, finite")
    elif value is None and kind == "Optional[str]":
        return
    elif not isinstance(value, str) or (not value and name != "prefix"):
        raise AgentConfigError(f"{name} must be a non-empty string")
    elif not _encodes(value):  # a \ud800 escape: every URL and path built from it would fail
        raise AgentConfigError(f"{name} must be UTF-8 text")


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
