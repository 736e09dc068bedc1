"""The simulation report in a real browser: Debian's headless chromium renders every Mermaid diagram as SVG.

Chromium opens the report from disk, with its background networking off, runs the page's scripts for up
to 20 s of virtual time (it ends sooner once the page is idle) and prints the resulting DOM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from contextlib import suppress
from pathlib import Path

import pytest

from tests.html_tree import parse
from topokeeper.sim.report import write_report
from topokeeper.sim.simulator import SimulationResult

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sim-result-demo.json"
# As root chromium needs --no-sandbox; the rest keeps it from reaching for Google's hosts.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=20000",
]
TIMEOUT_SECONDS = 120


def _dump_dom(page: Path, profile: Path) -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run `make install-system` (it apt-installs chromium)")
    command = [chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
    # Its own process group, so the browser's helper processes are stopped with it.
    browser = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = browser.communicate(timeout=TIMEOUT_SECONDS)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(browser.pid, signal.SIGKILL)
        browser.wait()
    assert browser.returncode == 0, f"chromium exited {browser.returncode}: {err[-2000:]}"
    return out


def test_every_partition_diagram_renders_as_svg(tmp_path: Path) -> None:
    result = SimulationResult.model_validate_json(FIXTURE.read_text())
    report = write_report(result, tmp_path / "out")
    dom = parse(_dump_dom(report, tmp_path / "profile"))
    containers = dom.find_all("pre", "mermaid")
    assert len(containers) == len(result.mermaid) == 3
    for partition, container in zip(sorted(result.mermaid), containers, strict=True):
        svgs = container.find_all("svg")
        assert container.attrs.get("data-processed") == "true", f"{partition}: Mermaid did not process it"
        assert len(svgs) == 1, f"{partition}: {len(svgs)} SVG elements"
        assert "Syntax error" not in container.text, f"{partition}: {container.text[:500]}"
        assert svgs[0].attrs.get("aria-roledescription") == "flowchart-v2", partition
        nodes = [g for g in svgs[0].find_all("g") if "node" in g.classes]
        assert nodes, f"{partition}: a flowchart without nodes"
        assert partition in container.text  # the subgraph title
