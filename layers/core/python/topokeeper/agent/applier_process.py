"""The applier as a subprocess (an argv list, never a shell) and the result document the reports carry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional

from topokeeper.agent.json_text import no_constant
from topokeeper.wire import TERMINATE_GRACE_SECONDS, AgentConfig

# PutEvents takes at most 256 KiB per request; one entry per request leaves room for the envelope.
MAX_DETAIL_BYTES = 200 * 1024
# The applier a config names none of: the head-node program this agent runs from (the .pyz that holds the
# topokeeper package: it runs ``MODE BUNDLE`` as the applier).
DEFAULT_APPLIER = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def agent_result(outcome: str, mode: str, plan_sha256: Optional[str], error: str) -> Dict[str, Any]:
    """A result document in the applier's shape, for when the applier's own never came."""
    return {
        "outcome": outcome,
        "mode": mode,
        "plan_sha256": plan_sha256,
        "before_sha256": None,
        "after_sha256": None,
        "partitions_changed": [],
        "reconfigured": False,
        "error": error,
        "drift": [],
        "grouping_drift": False,
        "applier_version": None,  # the applier's own document never came
    }


def _run_bounded(argv: List[str], environment: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv``; past ``timeout`` send SIGTERM, wait TERMINATE_GRACE_SECONDS, then SIGKILL. The
    applier installs no handler: a cut-off apply is repaired from its journal at the next start, not on the way
    out."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(environment)) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.communicate(timeout=TERMINATE_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def run_applier(config: AgentConfig, mode: str, bundle_path: str, plan_sha256: Optional[str]) -> Dict[str, Any]:
    """``python3 APPLIER MODE BUNDLE`` (an argv list, never a shell) -> its JSON document."""
    argv = [sys.executable, config.applier or DEFAULT_APPLIER, mode, bundle_path]
    if config.trusted_key:
        argv += ["--trusted-key", config.trusted_key]
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    try:
        completed = _run_bounded(argv, environment, config.applier_timeout_seconds)
    except subprocess.TimeoutExpired:
        return agent_result(
            "timed_out", mode, plan_sha256, f"applier did not finish in {config.applier_timeout_seconds}s"
        )
    except OSError as error:
        return agent_result("failed", mode, plan_sha256, f"applier did not start: {error}")
    try:  # NaN or Infinity would make the report JSON that EventBridge refuses, blocking the outbox
        document = json.loads(completed.stdout.decode("utf-8"), parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        document = None
    if not isinstance(document, dict) or not isinstance(document.get("outcome"), str):
        stderr = completed.stderr.decode("utf-8", "replace").strip()[-2000:]
        return agent_result(
            "failed",
            mode,
            plan_sha256,
            f"applier exited {completed.returncode} without a result document: {stderr}",
        )
    return document


_SUMMARY_KEYS = (
    "outcome",
    "mode",
    "plan_sha256",
    "before_sha256",
    "after_sha256",
    "partitions_changed",
    "grouping_drift",
    "applier_version",
    "managed_by",  # ParallelCluster writes the topology: the backend keeps the cluster in verify
    "apply_path",  # incremental (live node updates) or whole_file (reconfigure)
    "nodes_updated",
)


def bounded_result(result: Dict[str, Any]) -> Dict[str, Any]:
    """The result as is when it fits one event; else its summary, the error cut short and the first drifts."""
    if len(json.dumps(result)) <= MAX_DETAIL_BYTES - 4096:
        return result
    summary = {key: result.get(key) for key in _SUMMARY_KEYS}
    summary["partitions_changed"] = list(result.get("partitions_changed") or [])[:100]
    summary["reconfigured"] = result.get("reconfigured")
    summary["error"] = str(result.get("error"))[:2000] if result.get("error") is not None else None
    summary["drift"] = list(result.get("drift") or [])[:20]
    summary["deferred"] = list(result.get("deferred") or [])[:100]  # what the backend must place again
    summary["truncated"] = True
    if len(json.dumps(summary)) > MAX_DETAIL_BYTES - 4096:
        summary["drift"] = []
    return summary
