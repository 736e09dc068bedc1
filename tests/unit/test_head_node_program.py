"""The head-node program: one deterministic file, built from the package's stdlib-only modules, which nothing
else in the package imports; the wire contract defines each shared rule once."""

from __future__ import annotations

import ast
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from topokeeper.contract import head_node_program
from topokeeper.contract.head_node_program import PACKAGE_DIR, PROGRAM_NAME, program_bytes, program_sha256, source_paths

PACKAGE_FILES = sorted(PACKAGE_DIR.rglob("*.py"))


def _build_again() -> bytes:
    program_bytes.cache_clear()
    try:
        return program_bytes()
    finally:
        program_bytes.cache_clear()


def test_two_builds_give_the_same_bytes() -> None:
    first = _build_again()
    assert _build_again() == first
    assert program_sha256() == hashlib.sha256(first).hexdigest()


def test_the_archive_is_stored_sorted_and_stamped_alike() -> None:
    data = program_bytes()
    assert data.startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        entries = archive.infolist()
        names = [entry.filename for entry in entries]
        assert names == sorted(names)
        assert names == sorted(["__main__.py", *(f"topokeeper/{path}" for path in source_paths())])
        for entry in entries:
            assert (entry.compress_type, entry.date_time, entry.external_attr >> 16) == (
                zipfile.ZIP_STORED,
                (1980, 1, 1, 0, 0, 0),
                0o100644,
            )
        for path in source_paths():  # the sources as they are in the package, byte for byte
            assert archive.read(f"topokeeper/{path}") == (PACKAGE_DIR / path).read_bytes()


def test_it_packs_the_wire_the_head_node_program_and_the_agent_and_nothing_operator_side() -> None:
    paths = source_paths()
    expected = {
        "__init__.py",
        "wire.py",
        "wire_updates.py",
        "headnode/main.py",
        "headnode/modes.py",
        "agent/main.py",
        "agent/cycle.py",
    }
    assert expected | {"computenode/hostfile.py"} <= set(paths)
    packed = ("headnode/", "agent/", "computenode/")
    assert all(path in {"__init__.py", "wire.py", "wire_updates.py"} or path.startswith(packed) for path in paths)
    assert "agent_install.py" not in paths and "head_node_program.py" not in paths


def test_python_lists_every_packed_source_and_runs_the_file(tmp_path: Path) -> None:
    program = head_node_program.write_program(tmp_path / PROGRAM_NAME)
    listing = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(program)], capture_output=True, text=True, check=True
    ).stdout
    listed = {line.split()[0] for line in listing.splitlines()[1:]}
    assert listed == {"__main__.py", *(f"topokeeper/{path}" for path in source_paths())}
    usage = subprocess.run([sys.executable, "-I", str(program), "--help"], capture_output=True, text=True, check=False)
    assert (usage.returncode, usage.stderr) == (0, "")
    assert usage.stdout.startswith(f"usage: {PROGRAM_NAME} ")
    agent = subprocess.run(
        [sys.executable, "-I", str(program), "agent", "--help"], capture_output=True, text=True, check=False
    )
    assert (agent.returncode, agent.stderr) == (0, "")
    assert "--config" in agent.stdout and "pull agent" in agent.stdout


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return found | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_no_module_outside_the_head_node_package_imports_it() -> None:
    importers = [
        path.relative_to(PACKAGE_DIR).as_posix()
        for path in PACKAGE_FILES
        if path.relative_to(PACKAGE_DIR).parts[0] != "headnode"
        and any(name == "topokeeper.headnode" or name.startswith("topokeeper.headnode.") for name in _imports(path))
    ]
    assert importers == []


def _definitions(path: Path) -> set[str]:
    """Top-level functions, classes and constants a module defines, and the Slurm 25.05 cut-over as a literal."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and [getattr(item, "value", None) for item in node.elts] == [25, 5]:
            names.add("(25, 5)")
    return names


def test_each_shared_rule_is_defined_once_in_the_wire_contract() -> None:
    """Hostlist expansion and compression and the Slurm version cut-over: one definition each, in wire.py."""
    rules = {
        "expand": {"expand", "expand_hostlist"},
        "compress": {"compress", "compress_hostlist"},
        "the 25.05 cut-over": {"FIRST_YAML_VERSION", "(25, 5)"},
        "the format for a version": {"format_for_version"},
        "reading a version": {"parse_slurm_version"},
    }
    defined = {path.relative_to(PACKAGE_DIR).as_posix(): _definitions(path) for path in PACKAGE_FILES}
    for rule, names in rules.items():
        where = sorted(path for path, found in defined.items() if found & names)
        assert where == ["wire.py"], rule
