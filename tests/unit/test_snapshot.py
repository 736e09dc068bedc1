import copy
import json
from pathlib import Path

import pytest

from topokeeper.contract.errors import InputError
from topokeeper.domain.models import PartitionSettings, PlannerConfig
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import AwsClusterNode, build_snapshot, parse_snapshot_document, slurm_node_name

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _document(name: str = "mixed-cluster.json") -> dict:
    return json.loads((EXAMPLES / name).read_text())


def _build(document: dict, config: PlannerConfig | None = None, version: str | None = None):
    return build_snapshot(parse_snapshot_document(document), config or PlannerConfig(), version)


def test_example_cluster_groups_nodes_by_slurm_config_partition() -> None:
    snapshot = _build(_document())
    sizes = {p.name: len(p.nodes) for p in snapshot.partitions}
    assert sizes == {"ml-p5": 17, "ml-p6e": 36, "preprocess": 4}
    assert str(snapshot.slurm_version) == "26.05"
    p5 = next(p for p in snapshot.partitions if p.name == "ml-p5")
    assert p5.instance_types == ("p5.48xlarge",)
    assert all(n.name.startswith("ip-10-1-40-") for n in p5.nodes)


def test_join_on_instance_id_and_ultraserver_from_hyperpod() -> None:
    snapshot = _build(_document())
    gb = next(p for p in snapshot.partitions if p.name == "ml-p6e")
    assert all(n.ultraserver_id and n.ultraserver_id.startswith("us-") for n in gb.nodes)
    assert all(len(n.network_nodes) == 3 for n in gb.nodes)


def test_capacity_block_id_is_the_fallback_ultraserver_id() -> None:
    document = _document()
    for raw in document["nodes"]:
        raw.pop("UltraServerInfo", None)
    gb = next(p for p in _build(document).partitions if p.name == "ml-p6e")
    assert {n.ultraserver_id[:3] for n in gb.nodes} == {"cb-"}


def test_partition_precedence_config_over_slurm_config_over_legacy() -> None:
    document = _document()
    document["slurm"]["partitions"] = {"cpu": "legacy-cpu", "p5": "legacy-p5"}
    config = PlannerConfig(partitions={"cpu-override": PartitionSettings(instance_groups=("cpu",))})
    names = {p.name for p in _build(document, config).partitions}
    assert names == {"ml-p5", "ml-p6e", "cpu-override"}


def test_legacy_mapping_is_used_without_slurm_config() -> None:
    snapshot = _build(_document("legacy-mapping-cluster.json"))
    assert {p.name: len(p.nodes) for p in snapshot.partitions} == {"gb200": 36, "cpu": 2}


def test_node_name_from_ip_when_no_host_name() -> None:
    raw = AwsClusterNode(
        InstanceGroupName="g",
        InstanceId="i-0123456789abcdef0",
        InstanceType="ml.p5.48xlarge",
        PrivatePrimaryIp="10.1.2.3",
    )
    assert slurm_node_name(raw) == "ip-10-1-2-3"


def test_node_without_any_name_is_left_out_with_a_warning() -> None:
    document = _document()
    document["nodes"][5].pop("PrivateDnsHostname")
    snapshot = _build(document)
    assert any("no host name" in w for w in snapshot.warnings)
    assert sum(len(p.nodes) for p in snapshot.partitions) == 56


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["nodes"][3].update(PrivateDnsHostname="ip-1;reboot.ec2.internal"), "nodes[3].PrivateDnsHostname"),
        (lambda d: d["nodes"][3].update(PrivateDnsHostname="a\nSwitchName=evil.x"), "nodes[3].PrivateDnsHostname"),
        (lambda d: d["nodes"][3].update(PrivateDnsHostname="h" * 65 + ".ec2.internal"), "nodes[3].PrivateDnsHostname"),
        (lambda d: d["nodes"][3].update(InstanceId="i-$(id)"), "nodes[3].InstanceId"),
        (lambda d: d["instance_topology"][0].update(NetworkNodes=["nn-a", "nn b", "nn-c"]), "nodes[2].NetworkNodes"),
        (lambda d: d["nodes"][30].update(UltraServerInfo={"Id": "us-1,us-2"}), "nodes[30].UltraServerInfo.Id"),
        (
            lambda d: d["describe_cluster"]["InstanceGroups"][2]["SlurmConfig"].update(PartitionNames=["p5 evil"]),
            "nodes[2].partition",
        ),
        (lambda d: d.pop("describe_cluster"), "describe_cluster"),
        (lambda d: d["nodes"][0].pop("InstanceId"), "nodes[0].InstanceId"),
    ],
)
def test_hostile_or_broken_input_is_refused_naming_the_field(mutate, field: str) -> None:
    document = copy.deepcopy(_document())
    mutate(document)
    with pytest.raises(InputError) as error:
        _build(document)
    assert error.value.field.startswith(field), error.value


