import pytest

from topokeeper.domain.catalog import Capability, ec2_instance_type, lookup
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
    from topokeeper.domain.catalog import CATALOG

    assert all("Prerequisites for Amazon EC2 topology" in info.source for info in CATALOG.values())
    assert ec2_instance_type("ml.p5.48xlarge") == "p5.48xlarge"


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
