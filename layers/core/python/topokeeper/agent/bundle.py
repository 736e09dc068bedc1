"""The check a downloaded bundle passes before the applier sees it (which checks everything again)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Dict, Optional

from topokeeper.wire import BUNDLE_SCHEMAS

# The bundle schemas this agent understands, and the newest. A newer one is refused as "agent_outdated": the
# install script that shipped this agent must be re-run to get an agent (and applier) that knows it.
NEWEST_BUNDLE_SCHEMA = BUNDLE_SCHEMAS[-1]
BUNDLE_SCHEMA_NAME, _, _version = NEWEST_BUNDLE_SCHEMA.partition("/")
BUNDLE_SCHEMA_VERSION = int(_version)
AGENT_OUTDATED = "agent_outdated"


class BundleRefused(Exception):
    """The downloaded bundle must not reach the applier."""

    outcome = "refused"


class AgentOutdated(BundleRefused):
    """The bundle is of a newer schema than this agent knows: only an upgrade helps."""

    outcome = AGENT_OUTDATED


SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SCHEMA = re.compile(re.escape(BUNDLE_SCHEMA_NAME) + r"/([1-9][0-9]{0,5})")


def check_schema(schema: Any) -> None:
    """Only this agent's schemas pass; a newer version of them means this agent is outdated."""
    if schema in BUNDLE_SCHEMAS:
        return
    match = _SCHEMA.fullmatch(schema) if isinstance(schema, str) else None
    if match and int(match.group(1)) > BUNDLE_SCHEMA_VERSION:
        raise AgentOutdated(
            f"agent outdated: the bundle is {schema}, this agent knows {NEWEST_BUNDLE_SCHEMA} at most; re-run the "
            "`topokeeper agent install-script` output on this head node"
        )
    raise BundleRefused(f"schema: expected {' or '.join(BUNDLE_SCHEMAS)}, got {repr(schema)[:80]}")


def check_bundle(body: bytes, cluster: str) -> Dict[str, Any]:
    """Keep junk from the applier: the bundle parses, is this cluster's, and every file matches its sha256.
    The applier checks everything again; it never trusts this."""
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # RecursionError: nested past the stack
        raise BundleRefused(f"bundle is not JSON: {str(error)[:200]}") from error
    if not isinstance(document, dict):
        raise BundleRefused("bundle is not a JSON object")
    check_schema(document.get("schema"))
    if document.get("cluster_name") != cluster:
        raise BundleRefused(f"cluster_name: {document.get('cluster_name')!r} is not this cluster ({cluster!r})")
    if not isinstance(document.get("plan_sha256"), str) or not SHA256.match(document["plan_sha256"]):
        raise BundleRefused("plan_sha256: not a sha256")
    files = document.get("files")
    if not isinstance(files, dict):
        raise BundleRefused("files: not an object")
    for name in sorted(files):
        entry = files[name]
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str):
            raise BundleRefused(f"files[{name}].content: not a string")
        try:
            encoded = content.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate from a \ud800 escape: no file can hold it
            raise BundleRefused(f"files[{name}].content: not UTF-8 text") from error
        if entry.get("sha256") != hashlib.sha256(encoded).hexdigest():
            raise BundleRefused(f"files[{name}].sha256 does not match its content")
    return document


def plan_sha256_of(body: bytes) -> Optional[str]:
    """The plan hash a refused bundle claims, for the report only."""
    try:
        claimed = json.loads(body.decode("utf-8")).get("plan_sha256")
    except (UnicodeDecodeError, ValueError, AttributeError, RecursionError):
        return None
    return claimed if isinstance(claimed, str) and SHA256.match(claimed) else None
