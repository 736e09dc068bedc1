"""The head-node program as the head node runs it: Python 3.8 syntax, the standard library only (subprocesses)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import head_node_program
from topokeeper.contract.head_node_program import PACKAGE_DIR, source_paths
from topokeeper.headnode import APPLIER_VERSION


def test_vermin_finds_nothing_newer_than_python_3_8_in_any_packed_source() -> None:
    sources = [str(PACKAGE_DIR / path) for path in source_paths()]
    result = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "-t=3.8-", "--no-tips", "--violations", *sources],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_program_imports_in_a_clean_interpreter_without_site_packages() -> None:
    """Every module of the built file imports with nothing but the standard library and the file itself."""
    program = head_node_program()
    packages = [path[: -len(".py")].replace("/", ".").removesuffix(".__init__") for path in source_paths()]
    modules = [f"topokeeper.{name}" for name in packages if not name.endswith("__main__") and name != "__init__"]
    check = (
        "import importlib, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "for name in sys.argv[2:]:\n"
        "    importlib.import_module(name)\n"
        "standard = set(sys.stdlib_module_names) | {'__main__', 'topokeeper'}\n"
        "foreign = sorted({m.split('.')[0] for m in sys.modules} - standard)\n"
        "outside = sorted(m for m, module in sys.modules.items() if m.startswith('topokeeper')"
        " and not getattr(module, '__file__', sys.argv[1]).startswith(sys.argv[1]))\n"
        "from topokeeper.headnode import APPLIER_VERSION\n"
        "print(APPLIER_VERSION, foreign, outside)\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", check, str(program), *modules], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{APPLIER_VERSION} [] []\n"
    # The same interpreter really has no third-party packages: the check above means something.
    no_site = subprocess.run([sys.executable, "-I", "-S", "-c", "import pydantic"], capture_output=True, check=False)
    assert no_site.returncode != 0
