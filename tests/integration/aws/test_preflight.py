"""``topokeeper preflight`` against the emulator: each check answering each way, and a refusal as its row's
failure (exit 1), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.aws.support import cluster_request, group
from topokeeper.cli.main import main
from topokeeper.contract.stack_spec import PEAK_CONCURRENT_EXECUTIONS, POWERTOOLS_LAYER_PARAMETER
from topokeeper.sim.aws_emulator import AwsEmulator

HEAD = "mi-0123456789abcdef0"


def _config(tmp_path: Path, **cluster: Any) -> str:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"clusters": [{"name": "llm-train", **cluster}]}))
    return str(path)


def _healthy(aws: AwsEmulator) -> None:
    """An account where every check passes."""
    aws.client("sagemaker").create_cluster(
        **cluster_request("llm-train", group("p5-train", "ml.p5.48xlarge", 4, partition="ml-p5"))
    )
    aws.client("s3").create_bucket(Bucket="trail-bucket")
    trail = aws.client("cloudtrail")
    trail.create_trail(Name="management", S3BucketName="trail-bucket", IsMultiRegionTrail=True)
    trail.put_event_selectors(
        TrailName="management", EventSelectors=[{"ReadWriteType": "All", "IncludeManagementEvents": True}]
    )
    trail.start_logging(Name="management")
    aws.ssm.register_managed_instance(HEAD)
    aws.publish_public_parameter(POWERTOOLS_LAYER_PARAMETER, "arn:aws:lambda:us-east-1:017000801446:layer:x:1")
    aws.quotas.set("lambda", "L-B99A9384", 1000.0)


def _run(aws: AwsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, dict[str, Any]]]:
    """Preflight with the operator's credentials: a role allowed everything unless a test narrowed it."""
    config = _config(tmp_path, mode="verify", channel="ssm", head_node=HEAD)
    if _operator(aws) not in {role.arn for role in aws.iam.roles.values()}:
        aws.iam.add_role(_operator(aws), [{"Effect": "Allow", "Action": "*", "Resource": "*"}])
    with aws.iam.acting_as(_operator(aws)):
        code = main(["preflight", "--cluster", "llm-train", "--config", config, "--json"])
    out = capsys.readouterr().out
    return code, {row["check"]: row for row in json.loads(out)["checks"]}


def test_every_check_passes_on_a_ready_account(
    emulated: AwsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _healthy(emulated)
    code, rows = _run(emulated, tmp_path, capsys)
    assert {check: row["status"] for check, row in rows.items()} == dict.fromkeys(rows, "pass"), rows
    assert code == 0
    assert "4 of 4" in rows["DescribeInstanceTopology sees the cluster"]["detail"]


def _no_topology(aws: AwsEmulator) -> None:
    aws.network.expose_hyperpod_nodes = False  # HyperPod runs the nodes in a service account


def _trail_stopped(aws: AwsEmulator) -> None:
    aws.client("cloudtrail").stop_logging(Name="management")


def _read_only_trail(aws: AwsEmulator) -> None:
    aws.client("cloudtrail").put_event_selectors(
        TrailName="management", EventSelectors=[{"ReadWriteType": "ReadOnly", "IncludeManagementEvents": True}]
    )


def _only_a_regional_trail_elsewhere(aws: AwsEmulator) -> None:
    trail = aws.client("cloudtrail")
    trail.delete_trail(Name="management")
    aws.client("s3").create_bucket(Bucket="west-trail", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    west = aws.client("cloudtrail", region_name="us-west-2")
    west.create_trail(Name="west-only", S3BucketName="west-trail")
    west.start_logging(Name="west-only")


def _head_offline(aws: AwsEmulator) -> None:
    aws.ssm.set_ping_status(HEAD, "ConnectionLost")


def _operator(aws: AwsEmulator) -> str:
    return f"arn:aws:iam::{aws.account_id}:role/operator"


def _quota_denied(aws: AwsEmulator) -> None:
    aws.iam.add_role(_operator(aws), [{"Effect": "Allow", "NotAction": "servicequotas:*", "Resource": "*"}])


def _default_quota_too_small(aws: AwsEmulator) -> None:
    """No applied value (GetServiceQuota: NoSuchResourceException): AWS's default of a new account holds."""
    aws.quotas.forget("lambda", "L-B99A9384")
    aws.quotas.set_default("lambda", "L-B99A9384", 1.0)


def _no_quota(aws: AwsEmulator) -> None:
    aws.quotas.set("lambda", "L-B99A9384", float(PEAK_CONCURRENT_EXECUTIONS - 1))


FAILURES = [
    (_no_topology, "DescribeInstanceTopology sees the cluster", "service account"),
    (_trail_stopped, "a trail delivers management events", "create or start"),
    (_read_only_trail, "a trail delivers management events", "none of 1 trail"),
    (_only_a_regional_trail_elsewhere, "a trail delivers management events", "none of 0 trail"),
    (_head_offline, "SSM reaches the head node", "ConnectionLost"),
    (_no_quota, "service quotas fit", "request-service-quota-increase"),
    (_quota_denied, "service quotas fit", "allow servicequotas:GetServiceQuota"),
    (_default_quota_too_small, "service quotas fit", "request-service-quota-increase"),
]


@pytest.mark.parametrize(("spoil", "check", "named"), FAILURES, ids=[f[0].__name__ for f in FAILURES])
def test_each_check_fails_naming_what_to_do(
    emulated: AwsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: Any, check: str, named: str
) -> None:
    _healthy(emulated)
    spoil(emulated)
    code, rows = _run(emulated, tmp_path, capsys)
    assert code == 1
    assert rows[check]["status"] == "FAIL"
    assert named in rows[check]["detail"] + rows[check]["fix"], rows[check]
    assert [c for c, row in rows.items() if row["status"] == "FAIL"] == [check]


def test_what_the_account_lacks_is_a_row_not_a_traceback(
    emulated: AwsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No cluster, no trail, no managed node, no Powertools parameter, no quota value: five findings, exit 1."""
    code, rows = _run(emulated, tmp_path, capsys)
    assert code == 1
    assert {check: row["status"] for check, row in rows.items()} == dict.fromkeys(rows, "FAIL"), rows
    assert "ResourceNotFound" in rows["DescribeInstanceTopology sees the cluster"]["detail"]
    assert "not an SSM managed node" in rows["SSM reaches the head node"]["detail"]
    assert POWERTOOLS_LAYER_PARAMETER in rows["Powertools layer in the region"]["detail"]
    assert "NoSuchResourceException" in rows["service quotas fit"]["detail"]


def test_agent_channel_skips_ssm_and_prints_a_table(
    emulated: AwsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _healthy(emulated)
    code = main(["preflight", "--cluster", "llm-train", "--config", _config(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].split() == ["CHECK", "RESULT", "DETAIL"]
    assert "SSM reaches the head node" in out and "skip" in out
