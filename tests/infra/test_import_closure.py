"""infra.import_closure on a small planted package: which imports it follows and which files it ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.import_closure import import_closure

pytestmark = pytest.mark.infra

PACKAGE_FILES = {
    "pkg/__init__.py": "",
    "pkg/top.py": "from pkg.sub import helper\nimport json\n",
    "pkg/sub/__init__.py": "from . import helper\n",
    "pkg/sub/helper.py": "from ..deep.leaf import VALUE\n",
    "pkg/deep/__init__.py": "",
    "pkg/deep/leaf.py": "VALUE = 1\n",
    "pkg/lazy.py": "def load():\n    from pkg.late import thing\n    return thing\n",
    "pkg/late.py": "thing = 2\n",
    "pkg/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import operator_only\n",
    "pkg/operator_only.py": "import pkg.never\n",
    "pkg/never.py": "",
    "pkg/data.sh": "#!/bin/sh\n",
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name, text in PACKAGE_FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def _entry(root: Path, text: str) -> Path:
    path = root / "functions" / "handler.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_top_level_relative_and_package_imports_are_followed_with_each_packages_init(root: Path) -> None:
    closure = import_closure([_entry(root, "import pkg.top\n")], root, "pkg")

    assert [path.as_posix() for path in closure] == [
        "__init__.py",
        "deep/__init__.py",
        "deep/leaf.py",
        "sub/__init__.py",
        "sub/helper.py",
        "top.py",
    ]


def test_imports_inside_functions_count_and_type_checking_imports_do_not(root: Path) -> None:
    handler = _entry(root, "def lambda_handler(event, context):\n    from pkg import lazy, typed\n")

    closure = [path.as_posix() for path in import_closure([handler], root, "pkg")]

    assert closure == ["__init__.py", "late.py", "lazy.py", "typed.py"]


def test_a_relative_import_above_the_package_is_refused(root: Path) -> None:
    (root / "pkg" / "bad.py").write_text("from ... import other\n")

    with pytest.raises(ValueError, match="beyond the top-level package"):
        import_closure([_entry(root, "import pkg.bad\n")], root, "pkg")
