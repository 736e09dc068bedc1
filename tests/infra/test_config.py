"""cdk.json context -> Settings: the example is valid, overrides work, and errors name the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import ConfigError, drift_alarm_period, load_settings, read_context_config, refuse_placeholders
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


def _app_py(tmp_path: Path, context: dict[str, object]) -> subprocess.CompletedProcess[str]:
    """``python app.py`` as the CDK CLI runs it with ``-c`` values (CDK_CONTEXT_JSON)."""
    environment = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": str(tmp_path / "out")}
    return subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True, check=False
    )


def test_the_shipped_examples_are_refused_one_line_each_unless_asked_for(tmp_path: Path) -> None:
    run = _app_py(tmp_path, {})  # cdk.json as shipped: a deploy would reach example accounts and mailboxes
    assert run.returncode == 2, run.stderr
    lines = run.stderr.splitlines()
    assert (
        "topokeeper: error: topokeeper.clusters[0].arn: 'arn:aws:sagemaker:us-west-2:111122223333:cluster/"
        in (lines[0])
    )
    assert any(
        line.startswith("topokeeper: error: topokeeper.clusters[1].head_node: 'i-0a1b2c3d4e5f60718'") for line in lines
    )
    assert any(line.startswith("topokeeper: error: topokeeper.alarm_email: 'hpc-oncall@example.com'") for line in lines)
    assert all("-c topokeeper:examples=true" in line for line in lines)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_refuse_placeholders_passes_an_operators_own_values() -> None:
    config = example_config()
    config["clusters"][0]["arn"] = "arn:aws:sagemaker:us-west-2:210987654321:cluster/x7k2m9p4q1z8"
    config["clusters"][1]["head_node"] = "i-07e1c0ffee5ca1ab1"
    config["alarm_email"] = "hpc-oncall@corp.internal"
    refuse_placeholders(config)  # nothing raised: no example value left
    config["alarm_email"] = "ops@example.org"
    with pytest.raises(ConfigError, match=r"^topokeeper\.alarm_email: 'ops@example\.org' is an example value"):
        refuse_placeholders(config)


def test_a_multi_line_config_file_is_read_and_validated_like_the_inline_one(tmp_path: Path) -> None:
    config = example_config()
    config["drift_schedule"] = "rate(1 hour)"
    path = tmp_path / "prod-topokeeper.json"
    path.write_text(json.dumps(config, indent=2))  # many lines: -c topokeeper="$(cat ...)" would pass one
    raw = read_context_config({"clusters": []}, str(path))
    assert load_settings(raw).drift_schedule == "rate(1 hour)"
    config["drift_schedule"] = "every hour"
    path.write_text(json.dumps(config, indent=2))
    with pytest.raises(ConfigError, match=r"^topokeeper\.drift_schedule: "):
        load_settings(read_context_config(None, str(path)))
    with pytest.raises(ConfigError, match=r"^topokeeper:config-file: cannot read .*missing\.json: No such file"):
        read_context_config(None, str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text("{\n  'clusters': []\n}")
    with pytest.raises(ConfigError, match=r"^topokeeper:config-file: .*broken\.json is not valid JSON"):
        read_context_config(None, str(tmp_path / "broken.json"))


def test_the_app_synthesizes_from_a_config_file_over_cdk_json(tmp_path: Path) -> None:
    config = example_config()
    config["clusters"][0]["arn"] = "arn:aws:sagemaker:us-west-2:210987654321:cluster/x7k2m9p4q1z8"
    config["clusters"][1]["head_node"] = "i-07e1c0ffee5ca1ab1"
    config["alarm_email"] = "hpc-oncall@corp.internal"
    path = tmp_path / "prod.json"
    path.write_text(json.dumps(config, indent=2))
    run = _app_py(tmp_path, {"topokeeper:config-file": str(path)})
    assert run.returncode == 0, run.stderr
    template = json.loads((tmp_path / "out" / "Topokeeper.template.json").read_text())
    assert "x7k2m9p4q1z8" in json.dumps(template)


@pytest.mark.parametrize(("content", "kind"), [("null", "null"), ("[]", "list"), ('"x"', "str")])
def test_a_config_file_that_holds_no_object_is_refused_naming_the_file(tmp_path: Path, content: str, kind: str) -> None:
    path = tmp_path / "prod.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=rf"^topokeeper:config-file: .*prod\.json holds {kind}, not the settings"):
        read_context_config({"clusters": []}, str(path))
