import botocore.session
import pytest

from topokeeper.domain.catalog import (
    CATALOG,
    Accelerator,
    Capability,
    InstanceTypeInfo,
    UltraServer,
    ec2_instance_type,
    hyperpod_instance_type,
    hyperpod_offers,
    lookup,
)
from topokeeper.domain.models import SlurmFormat, SlurmVersion, check_block_sizes
from topokeeper.domain.names import check_slurm_name


@pytest.mark.parametrize(
    "name",
    ["ip-10-1-2-3", "nn-0a1b2c3d4e5f60718", "us-1", "a", "x_y.z", "a" * 64, "n" + "0" * 62 + "1", "nn-" + "9" * 17],
)
def test_safe_names_pass(name: str) -> None:
    assert check_slurm_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "a" * 65,
        "n" + "1" * 63,
        "",
        "-lead",
        "a;rm -rf /",
        "a b",
        "a\nb",
        "$(id)",
        "a`id`",
        "a,b",
        "a[1-2]",
        "a=b",
        "a#b",
        "a:b",
        "ünï",
    ],
)
def test_hostile_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="Slurm name|longer than 64|too large"):
        check_slurm_name(name)


@pytest.mark.parametrize(
    ("instance_type", "capability", "layers", "ultraserver_size"),
    [
        ("p5.48xlarge", Capability.TREE, 3, None),
        ("ml.p5.48xlarge", Capability.TREE, 3, None),
        ("p6-b200.48xlarge", Capability.TREE, 4, None),
        ("ml.p6-b300.48xlarge", Capability.TREE, 4, None),
        ("ml.p6e-gb200.36xlarge", Capability.ULTRASERVER, 3, 18),
        ("trn2u.48xlarge", Capability.ULTRASERVER, 3, 4),
        ("trn1n.32xlarge", Capability.TREE, 3, None),
        ("hpc7g.16xlarge", Capability.TREE, 3, None),
        ("g6e.48xlarge", Capability.TREE, 3, None),
        ("ml.g5.48xlarge", Capability.NONE, 0, None),
        ("g6.48xlarge", Capability.NONE, 0, None),
        ("inf2.48xlarge", Capability.NONE, 0, None),
        ("ml.c7i.4xlarge", Capability.NONE, 0, None),
        ("m5.xlarge", Capability.NONE, 0, None),
    ],
)
def test_catalog(instance_type: str, capability: Capability, layers: int, ultraserver_size: int | None) -> None:
    info = lookup(instance_type)
    assert (info.capability, info.network_layers, info.ultraserver_size) == (capability, layers, ultraserver_size)
    assert info.source


def test_every_catalog_entry_names_its_source() -> None:
    assert all("Prerequisites for Amazon EC2 topology" in info.source for info in CATALOG.values())
    assert all("accelerated-computing" in info.source for info in CATALOG.values() if info.accelerator)
    assert ec2_instance_type("ml.p5.48xlarge") == "p5.48xlarge"
    assert hyperpod_instance_type("p5.48xlarge") == hyperpod_instance_type("ml.p5.48xlarge") == "ml.p5.48xlarge"


@pytest.mark.parametrize(
    ("instance_type", "ultraserver", "accelerator"),
    [
        ("ml.p6e-gb200.36xlarge", UltraServer(18, "ml.u-p6e-gb200x72"), Accelerator("nvidia.com/gpu", 4)),
        ("trn2u.48xlarge", UltraServer(4, "ml.u-trn2x64"), Accelerator("aws.amazon.com/neuron", 16)),
        ("p5.48xlarge", None, Accelerator("nvidia.com/gpu", 8)),
        ("p6-b300.48xlarge", None, Accelerator("nvidia.com/gpu", 8)),
        ("trn1.2xlarge", None, Accelerator("aws.amazon.com/neuron", 1)),
        ("trn2.48xlarge", None, Accelerator("aws.amazon.com/neuron", 16)),
        ("g6e.48xlarge", None, None),
        ("c7i.4xlarge", None, None),
    ],
)
def test_catalog_ultraservers_and_accelerators(
    instance_type: str, ultraserver: UltraServer | None, accelerator: Accelerator | None
) -> None:
    info = lookup(instance_type)
    assert (info.ultraserver, info.accelerator) == (ultraserver, accelerator)
    assert info.ultraserver_size == (ultraserver.size if ultraserver else None)


def test_hyperpod_flag_is_what_botocore_lists() -> None:
    """An entry says HyperPod offers its type exactly when SageMaker's ClusterInstanceType lists it (a type newer
    than the installed botocore fails here: upgrade botocore, or say why in the entry)."""
    enum = set(botocore.session.get_session().get_service_model("sagemaker").shape_for("ClusterInstanceType").enum)
    assert {t for t, info in CATALOG.items() if info.hyperpod} == {t for t in CATALOG if f"ml.{t}" in enum}
    assert hyperpod_offers("ml.p6e-gb200.36xlarge")
    assert not hyperpod_offers("p6e-gb200.36xlarge")  # the EC2 name is not the SageMaker one
    assert not hyperpod_offers("ml.trn2u.48xlarge")
    assert not hyperpod_offers("ml.c7i.4xlarge")  # not in the catalog: botocore's enum decides


def test_capability_follows_from_the_facts() -> None:
    assert InstanceTypeInfo().capability is Capability.NONE
    assert InstanceTypeInfo(network_layers=4).capability is Capability.TREE
    assert InstanceTypeInfo(network_layers=3, ultraserver=UltraServer(2, "ml.u-x")).capability is Capability.ULTRASERVER
    with pytest.raises(ValueError, match="network_layers"):
        InstanceTypeInfo(ultraserver=UltraServer(2, "ml.u-x"))


@pytest.mark.parametrize("sizes", [(18,), (9, 18), (17, 34, 68), (4, 16), (1, *(2**k for k in range(1, 16)))])
def test_valid_block_sizes(sizes: tuple[int, ...]) -> None:
    check_block_sizes(sizes)


@pytest.mark.parametrize(
    "sizes", [(), (18, 54), (18, 18), (18, 9), (0,), (-4,), (3, 6, 9), tuple(2**k for k in range(17))]
)
def test_invalid_block_sizes(sizes: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="block_sizes"):
        check_block_sizes(sizes)


@pytest.mark.parametrize(
    ("text", "slurm_format"),
    [
        ("24.11", SlurmFormat.CONF),
        ("24.11.5", SlurmFormat.CONF),
        ("25.05", SlurmFormat.YAML),
        ("25.11.7", SlurmFormat.YAML),
        ("26.05", SlurmFormat.YAML),
        ("23.11", SlurmFormat.CONF),
    ],
)
def test_version_selects_format(text: str, slurm_format: SlurmFormat) -> None:
    assert SlurmVersion.parse(text).format is slurm_format


def test_bad_version() -> None:
    with pytest.raises(ValueError, match="Slurm version"):
        SlurmVersion.parse("25")
