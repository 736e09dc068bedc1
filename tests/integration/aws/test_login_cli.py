"""``topokeeper login rotate-host-keys`` and ``install-script`` against the emulator's Secrets Manager and KMS."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from topokeeper.adapters.aws import clear_clients
from topokeeper.cli.main import main
from topokeeper.contract.constants import login_secret_names
from topokeeper.sim.aws_emulator import AwsEmulator

ROLE = "arn:aws:iam::123456789012:role/llm-train-login"
ENDPOINT = "login.llm-train.internal"


def rotate(aws: AwsEmulator, key: str, *extra: str) -> int:
    return main(
        [
            "--endpoint-url", aws.endpoint_url, "--region", aws.region, "login", "rotate-host-keys",
            "--cluster", "llm-train", "--name", ENDPOINT, "--login-role-arn", ROLE, "--kms-key-id", key, *extra,
        ]
    )  # fmt: skip


@pytest.fixture
def key(aws: AwsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in aws.env().items():
        monkeypatch.setenv(name, value)
    clear_clients()  # the CLI's cached clients must reach this emulator
    yield str(aws.client("kms").create_key()["KeyMetadata"]["Arn"])
    clear_clients()


def test_rotation_keeps_the_ca_so_the_users_line_never_changes(
    aws: AwsEmulator, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = aws.client("secretsmanager")
    bundle_name, ca_name = login_secret_names("llm-train")

    assert rotate(aws, key) == 0
    first_line = capsys.readouterr().out.splitlines()[-1]
    first_bundle = secrets.get_secret_value(SecretId=bundle_name)["SecretString"]
    assert rotate(aws, key) == 0
    second_line = capsys.readouterr().out.splitlines()[-1]
    second_bundle = secrets.get_secret_value(SecretId=bundle_name)["SecretString"]

    assert first_line.startswith(f"@cert-authority {ENDPOINT} ssh-ed25519 ")
    assert first_line == second_line
    assert first_bundle != second_bundle and second_bundle.startswith("topokeeper-host-identity/1\n")
    described = secrets.describe_secret(SecretId=bundle_name)
    assert described["KmsKeyId"] == key
    policy = json.loads(secrets.get_resource_policy(SecretId=bundle_name)["ResourcePolicy"])
    allow, deny = policy["Statement"]
    assert (allow["Effect"], allow["Principal"], allow["Action"]) == (
        "Allow",
        {"AWS": [ROLE]},
        ["secretsmanager:GetSecretValue"],
    )
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"StringNotEquals": {"aws:PrincipalArn": [ROLE]}}
    ca_policy = json.loads(secrets.get_resource_policy(SecretId=ca_name)["ResourcePolicy"])
    assert ca_policy["Statement"][0]["Principal"] == {"AWS": [ROLE]}
    assert ca_policy["Statement"][0]["Effect"] == "Deny"


def test_plain_keys_pin_the_key_and_keep_no_ca(aws: AwsEmulator, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert rotate(aws, key, "--plain") == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"{ENDPOINT} ssh-ed25519 ")
    names = {s["Name"] for s in aws.client("secretsmanager").list_secrets()["SecretList"]}
    assert names == {login_secret_names("llm-train")[0]}


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--name", "bad name;rm"], "--name"),
        (["--kms-key-id", "alias"], "--kms-key-id"),
    ],
)
def test_bad_arguments_name_the_field_and_store_nothing(
    aws: AwsEmulator, key: str, capsys: pytest.CaptureFixture[str], argv: list[str], field: str
) -> None:
    args = ["--endpoint-url", aws.endpoint_url, "login", "rotate-host-keys", "--cluster", "llm-train"]
    args += ["--login-role-arn", ROLE] + (argv if "--kms-key-id" in argv else [*argv, "--kms-key-id", key])
    if "--name" not in argv:
        args += ["--name", ENDPOINT]
    assert main(args) == 2
    assert f"error: {field}:" in capsys.readouterr().err
    assert aws.client("secretsmanager").list_secrets()["SecretList"] == []


def test_install_script_bakes_only_validated_values(capsys: pytest.CaptureFixture[str]) -> None:
    arn = "arn:aws:secretsmanager:us-west-2:111122223333:secret:topokeeper/llm-train/login-host-identity-AbCdEf"
    assert main(["login", "install-script", "--secret-arn", arn, "--secret-region", "us-west-2"]) == 0
    script = capsys.readouterr().out
    assert f"SECRET_ID='{arn}'" in script and "REGION='us-west-2'" in script
    assert "@SECRET_ID@" not in script and "@REGION@" not in script
    assert main(["login", "install-script", "--secret-arn", arn + "';reboot;'", "--secret-region", "us-west-2"]) == 2
    assert "--secret-arn" in capsys.readouterr().err
