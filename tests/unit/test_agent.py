"""The agent's pieces that need no AWS or subprocess: config, bundle checks, report sizes, the lock.

The applier subprocess: tests/integration/agent/test_agent_applier_process.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_support import (
    CLUSTER,
    FakeApplier,
    agent_command,
    agent_program,
    bundle_body,
    bundle_document,
    events_named,
    write_config,
)
from topokeeper.agent.applier_process import MAX_DETAIL_BYTES, agent_result, bounded_result
from topokeeper.agent.bundle import (
    AGENT_OUTDATED,
    BUNDLE_SCHEMA_NAME,
    BUNDLE_SCHEMA_VERSION,
    AgentOutdated,
    BundleRefused,
    check_bundle,
)
from topokeeper.agent.config import load_config
from topokeeper.agent.cycle import Agent
from topokeeper.agent.main import EXIT_BAD_CONFIG, main
from topokeeper.agent.state import State, exclusive, load_state
from topokeeper.cli.agent_install import install_config
from topokeeper.contract.ports import Outcome
from topokeeper.render.bundle import Bundle
from topokeeper.service.registration import with_registering
from topokeeper.wire import (
    BUNDLE_SCHEMA,
    REGISTERING_BUNDLE_SCHEMA,
    AgentConfig,
    AgentConfigError,
    agent_config_document,
    agent_config_from_document,
    agent_source,
)


def test_config_defaults_and_key(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"cluster": CLUSTER, "bucket": "topo-bundles", "region": "us-east-1"}))
    config = load_config(str(path))
    assert config.key == "clusters/llm-train-slurm/bundle.json"
    assert (config.event_bus, config.poll_interval_seconds, config.verify_interval_seconds) == ("default", 60.0, 900.0)
    assert config.applier is None  # applier.py beside the agent program


def test_the_default_applier_is_the_program_the_agent_runs_from(tmp_path: Path) -> None:
    """Installed as the install script does: one .pyz, which is the agent and the applier."""
    program = agent_program(tmp_path / "opt")
    _, environment = agent_command(program)
    printed = subprocess.run(
        [sys.executable, "-c", "from topokeeper.agent.applier_process import DEFAULT_APPLIER; print(DEFAULT_APPLIER)"],
        env={**environment, "PYTHONPATH": str(program)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed.stdout == f"{program}\n"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"cluster": CLUSTER, "bucket": "b", "region": "r", "pol_interval_seconds": 5}, "unknown key 'pol_interval"),
        ({"cluster": CLUSTER, "region": "r"}, "missing key 'bucket'"),
        ({"cluster": CLUSTER, "bucket": "b", "region": "r", "verify_interval_seconds": "1h"}, "must be a number"),
        ({"cluster": CLUSTER, "bucket": "", "region": "r"}, "bucket must be a non-empty string"),
        ([], "expected a JSON object"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, document: object, message: str) -> None:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(document))
    with pytest.raises(AgentConfigError, match=message):
        load_config(str(path))


def test_bad_config_exits_2_with_one_log_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.json"
    path.write_text("{")
    assert main(["--config", str(path), "--once"]) == EXIT_BAD_CONFIG
    assert len(events_named(capsys.readouterr().err, "config.invalid")) == 1


def test_a_planner_bundle_passes_the_check() -> None:
    document = bundle_document()
    assert check_bundle(bundle_body(document), CLUSTER)["plan_sha256"] == document["plan_sha256"]


def _tampered(name: str) -> bytes:
    document = bundle_document()
    if name == "content":
        document["files"]["topology.yaml"]["content"] += "- topology: injected\n"
    elif name == "cluster":
        document["cluster_name"] = "another-cluster"
    elif name == "schema":
        document["schema"] = "topokeeper.bundle/02"
    elif name == "foreign schema":
        document["schema"] = "someone.bundle/2"
    elif name == "plan":
        document["plan_sha256"] = "$(reboot)"
    return bundle_body(document)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_tampered("content"), r"files\[topology.yaml\].sha256 does not match its content"),
        (_tampered("cluster"), "cluster_name: 'another-cluster' is not this cluster"),
        (
            _tampered("schema"),
            "schema: expected topokeeper.bundle/2 or topokeeper.bundle/3, got 'topokeeper.bundle/02'",
        ),
        (
            _tampered("foreign schema"),
            "schema: expected topokeeper.bundle/2 or topokeeper.bundle/3, got 'someone.bundle/2'",
        ),
        (_tampered("plan"), "plan_sha256: not a sha256"),
        (b"\xff\xfe", "bundle is not JSON"),
        (b"[1]", "not a JSON object"),
    ],
)
def test_a_bad_bundle_is_refused_with_the_reason(body: bytes, message: str) -> None:
    with pytest.raises(BundleRefused, match=message) as refused:
        check_bundle(body, CLUSTER)
    assert refused.value.outcome == "refused"


@pytest.mark.parametrize("registering", [[], ["ip-10-1-40-10"]])
def test_bundles_with_and_without_nodes_left_to_registration_pass(registering: list[str]) -> None:
    document = with_registering(Bundle.model_validate(bundle_document()), registering).document()
    schema = REGISTERING_BUNDLE_SCHEMA if registering else BUNDLE_SCHEMA

    assert check_bundle(bundle_body(document), CLUSTER)["schema"] == schema


def test_a_newer_bundle_schema_says_the_agent_is_outdated_and_how_to_upgrade() -> None:
    document = bundle_document()
    document["schema"] = f"{BUNDLE_SCHEMA_NAME}/{BUNDLE_SCHEMA_VERSION + 1}"

    with pytest.raises(AgentOutdated) as outdated:
        check_bundle(bundle_body(document), CLUSTER)

    assert outdated.value.outcome == AGENT_OUTDATED == Outcome.AGENT_OUTDATED.value
    assert str(outdated.value).startswith(f"agent outdated: the bundle is {document['schema']}")
    assert "re-run the `topokeeper agent install-script` output" in str(outdated.value)


def test_each_cluster_reports_with_its_own_source() -> None:
    assert agent_source(CLUSTER) == f"topokeeper.agent.{CLUSTER}"
    assert agent_source(CLUSTER) != agent_source("another-cluster")


def _config(tmp_path: Path, applier: FakeApplier, **settings: object) -> AgentConfig:
    return load_config(str(write_config(tmp_path / "agent.json", applier, tmp_path / "state", **settings)))


def test_a_result_too_large_for_one_event_keeps_its_summary() -> None:
    drift = [{"unit": f"nn-{i:05d}", "expected": ["ip-10-1-0-1"] * 20, "live": []} for i in range(5000)]
    result = {
        **agent_result("drift", "verify", "ab" * 32, "x" * 10_000),
        "drift": drift,
        "grouping_drift": True,
        "deferred": [[f"q1-dy-p5-{i}", f"10.0.0.{i}", "10.0.9.9"] for i in range(150)],
    }
    bounded = bounded_result(result)
    assert len(json.dumps(bounded)) < MAX_DETAIL_BYTES
    assert (bounded["outcome"], bounded["plan_sha256"], bounded["truncated"]) == ("drift", "ab" * 32, True)
    assert bounded["grouping_drift"] is True
    assert bounded["drift"] == drift[:20] and len(bounded["error"]) == 2000
    assert bounded["deferred"] == result["deferred"][:100]  # the nodes the backend must place again
    small = agent_result("in_sync", "verify", "ab" * 32, "")
    assert bounded_result(small) is small


def test_a_cycle_never_overlaps_another(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    applier = FakeApplier(tmp_path / "opt")
    config = _config(tmp_path, applier, endpoint_url="http://127.0.0.1:9")
    (tmp_path / "state").mkdir()
    with exclusive(str(tmp_path / "state" / "lock")) as locked:
        assert locked
        Agent(config).cycle()
    assert len(events_named(capsys.readouterr().err, "cycle.skipped")) == 1
    assert applier.calls() == []


def test_an_unreadable_state_file_starts_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"etag": ')
    assert load_state(str(path)) == State()
    assert events_named(capsys.readouterr().err, "state.unreadable")


def test_the_install_script_writes_its_config_through_the_agent_s_schema() -> None:
    """One schema (topokeeper.wire.AgentConfig): what the install script writes is what the agent reads."""
    values = {
        "cluster": CLUSTER,
        "bucket": "topo-bundles",
        "region": "us-west-2",
        "prefix": "clusters",
        "mode": "verify",
        "event_bus": "default",
        "poll_interval_seconds": 30,
        "verify_interval_seconds": 600,
    }
    config = install_config(values, trusted_key=True)
    assert agent_config_from_document(json.loads(json.dumps(agent_config_document(config)))) == config
    assert (config.key, config.trusted_key) == (
        f"clusters/{CLUSTER}/verify.json",
        "${root}/etc/topokeeper/bundle-key.json",
    )
    with pytest.raises(AgentConfigError, match="unknown key 'poll_seconds'"):
        agent_config_from_document({**agent_config_document(config), "poll_seconds": 30})
