"""``topokeeper agent install-script`` refuses every value that could break out of the line it is written on.

The snippet itself, run by bash, and the agent's portability: tests/integration/agent/test_agent_install.py."""

from __future__ import annotations

import pytest

from tests.agent_support import INSTALL_SCRIPT_ARGS
from topokeeper.cli.main import main


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--cluster", "llm;reboot"),
        ("--bucket", "Topo_Bundles"),
        ("--region", "us-west-2$(id)"),
        ("--event-bus", "a b"),
        # A trailing newline ends the comment line that names the value: what follows would run.
        ("--cluster", "llm-train-slurm\n"),
        ("--bucket", "topo-bundles\n"),
        ("--region", "us-west-2\n"),
        ("--event-bus", "default\n"),
        ("--prefix", "topokeeper\n"),
        # A prefix names keys under itself; dot segments would name others.
        ("--prefix", "../.."),
        ("--prefix", "topokeeper/../other"),
        ("--prefix", "./topokeeper"),
        ("--prefix", ".."),
    ],
)
def test_values_that_could_carry_shell_syntax_are_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = [*INSTALL_SCRIPT_ARGS, flag, value]
    assert main(arguments) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"topokeeper: error: {flag}: not a valid") and captured.err.count("\n") == 1
