"""The new config proved on a throw-away slurmctld before any file is replaced."""

from __future__ import annotations

import hashlib
import os


def proof_dir_prefix(config_path: str) -> str:
    """The name every proof directory of this config dir starts with (the next run finds a killed one's)."""
    return "topokeeper-proof-%s-" % hashlib.sha256(os.path.realpath(config_path).encode()).hexdigest()[:16]
