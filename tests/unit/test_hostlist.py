import pytest
from hypothesis import given
from hypothesis import strategies as st

from topokeeper.wire import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("ip-10-1-12-[34-35],ip-10-1-99-7", ["ip-10-1-12-34", "ip-10-1-12-35", "ip-10-1-99-7"]),
        ("node[01-03]", ["node01", "node02", "node03"]),
        ("n[09-10]", ["n09", "n10"]),
        ("n[9-10]", ["n9", "n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("tux[0-1,12]", ["tux0", "tux1", "tux12"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("nn-0a1b2c3d4e5f60718,nn-0a1b2c3d4e5f60719", ["nn-0a1b2c3d4e5f60718", "nn-0a1b2c3d4e5f60719"]),
        ("single", ["single"]),
    ],
)
def test_expand_follows_slurm(expression: str, names: list[str]) -> None:
    assert expand(expression) == names


@pytest.mark.parametrize("expression", ["nn-l2-[a,b]", "s[1-2", "s1-2]", "s[[1]]", "s[5-3]", "s[1-]"])
def test_expand_rejects_what_slurm_rejects(expression: str) -> None:
    with pytest.raises(HostlistError):
        expand(expression)


@pytest.mark.parametrize(
    ("names", "expression"),
    [
        (["ip-10-1-12-35", "ip-10-1-99-7", "ip-10-1-12-34"], "ip-10-1-12-[34-35],ip-10-1-99-7"),
        (["n09", "n10"], "n[09-10]"),
        (["n9", "n10"], "n[9-10]"),
        (["n9", "n010"], "n[9,010]"),
        (["n1", "n2", "n3", "n7"], "n[1-3,7]"),
        (["n1", "n1"], "n1"),
        (["gb-001", "gb-002", "p5-001"], "gb-[001-002],p5-001"),
        (["abc"], "abc"),
        (["x" + "9" * 19, "x" + "9" * 19], "x" + "9" * 19),
    ],
)
def test_compress_matches_slurm_output(names: list[str], expression: str) -> None:
    assert compress(names) == expression


names_strategy = st.lists(
    st.builds(
        lambda prefix, number, pad: f"{prefix}{number:0{pad}d}",
        st.sampled_from(["ip-10-1-12-", "p5-", "gb-", "node", "a1b"]),
        st.integers(min_value=0, max_value=1200),
        st.integers(min_value=1, max_value=4),
    )
    | st.sampled_from(["login", "head-a", "x_y.z"]),
    max_size=60,
)


@given(names_strategy)
def test_compress_round_trips(names: list[str]) -> None:
    expression = compress(names)
    assert sorted(expand(expression)) == sorted(set(names))
    assert len(expand(expression)) == len(set(names))
    assert compress(expand(expression)) == expression


@pytest.mark.parametrize("expression", ["n[1-2000000]", "n[1-2000]-[1-2000]", "n[1-1000000],m[1-1000000]"])
def test_a_hostlist_of_more_names_than_any_cluster_is_refused_before_it_is_built(expression: str) -> None:
    """A typo'd range (n[1-999999999], in a job's node list or a tampered nccl-check manifest) was expanded name
    by name until memory ran out."""
    with pytest.raises(HostlistError, match="more than"):
        expand(expression)
