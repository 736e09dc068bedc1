"""``placement_metrics`` and ``placement_alarms`` in the stack: per-partition alarms, a dashboard row that finds the
partitions by search, and the synthesized template still passes cdk-nag and cfn-lint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.constants import REPO_ROOT, STACK_ID
from tests.infra.conftest import example_config, synthesize

pytestmark = pytest.mark.infra


def test_placement_alarms_watch_their_partition_and_the_dashboard_searches_every_one(tmp_path: Path) -> None:
    config = example_config()
    agent, ssm = config["clusters"]
    ssm.update(
        placement_metrics=True,
        placement_alarms={"gpu": {"largest_placeable_below": 8, "topology_pending_seconds_above": 3600}},
    )
    # The agent channel (HyperPod) reads the facts its agent puts: the same alarms, row and nag-clean template.
    agent.update(placement_metrics=True, placement_alarms={"ml-p5": {"largest_placeable_below": 4}})
    synthesized = synthesize(tmp_path, config, nag=True)  # raises ValidationFailed on any unacknowledged finding
    alarms = {
        resource["Properties"]["AlarmName"].split("-", 1)[1]: resource["Properties"]
        for resource in synthesized.resources.values()
        if resource["Type"] == "AWS::CloudWatch::Alarm" and "partition" in json.dumps(resource["Properties"])
    }
    cluster = ssm["name"]
    assert sorted(alarms) == [
        f"{cluster}-gpu-LargestPlaceableJobNodes",
        f"{cluster}-gpu-TopologyPendingSeconds",
        f"{agent['name']}-ml-p5-LargestPlaceableJobNodes",
    ]
    largest = alarms[f"{cluster}-gpu-LargestPlaceableJobNodes"]
    assert largest["Dimensions"] == [{"Name": "cluster", "Value": cluster}, {"Name": "partition", "Value": "gpu"}]
    assert (largest["Statistic"], largest["Threshold"], largest["ComparisonOperator"]) == (
        "Minimum",
        8,
        "LessThanThreshold",
    )
    body = json.dumps(synthesized.template.to_json())
    for name in (cluster, agent["name"]):
        for metric in ("LargestPlaceableJobNodes", "JobsSpreadBeyondNeed", "TopologyPendingSeconds"):
            assert f'MetricName=\\\\\\"{metric}\\\\\\" cluster=\\\\\\"{name}\\\\\\"' in body, metric
        assert f'"topokeeper","PlacementFactsFailures","cluster","{name}"' in body.replace("\\", "")
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    template = tmp_path / f"{STACK_ID}.template.json"
    run = subprocess.run([str(cfn_lint), str(template)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
