"""Every topokeeper command README.md and the pages in docs/ show parses with the CLI's own parser (deploy
commands are checked for syntax only); the local ones run, and where a page shows their output, they print it."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.readme_examples import README, ROOT, blocks, commands, matches_shown, pages
from topokeeper.cli.main import build_parser, main
from topokeeper.contract.config import Settings

COMMANDS = commands()
# Run here, with their shown output where a page shows it (the demo's: tests/e2e/test_demo_story.py).
LOCAL = ("plan", "show", "labels", "kueue", "placement")


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command line the parser takes, as its words: ``("login", "rotate-host-keys")``."""
    found = set()
    for action in parser._actions:  # argparse keeps its subparsers here only
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                found |= _subcommands(subparser, (*prefix, name)) or {(*prefix, name)}
    return found


def test_the_pages_show_every_command() -> None:
    shown = {command.argv[: len(words)] for command in COMMANDS for words in _subcommands(build_parser())}
    missing = sorted(" ".join(words) for words in _subcommands(build_parser()) if words not in shown)
    assert not missing, f"no page shows topokeeper {', '.join(missing)}"


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_readme_command_parses(command) -> None:  # type: ignore[no-untyped-def]
    try:
        build_parser().parse_args(list(command.argv))
    except SystemExit as error:
        pytest.fail(f"{command.where}: `{command.text}` does not parse (exit {error.code})")


def _local(command) -> bool:  # type: ignore[no-untyped-def]
    """A local command on the checkout's files (``plan --snapshot snap.json`` after a live ``snapshot`` is not)."""
    files = ("--snapshot", "--nodes", "--squeue", "--facts")
    inputs = [command.argv[i + 1] for i, word in enumerate(command.argv[:-1]) if word in files]
    return command.argv[0] in LOCAL and all((ROOT / path).is_file() for path in inputs)


@pytest.mark.parametrize("command", [c for c in COMMANDS if _local(c)], ids=lambda c: c.where)
def test_local_readme_commands_run_and_print_what_is_shown(command, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = list(command.argv)
    for option in ("--out",):  # written into a temporary directory, not the checkout
        if option in argv:
            argv[argv.index(option) + 1] = str(tmp_path / argv[argv.index(option) + 1])
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        assert main(argv) == 0, f"{command.where}: `{command.text}` failed"
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out.replace(str(tmp_path) + "/", "")
    following = next(iter(blocks()[command.block + 1 :]), None)
    commands_in_block = [c for c in COMMANDS if c.block == command.block]
    if following and following.page == command.page and following.lang == "" and len(commands_in_block) == 1:
        assert matches_shown(following.lines, printed), (
            f"{following.where} shows\n" + "\n".join(following.lines) + f"\n`{command.text}` printed\n{printed}"
        )


def test_shown_output_matching() -> None:
    shown = ["a ... c", "...", "z"]
    assert matches_shown(shown, "a b c\nx\ny\nz\n") and matches_shown(shown, "a  c\nz")
    assert not matches_shown(shown, "a b c\nx\n") and not matches_shown(shown, "b c\nz\n")
    assert not matches_shown(["a", "z"], "a\nx\nz\n")


# The README is the first page a user reads: short, the two commands, a link to every page that holds the rest.
README_MAX_LINES = 250
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_short_and_links_every_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines"
    assert "make demo" in text and "make test" in text
    linked = set(_LINK.findall(text))
    assert {f"docs/{page.name}" for page in pages()[1:]} <= linked


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = [line.lstrip("#").strip() for line in _prose(page) if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def _prose(page: Path) -> list[str]:
    """A page's lines outside code blocks."""
    inside, kept = False, []
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif not inside:
            kept.append(line)
    return kept


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_pages_reaches_a_file_and_a_heading(page: Path) -> None:
    for target in _LINK.findall("\n".join(_prose(page))):
        if re.match(r"\w+:", target):  # a URL, not a page of this repository
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.is_file(), f"{page.relative_to(ROOT)}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.relative_to(ROOT)}: link to {target}: no such heading"


def _settings_shown() -> list[tuple[str, object]]:
    """Each deployment configuration a page shows, as the settings it stands for: a whole object, the
    ``"topokeeper": {...}`` context entry, or a cluster's ``"login": {...}``."""
    found = []
    for block in blocks():
        if block.lang != "json":
            continue
        text = "\n".join(block.lines).strip()
        document = json.loads(text if text.startswith("{") else "{" + text + "}")
        if "clusters" in document:
            found.append((block.where, document))
        elif "topokeeper" in document:
            found.append((block.where, document["topokeeper"]))
        elif "login" in document:
            found.append((block.where, {"clusters": [{"name": "llm-train", "login": document["login"]}]}))
    return found


def test_every_configuration_a_page_shows_is_valid() -> None:
    shown = _settings_shown()
    assert len(shown) >= 4
    for where, settings in shown:
        try:
            Settings.model_validate(settings)
        except ValidationError as error:
            pytest.fail(f"{where}: {error}")
