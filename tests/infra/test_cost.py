"""``topokeeper cost`` on the synthesized stacks: every resource counted, the fixed charges priced exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from infra.constants import REPO_ROOT
from tests.infra.conftest import Synthesized, synthesize
from tests.infra.test_login_endpoint import LOGIN, with_login
from topokeeper.cli.cost import FIXED_MONTHLY, FREE, USAGE_PRICED, estimate, render
from topokeeper.cli.main import main
from topokeeper.contract.errors import InputError

pytestmark = pytest.mark.infra


@pytest.fixture(scope="module")
def login(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(tmp_path_factory.mktemp("login"), with_login(LOGIN))


def _counts(synthesized: Synthesized) -> Counter[str]:
    return Counter(resource["Type"] for resource in synthesized.resources.values())


@pytest.mark.parametrize("stack", ["example", "login"])
def test_every_resource_of_the_template_is_counted_and_the_fixed_ones_priced(
    stack: str, request: pytest.FixtureRequest
) -> None:
    synthesized: Synthesized = request.getfixturevalue(stack)
    counts = _counts(synthesized)
    cost = estimate(synthesized.template.to_json(), clusters=len(synthesized.settings.clusters))
    billable = {kind: count for kind, count in counts.items() if kind not in FREE}
    assert {line.resource_type: line.count for line in cost.lines} == billable
    assert cost.resources + sum(count for kind, count in counts.items() if kind in FREE) == sum(counts.values())
    assert cost.fixed_monthly == pytest.approx(sum(FIXED_MONTHLY.get(kind, 0) * n for kind, n in counts.items()))
    assert counts["AWS::KMS::Key"] == 2 and cost.fixed_monthly >= 2 * 1.00 + counts["AWS::CloudWatch::Alarm"] * 0.10
    assert cost.drift_runs == 2920  # rate(15 minutes) over a 730-hour month
    assert set(counts) <= set(FIXED_MONTHLY) | USAGE_PRICED | FREE


def test_a_type_the_estimate_does_not_know_is_refused_naming_it(example: Synthesized) -> None:
    template: dict[str, Any] = json.loads(json.dumps(example.template.to_json()))
    template["Resources"]["Extra"] = {"Type": "AWS::RDS::DBInstance", "Properties": {}}
    with pytest.raises(InputError, match="AWS::RDS::DBInstance"):
        estimate(template, clusters=2)


def test_the_command_prints_one_table_with_the_total(example: Synthesized, tmp_path, capsys) -> None:
    path = tmp_path / "Topokeeper.template.json"
    path.write_text(json.dumps(example.template.to_json()))
    assert main(["cost", "--template", str(path)]) == 0
    printed = capsys.readouterr().out
    cost = estimate(example.template.to_json(), clusters=2)
    assert printed == render(cost, 2) + "\n"
    assert "AWS::KMS::Key" in printed and "2 cluster(s)" in printed and f"${cost.monthly:.2f}" in printed


def test_the_readme_shows_the_estimate_of_the_sample_config(example: Synthesized) -> None:
    shown = render(estimate(example.template.to_json(), clusters=len(example.settings.clusters)), 2)
    assert shown in (REPO_ROOT / "README.md").read_text()


@pytest.mark.parametrize(
    "template",
    [
        {"Resources": []},
        {"Resources": {"Queue": []}},
        {"Resources": {"F": {"Type": "AWS::Lambda::Function", "Properties": []}}},
        {
            "Resources": {
                "F": {
                    "Type": "AWS::Lambda::Function",
                    "Properties": {"Environment": {"Variables": {"TOPOKEEPER_CONFIG": "not json"}}},
                }
            }
        },
    ],
    ids=["resources-a-list", "resource-a-list", "properties-a-list", "config-not-json"],
)
def test_a_file_that_is_no_template_is_one_error_not_a_traceback(
    template: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "template.json"
    path.write_text(json.dumps(template))
    assert main(["cost", "--template", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("topokeeper: error: --template"), error
