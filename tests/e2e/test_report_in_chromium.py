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
from tests.report_at_scale import synthetic_result
from topokeeper.sim.report import MAX_BOXES, write_report
from topokeeper.sim.simulator import SimulationResult
from topokeeper.wire import compress

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


def _chromium(page: Path, profile: Path, *options: str) -> str:
    """Run headless chromium on ``page`` with ``options``; its stdout."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run `make install-system` (it apt-installs chromium)")
    command = [chromium, *FLAGS, *options, f"--user-data-dir={profile}", page.as_uri()]
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


def _dump_dom(page: Path, profile: Path, window: str | None = None) -> str:
    return _chromium(page, profile, "--dump-dom", *([f"--window-size={window}"] if window else []))


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


# 1,000 nodes in `make test`; `make bench` runs it at 10,000 (TOPOKEEPER_REPORT_NODES).
SCALE_NODES = int(os.environ.get("TOPOKEEPER_REPORT_NODES", "1000"))
WIDTH = 1400
MAX_PAGE_HEIGHT = 12_000  # CSS pixels with every detail closed; one row per event made ~34,000 at 1,000 nodes


def test_the_report_stays_readable_at_scale(tmp_path: Path) -> None:
    """Every diagram renders; each is a picture of at most MAX_BOXES boxes per level kind, not a strip; the
    page with its node lists closed stays short; a full-page screenshot is written for a human to look at."""
    result = synthetic_result(SCALE_NODES)
    report = write_report(result, tmp_path / "out")
    dom = parse(_dump_dom(report, tmp_path / "profile", window=f"{WIDTH},1000"))
    (body,) = dom.find_all("body")
    height = int(body.attrs["data-rendered-height"])
    assert 1000 < height <= MAX_PAGE_HEIGHT, f"{SCALE_NODES} nodes: the page is {height} px tall"
    containers = dom.find_all("pre", "mermaid")
    assert len(containers) == len(result.desired["partitions"]) == 3
    for container in containers:
        (svg,) = container.find_all("svg")
        assert container.attrs.get("data-processed") == "true" and "Syntax error" not in container.text
        boxes = [g for g in svg.find_all("g") if "node" in g.classes]
        assert 1 <= len(boxes) <= 2 * MAX_BOXES, f"{len(boxes)} boxes"
        _, _, width, tall = (float(v) for v in svg.attrs["viewbox"].split())
        assert width / tall < 8, f"a {width:.0f} x {tall:.0f} strip"
    # The leaf and block tables hold every node, on demand.
    text = dom.text
    for partition in result.desired["partitions"]:
        units = partition.get("blocks") or [s for s in partition.get("switches", []) if not s["switches"]]
        assert all(compress(unit["nodes"]) in text for unit in units), partition["name"]
    screenshot = tmp_path / "report.png"
    _screenshot(report, tmp_path / "profile-shot", screenshot, f"{WIDTH},{height}")
    assert _png_size(screenshot) == (WIDTH, height)


def _screenshot(page: Path, profile: Path, out: Path, window: str) -> None:
    _chromium(page, profile, f"--window-size={window}", "--hide-scrollbars", f"--screenshot={out}")
    assert out.is_file()


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
