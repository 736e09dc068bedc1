"""The ParallelCluster cluster-config snippet in docs/deploy.md (the fenced yaml block after the marker
``<!-- topokeeper:parallelcluster-config -->``, which a schema check against ParallelCluster's own config schema
may also read): it parses, its queue runs ``node-start`` as its OnNodeStart action with arguments the program's
own parser accepts, and it attaches a policy and grants read access to the bucket holding the program."""

from __future__ import annotations

from typing import Any

import yaml

from tests.readme_examples import ROOT, blocks
from topokeeper.agent.node_start import WAIT_SECONDS, parser

MARKER = "<!-- topokeeper:parallelcluster-config -->"
DEPLOY = ROOT / "docs" / "deploy.md"


def snippet() -> dict[str, Any]:
    lines = DEPLOY.read_text().splitlines()
    (marker,) = [index for index, line in enumerate(lines, start=1) if line.strip() == MARKER]
    (block,) = [block for block in blocks(DEPLOY) if block.line == marker + 1]
    assert block.lang == "yaml"
    document: dict[str, Any] = yaml.safe_load("\n".join(block.lines))
    return document


def test_the_queue_runs_node_start_with_arguments_its_parser_accepts() -> None:
    (queue,) = snippet()["Scheduling"]["SlurmQueues"]
    action = queue["CustomActions"]["OnNodeStart"]
    assert action["Script"].endswith("/topokeeper-head-node.pyz")
    command, *arguments = action["Args"]
    assert command == "node-start"
    args = parser().parse_args(arguments)
    assert (args.cluster, args.region, args.wait_seconds) == ("cfd-pcluster", "us-west-2", WAIT_SECONDS)
    bucket = action["Script"].removeprefix("s3://").split("/", 1)[0]
    assert [access["BucketName"] for access in queue["Iam"]["S3Access"]] == [bucket]
    (policy,) = queue["Iam"]["AdditionalIamPolicies"]
    assert policy["Policy"].startswith("arn:aws:iam::")
