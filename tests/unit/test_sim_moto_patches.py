"""The emulator's moto patches that save work (topokeeper.sim.aws.moto_patches): each answers exactly as moto does."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def _patched() -> Iterator[None]:
    """moto with the emulator's patches, as a running emulator has it; moto's own again after."""
    moto_patches.apply()
    try:
        yield
    finally:
        moto_patches.restore()


def _both(operation: str, result: dict[str, Any]) -> tuple[str, str]:
    moto_patches.restore()
    original = _serialize(operation, result)
    with _patched():
        return original, _serialize(operation, result)


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
    with _patched():
        loader = boto3.session.Session()._loader
        paths = list(loader.search_paths)
        for _ in range(3):
            assert boto3.session.Session()._loader is loader
        assert loader.search_paths == paths
        assert sum(path.endswith("boto3/data") for path in paths) == 1  # boto3's resources still load


def _create_table(db: Any, name: str, kind: str = "S", *, sort_key: bool = True) -> None:
    schema = [("pk", "HASH"), ("sk", "RANGE")] if sort_key else [("pk", "HASH")]
    db.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": n, "KeyType": k} for n, k in schema],
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": kind} for n, _ in schema],
    )


def _transactions() -> list[list[dict[str, Any]]]:
    """Transactions over a table with a sort key ("t") and one without ("h"): committed, cancelled by a condition
    after writes of every kind, refused as invalid after a first write, and naming a table that does not exist."""

    def update(table: str, key: dict[str, Any], expression: str, values: dict[str, Any]) -> dict[str, Any]:
        return {"Update": {"TableName": table, "Key": key, "UpdateExpression": expression,
                           "ExpressionAttributeValues": values}}  # fmt: skip

    node = {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "NODE#1"}}
    state = {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "STATE"}}
    in_place = "ADD generation :one SET triggers = list_append(triggers, :t), nested.deep = :t"
    values = {":one": {"N": "1"}, ":t": {"L": [{"S": "new"}]}}
    other = {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "NODE#3"}}
    fails = {"ConditionCheck": {"TableName": "t", "Key": other, "ConditionExpression": "attribute_not_exists(pk)"}}
    return [
        [update("t", state, in_place, values),
         {"Put": {"Item": {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "AUDIT#1"}, "x": {"S": "y"}}, "TableName": "t"}},
         {"Delete": {"TableName": "t", "Key": node}},
         {"ConditionCheck": {"TableName": "h", "Key": {"pk": {"S": "one"}}, "ConditionExpression": "n = :one",
                             "ExpressionAttributeValues": {":one": {"N": "1"}}}}],
        [update("t", state, in_place, values),
         {"Put": {"Item": {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "AUDIT#2"}}, "TableName": "t"}},
         {"Put": {"Item": {"pk": {"S": "CLUSTER#new"}, "sk": {"S": "STATE"}}, "TableName": "t"}},
         {"Delete": {"TableName": "t", "Key": {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "NODE#2"}}}},
         update("h", {"pk": {"S": "one"}}, "ADD n :one", {":one": {"N": "1"}}),
         fails],
        [update("h", {"pk": {"S": "one"}}, "ADD n :one", {":one": {"N": "1"}}),
         {"Delete": {"TableName": "h", "Key": {"pk": {"S": "two"}}}},
         update("t", state, in_place, values),
         update("t", state, in_place, values)],  # the same item twice: a ValidationException after two writes
        [{"Put": {"Item": {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "AUDIT#3"}}, "TableName": "t"}},
         {"Put": {"Item": {"pk": {"S": "x"}, "sk": {"S": "y"}}, "TableName": "missing"}}],
    ]  # fmt: skip


def _play_transactions() -> list[Any]:
    """Each transaction's answer (or error) and both tables' items after it, through moto's own API."""
    from moto import mock_aws

    with mock_aws():
        db = boto3.client("dynamodb", region_name="us-east-1")
        _create_table(db, "t")
        _create_table(db, "h", sort_key=False)
        state = {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "STATE"}, "generation": {"N": "1"}}
        db.put_item(
            TableName="t", Item={**state, "triggers": {"L": [{"S": "old"}]}, "nested": {"M": {"deep": {"L": []}}}}
        )
        for n in range(1, 4):
            db.put_item(TableName="t", Item={"pk": {"S": "CLUSTER#c"}, "sk": {"S": f"NODE#{n}"}, "f": {"S": str(n)}})
        for name in ("one", "two"):
            db.put_item(TableName="h", Item={"pk": {"S": name}, "n": {"N": "1"}, "m": {"M": {"a": {"L": []}}}})
        seen: list[Any] = []
        for transaction in _transactions():
            try:
                answer = db.transact_write_items(TransactItems=transaction)
                seen.append({key: value for key, value in answer.items() if key != "ResponseMetadata"})
            except db.exceptions.ClientError as error:
                seen.append({key: value for key, value in error.response.items() if key != "ResponseMetadata"})
            seen.append([db.scan(TableName=table, ConsistentRead=True)["Items"] for table in ("t", "h")])
        return seen


