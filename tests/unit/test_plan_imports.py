"""``topokeeper plan`` and ``show`` load no AWS SDK and no operator command (they cost ~0.5 s of a 0.9 s run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from topokeeper.cli.main import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOT_FOR_PLANNING = (
    "boto3",
    "botocore",
    "aws_lambda_powertools",
    "moto",
    "topokeeper.adapters",
    "topokeeper.service",
    "topokeeper.sim",
    "topokeeper.login",
    "topokeeper.kueue",
    "topokeeper.agent",
    "topokeeper.cli.operator_commands",
    "topokeeper.cli.readonly_commands",
    "topokeeper.cli.kueue_commands",
    "topokeeper.cli.login_commands",
    "topokeeper.wiring",
    "topokeeper.contract.deployment",
    # Nor what only the other planning commands or a YAML file need.
    "yaml",
    "topokeeper.cli.nccl_check",
    "topokeeper.computenode",
    "topokeeper.contract.head_node_program",
)

RUN_AND_LIST = """
import json, sys
from topokeeper.cli.main import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""


def _modules_after(*commands: list[str]) -> tuple[list[int], list[str]]:
    completed = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST, json.dumps(commands)], capture_output=True, text=True, check=True
    )
    found = json.loads(completed.stdout.splitlines()[-1])
    return found["codes"], found["modules"]


def test_plan_and_show_import_no_aws_sdk_or_operator_command(tmp_path: Path) -> None:
    snapshot = str(EXAMPLES / "mixed-cluster.json")
    codes, modules = _modules_after(
        ["plan", "--snapshot", snapshot, "--out", str(tmp_path)],
        ["show", "--snapshot", snapshot, "--leaves", "--slurm-version", "24.11"],
        ["show", "--snapshot", snapshot, "--json"],
    )
    assert codes == [0, 0, 0]
    assert (tmp_path / "bundle.json").is_file()
    loaded = [name for name in modules if any(name == top or name.startswith(f"{top}.") for top in NOT_FOR_PLANNING)]
    assert loaded == []


def test_every_other_command_line_still_reaches_the_operator_commands(tmp_path: Path) -> None:
    parser = build_parser()
    assert parser.parse_args(["audit", "--cluster", "c"]).run.__module__ == "topokeeper.cli.operator_commands"
    verify = parser.parse_args(["verify", "--snapshot", "s.json", "--bundle-out", "out"])
    assert verify.run.__module__ == "topokeeper.cli.readonly_commands"
    # A global option before the command: the command is still found, and only its module loaded.
    codes, modules = _modules_after(
        ["--region", "us-east-1", "plan", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--out", str(tmp_path)]
    )
    assert codes == [0] and "topokeeper.cli.operator_commands" not in modules
