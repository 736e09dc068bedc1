"""``topokeeper agent install-script``: the snippet really installs the package's files and valid systemd units."""

from __future__ import annotations

import configparser
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import topokeeper
from tests.agent_support import INSTALL_SCRIPT_ARGS, INSTALL_SCRIPT_BASE_ARGS, bundle_document
from tests.helpers import head_node_program
from tests.signing_support import sign, signing_key
from topokeeper.adapters.aws import clear_clients
from topokeeper.agent.applier_process import run_applier
from topokeeper.agent.config import load_config
from topokeeper.cli.main import main
from topokeeper.contract.head_node_program import PROGRAM_NAME, program_bytes, source_paths
from topokeeper.headnode.signature import read_trusted_key, rsa_public_key
from topokeeper.sim.aws_emulator import AwsEmulator
from topokeeper.wire import AgentConfig


def _snippet(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main([*INSTALL_SCRIPT_ARGS, *extra]) == 0
    return capsys.readouterr().out


def _run(snippet: str, root: Path) -> subprocess.CompletedProcess[str]:
    """As a lifecycle script runs it: a file given to bash (the snippet is too large for one argument)."""
    environment = {**os.environ, "TOPOKEEPER_ROOT": str(root), "TOPOKEEPER_SKIP_SYSTEMCTL": "1"}
    script = root.parent / f"{root.name}-on_create.sh"
    script.write_text(snippet)
    return subprocess.run(
        ["bash", str(script)], env=environment, capture_output=True, text=True, timeout=60, check=False
    )


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def test_snippet_installs_the_package_files_config_and_valid_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snippet = _snippet(capsys, "--poll-seconds", "30", "--verify-seconds", "600")
    root = tmp_path / "root"

    for _ in range(2):  # lifecycle scripts may run again: a second install must also succeed
        completed = _run(snippet, root)
        assert completed.returncode == 0, completed.stderr
    assert completed.stdout == f"topokeeper: agent installed in {root}/opt/topokeeper\n"

    installed = root / "opt" / "topokeeper" / PROGRAM_NAME
    assert installed.read_bytes() == program_bytes()  # the one file, byte for byte (it is binary)
    assert stat.S_IMODE(installed.stat().st_mode) == 0o755
    assert sorted(path.name for path in installed.parent.iterdir()) == [PROGRAM_NAME]
    assert stat.S_IMODE((root / "var" / "lib" / "topokeeper").stat().st_mode) == 0o700

    config = load_config(str(root / "etc" / "topokeeper" / "agent.json"))
    assert config == AgentConfig(
        cluster="llm-train-slurm",
        bucket="topo-bundles",
        region="us-west-2",
        poll_interval_seconds=30,
        verify_interval_seconds=600,
        applier=f"{root}/opt/topokeeper/{PROGRAM_NAME}",
        state_dir=f"{root}/var/lib/topokeeper",
    )

    units = root / "etc" / "systemd" / "system"
    service, timer = units / "topokeeper-agent.service", units / "topokeeper-agent.timer"
    verified = subprocess.run(
        ["systemd-analyze", "verify", str(service), str(timer)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (verified.returncode, verified.stderr) == (0, "")  # warnings such as unknown keys also fail
    assert _unit(service)["Service"]["ExecStart"] == (
        f"/usr/bin/python3 {root}/opt/topokeeper/{PROGRAM_NAME} agent --config {root}/etc/topokeeper/agent.json --once"
    )
    assert _unit(service)["Service"]["Environment"] == (
        "PATH=/opt/slurm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    )
    assert _unit(timer)["Timer"]["OnUnitActiveSec"] == "30s"


def test_snippet_refuses_an_embedded_file_that_does_not_match_its_sha256(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _snippet(capsys).splitlines()
    first_data_line = lines.index(f"base64 -d > \"$dir/{PROGRAM_NAME}.new\" <<'TOPOKEEPER_EOF'") + 1
    lines[first_data_line] = lines[first_data_line][::-1]  # still base64, other bytes
    completed = _run("\n".join(lines) + "\n", tmp_path / "root")
    assert completed.returncode != 0
    assert "checksum did NOT match" in completed.stderr
    assert not (tmp_path / "root" / "opt" / "topokeeper" / PROGRAM_NAME).exists()


def test_agent_runs_on_python_3_8() -> None:
    vermin = Path(sys.executable).with_name("vermin")
    package = Path(topokeeper.__file__).parent
    sources = [str(package / path) for path in source_paths()]  # the agent and everything it ships with
    completed = subprocess.run(
        [str(vermin), "-t=3.8-", "--no-tips", "--violations", *sources],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout


def test_agent_needs_only_the_standard_library() -> None:
    # -S: no site-packages at all, so any import outside the standard library (and the program) fails.
    completed = subprocess.run(
        [sys.executable, "-I", "-S", str(head_node_program()), "agent", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "--once" in completed.stdout


def _deployment(tmp_path: Path, cluster: dict[str, object]) -> Path:
    path = tmp_path / "deployment.json"
    document = {
        "table": "t",
        "bucket": "topo-bundles",
        "queue_url": "https://sqs/q",
        "settings": {"clusters": [cluster]},
    }
    path.write_text(json.dumps(document))
    return path


def test_without_mode_or_deployment_the_script_is_refused_saying_what_to_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(INSTALL_SCRIPT_BASE_ARGS) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("topokeeper: error: --mode:")
    assert "--deployment" in captured.err and "verify" in captured.err


@pytest.mark.parametrize(
    ("cluster", "mode"),
    [({"name": "llm-train-slurm"}, "verify"), ({"name": "llm-train-slurm", "mode": "enforce"}, "enforce")],
)
def test_the_mode_follows_the_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: dict[str, object], mode: str
) -> None:
    deployment = _deployment(tmp_path, {**cluster, "channel": "agent"})
    snippet = _snippet_from(capsys, [*INSTALL_SCRIPT_BASE_ARGS, "--deployment", str(deployment), "--unsigned"])
    assert f'"mode": "{mode}"' in snippet


@pytest.mark.parametrize(
    ("settings", "flags", "seconds"),
    [
        ({}, [], 0),  # no placement_metrics: the agent puts no facts
        ({"placement_metrics": True}, [], 900),  # each drift period (15 min)
        ({"placement_metrics": True, "drift_schedule": "rate(5 minutes)"}, [], 300),
        ({"placement_metrics": True, "drift_schedule": "rate(1 hour)"}, [], 900),  # half the 1800 s stale bound
        ({"placement_metrics": True}, ["--placement-seconds", "120"], 120),
        ({}, ["--placement-seconds", "0"], 0),
    ],
)
def test_placement_facts_follow_the_deployment_s_placement_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], settings: dict[str, object], flags: list[str], seconds: int
) -> None:
    cluster = {"name": "llm-train-slurm", "channel": "agent", "placement_metrics": settings.get("placement_metrics")}
    deployment = _deployment(tmp_path, {k: v for k, v in cluster.items() if v is not None})
    if "drift_schedule" in settings:
        document = json.loads(deployment.read_text())
        document["settings"]["drift_schedule"] = settings["drift_schedule"]
        deployment.write_text(json.dumps(document))
    arguments = [*INSTALL_SCRIPT_BASE_ARGS, "--deployment", str(deployment), *flags]
    snippet = _snippet_from(capsys, arguments)
    assert f'"placement_facts_interval_seconds": {seconds}' in snippet


def test_a_negative_placement_interval_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*INSTALL_SCRIPT_BASE_ARGS, "--mode", "verify", "--placement-seconds", "-1"]) == 2
    error = capsys.readouterr().err
    assert error == "topokeeper: error: --placement-seconds: must be 0 (never) or more\n"


def test_an_enforce_agent_without_a_signing_key_is_refused_unless_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*INSTALL_SCRIPT_BASE_ARGS, "--mode", "enforce"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("topokeeper: error: --signing-key:")
    assert "--unsigned" in captured.err
    assert main([*INSTALL_SCRIPT_BASE_ARGS, "--mode", "verify"]) == 0  # verify applies nothing: no key needed
    assert main([*INSTALL_SCRIPT_BASE_ARGS, "--mode", "enforce", "--unsigned"]) == 0


def test_a_cluster_not_in_the_deployment_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deployment = _deployment(tmp_path, {"name": "other", "channel": "agent"})
    assert main([*INSTALL_SCRIPT_BASE_ARGS, "--deployment", str(deployment)]) == 2
    assert capsys.readouterr().err.startswith("topokeeper: error: --cluster: llm-train-slurm is not in")


def _snippet_from(capsys: pytest.CaptureFixture[str], arguments: list[str]) -> str:
    assert main(arguments) == 0
    return capsys.readouterr().out


def test_with_the_signing_key_the_snippet_installs_its_public_key_and_the_agent_checks_signatures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The install script fetches the stack's public key (GetPublicKey, the operator's credentials), installs it
    root-only beside the config, and the agent hands it to the applier, which refuses a forged bundle."""
    with AwsEmulator(region="us-west-2") as aws:
        for name, value in aws.env().items():
            monkeypatch.setenv(name, value)
        clear_clients()
        key_arn = aws.client("kms").create_key(KeySpec="RSA_3072", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
        try:
            snippet = _snippet(capsys, "--signing-key", key_arn)
        finally:
            clear_clients()
        public_key = aws.client("kms").get_public_key(KeyId=key_arn)["PublicKey"]
    root = tmp_path / "root"
    completed = _run(snippet, root)
    assert completed.returncode == 0, completed.stderr

    installed = root / "etc" / "topokeeper" / "bundle-key.json"
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600
    trusted = read_trusted_key(str(installed))
    assert (trusted.cluster, trusted.key_id) == ("llm-train-slurm", key_arn)
    assert (trusted.modulus, trusted.exponent) == rsa_public_key(public_key)
    config = load_config(str(root / "etc" / "topokeeper" / "agent.json"))
    assert config.trusted_key == str(installed)

    # The agent's applier run: a bundle signed by any other key is refused before anything else.
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(sign(bundle_document(), 5, key=signing_key("attacker"))))
    result = run_applier(config, "apply", str(bundle), None)
    assert (result["outcome"], result["signature"]) == ("bad_signature", "unchecked")
    assert "does not verify with the trusted key " + key_arn in result["error"]
