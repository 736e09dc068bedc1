"""The applier file as the head node runs it: Python 3.8 syntax, the standard library only (subprocesses)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from topokeeper.applier import applier

APPLIER = Path(applier.__file__)


def test_vermin_finds_nothing_newer_than_python_3_8() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "-t=3.8-", "--no-tips", "--violations", str(APPLIER)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_applier_imports_in_a_clean_interpreter_without_site_packages() -> None:
    check = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('applier', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "foreign = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'})\n"
        "print(module.APPLIER_VERSION, foreign)\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", check, str(APPLIER)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{applier.APPLIER_VERSION} []\n"
    # The same interpreter really has no third-party packages: the check above means something.
    no_site = subprocess.run([sys.executable, "-I", "-S", "-c", "import pydantic"], capture_output=True, check=False)
    assert no_site.returncode != 0
