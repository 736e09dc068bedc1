"""The first-day mistakes, each against the emulator: every command that reaches AWS answers a wrong id, bucket,
stack, cluster or key with one line saying what to do, never a traceback (an exception out of ``main`` fails)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from topokeeper.adapters.aws import clear_clients
from topokeeper.cli.main import main
from topokeeper.sim.aws_emulator import AwsEmulator

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SNAPSHOT = str(EXAMPLES / "mixed-cluster.json")
MISSING_KEY = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"


@pytest.fixture
def emulated(aws: AwsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsEmulator]:
    for name, value in aws.env().items():
        monkeypatch.setenv(name, value)
    clear_clients()
    yield aws
    clear_clients()


# (command, what the one line must name), as an operator might type them on the first day.
WRONG = [
    (["verify", "--snapshot", SNAPSHOT, "--head-node", "i-0123456789abcdef0", "--bucket", "no-such-bucket"],
     "NoSuchBucket"),
    (["drift", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["diff", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["audit", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["apply", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["snapshot", "--cluster", "no-such-cluster"], "no-such-cluster"),
    (["labels", "--cluster", "no-such-cluster"], "no-such-cluster"),
    (["kueue", "--cluster", "no-such-cluster", "--out", "{tmp}/kueue"], "no-such-cluster"),
    (["agent", "install-script", "--cluster", "llm-train", "--bucket", "b", "--region", "us-east-1",
      "--mode", "verify", "--signing-key", MISSING_KEY], "11111111-2222-3333-4444-555555555555"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "named"), WRONG, ids=lambda value: " ".join(value[:2]) if isinstance(value, list) else None
)
def test_a_wrong_input_gets_one_line_saying_what_to_do(
    emulated: AwsEmulator, command: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [part.format(tmp=tmp_path) for part in command]
    assert main(argv) != 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("topokeeper: error: "), captured.err
    assert named in captured.err, captured.err


def test_a_head_node_ssm_cannot_reach_says_to_check_its_registration(
    emulated: AwsEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    emulated.ssm.strict_targets = True  # as AWS: only running or registered instances
    emulated.client("s3").create_bucket(Bucket="plans")
    argv = ["verify", "--snapshot", SNAPSHOT, "--head-node", "i-0123456789abcdef0", "--bucket", "plans"]
    assert main(argv) != 0
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "InvalidInstanceId" in error and "describe-instance-information" in error, error
