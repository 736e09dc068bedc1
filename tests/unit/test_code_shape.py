"""No source file over 800 lines and no function over 80 under layers/, functions/ and infra/.

A CDK construct's ``__init__`` in infra/ is exempt: it declares resources one after another, and cutting it
into functions would only scatter the declaration.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("layers", "functions", "infra")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
CONSTRUCT_BASES = {"Construct", "Stack"}
# Offenders known when the limits were set (issue 25), split by other branches: the lead removes each entry when
# merging the branch that fixes it. An entry that no longer offends fails the test too, so none outlives its fix.
KNOWN_LONG_FILES: set[str] = set()
KNOWN_LONG_FUNCTIONS: set[str] = set()


def sources(root: Path = REPO) -> list[Path]:
    return sorted(
        path
        for directory in CHECKED
        for path in (root / directory).rglob("*.py")
        if "__pycache__" not in path.parts and ".build" not in path.parts
    )


def _is_construct(node: ast.ClassDef) -> bool:
    names = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", None) for base in node.bases}
    return bool(names & CONSTRUCT_BASES)


def functions(tree: ast.AST, prefix: str = "", in_construct: bool = False) -> Iterator[tuple[str, int, bool]]:
    """(qualified name, lines from ``def`` to its last line, whether it is a construct's ``__init__``) of every
    function in ``tree``, nested ones and methods included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            yield f"{prefix}{node.name}", node.end_lineno - node.lineno + 1, in_construct and node.name == "__init__"
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.", _is_construct(node))
        else:
            yield from functions(node, prefix, in_construct)


def long_files(root: Path = REPO) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for path in sources(root)
        if len(path.read_text().splitlines()) > MAX_FILE_LINES
    }


def long_functions(root: Path = REPO) -> set[str]:
    found = set()
    for path in sources(root):
        relative = path.relative_to(root).as_posix()
        for name, lines, construct_init in functions(ast.parse(path.read_text(), relative)):
            if lines > MAX_FUNCTION_LINES and not (construct_init and relative.startswith("infra/")):
                found.add(f"{relative}:{name}")
    return found


def test_no_source_file_is_over_800_lines() -> None:
    assert long_files() == KNOWN_LONG_FILES


def test_no_function_is_over_80_lines_but_cdk_construct_bodies() -> None:
    assert long_functions() == KNOWN_LONG_FUNCTIONS


def test_a_new_offender_is_found_and_only_an_infra_constructs_init_is_exempt(tmp_path: Path) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # with its def: one line too many
    construct = f"class Queues(Construct):\n    def __init__(self):\n{body}    def helper(self):\n{body}"
    for directory in ("infra", "layers/pkg"):
        (tmp_path / directory).mkdir(parents=True)
        (tmp_path / directory / "queues.py").write_text(construct)
    (tmp_path / "functions").mkdir()
    # At the limits exactly: a function of 80 lines in a file of 800.
    at_limit = "def ok():\n" + body[body.index("\n") + 1 :].replace("        ", "    ")
    (tmp_path / "functions" / "handler.py").write_text(at_limit + "y = 1\n" * (MAX_FILE_LINES - MAX_FUNCTION_LINES))
    (tmp_path / "functions" / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))

    assert long_files(tmp_path) == {"functions/long.py"}
    assert long_functions(tmp_path) == {
        "infra/queues.py:Queues.helper",
        "layers/pkg/queues.py:Queues.__init__",
        "layers/pkg/queues.py:Queues.helper",
    }
