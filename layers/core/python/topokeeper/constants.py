"""Contract values shared by the package, the stack (``infra/``) and the head-node files.

Each value is written once here. The stdlib-only files that run on the head node (``applier/applier.py``,
``agent/agent.py``) cannot import the package and keep literal copies; ``tests/unit/test_constants.py``
asserts that they carry the same values.
"""

from __future__ import annotations

# --- The agent channel's object keys (branch tiers) ---------------------------------------------------
# The reconcile function writes them, the agent policy (infra/agent.py) grants them, and the stdlib agent
# (agent/agent.py: DEFAULT_PREFIX, object_key) reads them; tests/unit/test_agent_object_keys.py holds the
# agent to these values.
AGENT_KEY_PREFIX = "clusters"
AGENT_BUNDLE_OBJECT = "bundle.json"  # enforce: the agent applies it
AGENT_VERIFY_OBJECT = "verify.json"  # verify: the agent only ever verifies against it


def bundle_key(cluster: str) -> str:
    return f"{AGENT_KEY_PREFIX}/{cluster}/{AGENT_BUNDLE_OBJECT}"


def verify_key(cluster: str) -> str:
    return f"{AGENT_KEY_PREFIX}/{cluster}/{AGENT_VERIFY_OBJECT}"


# --- end of the agent channel's object keys -----------------------------------------------------------
