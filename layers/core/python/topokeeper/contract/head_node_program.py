"""The head-node program as one file: ``topokeeper-head-node.pyz``, a standard-library zipapp.

It packs ``topokeeper/__init__.py``, ``topokeeper/wire.py``, ``topokeeper/wire_updates.py``, ``topokeeper/headnode/``,
``topokeeper/agent/`` and ``topokeeper/computenode/``
(standard library only, Python 3.8+) with a ``__main__.py`` that runs ``apply|dry-run|verify BUNDLE ...`` (the
head-node program), ``agent ...`` (the pull agent), ``node-start ...`` (a ParallelCluster compute node's start
action: ``topokeeper.agent.node_start``) or ``hostfile ...`` (a job's nodes in topology order, on a
compute node). Every channel ships these bytes: the SSM command, the
agent's install script, ``verify --bundle-out``; the stack records their sha256 (output HeadNodeProgramSha256).

The build is deterministic, so one source tree gives one sha256: entries sorted, stored (not deflated: the
bytes do not depend on zlib's version, and the sources stay readable with ``unzip -p``), each stamped
1980-01-01 00:00:00 with mode 0644. An operator lists it with ``python3 -m zipfile -l FILE`` and reads a source
with ``unzip -p FILE topokeeper/headnode/modes.py``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from pathlib import Path

PROGRAM_NAME = "topokeeper-head-node.pyz"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # topokeeper/, which this module is in contract/ of
_PACKED_PACKAGES = ("headnode", "agent", "computenode")
_SHEBANG = b"#!/usr/bin/env python3\n"
_TIMESTAMP = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can carry
_FILE_MODE = 0o100644  # a regular file, rw-r--r--
MAIN = '''"""topokeeper-head-node.pyz: MODE BUNDLE ... runs the head-node program; agent ... runs the pull agent;
node-start ... hands a ParallelCluster compute node's topology to slurmd; hostfile ... prints a job's nodes in
topology order; placement-facts prints what topokeeper placement needs."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "agent":
    from topokeeper.agent.main import main as agent_main

    sys.exit(agent_main(sys.argv[2:]))
if len(sys.argv) > 1 and sys.argv[1] == "node-start":
    # A node's bootstrap never fails for topokeeper, even where this python3 cannot import it (RHEL 8: 3.6).
    try:
        from topokeeper.agent.node_start import main as node_start_main
    except BaseException as error:
        import json

        reason = "%r; slurmd starts without a topology (the program needs Python 3.8+)" % (error,)
        sys.stderr.write(json.dumps({"level": "error", "event": "node_start.crashed", "reason": reason[:300]}) + "\\n")
        sys.exit(0)
    sys.exit(node_start_main(sys.argv[2:]))
if len(sys.argv) > 1 and sys.argv[1] == "hostfile":
    from topokeeper.headnode.hostfile import main as hostfile_main

    sys.exit(hostfile_main(sys.argv[2:]))
if len(sys.argv) > 1 and sys.argv[1] == "placement-facts":
    from topokeeper.headnode.placement import main as placement_main

    sys.exit(placement_main(sys.argv[2:]))
from topokeeper.headnode.main import main

sys.exit(main())
'''


def source_paths() -> list[str]:
    """The package's files the program packs, relative to the package directory (``wire.py``, ...), sorted."""
    paths = ["__init__.py", "wire.py", "wire_updates.py"]
    for package in _PACKED_PACKAGES:
        paths += [path.relative_to(PACKAGE_DIR).as_posix() for path in (PACKAGE_DIR / package).rglob("*.py")]
    return sorted(paths)


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_TIMESTAMP)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # Unix: the mode below is read as Unix permissions
    info.external_attr = _FILE_MODE << 16
    return info


@functools.cache
def program_bytes() -> bytes:
    """The zipapp's bytes: the shebang line, then the zip archive (Python runs its ``__main__.py``)."""
    members = {f"topokeeper/{path}": (PACKAGE_DIR / path).read_bytes() for path in source_paths()}
    members["__main__.py"] = MAIN.encode()
    buffer = io.BytesIO()
    buffer.write(_SHEBANG)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(members):
            archive.writestr(_entry(name), members[name])
    return buffer.getvalue()


def program_sha256() -> str:
    return hashlib.sha256(program_bytes()).hexdigest()


def write_program(path: Path) -> Path:
    """Write the program to ``path`` (mode 0755: ``./topokeeper-head-node.pyz`` runs it too)."""
    path.write_bytes(program_bytes())
    path.chmod(0o755)
    return path
