"""The emulator's moto patches that save work (topokeeper.sim.aws.moto_patches): each answers exactly as moto does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import Enum
from typing import Any

import boto3
import pytest
from moto.core.serialize import JSONSerializer
from moto.core.utils import get_service_model

from topokeeper.sim.aws import moto_patches


class _Color(Enum):
    RED = "red"


# Every AttributeValue member, nested both ways, empty containers, false booleans; as dynamo_to_dict leaves them.
PLAIN_ITEM: dict[str, Any] = {
    "pk": {"S": "CLUSTER#big"},
    "empty": {"S": ""},
    "generation": {"N": "1001"},
    "table": {"B": b"\x1f\x8b\x08\x00gzipped"},
    "names": {"SS": ["a", "b"]},
    "sizes": {"NS": ["1", "2.5"]},
    "blobs": {"BS": [b"\x00", b"\xff\xfe"]},
    "nested": {"M": {"inner": {"L": [{"S": "x"}, {"M": {"deep": {"BOOL": False}}}, {"L": []}]}, "none": {"M": {}}}},
    "triggers": {"L": [{"S": json.dumps({"kind": "launch", "at": t})} for t in range(20)]},
    "nothing": {"NULL": True},
    "flag": {"BOOL": False},
}
# What the direct writer leaves to moto: values it does not know, in moto's own spelling of the serializer's input.
NOT_PLAIN_ITEMS: list[dict[str, Any]] = [
    {"color": {"S": _Color.RED}},  # moto unwraps enums
    {"number": {"N": 7}},  # moto writes str(7)
    {"odd": {"S": "x", "Unknown": "y"}},  # moto drops what the model lacks
    {"list": {"L": [None, {"S": "x"}]}},  # moto keeps a None item as it is
    {"blob": {"B": "text"}},  # moto encodes a str blob too
]


def _serialize(operation: str, result: dict[str, Any]) -> str:
    model = get_service_model("dynamodb").operation_model(operation)
    body: str = JSONSerializer(model).serialize(result)["body"]
    return body


@pytest.fixture
def unpatched() -> Iterator[None]:
    was_applied = moto_patches.applied()
    moto_patches.restore()
    yield
    if was_applied:
        moto_patches.apply()


def _both(operation: str, result: dict[str, Any]) -> tuple[str, str]:
    moto_patches.restore()
    original = _serialize(operation, result)
    moto_patches.apply()
    try:
        return original, _serialize(operation, result)
    finally:
        moto_patches.restore()


def test_attribute_values_are_written_byte_for_byte_as_moto_writes_them(unpatched: None) -> None:
    original, patched = _both("UpdateItem", {"Attributes": PLAIN_ITEM, "ConsumedCapacity": {"TableName": "t"}})
    assert patched == original
    assert json.loads(patched)["Attributes"]["table"] == {"B": "H4sIAGd6aXBwZWQ="}  # and it is base64 on the wire


def test_items_across_operations_match_moto(unpatched: None) -> None:
    for operation, result in [
        ("GetItem", {"Item": PLAIN_ITEM}),
        ("Query", {"Items": [PLAIN_ITEM, {"pk": {"S": "other"}}], "Count": 2, "ScannedCount": 2}),
        ("BatchGetItem", {"Responses": {"t": [PLAIN_ITEM]}, "UnprocessedKeys": {}}),
    ]:
        original, patched = _both(operation, result)
        assert patched == original, operation


@pytest.mark.parametrize("item", NOT_PLAIN_ITEMS, ids=lambda item: next(iter(item)))
def test_values_the_direct_writer_does_not_cover_fall_back_to_moto(unpatched: None, item: dict[str, Any]) -> None:
    original, patched = _both("GetItem", {"Item": item})
    assert patched == original


def test_boto3_sessions_do_not_grow_the_shared_loaders_search_paths(unpatched: None) -> None:
    """boto3 appends its data directory to its session's loader: shared, that loader would take one more path for
    every boto3 session made while the emulator runs (and keep them after it stops)."""
    moto_patches.apply()
    try:
        loader = boto3.session.Session()._loader
        paths = list(loader.search_paths)
        for _ in range(3):
            assert boto3.session.Session()._loader is loader
        assert loader.search_paths == paths
        assert sum(path.endswith("boto3/data") for path in paths) == 1  # boto3's resources still load
    finally:
        moto_patches.restore()
