import pytest
from pydantic import ValidationError

from topokeeper.contract.config import MAX_CONFIG_BYTES, ClusterConfig, Mode, Settings
from topokeeper.contract.errors import InputError
from topokeeper.contract.ports import Channel, Metric
from topokeeper.contract.stack_spec import Comparison, cluster_alarms, placement_alarms


def test_hyperpod_defaults_to_verify_through_the_agent() -> None:
    cluster = ClusterConfig(name="llm-train")
    assert (cluster.effective_mode, cluster.effective_channel) == (Mode.VERIFY, Channel.AGENT)


def test_plain_ec2_defaults_to_enforce_through_ssm() -> None:
    cluster = ClusterConfig(name="pcluster", orchestrator="ec2", head_node="i-0123456789abcdef0")
    assert (cluster.effective_mode, cluster.effective_channel) == (Mode.ENFORCE, Channel.SSM)


@pytest.mark.parametrize(
    ("fields", "location", "message"),
    [
        ({"name": "pc", "orchestrator": "ec2"}, "clusters[0]", "needs head_node"),
        ({"name": "hp", "channel": "ssm", "head_node": "i-0123456789abcdef0"}, "clusters[0]", "HyperPod nodes cannot"),
        (
            {"name": "pc", "orchestrator": "ec2", "head_node": "sagemaker-cluster:abc_controller-i-0123"},
            "clusters[0].head_node",
            "i-/mi- ids only",
        ),
        ({"name": "bad name"}, "clusters[0].name", "HyperPod cluster name"),
        ({"name": "hp", "mode": "fight"}, "clusters[0].mode", "Input should be"),
        (
            {"name": "hp", "partitions": {"gb": {"block_sizes": [18, 27]}}},
            "clusters[0].partitions.gb.block_sizes",
            "base x 2^k",
        ),
        ({"name": "hp", "slurm_version": "twenty"}, "clusters[0]", "Slurm version"),
        ({"name": "hp", "arn": "arn:aws:sagemaker:us-east-1:111122223333:cluster/NOPE"}, "clusters[0].arn", "ARN"),
    ],
)
def test_bad_cluster_config_names_the_key(fields: dict, location: str, message: str) -> None:
    with pytest.raises(ValidationError) as error:
        Settings.model_validate({"clusters": [fields]})
    converted = InputError.from_validation(error.value)
    assert converted.field == location
    assert message in converted.message


def test_hyperpod_head_node_registered_as_managed_node_takes_ssm() -> None:
    cluster = ClusterConfig(name="hp", channel="ssm", head_node="mi-0123456789abcdef0")
    assert (cluster.effective_mode, cluster.effective_channel) == (Mode.VERIFY, Channel.SSM)


def test_duplicate_clusters_are_refused() -> None:
    with pytest.raises(ValidationError, match="listed twice: a"):
        Settings(clusters=[ClusterConfig(name="a"), ClusterConfig(name="a")])


def test_lookup_by_name_or_arn() -> None:
    arn = "arn:aws:sagemaker:us-east-1:111122223333:cluster/h4k2x9q7m1ab"
    settings = Settings(clusters=[ClusterConfig(name="llm", arn=arn)])
    assert settings.cluster(arn) is settings.cluster("llm") is settings.clusters[0]
    assert settings.cluster("other") is None


def test_environment_form_is_compact_and_round_trips() -> None:
    settings = Settings(clusters=[ClusterConfig(name=f"cluster-{i}") for i in range(20)])
    text = settings.to_env()
    assert len(text.encode()) < MAX_CONFIG_BYTES
    assert Settings.model_validate_json(text) == settings


def test_the_managed_topology_alarm_is_off_unless_a_cluster_asks_for_it() -> None:
    settings = Settings.model_validate(
        {"clusters": [{"name": "quiet"}, {"name": "watched", "alarm_on_managed_topology_updates": True}]}
    )
    quiet, watched = settings.clusters
    assert Metric.MANAGED_TOPOLOGY_UPDATES not in cluster_alarms(settings, quiet)
    alarm = cluster_alarms(settings, watched)[Metric.MANAGED_TOPOLOGY_UPDATES]
    assert (alarm.statistic, alarm.threshold, alarm.comparison) == (
        "Sum",
        1,
        Comparison.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
    )


def _largest_login() -> dict[str, object]:
    return {
        "enabled": True,
        "vpc_id": "vpc-0a1b2c3d4e5f60718",
        "vpc_config": {
            "security_group_ids": [f"sg-0a1b2c3d4e5f6{i:04x}" for i in range(5)],
            "subnets": [f"subnet-0a1b2c3d4e5f6{i:04x}" for i in range(16)],
        },
        "allowed_cidrs": [f"10.{i}.0.0/16" for i in range(50)],
        "allowed_security_group_ids": [f"sg-0a1b2c3d4e5f7{i:04x}" for i in range(50)],
        "client_vpn_security_group_id": "sg-0a1b2c3d4e5f60999",
        "deletion_protection": True,
        "deregistration_delay_seconds": 1800,
    }


