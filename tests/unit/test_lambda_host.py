"""Where the simulator finds the stack's handlers: beside the package in a checkout, else $TOPOKEEPER_FUNCTIONS_DIR."""

from __future__ import annotations

from pathlib import Path

import pytest

from topokeeper.contract.stack_spec import FUNCTION_NAMES
from topokeeper.sim.lambda_host import FUNCTIONS_DIR_VARIABLE, functions_dir, load_handler
from topokeeper.sim.slurm_chroot import HarnessError

CHECKOUT_FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"


def test_a_source_checkout_finds_the_handlers_the_stack_deploys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FUNCTIONS_DIR_VARIABLE, raising=False)
    assert functions_dir() == CHECKOUT_FUNCTIONS
    assert callable(load_handler("ingest"))


def test_the_variable_points_an_installed_package_at_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in FUNCTION_NAMES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "handler.py").write_text(f"def lambda_handler(event, context):\n    return {name!r}\n")
    monkeypatch.setenv(FUNCTIONS_DIR_VARIABLE, str(tmp_path))
    assert functions_dir() == tmp_path
    assert load_handler("drift")({}, None) == "drift"


def test_without_the_handlers_one_message_says_what_is_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "ingest").mkdir()
    (tmp_path / "ingest" / "handler.py").write_text("def lambda_handler(event, context):\n    return None\n")
    monkeypatch.setenv(FUNCTIONS_DIR_VARIABLE, str(tmp_path))
    with pytest.raises(HarnessError) as raised:
        functions_dir()
    message = str(raised.value)
    assert f"${FUNCTIONS_DIR_VARIABLE}={tmp_path}" in message
    assert "lacks reconcile, result, drift" in message
    assert "source checkout" in message
