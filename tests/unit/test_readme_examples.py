"""Every topokeeper command the README shows parses with the CLI's own parser (deploy commands are checked for
syntax only); the local ones run, and where the README shows their output, they print it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.readme_examples import README, blocks, commands, matches_shown
from topokeeper.cli.main import build_parser, main

COMMANDS = commands()
# Run here, with their shown output where the README shows it (the demo's: tests/e2e/test_demo_story.py).
LOCAL = ("plan", "show", "labels", "kueue")


def test_the_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 15 and {c.argv[0] for c in COMMANDS} >= {"plan", "show", "simulate", "agent", "audit"}


@pytest.mark.parametrize("command", COMMANDS, ids=[f"README.md:{c.line}" for c in COMMANDS])
def test_every_readme_command_parses(command) -> None:  # type: ignore[no-untyped-def]
    try:
        build_parser().parse_args(list(command.argv))
    except SystemExit as error:
        pytest.fail(f"README.md:{command.line}: `{command.text}` does not parse (exit {error.code})")


def _local(command) -> bool:  # type: ignore[no-untyped-def]
    """A local command on the checkout's files (``plan --snapshot snap.json`` after a live ``snapshot`` is not)."""
    inputs = [command.argv[i + 1] for i, word in enumerate(command.argv[:-1]) if word in ("--snapshot", "--nodes")]
    return command.argv[0] in LOCAL and all((README.parent / path).is_file() for path in inputs)


@pytest.mark.parametrize("command", [c for c in COMMANDS if _local(c)], ids=lambda c: f"README.md:{c.line}")
def test_local_readme_commands_run_and_print_what_is_shown(command, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = list(command.argv)
    for option in ("--out",):  # written into a temporary directory, not the checkout
        if option in argv:
            argv[argv.index(option) + 1] = str(tmp_path / argv[argv.index(option) + 1])
    cwd = Path.cwd()
    os.chdir(README.parent)
    try:
        assert main(argv) == 0, f"README.md:{command.line}: `{command.text}` failed"
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out.replace(str(tmp_path) + "/", "")
    following = blocks()[command.block + 1]
    commands_in_block = [c for c in COMMANDS if c.block == command.block]
    if following.lang == "" and len(commands_in_block) == 1:
        assert matches_shown(following.lines, printed), (
            f"README.md:{following.line} shows\n"
            + "\n".join(following.lines)
            + f"\n`{command.text}` printed\n{printed}"
        )


def test_shown_output_matching() -> None:
    shown = ["a ... c", "...", "z"]
    assert matches_shown(shown, "a b c\nx\ny\nz\n") and matches_shown(shown, "a  c\nz")
    assert not matches_shown(shown, "a b c\nx\n") and not matches_shown(shown, "b c\nz\n")
    assert not matches_shown(["a", "z"], "a\nx\nz\n")
