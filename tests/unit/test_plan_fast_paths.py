"""The planner's fast paths (issue 13: 100,000 nodes under 2 s) give what the checked paths give, or fail alike.

Each fast path skips work only when a stricter test passes; these properties draw values on both sides of
that test and compare with the path it replaces: a snapshot read without the models against one read with
them, a node assembled against one validated, pydantic-core's JSON against ``json.dumps``, the hostlist
suffix without a regex against the regex.
"""

from __future__ import annotations

import copy
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from topokeeper import wire
from topokeeper.contract.errors import InputError
from topokeeper.domain.models import Block, Node, PlannerConfig, Switch, assemble
from topokeeper.domain.names import check_slurm_name, is_plain_slurm_name
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import (
    SnapshotFacts,
    build_snapshot,
    join_snapshot,
    parse_snapshot_document,
    read_snapshot,
)
from topokeeper.render.bundle import json_text, render

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.json"))
PROPERTY = settings(max_examples=int(os.environ.get("TOPOKEEPER_FUZZ_EXAMPLES", "25")) * 4, deadline=None)

NAME_CHARACTERS = st.sampled_from("aZ09._-,[]; \n\x7féé\u0661")
ODD_VALUES = [None, 0, 1.5, True, "", "a;b", "x" * 65, "9" * 25, "n" + "0" * 24 + "1", ["a"], {"Id": 1}, ("a",)]


@PROPERTY
@given(st.text(NAME_CHARACTERS, max_size=70) | st.from_regex(r"[a-z][a-z0-9-]{0,40}[0-9]{15,25}", fullmatch=True))
def test_a_plain_name_is_one_check_slurm_name_accepts_unchanged(name: str) -> None:
    if is_plain_slurm_name(name):
        assert check_slurm_name(name) == name


def test_plain_stops_at_the_limits_check_slurm_name_has() -> None:
    assert is_plain_slurm_name("a" * 64) and not is_plain_slurm_name("a" * 65)
    assert is_plain_slurm_name("n" + "9" * 19) and not is_plain_slurm_name("n" + "1" * 20)
    assert check_slurm_name("n" + "0" * 19 + "1")  # not plain, still valid: the model decides
    assert not is_plain_slurm_name(1) and not is_plain_slurm_name(None)


GOOD_NODE = {
    "name": "ip-10-1-2-3",
    "instance_id": "i-0123456789abcdef0",
    "instance_type": "ml.p5.48xlarge",
    "instance_group": "p5",
    "partition": "gpu",
    "status": "Running",
    "network_nodes": ("nn-a", "nn-b", "nn-c"),
    "ultraserver_id": None,
    "availability_zone": "us-east-1a",
}
NODE_VALUES: dict[str, list[Any]] = {
    "name": ["ip-10-1-2-3", "q1-st-p5-1", *ODD_VALUES],
    "instance_id": ["i-0123456789abcdef0", "i-01234567", "i-0123", *ODD_VALUES],
    "instance_type": ["p5.48xlarge", "ml.p6e-gb200.36xlarge", "ml.bad type", "P5.48XLARGE", *ODD_VALUES],
    "instance_group": ["p5", *ODD_VALUES],
    "partition": ["gpu", *ODD_VALUES],
    "status": ["Running", "Pending", *ODD_VALUES],
    "network_nodes": [(), ("nn-a",), ("a", "b", "c", "d"), ("a", "b", "c", "d", "e"), ("a;b",), ["nn-a"], *ODD_VALUES],
    "ultraserver_id": ["us-1", *ODD_VALUES],
    "availability_zone": ["us-east-1a", *ODD_VALUES],
}


def _outcome(build: Any, value: Any) -> Any:
    try:
        built = build(value)
    except ValidationError as error:
        return ("error", error.errors(include_url=False, include_context=False))
    return ("node", built, built.model_fields_set, {key: type(item) for key, item in built.__dict__.items()})


def test_a_node_from_fields_with_one_odd_value_is_the_validated_node_or_the_same_error() -> None:
    for field, values in NODE_VALUES.items():
        for value in values:
            fields = {**GOOD_NODE, field: value}
            assert _outcome(lambda f: Node.from_fields(dict(f)), fields) == _outcome(Node.model_validate, fields)


@PROPERTY
@given(st.fixed_dictionaries({field: st.sampled_from(values) for field, values in NODE_VALUES.items()}))
def test_a_node_from_fields_is_the_validated_node_or_the_same_error(fields: dict[str, Any]) -> None:
    assert _outcome(lambda f: Node.from_fields(dict(f)), fields) == _outcome(Node.model_validate, fields)


def test_nodes_from_plain_rows_are_the_validated_nodes_or_none() -> None:
    odd_ones = [(field, value) for field, values in NODE_VALUES.items() for value in values]
    odd_ones += [("name", "a\nb"), ("instance_id", "i-01234567\ni-01234567"), ("network_nodes", ("a\nb",))]
    for field, value in odd_ones:
        rows = [dict(GOOD_NODE), {**GOOD_NODE, "name": "ip-10-1-2-4", field: value}]
        expected = [_outcome(Node.model_validate, row) for row in rows]
        built = Node.from_plain_rows([dict(row) for row in rows])
        if built is None:
            assert all(
                _outcome(lambda f: Node.from_fields(dict(f)), row) == outcome
                for row, outcome in zip(rows, expected, strict=True)
            )
        else:
            assert [_outcome(lambda node: node, node) for node in built] == expected, (field, value)