def test_transactions_commit_and_roll_back_as_moto_does(unpatched: None) -> None:
    original = _play_transactions()
    with _patched():
        patched = _play_transactions()
    assert patched == original
    codes = [answer.get("Error", {}).get("Code") for answer in original[::2]]
    assert codes == [None, "TransactionCanceledException", "ValidationException", "ResourceNotFoundException"]
    assert original[3] == original[1]  # the cancelled one left both tables as they were


def test_a_transaction_copies_only_the_items_it_writes(unpatched: None) -> None:
    """The savings themselves: a cancelled transaction puts back a table that shares its untouched items."""
    from moto import mock_aws
    from moto.dynamodb.models import dynamodb_backends

    with _patched(), mock_aws():
        db = boto3.client("dynamodb", region_name="us-east-1")
        _create_table(db, "t")
        for sk in ("STATE", "NODE#1", "NODE#2"):
            db.put_item(TableName="t", Item={"pk": {"S": "c"}, "sk": {"S": sk}, "n": {"N": "1"}})
        backend = dynamodb_backends["123456789012"]["us-east-1"]
        before = {item.range_key.value: item for item in backend.tables["t"].all_items()}
        with pytest.raises(db.exceptions.TransactionCanceledException):
            db.transact_write_items(TransactItems=[
                {"Update": {"TableName": "t", "Key": {"pk": {"S": "c"}, "sk": {"S": "STATE"}},
                            "UpdateExpression": "ADD n :one", "ExpressionAttributeValues": {":one": {"N": "1"}}}},
                {"ConditionCheck": {"TableName": "t", "Key": {"pk": {"S": "c"}, "sk": {"S": "NODE#1"}},
                                    "ConditionExpression": "attribute_not_exists(pk)"}},
            ])  # fmt: skip
        after = {item.range_key.value: item for item in backend.tables["t"].all_items()}
    assert after["STATE"] is not before["STATE"] and after["STATE"].attrs["n"].value == "1"  # written: put back
    assert after["NODE#2"] is before["NODE#2"]  # not named by the transaction: shared, not copied


# BatchGetItem projections: the node-facts cache's (a top-level string) and every kind moto handles itself.
PROJECTIONS = [
    ("facts", {}),
    ("facts, #n, absent", {"#n": "name"}),
    ("generation", {}),  # a number: moto normalizes it ("01.50" comes back as "1.50")
    ("nested.deep, triggers[1]", {}),
    ("bits, flag", {}),
]


