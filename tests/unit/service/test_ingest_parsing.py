"""Which cluster each AWS event is about, from the documented samples (lenient where AWS is sloppy)."""

import json
from pathlib import Path

import pytest

from topokeeper.contract.config import ClusterConfig, Settings
from topokeeper.contract.errors import InputError
from topokeeper.contract.event_schemas import TopokeeperEvent
from topokeeper.service.ingest import IngestDeps, cluster_reference

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "events"
ARN = "arn:aws:sagemaker:us-east-1:111122223333:cluster/h4k2x9q7m1ab"


def _event(name: str, **detail_changes) -> TopokeeperEvent:
    document = json.loads((FIXTURES / f"{name}.json").read_text())
    document["detail"].update(detail_changes)
    return TopokeeperEvent.model_validate(document)


def _deps(tags: dict[str, str] | None = None) -> IngestDeps:
    settings = Settings(
        clusters=[
            ClusterConfig(name="sample-cluster"),
            ClusterConfig(name="pcluster", orchestrator="ec2", head_node="i-0123456789abcdef0"),
        ]
    )
    return IngestDeps(
        settings=settings,
        state=None,  # type: ignore[arg-type]  # cluster_reference reads no state
        queue=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        clock=None,  # type: ignore[arg-type]
        cluster_name_of_arn=lambda arn: "sample-cluster" if arn == ARN else None,
        instance_tags=lambda instance_id: tags or {},
    )


@pytest.mark.parametrize(
    ("fixture", "summary"),
    [
        ("hyperpod-state-change", "cluster InService"),
        ("hyperpod-node-health", "node i-12345678abcdefghi health"),
        ("hyperpod-cluster-event", "Instance creation in Cluster sample-cluster and InstanceGroup p5Inst failed"),
        ("cloudtrail-batch-delete", "BatchDeleteClusterNodes API call"),
    ],
)
def test_documented_samples_name_their_cluster(fixture: str, summary: str) -> None:
    assert cluster_reference(_event(fixture), _deps()) == ("sample-cluster", summary)


def test_epoch_millisecond_times_parse() -> None:
    from topokeeper.contract.event_schemas import ClusterStateDetail

    detail = ClusterStateDetail.model_validate(_event("hyperpod-state-change").detail)
    assert detail.CreationTime is not None and detail.CreationTime.year == 2025


def test_cloudtrail_cluster_name_may_be_a_name() -> None:
    event = _event("cloudtrail-batch-delete", requestParameters={"clusterName": "pcluster", "nodeIds": []})
    assert cluster_reference(event, _deps())[0] == "pcluster"


def test_ec2_state_change_maps_by_cluster_tag() -> None:
    deps = _deps(tags={"topokeeper:cluster": "pcluster", "Name": "compute"})
    assert cluster_reference(_event("ec2-state-change"), deps) == ("pcluster", "instance i-0abcdef1234567890 running")
    assert cluster_reference(_event("ec2-state-change"), _deps(tags={}))[0] is None


@pytest.mark.parametrize(
    ("fixture", "changes", "field"),
    [
        ("hyperpod-state-change", {"ClusterName": None}, "detail.ClusterName"),
        ("cloudtrail-batch-delete", {"requestParameters": {"nodeIds": []}}, "detail.requestParameters.clusterName"),
        ("ec2-state-change", {"instance-id": "i-$(reboot)"}, "detail.instance-id"),
    ],
)
def test_malformed_events_name_the_field(fixture: str, changes: dict, field: str) -> None:
    with pytest.raises(InputError) as error:
        cluster_reference(_event(fixture, **changes), _deps())
    assert error.value.field == field


def test_ssm_and_unknown_events_are_not_changes() -> None:
    assert cluster_reference(_event("ssm-invocation"), _deps())[0] is None
