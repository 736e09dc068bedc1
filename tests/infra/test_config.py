"""cdk.json context -> Settings: the example is valid, overrides work, and errors name the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infra.config import ConfigError, drift_alarm_period, load_settings
from infra.constants import REPO_ROOT
from tests.infra.conftest import example_config
from topokeeper.contract.config import MAX_CONFIG_BYTES, Channel, Mode, Orchestrator

pytestmark = pytest.mark.infra


def test_the_example_context_has_a_hyperpod_agent_cluster_and_an_ec2_ssm_cluster() -> None:
    settings = load_settings(example_config())

    hyperpod, pcluster = settings.clusters
    assert (hyperpod.orchestrator, hyperpod.effective_mode, hyperpod.effective_channel) == (
        Orchestrator.HYPERPOD,
        Mode.VERIFY,
        Channel.AGENT,
    )
    assert (pcluster.orchestrator, pcluster.effective_mode, pcluster.effective_channel) == (
        Orchestrator.EC2,
        Mode.ENFORCE,
        Channel.SSM,
    )
    assert pcluster.head_node is not None and pcluster.head_node.startswith("i-")


def test_a_json_string_as_from_a_cli_override_is_accepted() -> None:
    config = example_config()
    config["drift_schedule"] = "rate(1 hour)"

    assert load_settings(json.dumps(config)).drift_schedule == "rate(1 hour)"


def test_login_endpoints_whose_target_groups_would_overflow_the_environment_are_refused_at_synth() -> None:
    config = example_config()
    login = {
        "enabled": True,
        "vpc_id": "vpc-0a1b2c3d4e5f60718",
        "vpc_config": {"security_group_ids": ["sg-0a1b2c3d4e5f60001"], "subnets": ["subnet-0a1b2c3d4e5f60001"]},
        "allowed_cidrs": [f"10.{i}.0.0/16" for i in range(50)],
    }
    few = [{"name": f"login-{index:02d}", "login": login} for index in range(3)]
    config["clusters"] = few
    assert [cluster.name for cluster in load_settings(config).clusters] == [c["name"] for c in few]

    config["clusters"] = few + [{"name": f"login-{index:02d}", "login": login} for index in range(3, 30)]
    with pytest.raises(ConfigError, match="LOGIN_TARGET_GROUPS"):
        load_settings(config)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c["clusters"][1].update(head_node="sagemaker-cluster:abc_controller-i-0123"),
            "topokeeper.clusters[1].head_node: Value error, SSM SendCommand takes i-/mi- ids only",
        ),
        (
            lambda c: c["clusters"][0]["partitions"]["ml-p6e"].update(kind="ring"),
            "topokeeper.clusters[0].partitions.ml-p6e.kind: Input should be",
        ),
        (lambda c: c.update(log_retention_days=10), "topokeeper.log_retention_days: Input should be 1, 3, 5"),
        (
            lambda c: c.update(alarm_emial="x@example.com"),
            "topokeeper.alarm_emial: Extra inputs are not permitted: did you mean 'alarm_email'?",
        ),
        (
            lambda c: c["clusters"][0].update(mdoe="enforce"),
            "topokeeper.clusters[0].mdoe: Extra inputs are not permitted: did you mean 'mode'?",
        ),
        (lambda c: c.update(drift_schedule="every 15 minutes"), "topokeeper.drift_schedule: expected rate("),
        (
            lambda c: c.update(drift_schedule="rate(15 minutes)", drift_alarm_periods=97),
            "topokeeper.drift_alarm_periods: 97 periods of 900 s exceed CloudWatch's 1-day",
        ),
        (
            lambda c: c.update(operator_role_arn="arn:aws:iam::111122223333:user/alice"),
            "topokeeper.operator_role_arn: Value error, not an IAM role ARN",
        ),
    ],
)
def test_errors_name_the_offending_context_key(change, message: str) -> None:
    config = example_config()
    change(config)

    with pytest.raises(ConfigError) as raised:
        load_settings(config)

    assert str(raised.value).startswith(message)


def test_missing_context_and_bad_json_are_reported() -> None:
    with pytest.raises(ConfigError, match=r"^topokeeper: missing; set it in cdk.json context"):
        load_settings(None)
    with pytest.raises(ConfigError, match=r"^topokeeper: not valid JSON"):
        load_settings("{clusters: []}")


def test_a_config_too_large_for_the_lambda_environment_is_refused_at_synth() -> None:
    config = example_config()
    config["clusters"] = [
        {"name": f"cluster-{index:03d}", "orchestrator": "ec2", "head_node": f"i-{index:017x}"} for index in range(60)
    ]

    with pytest.raises(ConfigError, match=rf"over the {MAX_CONFIG_BYTES}-byte limit"):
        load_settings(config)


@pytest.mark.parametrize(
    ("schedule", "seconds"),
    [("rate(15 minutes)", 900), ("rate(1 minute)", 60), ("rate(2 hours)", 7200), ("cron(0 * * * ? *)", 3600)],
)
def test_the_drift_alarm_period_is_one_drift_check(schedule: str, seconds: int) -> None:
    config = example_config()
    config["drift_schedule"] = schedule

    assert drift_alarm_period(load_settings(config)).to_seconds() == seconds


def test_the_app_exits_2_naming_the_key_when_a_cli_override_is_invalid(tmp_path) -> None:
    config = example_config()
    config["clusters"][1]["head_node"] = "head-1"
    # What the CDK CLI hands the app for -c topokeeper='{...}' (a separate process: jsii's node
    # runtime in this one took its environment when it started).
    environment = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({"topokeeper": json.dumps(config)}),
        "CDK_OUTDIR": str(tmp_path),
    }

    run = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True, check=False
    )

    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("topokeeper: error: topokeeper.clusters[1].head_node: Value error")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c["clusters"][0]["partitions"].update({"ml-p5\nkind: Secret": {"kind": "tree"}}),
            "topokeeper.clusters[0].partitions.ml-p5\\nkind: Secret.[key]: ",
        ),
        (
            lambda c: c.update(alarm_email="hpc-oncall@example.com\nBcc: someone@example.com"),
            "topokeeper.alarm_email: Value error, not one email address",
        ),
        (
            lambda c: c["clusters"][0]["partitions"]["ml-p6e"].update(block_sizes=[10**30]),
            "topokeeper.clusters[0].partitions.ml-p6e.block_sizes: Value error, block_sizes base 10",
        ),
    ],
)
def test_a_context_that_would_fail_later_is_refused_at_synth_in_one_line(change, message: str) -> None:
    config = example_config()
    change(config)

    with pytest.raises(ConfigError) as raised:
        load_settings(config)

    assert str(raised.value).startswith(message), str(raised.value)
    assert str(raised.value).isprintable(), repr(str(raised.value))