def test_replaced_node_keeps_its_host_name_and_the_running_instance_wins() -> None:
    document = _document()
    old = document["nodes"][2]
    new = copy.deepcopy(old)
    new["InstanceId"] = "i-0fffffffffffffff0"
    old["InstanceStatus"] = {"Status": "ShuttingDown"}
    document["nodes"].append(new)
    p5 = next(p for p in _build(document).partitions if p.name == "ml-p5")
    named = [n for n in p5.nodes if n.name == old["PrivateDnsHostname"].split(".")[0]]
    assert [n.instance_id for n in named] == ["i-0fffffffffffffff0"]


def test_gone_nodes_are_not_planned() -> None:
    document = _document()
    for raw in document["nodes"][2:5]:
        raw["InstanceStatus"] = {"Status": "Failure"}
    p5 = next(p for p in _build(document).partitions if p.name == "ml-p5")
    assert len(p5.nodes) == 14


def test_version_flag_overrides_snapshot() -> None:
    assert str(_build(_document(), version="24.11").slurm_version) == "24.11"
    with pytest.raises(InputError) as error:
        _build(_document(), version="nonsense")
    assert error.value.field == "slurm.version"


def test_parallelcluster_nodes_are_named_from_the_slurm_node_table() -> None:
    """NodeAddr = private IP names each instance; powered-down dynamic nodes stay, an unbound instance does not."""
    snapshot = _build(_document("pcluster-p5-cluster.json"))
    q1 = next(p for p in snapshot.partitions if p.name == "q1")
    by_name = {n.name: n for n in q1.nodes}
    assert sorted(by_name) == [f"q1-dy-p5-{i}" for i in range(1, 5)] + [f"q1-st-p5-{i}" for i in range(1, 5)]
    assert by_name["q1-st-p5-1"].instance_id == "i-05c1a000000000001"
    assert by_name["q1-dy-p5-2"].network_nodes[-1] == "nn-0a1b2c3d4e5f60102"
    for powered_down in ("q1-dy-p5-3", "q1-dy-p5-4"):
        assert (by_name[powered_down].instance_id, by_name[powered_down].network_nodes) == (None, ())
    cpu = next(p for p in snapshot.partitions if p.name == "cpu")
    assert [n.name for n in cpu.nodes] == ["cpu-st-c5-1", "cpu-st-c5-2"]
    assert snapshot.warnings == ("instance i-05c1a000000000007 (10.0.1.30) is no Slurm node's NodeAddr; left out",)
    q1_plan = next(p for p in plan(snapshot).partitions if p.partition == "q1")  # the partition's own warning
    assert q1_plan.warnings == (
        "2 Slurm node(s) with no instance (powered down?) planned without topology: q1-dy-p5-[3-4]",
    )


def test_without_the_slurm_node_table_nodes_keep_their_host_names() -> None:
    document = _document("pcluster-p5-cluster.json")
    del document["slurm"]["nodes"]
    q1 = next(p for p in _build(document).partitions if p.name == "q1")
    assert [n.name for n in q1.nodes][:2] == ["ip-10-0-1-10", "ip-10-0-1-11"]
    assert len(q1.nodes) == 7  # every instance; no Slurm-only nodes


def test_hyperpod_host_names_match_the_slurm_node_table_by_name_too() -> None:
    """On HyperPod the Slurm name is the host name: the table changes nothing, even without NodeAddr."""
    document = _document()
    plain = _build(copy.deepcopy(document))
    names = [n.name for p in plain.partitions for n in p.nodes]
    document["slurm"] = {**document.get("slurm", {}), "nodes": [{"name": name} for name in names]}
    assert _build(document).partitions == plain.partitions


def test_a_bad_name_in_the_slurm_node_table_names_the_field() -> None:
    document = _document("pcluster-p5-cluster.json")
    document["slurm"]["nodes"].append({"name": "q1 dy;rm", "address": "q1 dy;rm", "partitions": ["q1"]})
    with pytest.raises(InputError) as error:
        _build(document)
    assert error.value.field == "slurm.nodes[10].name"
