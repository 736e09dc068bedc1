"""The bench's whole-file baseline (bench/incremental.py): TOPOKEEPER_APPLIER_WHOLE_FILE=1 switches the applier's
live path off, and nothing else does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from topokeeper.headnode import modes
from topokeeper.headnode.config_dir import WHOLE_FILE_ENV, Faults


def test_the_whole_file_switch_takes_the_reconfigure_path_and_says_why() -> None:
    result: dict[str, Any] = {"whole_file_reason": None}
    context: Any = SimpleNamespace(faults=Faults({WHOLE_FILE_ENV: "1"}))
    assert modes._incremental(result, None, [], context) is None  # type: ignore[arg-type]
    assert result["whole_file_reason"] == "TOPOKEEPER_APPLIER_WHOLE_FILE=1 asks for the whole-file path"


def test_only_1_switches_it() -> None:
    assert not Faults({}).whole_file_only
    assert not Faults({WHOLE_FILE_ENV: "0"}).whole_file_only
    assert Faults({WHOLE_FILE_ENV: "1"}).whole_file_only
