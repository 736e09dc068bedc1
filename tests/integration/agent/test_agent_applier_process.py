"""The agent runs the applier as a subprocess (a fake one here, answering as told): credentials stay out,
a hang is stopped, a crash is reported with its stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent_support import FakeApplier, bundle_body, bundle_document, write_config
from topokeeper.agent.applier_process import run_applier
from topokeeper.agent.config import load_config
from topokeeper.wire import AgentConfig


def _config(tmp_path: Path, applier: FakeApplier, **settings: object) -> AgentConfig:
    return load_config(str(write_config(tmp_path / "agent.json", applier, tmp_path / "state", **settings)))


def _bundle_file(tmp_path: Path) -> str:
    path = tmp_path / "bundle.json"
    path.write_bytes(bundle_body(bundle_document()))
    return str(path)


def test_the_applier_runs_without_aws_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-the-applier")
    applier = FakeApplier(tmp_path / "opt")
    result = run_applier(_config(tmp_path, applier), "apply", _bundle_file(tmp_path), None)
    assert result["outcome"] == "applied"
    assert applier.calls()[0]["aws_variables"] == []


def test_an_applier_that_hangs_is_stopped_and_reported_timed_out(tmp_path: Path) -> None:
    applier = FakeApplier(tmp_path / "opt")
    applier.answer("verify", "in_sync", 0, sleep=30)
    config = _config(tmp_path, applier, applier_timeout_seconds=0.5)
    result = run_applier(config, "verify", _bundle_file(tmp_path), "ab" * 32)
    assert (result["outcome"], result["mode"], result["plan_sha256"]) == ("timed_out", "verify", "ab" * 32)
    assert "did not finish in 0.5s" in result["error"]


def test_an_applier_without_a_document_is_reported_failed_with_its_stderr(tmp_path: Path) -> None:
    applier = FakeApplier(tmp_path / "opt")
    applier.answer("apply", "applied", 1, stdout="Traceback (most recent call last): ...")
    result = run_applier(_config(tmp_path, applier), "apply", _bundle_file(tmp_path), None)
    assert result["outcome"] == "failed"
    assert "exited 1 without a result document: fake applier: no document" in result["error"]
