"""The first-day mistakes, each against the emulator: every command that reaches AWS answers a wrong id, bucket,
stack, cluster or key with one line saying what to do, never a traceback (an exception out of ``main`` fails)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.unit.service.test_ssm_channel import _decode
from topokeeper.cli.main import main
from topokeeper.sim.aws.ssm import CommandInvocationRequest
from topokeeper.sim.aws_emulator import AwsEmulator

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SNAPSHOT = str(EXAMPLES / "mixed-cluster.json")
MISSING_KEY = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"


# (command, what the one line must name), as an operator might type them on the first day.
WRONG = [
    (["verify", "--snapshot", SNAPSHOT, "--head-node", "i-0123456789abcdef0", "--bucket", "no-such-bucket"],
     "NoSuchBucket"),
    (["drift", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["diff", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["audit", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["apply", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["preflight", "--cluster", "llm-train", "--stack-name", "Topokeeper"], "deploy the stack first"),
    (["preflight", "--cluster", "llm-train", "--config", "{tmp}/missing.json"], "missing.json"),
    (["snapshot", "--cluster", "no-such-cluster"], "no-such-cluster"),
    (["snapshot", "--cluster", "pcluster", "--orchestrator", "ec2"],
     "no EC2 instance in us-east-1 has the tag topokeeper:cluster=pcluster; ParallelCluster's tags: --parallelcluster"),
    (["snapshot", "--cluster", "pcluster", "--parallelcluster"],
     "no EC2 instance in us-east-1 has the tag parallelcluster:cluster-name=pcluster"),
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
    emulated.client("s3").create_bucket(Bucket="plans")
    argv = ["verify", "--snapshot", SNAPSHOT, "--head-node", "i-0123456789abcdef0", "--bucket", "plans"]
    assert main(argv) != 0
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "InvalidInstanceId" in error and "describe-instance-information" in error, error


def test_verify_presigns_for_the_buckets_own_region(emulated: AwsEmulator, capsys: pytest.CaptureFixture[str]) -> None:
    """A bucket in another region than the CLI's: the URLs the head node fetches must be signed for the bucket's
    (S3 refuses any other), so every one of them is fetched here, as the head node would."""
    emulated.client("s3", region_name="us-west-2").create_bucket(
        Bucket="west-plans", CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
    )
    fetched: list[int] = []

    def head_node(invocation: CommandInvocationRequest) -> tuple[str, int, str, str]:
        payload = json.dumps(_decode(invocation.commands))
        for url in re.findall(r"https?://[^\s'\"]+X-Amz-Signature=[0-9a-f]+", payload):
            if "program-" in url:  # the program the command fetches: the head node's first GET
                with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the emulator's URL
                    fetched.append(response.status)
        return ("Success", 0, "", "")

    emulated.ssm.on_command = head_node
    emulated.ssm.register_managed_instance("i-0123456789abcdef0")  # a head node SSM reaches
    argv = ["verify", "--snapshot", SNAPSHOT, "--head-node", "i-0123456789abcdef0", "--bucket", "west-plans"]
    main([*argv, "--region", "us-east-1"])
    capsys.readouterr()
    assert fetched and set(fetched) == {200}
