"""cdk-nag AwsSolutions: the stack passes with its reviewed acknowledgments, and the check is live."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_sqs as sqs
from cdk_nag import AwsSolutionsChecks

from tests.infra.conftest import synthesize

pytestmark = pytest.mark.infra


def test_the_stack_has_no_unacknowledged_findings(tmp_path: Path) -> None:
    synthesized = synthesize(tmp_path, nag=True)  # raises ValidationFailed on any unacknowledged finding

    (report,) = json.loads((tmp_path / "validation-report.json").read_text())["pluginReports"]
    assert (report["conclusion"], report["violations"]) == ("success", [])
    for finding in report["suppressedViolations"]:
        # Each acknowledgment has its reason and sits on the construct that causes it, never the stack.
        assert len(finding["reason"]) > 40, finding["ruleName"]
        assert finding["acknowledgedAt"].count("/") >= 1, finding["ruleName"]

    # An acknowledgment of Resource::* names every action the role holds on "*".
    policies = {
        f"{function.role.node.path}/DefaultPolicy/Resource": function.role.node.find_child("DefaultPolicy")
        for function in synthesized.stack.functions.by_name.values()
    }
    for finding in report["suppressedViolations"]:
        if finding["ruleName"] != "AwsSolutions-IAM5[Resource::*]":
            continue
        (construct,) = finding["violatingConstructs"]
        document = synthesized.resource(policies[construct["constructPath"]])["Properties"]["PolicyDocument"]
        unscoped = {
            action
            for statement in document["Statement"]
            if statement["Resource"] == "*"
            for action in (statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]])
        }
        assert unscoped and all(action in finding["reason"] for action in unscoped), finding["acknowledgedAt"]


def test_the_check_is_live_a_plain_queue_fails_it(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    sqs.Queue(cdk.Stack(app, "Violations"), "Plain")

    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()

    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for plugin in report["pluginReports"] for v in plugin["violations"]}
    assert {"AwsSolutions-SQS3", "AwsSolutions-SQS4"} <= rules
