"""``topokeeper --help`` and each offline command's ``--help`` load no command they do not run, and no pydantic, AWS
SDK, Powertools or moto (together ~0.5 s of a 0.6 s ``--help``). What is loaded is read from ``sys.modules`` in a
fresh interpreter after the help was printed: no timing. bench/cli_speed.py measures the time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topokeeper.cli.main import ALL, COMMANDS, build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LOGIN_BUNDLE_ARN = "arn:aws:secretsmanager:us-east-1:111122223333:secret:topokeeper/login/c-AbCdEf"
HEAVY = ("pydantic", "pydantic_core", "boto3", "botocore", "aws_lambda_powertools", "moto")
COMMAND_MODULES = {registrar.partition(":")[0] for registrar, _ in COMMANDS.values()} - {"topokeeper.cli.main"}
# The offline commands (no AWS call needed), as `topokeeper ... --help` words.
OFFLINE = (
    (),
    ("plan",),
    ("show",),
    ("head-node-program",),
    ("hostfile",),
    ("nccl-check",),
    ("cost",),
    ("verify",),
    ("kueue",),
    ("labels",),
    ("simulate",),
    ("demo",),
    ("emulator",),
    ("login", "install-script"),
    ("agent", "install-script"),  # KMS only with --signing-key or --deployment
)

HELP_AND_LIST = """
import json, sys
from topokeeper.cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _loaded(prefixes: set[str] | tuple[str, ...], modules: list[str]) -> list[str]:
    return [name for name in modules if any(name == top or name.startswith(f"{top}.") for top in prefixes)]


@pytest.mark.parametrize("words", OFFLINE, ids=lambda words: " ".join(words) or "topokeeper")
def test_help_loads_only_the_command_it_shows(words: tuple[str, ...]) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", HELP_AND_LIST, json.dumps([*words, "--help"])],
        capture_output=True,
        text=True,
        check=True,
    )
    *shown, last = completed.stdout.splitlines()
    found = json.loads(last)
    assert found["code"] == 0, completed.stderr
    assert shown[0].startswith(" ".join(("usage: topokeeper", *words)))  # the help was printed
    own = COMMANDS[words[0]][0].partition(":")[0] if words else None
    assert _loaded(HEAVY, found["modules"]) == []
    assert _loaded(COMMAND_MODULES - {own}, found["modules"]) == []


def test_the_listed_commands_are_the_ones_their_modules_register() -> None:
    """Each line of ``topokeeper --help`` (and of the usage errors, which list the commands) is the line the command's
    module registers, in the same order, whichever command is run."""
    full = build_parser(ALL).format_help()
    assert build_parser(None).format_help() == full
    for name in COMMANDS:
        assert build_parser(name).format_help() == full, name


@pytest.mark.parametrize(
    "argv",
    [
        ["labels", "--snapshot", str(EXAMPLES / "eks" / "p5-3-layer.snapshot.json")],
        ["login", "install-script", "--secret-arn", LOGIN_BUNDLE_ARN, "--secret-region", "us-east-1"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_an_offline_run_loads_no_aws_sdk(argv: list[str]) -> None:
    """AWS errors are translated (cli.main._run_reaching_aws) without importing botocore where none can occur."""
    completed = subprocess.run(
        [sys.executable, "-c", HELP_AND_LIST, json.dumps(argv)], capture_output=True, text=True, check=True
    )
    found = json.loads(completed.stdout.splitlines()[-1])
    assert found["code"] == 0, completed.stderr
    assert _loaded(("boto3", "botocore", "aws_lambda_powertools", "moto"), found["modules"]) == []