def _play_reads() -> list[Any]:
    """Queries, scans and projected BatchGetItems over a table keyed by strings and one keyed by numbers."""
    from moto import mock_aws

    with mock_aws():
        db = boto3.client("dynamodb", region_name="us-east-1")
        _create_table(db, "s")
        _create_table(db, "n", "N")
        sorts = {
            "s": ["NODE#9", "NODE#10", "AUDIT#2", "AUDIT#10", "STATE", "a", "B"],
            "n": ["10", "-2", "1.5", "9", "0"],
        }
        for table, keys in sorts.items():
            for hash_key in reversed(keys[:3]):
                for number, sort_key in enumerate(keys):
                    db.put_item(TableName=table, Item={
                        "pk": {"S" if table == "s" else "N": hash_key}, "sk": {"S" if table == "s" else "N": sort_key},
                        "facts": {"S": json.dumps({"InstanceId": f"i-{number}"})}, "name": {"S": ""},
                        "generation": {"N": "01.50"}, "bits": {"B": b"\x00\x01"}, "flag": {"BOOL": True},
                        "nested": {"M": {"deep": {"S": "d"}, "other": {"N": "2"}}},
                        "triggers": {"L": [{"S": "a"}, {"M": {"b": {"N": "3"}}}]},
                    })  # fmt: skip
        seen: list[Any] = []
        s_key = {"pk": {"S": "AUDIT#2"}, "sk": {"S": "NODE#10"}}
        for expression, names in PROJECTIONS:
            request: dict[str, Any] = {"Keys": [s_key, {"pk": {"S": "x"}, "sk": {"S": "y"}}],
                                       "ProjectionExpression": expression}  # fmt: skip
            if names:
                request["ExpressionAttributeNames"] = names
            seen.append(db.batch_get_item(RequestItems={"s": request})["Responses"])
        for forward in (True, False):
            seen.append(db.query(TableName="s", KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
                                 ExpressionAttributeValues={":pk": {"S": "NODE#10"}, ":p": {"S": "AUDIT#"}},
                                 ScanIndexForward=forward)["Items"])  # fmt: skip
            seen.append(db.query(TableName="n", KeyConditionExpression="pk = :pk AND sk > :low",
                                 ExpressionAttributeValues={":pk": {"N": "-2"}, ":low": {"N": "0"}},
                                 ScanIndexForward=forward, Limit=2)["Items"])  # fmt: skip
        for table in sorts:
            seen.append(db.scan(TableName=table)["Items"])
            seen.append(db.scan(TableName=table, Limit=4)["LastEvaluatedKey"])
        return seen


def test_reads_answer_as_moto_does(unpatched: None) -> None:
    original = _play_reads()
    with _patched():
        patched = _play_reads()
    assert patched == original
    assert original[0]["s"] == [{"facts": {"S": json.dumps({"InstanceId": "i-1"})}}]
    assert original[2]["s"] == [{"generation": {"N": "1.50"}}]  # a number moto normalizes
    scan = [(item["pk"]["N"], item["sk"]["N"]) for item in original[-2]]  # the number table, in moto's order
    assert scan[:5] == [("-2", "-2"), ("-2", "0"), ("-2", "1.5"), ("-2", "9"), ("-2", "10")]


