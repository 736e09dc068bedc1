"""The applier edits one key of slurm.conf and keeps every other byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from topokeeper.headnode.failures import Refused
from topokeeper.headnode.slurm_conf import SlurmConf, set_key


@pytest.mark.parametrize(
    ("line", "value", "expected"),
    [
        ("PartitionName=gpu Nodes=a State=UP", "tree-gpu", "PartitionName=gpu Nodes=a State=UP Topology=tree-gpu"),
        # a new key goes before trailing spaces and the comment
        ("PartitionName=gpu State=UP   # main", "t", "PartitionName=gpu State=UP Topology=t   # main"),
        # keys are case-insensitive: the existing one keeps its spelling and its place
        ("partitionname=gpu TOPOLOGY=old\tMaxTime=10", "new", "partitionname=gpu TOPOLOGY=new\tMaxTime=10"),
        ("PartitionName=gpu Topology=old State=UP", None, "PartitionName=gpu State=UP"),
        ("PartitionName=gpu State=UP Topology=old  # c", None, "PartitionName=gpu State=UP  # c"),
        ("PartitionName=gpu State=UP", None, "PartitionName=gpu State=UP"),
        # a Topology= inside a comment is not a key
        ("PartitionName=gpu State=UP # Topology=old", None, "PartitionName=gpu State=UP # Topology=old"),
        ("PartitionName=gpu State=UP # Topology=old", "t", "PartitionName=gpu State=UP Topology=t # Topology=old"),
        # an escaped \# is not a comment
        ("PartitionName=gpu Features=a\\#b", "t", "PartitionName=gpu Features=a\\#b Topology=t"),
        ("PartitionName=gpu Topology=a State=UP Topology=b", "c", "PartitionName=gpu Topology=c State=UP"),
        ("PartitionName=gpu State=UP\r", "t", "PartitionName=gpu State=UP Topology=t\r"),
        (
            'PartitionName=gpu AllowGroups="a b" State=UP',
            "t",
            'PartitionName=gpu AllowGroups="a b" State=UP Topology=t',
        ),
    ],
)
def test_set_key_changes_only_that_key(line: str, value: str | None, expected: str) -> None:
    assert set_key(line, "Topology", value) == expected


SLURM_CONF = (
    b"# HyperPod-style slurm.conf \xe9t\xe9 (latin-1 bytes in a comment)\n"
    b"ClusterName=test\r\n"
    b"NodeName=p5-[001-004],gb-[001-002],cpu-1 State=CLOUD\n"
    b"PartitionName=DEFAULT MaxTime=INFINITE\n"
    b"\n"
    b"PartitionName=gpu\tNodes=p5-[001-004]   Default=YES  State=UP   # the GPU partition\n"
    b"partitionname=gb nodes=gb-[001-002] TOPOLOGY=block-old maxtime=1:00:00\n"
    b"PartitionName=cpu Nodes=cpu-1 State=UP\n"
    b"   # PartitionName=gpu Topology=commented-out\n"
    b"PartitionName=other Nodes=cpu-1 Topology=keep-me\n"
    b"SchedulerParameters=bf_continue"  # no newline at the end
)


def _write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_editing_keeps_every_other_byte(tmp_path: Path) -> None:
    conf = SlurmConf(str(_write(tmp_path / "slurm.conf", SLURM_CONF)))
    assert conf.partition_names() == {"gpu", "gb", "cpu", "other"}
    assert [conf.partition_topology(name) for name in ("gpu", "gb", "cpu", "other")] == [
        None,
        "block-old",
        None,
        "keep-me",
    ]

    edited = conf.edited_texts({"gpu": "tree-gpu", "gb": None, "cpu": None}, None)

    assert list(edited) == [str(tmp_path / "slurm.conf")]
    new = edited[str(tmp_path / "slurm.conf")].encode("utf-8", "surrogateescape")
    old_lines, new_lines = SLURM_CONF.split(b"\n"), new.split(b"\n")
    changed = {i: (old_lines[i], new_lines[i]) for i in range(len(old_lines)) if old_lines[i] != new_lines[i]}
    assert len(new_lines) == len(old_lines)
    assert changed == {
        5: (
            b"PartitionName=gpu\tNodes=p5-[001-004]   Default=YES  State=UP   # the GPU partition",
            b"PartitionName=gpu\tNodes=p5-[001-004]   Default=YES  State=UP Topology=tree-gpu   # the GPU partition",
        ),
        6: (
            b"partitionname=gb nodes=gb-[001-002] TOPOLOGY=block-old maxtime=1:00:00",
            b"partitionname=gb nodes=gb-[001-002] maxtime=1:00:00",
        ),
    }


def test_an_edit_that_is_already_made_changes_nothing(tmp_path: Path) -> None:
    conf = SlurmConf(str(_write(tmp_path / "slurm.conf", SLURM_CONF)))
    assert conf.edited_texts({"gb": "block-old", "cpu": None, "other": "keep-me"}, None) == {}


def test_topology_plugin_is_replaced_in_place_keeping_the_key_spelling(tmp_path: Path) -> None:
    path = _write(tmp_path / "slurm.conf", b"topologyplugin=topology/default\nPartitionName=gpu Nodes=a\n")
    edited = SlurmConf(str(path)).edited_texts({"gpu": None}, "topology/tree")
    assert edited == {str(path): "topologyplugin=topology/tree\nPartitionName=gpu Nodes=a\n"}


@pytest.mark.parametrize("ending", [b"\n", b""])
def test_topology_plugin_is_appended_when_missing(tmp_path: Path, ending: bytes) -> None:
    path = _write(tmp_path / "slurm.conf", b"PartitionName=gpu Nodes=a" + ending)
    edited = SlurmConf(str(path)).edited_texts({"gpu": None}, "topology/tree")
    assert edited == {str(path): "PartitionName=gpu Nodes=a\nTopologyPlugin=topology/tree\n"}


def test_a_partition_in_an_included_file_of_the_same_directory_is_edited_there(tmp_path: Path) -> None:
    main = _write(
        tmp_path / "slurm.conf",
        b"TopologyPlugin=topology/tree\nInclude partitions.conf\ninclude /nonexistent/site.conf\nInclude %c.conf\n",
    )
    included = _write(tmp_path / "partitions.conf", b"PartitionName=gpu Nodes=a  # included\nTopologyPlugin=x/y\n")
    conf = SlurmConf(str(main))
    assert conf.partition_names() == {"gpu"}
    assert conf.not_followed == ["/nonexistent/site.conf", "%c.conf"]
    assert conf.last_value("TopologyPlugin") == "x/y"  # read after slurm.conf's own line: it wins

    edited = conf.edited_texts({"gpu": "tree-gpu"}, None)

    assert edited == {str(included): "PartitionName=gpu Nodes=a Topology=tree-gpu  # included\nTopologyPlugin=x/y\n"}


def test_parallelcluster_includes_into_a_subdirectory_are_followed_in_reading_order(tmp_path: Path) -> None:
    """ParallelCluster 3: slurm.conf -> slurm_parallelcluster.conf -> pcluster/<queue>_partition.conf files."""
    etc = tmp_path / "etc"
    main = _write(etc / "slurm.conf", b"ClusterName=pc\ninclude slurm_parallelcluster.conf\n")
    _write(
        etc / "slurm_parallelcluster.conf",
        f"include {etc}/pcluster/slurm_parallelcluster_q1_partition.conf\ninclude pcluster/q2/*.conf\n".encode(),
    )
    q1 = _write(etc / "pcluster" / "slurm_parallelcluster_q1_partition.conf", b"PartitionName=q1 Nodes=q1_nodes\n")
    q2b = _write(etc / "pcluster" / "q2" / "b.conf", b"PartitionName=q2 Nodes=x State=DOWN\n")
    q2a = _write(etc / "pcluster" / "q2" / "a.conf", b"PartitionName=q2 Nodes=x Topology=old\n")
    conf = SlurmConf(str(main))
    assert conf.partition_names() == {"q1", "q2"}
    assert conf.not_followed == []
    assert [line.path for line in conf.partition_lines("q2")] == [str(q2a), str(q2b)]  # a glob reads sorted

    edited = conf.edited_texts({"q1": "tree-q1", "q2": "tree-q2"}, None)

    assert edited == {
        str(q1): "PartitionName=q1 Nodes=q1_nodes Topology=tree-q1\n",
        str(q2a): "PartitionName=q2 Nodes=x Topology=tree-q2\n",
        str(q2b): "PartitionName=q2 Nodes=x State=DOWN Topology=tree-q2\n",
    }


def test_a_glob_or_a_symlink_that_leaves_the_config_directory_is_not_followed(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    _write(tmp_path / "outside" / "x.conf", b"PartitionName=out Nodes=a\n")
    _write(etc / "inside" / "y.conf", b"PartitionName=in Nodes=a\n")
    (etc / "inside" / "z.conf").symlink_to(tmp_path / "outside" / "x.conf")
    conf = SlurmConf(str(_write(etc / "slurm.conf", b"Include inside/*.conf\nInclude ../outside/*.conf\n")))
    assert conf.partition_names() == {"in"}
    assert conf.not_followed == ["inside/*.conf", "../outside/*.conf"]


def test_an_include_outside_the_config_directory_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    _write(tmp_path / "elsewhere.conf", b"PartitionName=gpu Nodes=a\n")
    conf = SlurmConf(str(_write(tmp_path / "etc" / "slurm.conf", b"Include ../elsewhere.conf\n")))
    assert conf.partition_names() == set()
    assert conf.not_followed == ["../elsewhere.conf"]


def test_a_continued_partition_line_is_refused_not_guessed(tmp_path: Path) -> None:
    path = _write(tmp_path / "slurm.conf", b"PartitionName=gpu Nodes=a \\\n  State=UP\nPartitionName=cpu Nodes=b\n")
    conf = SlurmConf(str(path))
    assert conf.partition_names() == {"gpu", "cpu"}  # the continuation is no line of its own
    with pytest.raises(Refused, match="line 1: partition gpu continues on the next line"):
        conf.edited_texts({"gpu": "tree-gpu"}, None)
    assert conf.edited_texts({"cpu": "flat"}, None) == {
        str(path): "PartitionName=gpu Nodes=a \\\n  State=UP\nPartitionName=cpu Nodes=b Topology=flat\n"
    }


def test_topology_on_the_default_partition_line_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "slurm.conf", b"PartitionName=Default Topology=tree-x\nPartitionName=gpu Nodes=a\n")
    with pytest.raises(Refused, match="PartitionName=DEFAULT"):
        SlurmConf(str(path)).edited_texts({"gpu": None}, None)