def test_login_settings_stay_out_of_the_functions_environment() -> None:
    """At their limits one cluster's login settings take 2,700 bytes: two clusters' would not fit the environment."""
    clusters = [{"name": name, "login": _largest_login()} for name in ("llm", "cfd")]
    login = Settings.model_validate({"clusters": clusters})
    plain = Settings.model_validate({"clusters": [{"name": "llm"}, {"name": "cfd"}]})

    assert len(login.model_dump_json(exclude_defaults=True).encode()) > MAX_CONFIG_BYTES  # why they stay out
    assert login.to_env() == plain.to_env()
    assert Settings.model_validate_json(login.to_env()).clusters[0].login.enabled is False


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "hp"}, "only for orchestrator ec2 in mode enforce"),
        ({"name": "pc", "orchestrator": "ec2", "mode": "verify"}, "only for orchestrator ec2 in mode enforce"),
        ({"name": "k", "orchestrator": "eks"}, "only for orchestrator ec2 in mode enforce"),
    ],
)
def test_replacing_parallelclusters_topology_is_for_enforced_ec2_clusters_only(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError) as error:
        Settings.model_validate(
            {"clusters": [{"head_node": "i-0123456789abcdef0", **fields, "replace_parallelcluster_topology": True}]}
        )
    converted = InputError.from_validation(error.value)
    assert "replace_parallelcluster_topology" in converted.message and message in converted.message


def test_replacing_parallelclusters_topology_takes_a_boolean_and_defaults_off() -> None:
    base = {"name": "pc", "orchestrator": "ec2", "head_node": "i-0123456789abcdef0"}
    assert Settings.model_validate({"clusters": [base]}).clusters[0].replace_parallelcluster_topology is False
    chosen = Settings.model_validate({"clusters": [{**base, "replace_parallelcluster_topology": True}]})
    assert chosen.clusters[0].replace_parallelcluster_topology is True
    assert Settings.model_validate_json(chosen.to_env()) == chosen  # the functions read it from the environment
    with pytest.raises(ValidationError) as error:
        Settings.model_validate({"clusters": [{**base, "replace_parallelcluster_topology": "yes"}]})
    assert InputError.from_validation(error.value).field == "clusters[0].replace_parallelcluster_topology"


@pytest.mark.parametrize(
    ("head_node", "says"),
    [
        ("i-0123456789abcdef", "'i-0123456789abcdef' has 16 hex digits after i-: an EC2 instance id has 8 or 17"),
        ("mi-0123456789abcdef", "'mi-0123456789abcdef' has 16 hex digits after mi-: a managed node id has 17"),
        ("0123456789abcdef0", "did you mean 'i-0123456789abcdef0'?"),
        ("i-0123456789ABCDEF0", "hex digits are lower case: did you mean 'i-0123456789abcdef0'?"),
    ],
)
def test_a_head_node_id_of_the_wrong_shape_says_what_is_wrong_with_it(head_node: str, says: str) -> None:
    with pytest.raises(ValidationError) as error:
        Settings.model_validate({"clusters": [{"name": "pc", "orchestrator": "ec2", "head_node": head_node}]})
    converted = InputError.from_validation(error.value)
    assert converted.field == "clusters[0].head_node"
    assert says in converted.message and "HyperPod" not in converted.message, converted.message


_EC2 = {"name": "pc", "orchestrator": "ec2", "head_node": "i-0123456789abcdef0"}


@pytest.mark.parametrize(
    ("cluster", "field", "message"),
    [
        (
            {"name": "k", "orchestrator": "eks", "placement_metrics": True},
            "clusters[0]",
            "placement_metrics: only for Slurm clusters",
        ),
        (
            {**_EC2, "placement_alarms": {"gpu": {"largest_placeable_below": 8}}},
            "clusters[0]",
            "placement_alarms: set placement_metrics true too",
        ),
        (
            {**_EC2, "placement_metrics": True, "placement_alarms": {"gpu": {}}},
            "clusters[0].placement_alarms.gpu",
            "give largest_placeable_below, topology_pending_seconds_above or both",
        ),
        (
            {**_EC2, "placement_metrics": True, "placement_alarms": {"gpu": {"largest_placable_below": 8}}},
            "clusters[0].placement_alarms.gpu.largest_placable_below",
            "did you mean 'largest_placeable_below'?",
        ),
        ({**_EC2, "placment_metrics": True}, "clusters[0].placment_metrics", "did you mean 'placement_metrics'?"),
    ],
)
def test_placement_metrics_are_for_slurm_clusters_and_their_alarms_need_them(
    cluster: dict, field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as error:
        Settings.model_validate({"clusters": [cluster]})
    converted = InputError.from_validation(error.value, model=Settings)
    assert converted.field == field and message in converted.message, converted


def test_an_agent_cluster_takes_placement_metrics() -> None:
    """The agent puts the facts the drift check reads (topokeeper.agent.placement): no SSM needed."""
    (cluster,) = Settings.model_validate({"clusters": [{"name": "hp", "placement_metrics": True}]}).clusters
    assert (cluster.effective_channel, cluster.placement_metrics) == (Channel.AGENT, True)


def test_placement_alarms_follow_the_drift_check() -> None:
    settings = Settings.model_validate(
        {
            "clusters": [
                {
                    **_EC2,
                    "placement_metrics": True,
                    "placement_alarms": {
                        "gpu": {"largest_placeable_below": 8, "topology_pending_seconds_above": 3600},
                        "dev": {"topology_pending_seconds_above": 600},
                    },
                }
            ]
        }
    )
    assert Settings.model_validate_json(settings.to_env()) == settings
    alarms = [
        (p, m, a.statistic, a.threshold, a.comparison) for p, m, a in placement_alarms(settings, settings.clusters[0])
    ]
    assert alarms == [
        ("dev", Metric.TOPOLOGY_PENDING_SECONDS, "Maximum", 600, Comparison.GREATER_THAN_THRESHOLD),
        ("gpu", Metric.LARGEST_PLACEABLE_JOB_NODES, "Minimum", 8, Comparison.LESS_THAN_THRESHOLD),
        ("gpu", Metric.TOPOLOGY_PENDING_SECONDS, "Maximum", 3600, Comparison.GREATER_THAN_THRESHOLD),
    ]
    assert placement_alarms(settings, Settings.model_validate({"clusters": [_EC2]}).clusters[0]) == []
