"""The agent's placement step (``placement_metrics``): the head-node program's read-only ``placement-facts``, put
in the cluster's prefix of the plan bucket (``wire.agent_placement_facts_key``), where the drift check and
``topokeeper placement --cluster`` read the newest. SSM Run Command cannot reach a HyperPod head node, so the
agent brings the facts out as it brings its reports.

What is put is always one ``topokeeper.placement-facts/1`` document, JSON with every non-ASCII and control
character escaped: the program's own, or one whose ``error`` says in one line why there are no facts (the program
failed, printed no document, or printed more than MAX_FACTS_BYTES), so the reader reports the reason rather than
old facts as current. Job names, comments and users are never asked for (``topokeeper.headnode.placement``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, Optional, Tuple

from topokeeper.agent.applier_process import DEFAULT_APPLIER, _run_bounded
from topokeeper.agent.json_text import no_constant
from topokeeper.wire import MAX_FULL_RESULT_BYTES, PLACEMENT_FACTS_SCHEMA, AgentConfig, one_line

# The bound the SSM path's whole result has too: 10,000 jobs and 20,000 nodes take about 1 MB.
MAX_FACTS_BYTES = MAX_FULL_RESULT_BYTES
# slurmctld answers three reads; a cycle that runs this runs no applier (cycle.Agent), so it stays in systemd's bound.
FACTS_TIMEOUT_SECONDS = 120.0


def _printable(text: str) -> str:
    """One line of printable ASCII: a control character (an escape sequence) or any other as ``\\xNN``/``\\uNNNN``,
    so an error read back and printed by whoever reads the facts cannot drive a terminal."""
    return "".join(
        ch
        if " " <= ch <= "~"
        else "\\x%02x" % ord(ch)
        if ord(ch) < 0x100
        else "\\u%04x" % ord(ch)
        if ord(ch) < 0x10000
        else "\\U%08x" % ord(ch)
        for ch in one_line(text)
    )


def _refused(error: str) -> Dict[str, Any]:
    return {"schema": PLACEMENT_FACTS_SCHEMA, "error": _printable(error)[:300] or "no reason given"}


def facts_document(stdout: bytes, returncode: int, stderr: bytes) -> Dict[str, Any]:
    """The program's last stdout line as its document, or a refusal naming why it is none."""
    lines = stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        document = json.loads(lines[-1], parse_constant=no_constant) if lines else None
    except (ValueError, RecursionError):
        document = None
    if not isinstance(document, dict) or document.get("schema") != PLACEMENT_FACTS_SCHEMA:
        tail = stderr.decode("utf-8", "replace").strip()[-300:]
        return _refused(f"placement-facts exited {returncode} without a {PLACEMENT_FACTS_SCHEMA} document: {tail}")
    if document.get("error") is not None:  # slurmctld could not be read: the reason, printable, and no facts
        return _refused(str(document["error"]))
    return document


def facts_body(config: AgentConfig) -> Tuple[bytes, Optional[str]]:
    """``python3 PROGRAM placement-facts`` (an argv list, never a shell) -> the bytes to put, at most
    MAX_FACTS_BYTES (a larger document is replaced by a refusal that says its size), and its error if any."""
    argv = [sys.executable, config.applier or DEFAULT_APPLIER, "placement-facts"]
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    try:
        completed = _run_bounded(argv, environment, FACTS_TIMEOUT_SECONDS)
        document = facts_document(completed.stdout, completed.returncode, completed.stderr)
    except subprocess.TimeoutExpired:
        document = _refused(f"placement-facts did not finish in {FACTS_TIMEOUT_SECONDS:.0f}s")
    except OSError as failure:
        document = _refused(f"placement-facts did not start: {failure}")
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    if len(body) > MAX_FACTS_BYTES:
        refusal = _refused(f"placement facts of {len(body)} bytes, over the {MAX_FACTS_BYTES} the agent puts")
        body, document = json.dumps(refusal, separators=(",", ":")).encode("ascii"), refusal
    error = document.get("error")
    return body, None if error is None else one_line(str(error))[:300]