def test_a_string_projection_is_taken_as_it_is(unpatched: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The savings themselves: moto's own projection runs only for what the direct one does not cover."""
    calls: list[list[list[str]]] = []
    original = moto_patches._ORIGINAL_PROJECT
    monkeypatch.setattr(
        moto_patches, "_ORIGINAL_PROJECT", lambda item, paths: calls.append(paths) or original(item, paths)
    )
    with _patched():
        _play_reads()
    assert calls == [[["generation"]], [["nested", "deep"], ["triggers[1]"]], [["bits"], ["flag"]]]


# UpdateItem as the state store sends it (record_change, the trigger append, save, consume_triggers) and the kinds
# moto refuses: each played twice, so that a second answer comes from what the first one parsed.
_UPDATES: list[dict[str, Any]] = [
    {"UpdateExpression": "SET last_event_at = :now, first_pending_at = if_not_exists(first_pending_at, :now) "
                         "ADD generation :one, trigger_count :one",
     "ExpressionAttributeValues": {":now": {"S": "2026-01-05T09:00:00Z"}, ":one": {"N": "1"}},
     "ReturnValues": "ALL_NEW"},
    {"UpdateExpression": "SET last_event_at = :now, first_pending_at = if_not_exists(first_pending_at, :now) "
                         "ADD generation :one, trigger_count :one",
     "ExpressionAttributeValues": {":now": {"S": "2026-01-05T09:00:07Z"}, ":one": {"N": "2"}},
     "ReturnValues": "UPDATED_NEW"},
    {"UpdateExpression": "SET triggers = list_append(if_not_exists(triggers, :empty), :t)",
     "ExpressionAttributeValues": {":t": {"L": [{"S": '{"kind": "launch"}'}]}, ":empty": {"L": []}},
     "ReturnValues": "UPDATED_OLD"},
    {"UpdateExpression": "SET controller = :c, version = :next, node_table = :t",
     "ConditionExpression": "attribute_not_exists(version) OR version = :seen",
     "ExpressionAttributeValues": {":c": {"S": '{"a": 1}'}, ":next": {"N": "1"}, ":seen": {"N": "0"},
                                   ":t": {"B": b"\x1f\x8b\x08table"}},
     "ReturnValues": "ALL_OLD"},
    {"UpdateExpression": "SET controller = :c, version = :next",
     "ConditionExpression": "(attribute_not_exists(version) OR version = :seen) AND attribute_exists(node_table)",
     "ExpressionAttributeValues": {":c": {"S": '{"a": 2}'}, ":next": {"N": "2"}, ":seen": {"N": "1"}}},
    {"UpdateExpression": "REMOVE triggers, first_pending_at SET trigger_count = :zero",
     "ConditionExpression": "generation = :g",
     "ExpressionAttributeValues": {":zero": {"N": "0"}, ":g": {"N": "999"}}},  # ConditionalCheckFailed
    {"UpdateExpression": "SET #n[0] = :v, m.#n = :v REMOVE nums[1] ADD tags :tags DELETE gone :gone",
     "ExpressionAttributeNames": {"#n": "nested"},
     "ExpressionAttributeValues": {":v": {"N": "5"}, ":tags": {"SS": ["x"]}, ":gone": {"SS": ["a"]}},
     "ReturnValues": "ALL_NEW"},
    {"UpdateExpression": "SET tally = tally + :one, spare = :ten - trigger_count",
     "ExpressionAttributeValues": {":one": {"N": "1"}, ":ten": {"N": "10"}}, "ReturnValues": "ALL_NEW"},
    {"UpdateExpression": "SET x = absent + :one", "ExpressionAttributeValues": {":one": {"N": "1"}}},
    {"UpdateExpression": "SET sk = :k", "ExpressionAttributeValues": {":k": {"S": "other"}}},
    {"UpdateExpression": "SET x = :a SET y = :a", "ExpressionAttributeValues": {":a": {"S": "x"}}},
    {"UpdateExpression": "SET x = :undefined", "ExpressionAttributeValues": {":a": {"S": "x"}}},
    {"UpdateExpression": "SET = :a", "ExpressionAttributeValues": {":a": {"S": "x"}}},  # not an expression
    {"UpdateExpression": "SET x = :a, x = :a", "ExpressionAttributeValues": {":a": {"S": "x"}}},
]  # fmt: skip


def _play_updates() -> list[Any]:
    """Each update's answer (or error) and the item after it, on an existing item and on one it makes; then the
    first update inside a transaction."""
    from moto import mock_aws

    with mock_aws():
        db = boto3.client("dynamodb", region_name="us-east-1")
        _create_table(db, "t")
        existing = {"pk": {"S": "CLUSTER#c"}, "sk": {"S": "STATE"}}
        db.put_item(TableName="t", Item={
            **existing, "generation": {"N": "7"}, "tally": {"N": "1.50"}, "node_table": {"B": b"\x00\x01"},
            "triggers": {"L": [{"S": json.dumps({"at": n})} for n in range(20)]}, "gone": {"SS": ["a", "b"]},
            "nested": {"L": [{"N": "1"}]}, "m": {"M": {}}, "nums": {"L": [{"N": "1"}, {"N": "2"}, {"N": "3"}]},
        })  # fmt: skip
        seen: list[Any] = []
        for key in (existing, {"pk": {"S": "CLUSTER#new"}, "sk": {"S": "STATE"}}):
            for update in _UPDATES + _UPDATES:
                try:
                    answer = db.update_item(TableName="t", Key=key, **update)
                    seen.append({name: value for name, value in answer.items() if name != "ResponseMetadata"})
                except db.exceptions.ClientError as error:
                    seen.append(error.response["Error"])
                seen.append(db.get_item(TableName="t", Key=key, ConsistentRead=True).get("Item"))
        request = {name: value for name, value in _UPDATES[0].items() if name != "ReturnValues"}
        db.transact_write_items(TransactItems=[{"Update": {"TableName": "t", "Key": existing, **request}}])
        seen.append(db.get_item(TableName="t", Key=existing, ConsistentRead=True)["Item"])
        return seen


def test_updates_answer_and_store_as_moto_does(unpatched: None) -> None:
    original = _play_updates()
    with _patched():
        patched = _play_updates()
    assert patched == original
    assert original[0]["Attributes"]["generation"] == {"N": "8"}
    assert original[2]["Attributes"]["generation"] == {"N": "10"}  # the second values, not the first ones again
    codes = [answer.get("Code") for answer in original[::2]]
    refused = ["ValidationException"] * 6
    assert codes[: len(_UPDATES)] == [None] * 5 + ["ConditionalCheckFailedException", None, None, *refused]
    failed = ["ConditionalCheckFailedException"] * 3
    # Refused again: a refusal is not remembered, nor a success in its place.
    assert codes[len(_UPDATES) : 2 * len(_UPDATES)] == [None] * 3 + failed + [None, None, *refused]


def _tree(node: Any, parent: Any = None) -> Any:
    """A parsed expression's shape: each node's class, its values and its children's, with each parent checked."""
    if not isinstance(node, moto_patches.AstNode):
        return node
    assert node.parent is parent
    state = {name: value for name, value in vars(node).items() if name not in ("children", "parent")}
    return type(node), state, [_tree(child, node) for child in node.children or []]


def _nodes(node: Any) -> set[int]:
    if not isinstance(node, moto_patches.AstNode):
        return set()
    return {id(node)}.union(*(_nodes(child) for child in node.children or []))


def test_a_parsed_expression_is_copied_into_the_same_tree_as_deepcopy_makes(unpatched: None) -> None:
    UpdateExpressionParser = moto_patches.UpdateExpressionParser

    for update in _UPDATES:
        if update["UpdateExpression"] == "SET = :a":
            continue
        parsed = UpdateExpressionParser.make(update["UpdateExpression"])
        copied = moto_patches._copy_expression(parsed)
        assert _tree(copied) == _tree(copy.deepcopy(parsed)) == _tree(parsed)
        assert len(_nodes(copied)) == len(_nodes(parsed)) > 5 and not _nodes(copied) & _nodes(parsed)
    with pytest.raises(moto_patches._NotATree):  # a node listed twice is no parsed tree: deepcopy copies it
        moto_patches._copy_node(_shared_child_tree(), (None, None), set())


def _shared_child_tree() -> Any:
    shared = moto_patches._AST_NODES["ExpressionAttribute"]("a")
    return moto_patches._AST_NODES["UpdateExpression"](children=[shared, shared])


def test_an_update_expression_is_parsed_once_and_a_bad_one_every_time(
    unpatched: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The savings themselves, and only successful parses kept."""
    from moto.dynamodb.exceptions import MockValidationException

    UpdateExpressionParser = moto_patches.UpdateExpressionParser
    parsed: list[str] = []
    original = moto_patches._ORIGINAL_MAKE_UPDATE_EXPRESSION.__func__

    def counted(cls: type, text: str) -> Any:
        parsed.append(text)
        return original(cls, text)

    moto_patches._parsed_update_expression.cache_clear()
    with _patched():
        monkeypatch.setattr(
            moto_patches,
            "_ORIGINAL_MAKE_UPDATE_EXPRESSION",
            classmethod(counted),
        )
        first = UpdateExpressionParser.make("SET a = :a ADD n :one")
        assert UpdateExpressionParser.make("SET a = :a ADD n :one") is first
        for _ in range(2):
            with pytest.raises(MockValidationException):
                UpdateExpressionParser.make("SET = :a")
        moto_patches._parsed_update_expression.cache_clear()
    assert parsed == ["SET a = :a ADD n :one", "SET = :a", "SET = :a"]


def _draw_ids(seed: int) -> list[str]:
    """moto's ids of each kind the emulator draws many of, 300 of each, from a seed."""
    import moto.sqs.models
    from moto.moto_api._internal import mock_random
    from moto.utilities.aws_headers import gen_amzn_requestid_long

    mock_random.seed(seed)
    kinds: list[Callable[[], str]] = [
        gen_amzn_requestid_long,
        mock_random.get_random_string,
        lambda: mock_random.get_random_string(8, include_digits=False),
        lambda: mock_random.get_random_string(12, lower_case=True),
        vars(moto.sqs.models)["generate_receipt_handle"],  # as SQS's messages call it
    ]
    return [
        "".join(sorted(set("".join(draws)))) + "/" + ",".join(sorted({str(len(d)) for d in draws}))
        for draws in ([kind() for _ in range(300)] for kind in kinds)
    ]


def test_moto_ids_keep_their_alphabet_and_length_and_follow_the_seed(unpatched: None) -> None:
    """Drawn as moto draws them (the characters each kind uses, each id's length), from the seed."""
    from moto.moto_api._internal import mock_random

    original = _draw_ids(13)
    with _patched():
        patched = _draw_ids(13)
        assert _draw_ids(13) == patched
        mock_random.seed(13)
        first = mock_random.get_random_string(52)
        mock_random.seed(13)
        assert mock_random.get_random_string(52) == first
        mock_random.seed(14)
        assert mock_random.get_random_string(52) != first
    assert patched == original
    assert original[-1] == "abcdefghijklmnopqrstuvwxyz/185"


def _enrich_each() -> list[Any]:
    """moto's answer enrichment (status, request id header, an XML body's RequestId) of each kind of body, with
    the request id (drawn as the patches draw it) written as ``<id>``."""
    from moto.core.responses import BaseResponse

    xml = "<R><ResponseMetadata><RequestId>old</RequestId></ResponseMetadata></R>"
    json_body = json.dumps({"RequestId": "x", "t": "<RequestId>" * 2})  # the tag without its end: no match
    enriched: list[Any] = []
    for body in [xml, xml.replace("R>", "R>\n"), json_body, b"<RequestId>b</RequestId>", None]:
        given: dict[str, Any] = {"status": 200, "k": "v"}
        headers, answer = BaseResponse._enrich_response(given, body)
        request_id = headers.pop("x-amzn-requestid")
        assert len(request_id) == 52
        enriched.append((headers, answer.replace(request_id, "<id>") if isinstance(answer, str) else answer))
    return enriched


def test_answers_are_enriched_as_moto_enriches_them(unpatched: None) -> None:
    original = _enrich_each()
    with _patched():
        patched = _enrich_each()
    assert patched == original
    assert original[0] == (
        {"status": "200", "k": "v"},
        "<R><ResponseMetadata><RequestId><id></RequestId></ResponseMetadata></R>",
    )


def test_moto_ec2_imported_with_one_botocore_session_lists_every_region_and_leaves_boto3_as_it_was() -> None:
    import boto3
    import boto3.session
    import botocore.session
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

    from topokeeper.sim.aws import network

    assert network.ec2_backends is not None and boto3.Session is boto3.session.Session
    session = botocore.session.get_session()
    expected = {
        region
        for partition in ("aws", "aws-us-gov", "aws-cn")
        for region in session.get_available_regions("ec2", partition_name=partition)
    }
    assert {region.name for region in RegionsAndZonesBackend.regions} == expected


_EC2_REGION_SESSIONS = """
import sys
import botocore.session

listed = []
original = botocore.session.Session.get_available_regions


def counted(self, service_name, *args, **kwargs):
    if service_name == "ec2":
        listed.append(id(self))
    return original(self, service_name, *args, **kwargs)


botocore.session.Session.get_available_regions = counted
__import__(sys.argv[1])
import functools
modules = list(sys.modules.values())
bound = [module for module in modules if isinstance(getattr(module, "Session", None), functools.partial)]
print(len(set(listed)), len(listed), len(bound))
"""


@pytest.mark.parametrize(
    "first_import", ["topokeeper.sim.aws.network", "topokeeper.sim.aws.moto_patches", "topokeeper.sim.world"]
)
def test_moto_ec2_lists_its_regions_with_one_botocore_session_whatever_the_emulator_imports_first(
    first_import: str,
) -> None:
    """The saving holds for every entry point: the world (tests, bench/scale.py) and moto_patches import moto.ec2
    (moto_patches through moto.ec2.models.instances) before network.py's swap could take effect."""
    import subprocess
    import sys

    ran = subprocess.run(
        [sys.executable, "-c", _EC2_REGION_SESSIONS, first_import], capture_output=True, text=True, check=True
    )
    sessions, listings, partials_left = map(int, ran.stdout.split())
    assert listings == 3
    assert sessions == 1
    assert partials_left == 0  # no module keeps the swapped-in Session (moto binds it with ``from boto3 import``)
