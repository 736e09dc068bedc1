"""The ParallelCluster cluster-config snippet in docs/deploy.md (the queue with topokeeper's OnNodeStart action)
loads with ParallelCluster's own schema (3.16.1, offline, in .venv-pcluster: see schema-requirements.txt), so an
operator can paste it into a cluster config and `pcluster create-cluster` accepts its keys."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.readme_examples import ROOT
from tests.unit.test_parallelcluster_snippet import snippet

PCLUSTER_PYTHON = ROOT / ".venv-pcluster" / "bin" / "python"
CHECK = Path(__file__).with_name("check_schema.py")
# The rest of a minimal cluster config around the snippet's Scheduling section (the snippet is what the operator
# adds to their own config; ParallelCluster's schema needs a whole one to load).
BASE: dict[str, Any] = {
    "Region": "us-west-2",
    "Image": {"Os": "alinux2023"},
    "HeadNode": {
        "InstanceType": "c5.xlarge",
        "Networking": {"SubnetId": "subnet-0123456789abcdef0"},
        "Ssh": {"KeyName": "operator-key"},
    },
}


def cluster_config() -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **snippet()}


def schema_errors(config: dict[str, Any], tmp_path: Path) -> str:
    """'' when ParallelCluster's schema loads the config, its errors otherwise."""
    assert PCLUSTER_PYTHON.exists(), f"{PCLUSTER_PYTHON} is missing: make test installs it (make install-pcluster)"
    path = tmp_path / "cluster-config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [str(PCLUSTER_PYTHON), str(CHECK), str(path), "cfd-pcluster"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.strip() if done.returncode else ""


def test_the_snippet_loads_with_parallelclusters_schema(tmp_path: Path) -> None:
    assert "Scheduling" in snippet()
    assert schema_errors(cluster_config(), tmp_path) == ""


def test_the_schema_refuses_a_misspelled_custom_action(tmp_path: Path) -> None:
    # The check can fail: the snippet with one key misspelled is refused, naming it.
    config = cluster_config()
    actions = config["Scheduling"]["SlurmQueues"][0]["CustomActions"]
    actions["OnNodeStartt"] = actions.pop("OnNodeStart")
    assert "OnNodeStartt" in schema_errors(config, tmp_path)


def test_the_schema_refuses_an_s3_access_entry_without_a_bucket(tmp_path: Path) -> None:
    config = cluster_config()
    del config["Scheduling"]["SlurmQueues"][0]["Iam"]["S3Access"][0]["BucketName"]
    assert "BucketName" in schema_errors(config, tmp_path)
