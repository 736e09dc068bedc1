"""`topokeeper emulator`: the operator CLI against it exactly as the documentation shows (commands and output)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import pytest

from tests.readme_examples import blocks, commands, matches_shown
from topokeeper.adapters.aws import clear_clients
from topokeeper.cli.main import main
from topokeeper.sim.head_node import HEAD_NODE_VARIABLE


def _readme_session() -> tuple[list[list[str]], tuple[str, ...]]:
    """The documented commands against the emulator's deployment file, and the output shown after them."""
    found = [c for c in commands() if "out/emulator/deployment.json" in c.argv]
    assert len({c.block for c in found}) == 1 and len(found) >= 3
    shown = blocks()[found[0].block + 1]
    assert shown.lang == ""
    return [list(c.argv) for c in found], shown.lines


def test_the_operator_cli_against_topokeeper_emulator_as_the_documentation_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    session, shown = _readme_session()
    environment = {**os.environ, HEAD_NODE_VARIABLE: "file"}
    emulator = subprocess.Popen(
        [sys.executable, "-m", "topokeeper.cli.main", "emulator"],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert emulator.stdout is not None
        printed = []
        for line in emulator.stdout:  # until it says it is ready
            printed.append(line)
            if line.startswith("Ctrl-C stops"):
                break
        text = "".join(printed)
        exported = re.search(r"^  export (.+)$", text, re.MULTILINE)
        assert exported, text
        assert (tmp_path / "out" / "emulator" / "deployment.json").is_file()
        for pair in exported.group(1).split():
            key, _, value = pair.partition("=")
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(tmp_path)
        clear_clients()
        capsys.readouterr()
        codes = [main(argv) for argv in session]
        output = capsys.readouterr().out
        assert codes == [0] * len(session), output
        assert matches_shown(shown, output), output
        emulator.send_signal(signal.SIGTERM)
        assert emulator.wait(timeout=120) == 0
    finally:
        clear_clients()
        with suppress(ProcessLookupError):
            os.killpg(emulator.pid, signal.SIGKILL)
        emulator.wait()