def test_a_node_from_fields_without_every_field_is_validated() -> None:
    partial = {key: value for key, value in GOOD_NODE.items() if key != "status"}
    assert _outcome(lambda f: Node.from_fields(dict(f)), partial) == _outcome(Node.model_validate, partial)


def test_an_assembled_model_equals_the_validated_one_and_needs_every_field() -> None:
    switch = assemble(Switch, {"name": "nn-a", "switches": (), "nodes": ("n1", "n2")})
    assert switch == Switch(name="nn-a", nodes=("n1", "n2")) and hash(switch) == hash(
        Switch(name="nn-a", nodes=("n1", "n2"))
    )
    other = assemble(Switch, {"name": "nn-b", "switches": (), "nodes": ("n4",)})
    assert switch.model_copy(update={"nodes": ("n3",)}).nodes == ("n3",)
    assert switch.model_fields_set == other.model_fields_set == {"name", "switches", "nodes"}  # shared, unchanged
    with pytest.raises(TypeError, match="needs every field"):
        assemble(Block, {"name": "b"})


def _documents() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in EXAMPLE_FILES]


NODE_KEYS = [
    "InstanceGroupName",
    "InstanceId",
    "InstanceType",
    "PrivateDnsHostname",
    "PrivatePrimaryIp",
    "InstanceStatus",
    "UltraServerInfo",
    "Placement",
]
TOPOLOGY_KEYS = ["InstanceId", "InstanceType", "NetworkNodes", "AvailabilityZone", "CapacityBlockId"]
DOCUMENT_VALUES = [
    *ODD_VALUES,
    {"Status": "ShuttingDown"},
    {"Status": None},
    {},
    {"Id": "us-7", "Type": 3},
    {"AvailabilityZone": 4},
    ["nn-a", 1],
    ["nn-a", "nn-b"],
    "ip-10-9-9-9.ec2.internal",
    "i-0123456789abcdef0",
]


def _read_both_ways(document: Any) -> tuple[Any, Any]:
    def outcome(read: Any) -> Any:
        try:
            return read()
        except InputError as error:
            return ("refused", str(error))

    plain = outcome(lambda: join_snapshot(read_snapshot(document), PlannerConfig()))
    modelled = outcome(lambda: build_snapshot(parse_snapshot_document(document), PlannerConfig()))
    return plain, modelled


def test_a_snapshot_read_without_the_models_is_the_one_read_with_them() -> None:
    """Every value on every key the models read, and each key missing, on one node and one topology item."""
    differ = []
    for section, keys, position in (("nodes", NODE_KEYS, 3), ("instance_topology", TOPOLOGY_KEYS, 0)):
        for key in keys:
            for value in [_MISSING, *DOCUMENT_VALUES]:
                document = _documents()[EXAMPLE_FILES.index(EXAMPLES / "mixed-cluster.json")]
                item = document[section][position]
                if value is _MISSING:
                    item.pop(key, None)
                else:
                    item[key] = copy.deepcopy(value)
                plain, modelled = _read_both_ways(document)
                if plain != modelled:
                    differ.append((section, key, value, plain, modelled))
    assert differ == []


_MISSING = object()


@pytest.mark.parametrize("where", ["nodes", "instance_topology", "describe_cluster", "root"])
def test_a_snapshot_with_wrong_shapes_is_refused_alike(where: str) -> None:
    document: Any = _documents()[0]
    if where == "root":
        document = [document]
    elif where == "describe_cluster":
        document["describe_cluster"]["ClusterName"] = "bad name!"
        document["nodes"][0]["InstanceId"] = 7  # both wrong: the first field in model order is named
    else:
        document[where] = {"not": "a list"}
    plain, modelled = _read_both_ways(document)
    assert plain == modelled and plain[0] == "refused"


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda path: path.stem)
@pytest.mark.parametrize("version", [None, "24.11"])
def test_every_example_plans_to_the_same_bytes_through_either_reading(path: Path, version: str | None) -> None:
    document = json.loads(path.read_text())
    modelled = copy.deepcopy(document)
    modelled["nodes"][0] = OrderedDict(modelled["nodes"][0])  # not a plain dict: the models read this one
    facts = read_snapshot(document)
    assert facts.raw.nodes == [] and SnapshotFacts.of(parse_snapshot_document(document)).instances == facts.instances
    fast = render(plan(join_snapshot(facts, PlannerConfig(), version))).files()
    slow = render(plan(join_snapshot(read_snapshot(modelled), PlannerConfig(), version))).files()
    assert fast == slow


JSON_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8) | st.sampled_from(
    ["\x7f", "\ud800", "\U0001f600", "é", "\x00\x1f", '"\\/', "a\u2028b"]
)
JSON_DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | JSON_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(JSON_TEXT, inner, max_size=4),
    max_leaves=20,
)


@PROPERTY
@given(JSON_DOCUMENTS, st.booleans())
def test_json_text_is_json_dumps_indented(document: Any, sort_keys: bool) -> None:
    assert json_text(document, sort_keys=sort_keys) == json.dumps(document, indent=2, sort_keys=sort_keys) + "\n"


@PROPERTY
@given(st.text(st.sampled_from("ab-.0129\u0661\n"), max_size=30))
def test_the_hostlist_suffix_without_a_regex_is_the_regex_one(name: str) -> None:
    match = wire._TRAILING_DIGITS.fullmatch(name)
    expected = None if not match or len(match.group(2)) > 18 else (match.group(1), match.group(2))
    assert wire._suffix(name) == expected
