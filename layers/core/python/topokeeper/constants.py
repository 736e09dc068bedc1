"""Contract values shared by the package, the stack (``infra/``) and the head-node files.

Each value is written once here. The stdlib-only files that run on the head node (``applier/applier.py``,
``agent/agent.py``) cannot import the package and keep literal copies; ``tests/unit/test_constants.py``
asserts that they carry the same values.
"""

from __future__ import annotations

# Where the agent channel puts a cluster's desired bundle in the plans bucket (the agent's default
# ``--prefix``): ``bundle.json`` to apply, ``verify.json`` to verify against only.
AGENT_KEY_PREFIX = "clusters"


def agent_bundle_key(cluster: str) -> str:
    return f"{AGENT_KEY_PREFIX}/{cluster}/bundle.json"


def agent_verify_key(cluster: str) -> str:
    return f"{AGENT_KEY_PREFIX}/{cluster}/verify.json"
