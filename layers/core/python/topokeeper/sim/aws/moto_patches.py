"""The few fixes (and savings of work moto repeats per request) that can only be made inside moto, applied while
an emulator runs and undone after.

Everything else the emulator adds is served by its own gateway in front of moto (``server.Gateway``), so
these are the only changes to moto's module state (and, to share parsed models, botocore's loader factory).
``apply`` is idempotent; ``restore`` puts back exactly what ``apply`` replaced.

Besides these, the emulator reads (never replaces) moto's in-process backends where AWS itself acts
without an API call of the account, or where a request would be counted and charged simulated time:
``events.EventEmitter`` (services put their events on the bus), ``network`` (EC2 instances to place),
``ssm`` (moto's command store, including its ``_commands`` list: moto lists commands only by filter) and
``topokeeper.sim.lambda_host`` (a peek at a queue's depth). moto's internals are not a stable API, so
pyproject.toml pins moto to the minor version these were written against.
"""

from __future__ import annotations

import base64
import copy
import functools
import re
import string
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.session
import jsonpath_ng.ext
import moto.backends
import moto.core.responses
import moto.dynamodb.models
import moto.dynamodb.parsing.ast_nodes
import moto.dynamodb.parsing.expressions
import moto.dynamodb.parsing.validators
import moto.s3.models
import moto.sqs.models
from moto.core.responses import BaseResponse
from moto.core.serialize import BaseJSONSerializer
from moto.core.utils import camelcase_to_underscores, method_names_from_class
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.models.table import Table
from moto.events.utils import EventTemplateParser
from moto.moto_api._internal import mock_random
from moto.moto_api._internal.moto_random import MotoRandom
from moto.utilities.aws_headers import gen_amzn_requestid_long

from topokeeper.sim.aws.clock import Clock, SystemClock
from topokeeper.sim.aws.moto_ec2 import Instance, instances_module

# moto's expression parser modules are untyped (a module-wide ``type: ignore``): their classes are taken as values.
_AST_NODES = vars(moto.dynamodb.parsing.ast_nodes)
AstNode: Any = _AST_NODES["Node"]
DepthFirstTraverser: Any = _AST_NODES["DepthFirstTraverser"]
UpdateExpressionParser: Any = vars(moto.dynamodb.parsing.expressions)["UpdateExpressionParser"]

_lock = threading.Lock()
_originals: dict[tuple[Any, str], Any] = {}

# EventBridge's envelope, as delivered to targets, carries ``account``; moto's default template drops it
# (moto/events/utils.py EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE).
EVENT_TEMPLATE_WITH_ACCOUNT = (
    '{"version": "0", "id": "<id>", "detail-type": "<detail-type>", "source": "<source>", '
    '"account": "<account>", "time": <time>, "region": "<region>", "resources": <resources>, "detail": <detail>}'
)


@functools.lru_cache(maxsize=256)
def _cached_jsonpath(expression: str) -> Any:
    """moto parses the same few JSONPaths again for every event it delivers to a target; jsonpath_ng builds a
    whole parser each time (about 10 ms). Parsed expressions are immutable, so one per text is enough."""
    return _ORIGINAL_JSONPATH_PARSE(expression)


_ORIGINAL_JSONPATH_PARSE = getattr(jsonpath_ng.ext, "parse")  # noqa: B009 - not in its __all__


@functools.cache
def _moto_modules() -> tuple[str, ...]:
    """moto's server lists its package directory (a stat per backend) twice for every request it routes; the
    directory does not change while a process runs."""
    return tuple(_ORIGINAL_LIST_OF_MOTO_MODULES())


_ORIGINAL_LIST_OF_MOTO_MODULES = moto.backends.list_of_moto_modules

# SQS converts each of a queue's attribute names from camelCase whenever it reads the queue's attributes, and
# moto's dispatch each request's action name.
_cached_camelcase_to_underscores = functools.lru_cache(maxsize=1024)(camelcase_to_underscores)

_ORIGINAL_INSTANCE_START = Instance.start


def _start_relaunches(clock: Clock) -> Callable[[Any], Any]:
    """EC2's LaunchTime is the instance's last start (moto keeps the first). LaunchTime has whole seconds and a
    start follows its stop by more than a second on AWS, so a restart never shows the previous LaunchTime."""
    now = _aws_now(clock)

    def start(self: Any) -> Any:
        previous = _ORIGINAL_INSTANCE_START(self)
        self.launch_time = max(now(), self.launch_time + timedelta(seconds=1))
        return previous

    return start


@functools.cache
def _shared_loader(search_path_string: str | None = None) -> Any:
    """One botocore data loader per data path for every session made while the emulator runs: each boto3 client
    the functions and moto create has a session of its own, which read and parsed endpoints.json and the service
    models (EC2's is megabytes) again. A loader only reads files and caches what it parsed, as one session's
    clients already share it."""
    loader = _ORIGINAL_CREATE_LOADER(search_path_string)
    loader._search_paths = _DistinctPaths(loader.search_paths)  # the list boto3 appends to
    return loader


class _DistinctPaths(list[str]):
    """A shared loader's search paths: each boto3 session appends its data directory, once is enough."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


_ORIGINAL_CREATE_LOADER = botocore.session.create_loader

# moto lists a response class's methods (inspect.getmembers) for every request it dispatches; they never change.
_cached_method_names = functools.lru_cache(maxsize=256)(method_names_from_class)

_ORIGINAL_SERIALIZE_STRUCTURE = BaseJSONSerializer._serialize_type_structure


class _NotPlain(Exception):
    """A value the direct AttributeValue writer does not cover: moto's own serializer writes it."""


def _string(item: Any) -> str:
    if type(item) is not str:
        raise _NotPlain
    return item


def _strings(item: Any) -> list[str]:
    if not isinstance(item, list):
        raise _NotPlain
    return [_string(each) for each in item]


def _blob(item: Any) -> str:
    if isinstance(item, str):
        item = item.encode()
    if not isinstance(item, bytes):
        raise _NotPlain
    return base64.b64encode(item).strip().decode()


def _blobs(item: Any) -> list[str]:
    if not isinstance(item, list):
        raise _NotPlain
    return [_blob(each) for each in item]


def _map(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise _NotPlain
    return {key: _attribute_value(each) for key, each in item.items()}


def _list(item: Any) -> list[Any]:
    if not isinstance(item, list):
        raise _NotPlain
    return [_attribute_value(each) for each in item]


def _as_is(item: Any) -> Any:
    return item


# DynamoDB's AttributeValue members in its model's order (botocore's dynamodb-2012-08-10), each written as moto's
# JSON serializer writes its shape: strings as str, blobs in base64, booleans as they are.
_ATTRIBUTE_VALUE_WRITERS = {
    "S": _string,
    "N": _string,
    "B": _blob,
    "SS": _strings,
    "NS": _strings,
    "BS": _blobs,
    "M": _map,
    "L": _list,
    "NULL": _as_is,
    "BOOL": _as_is,
}


def _attribute_value(value: Any) -> dict[str, Any]:
    """What moto's serializer writes for a DynamoDB AttributeValue held as a plain dict (as ``dynamo_to_dict``
    leaves every item), without its per-member shape walk and attribute lookups (a whole state item on every
    UpdateItem's ALL_NEW was a third of the simulator's time). Anything else raises ``_NotPlain``."""
    if not isinstance(value, dict) or not value.keys() <= _ATTRIBUTE_VALUE_WRITERS.keys():
        raise _NotPlain
    return {
        member: write(value[member])
        for member, write in _ATTRIBUTE_VALUE_WRITERS.items()
        if value.get(member) is not None
    }


def _serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
    if key and shape.name == "AttributeValue" and self.service_model.service_name == "dynamodb":
        try:
            serialized[key] = _attribute_value(value)
            return
        except _NotPlain:
            pass
    _ORIGINAL_SERIALIZE_STRUCTURE(self, serialized, value, shape, key)


# DynamoDB's TransactWriteItems: moto keeps a deep copy of every table a transaction names, to put back if it is
# cancelled. The state table of a 20,000-node cluster holds ~20,000 node-facts items, so each audit record's
# transaction copied all of them (~2 s). The copy below is the same snapshot for every item the transaction
# can change (its targets, deep-copied) and shares the rest, which no operation of the transaction touches
# (a Put or Delete replaces or drops the target's entry, an Update changes the target in place).
_transaction = threading.local()
_ORIGINAL_TRANSACT_WRITE_ITEMS = moto.dynamodb.models.DynamoDBBackend.transact_write_items

_Key = tuple[DynamoType, DynamoType | None]


def _transaction_targets(backend: Any, transact_items: list[dict[str, Any]]) -> dict[str, set[_Key]] | None:
    """table name -> the keys the transaction names, or None where moto's own checks have to speak first (an
    unknown table or a key that is not one): moto then copies whole tables as it always does."""
    targets: dict[str, set[_Key]] = {}
    try:
        for entry in transact_items:
            for operation, request in entry.items():
                table = backend.tables[request["TableName"]]
                key = request["Item"] if operation == "Put" else request["Key"]
                range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
                targets.setdefault(table.name, set()).add((DynamoType(key[table.hash_key_attr]), range_key))
    except (AttributeError, KeyError, TypeError):
        return None
    return targets


def _transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
    _transaction.targets = _transaction_targets(self, transact_items)
    try:
        _ORIGINAL_TRANSACT_WRITE_ITEMS(self, transact_items)
    finally:
        _transaction.targets = None


def _transaction_backup(table: Table, keys: set[_Key]) -> Table:
    """What ``copy.deepcopy(table)`` gives back for a transaction that writes only ``keys``: every attribute but
    the items deep-copied; the item maps copied; the targets' items deep-copied, the others shared."""
    backup: Table = copy.copy(table)
    memo: dict[int, Any] = {id(table): backup}
    for name, value in vars(table).items():
        if name != "items":
            setattr(backup, name, copy.deepcopy(value, memo))
    items = copy.copy(table.items)  # the defaultdict, factory and order kept
    for hash_key, range_key in keys:
        if hash_key not in items:
            continue
        if range_key is None:
            items[hash_key] = copy.deepcopy(items[hash_key], memo)
            continue
        held = items[hash_key] = dict(items[hash_key])
        if range_key in held:
            held[range_key] = copy.deepcopy(held[range_key], memo)
    backup.items = items
    return backup


class _TransactionCopy:
    """``copy`` as moto's DynamoDB backend module sees it: a table copied inside a transaction whose targets are
    known is copied by ``_transaction_backup``; everything else by ``copy`` itself."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        targets: dict[str, set[_Key]] | None = getattr(_transaction, "targets", None)
        if targets is not None and type(value) is Table and value.name in targets:
            return _transaction_backup(value, targets[value.name])
        return copy.deepcopy(value, memo)


_ORIGINAL_PROJECT = Item.project
_LIST_ELEMENT = re.compile(r"(.+)\[(\d+)\]$")  # moto's find_nested_key: a path element naming a list item


def _project(self: Any, projection_expressions: list[list[str]]) -> Any:
    """moto's ``Item.project`` for the projection the node-facts cache asks of every item of a BatchGetItem: top-
    level attributes that are strings. moto turns the whole item into Python values and back for each (two
    thirds of a 20,000-item read); a string comes back as it was, so it is taken as it is. Any other path or
    type (numbers come back normalized) goes to moto."""
    attrs: dict[str, Any] = {}
    for path in projection_expressions:
        if len(path) != 1 or _LIST_ELEMENT.match(path[0]):
            return _ORIGINAL_PROJECT(self, projection_expressions)
        value = self.attrs.get(path[0])
        if value is None:
            continue
        if value.type != "S":
            return _ORIGINAL_PROJECT(self, projection_expressions)
        attrs[path[0]] = {"S": value.value}
    return Item(hash_key=self.hash_key, range_key=self.range_key, attrs=attrs)


def _item_order(item: Any) -> Any:
    return (item.hash_key.cast_value, item.range_key.cast_value) if item.range_key else item.hash_key.cast_value


def _all_items(self: Any) -> list[Any]:
    """moto's ``Table.all_items`` (every Query and Scan starts from it) in the same order, sorted by the keys'
    values rather than by ``DynamoType`` comparisons, which cost a Python call each (a Query of the audit
    history sorted the ~20,000 node-facts items of a large cluster in ~1 s). A table's keys all have its
    schema's type, and ``DynamoType`` orders them by these very values."""
    items: list[Any] = []
    for hash_set in self.items.values():
        if self.range_key_attr:
            items.extend(hash_set.values())
        else:
            items.append(hash_set)
    return sorted(items, key=_item_order)


# DynamoDB's UpdateItem parses its update expression twice a request (moto/dynamodb/responses.py reads the names
# and values it uses, the backend parses it again to validate), and the simulator sends the same few expressions
# over and over. Only a successful parse is kept (a bad expression raises as it always did). The parsed tree is
# shared: its readers only read it (``find_clauses``), and the validator works on a copy of its own.
_ORIGINAL_MAKE_UPDATE_EXPRESSION = vars(UpdateExpressionParser)["make"]


@functools.lru_cache(maxsize=1024)
def _parsed_update_expression(expression: str) -> Any:
    return _ORIGINAL_MAKE_UPDATE_EXPRESSION.__func__(UpdateExpressionParser, expression)


def _make_update_expression(cls: type, expression: str) -> Any:
    if cls is not UpdateExpressionParser or type(expression) is not str:
        return _ORIGINAL_MAKE_UPDATE_EXPRESSION.__func__(cls, expression)
    return _parsed_update_expression(expression)


class _NotATree(Exception):
    """Not the tree the parser builds (a node shared, a parent elsewhere, a value of another kind)."""


_LEAF_TYPES = (str, int, type(None))


def _node_class(kind: Any) -> bool:
    """``isinstance(node, Node)`` by the node's class: moto's nodes are ABCs, whose ``isinstance`` is slow."""
    return issubclass(kind, AstNode)


_is_node: Callable[[Any], bool] = functools.cache(_node_class)


def _copy_node(node: Any, parent: tuple[Any, Any], copied_ids: set[int]) -> Any:
    """A copy of ``node`` whose parent is ``parent[1]``, the copy of its parent ``parent[0]``."""
    if id(node) in copied_ids or node.parent is not parent[0]:
        raise _NotATree
    copied_ids.add(id(node))
    kind: Any = type(node)
    copied = kind.__new__(kind)
    state: dict[str, Any] = {}
    for name, value in vars(node).items():
        if name == "parent":
            state[name] = parent[1]
        elif name == "children" and type(value) is list:
            children = []
            for child in value:
                if _is_node(type(child)):
                    children.append(_copy_node(child, (node, copied), copied_ids))
                elif type(child) in _LEAF_TYPES:
                    children.append(child)
                else:
                    raise _NotATree
            state[name] = children
        elif type(value) in _LEAF_TYPES:
            state[name] = value
        else:
            raise _NotATree
    vars(copied).update(state)
    return copied


def _copy_expression(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """``deepcopy`` as moto's DynamoDB validators see it: the validator copies the whole parsed expression before
    it resolves it against the item (a generic deep copy of a ~40-node tree, each node an ABC). A tree as the
    parser builds it (each node listed once, by its parent; names, numbers and nodes only) is copied node by node
    into the same tree; anything else by ``copy.deepcopy``."""
    if memo is None and _is_node(type(value)) and value.parent is None:
        try:
            return _copy_node(value, (None, None), set())
        except _NotATree:
            pass
    return copy.deepcopy(value, memo)


_NO_PRE_PROCESSING = DepthFirstTraverser.pre_processing_of_child  # a hook that does nothing unless overridden
# (traverser class, node class) -> the class of the traverser's processing map that takes such a node, or None
_processed_as: dict[tuple[type, type], type | None] = {}


def _traverse_node_recursively(self: Any, node: Any, child_id: int = -1) -> Any:
    """moto's ``DepthFirstTraverser.traverse_node_recursively`` (each of the validator's ten processors walks the
    whole tree with it), with the processing map's class for a node's class found once per traverser class (a
    map names the same classes on every call, as each of moto's does) rather than by ``isinstance`` against
    ABCs at every node, the map built only for a node it processes, and no call for a child that is no node
    (it would come back as it is) nor for the hook a traverser does not override."""
    if not _is_node(type(node)):
        return node
    parent_node = node.parent
    if node.children is not None:
        pre_process = None if type(self).pre_processing_of_child is _NO_PRE_PROCESSING else self.pre_processing_of_child
        for i, child_node in enumerate(node.children):
            if pre_process is not None:
                pre_process(node, i)
            if _is_node(type(child_node)):
                self.traverse_node_recursively(child_node, i)
    kinds = (type(self), type(node))
    if kinds not in _processed_as:
        _processed_as[kinds] = next((key for key in self._processing_map() if issubclass(kinds[1], key)), None)
    key = _processed_as[kinds]
    if key is not None:
        node = self._processing_map()[key](node)
        node.parent = parent_node
        if parent_node:
            parent_node.children[child_id] = node
    return node


def _clause_container(kind: Any) -> bool:
    return issubclass(kind, (_AST_NODES["Expression"], _AST_NODES["UpdateExpressionFunction"]))


_searched_for_clauses: Callable[[Any], bool] = functools.cache(_clause_container)


def _find_clauses(self: Any, clause_types: list[type]) -> list[Any]:
    """moto's ``Node.find_clauses`` (the validators look for clauses from every node that is an expression), with
    the class of a child that is no clause looked up once rather than by ``isinstance`` against ABCs."""
    clauses = []
    for child in self.children or []:
        if type(child) in clause_types:
            clauses.append(child)
        elif _searched_for_clauses(type(child)):
            clauses.extend(child.find_clauses(clause_types))
    return clauses


# moto's ids (a request id on every answer, a receipt handle of 185 letters for every message received) are drawn
# one ``random.choice`` per character. The same alphabets and lengths, from the same seeded generator, in one
# draw of bytes each (a byte's value modulo the alphabet's length picks the character).
_LETTERS = string.ascii_letters
_LETTERS_AND_DIGITS = string.ascii_letters + string.digits


@functools.cache
def _alphabet_table(alphabet: str) -> bytes:
    return bytes(ord(alphabet[value % len(alphabet)]) for value in range(256))


def _random_string(self: Any, length: int = 20, include_digits: bool = True, lower_case: bool = False) -> str:
    alphabet = _LETTERS_AND_DIGITS if include_digits else _LETTERS
    text: str = self.randbytes(length).translate(_alphabet_table(alphabet)).decode()
    return text.lower() if lower_case else text


def _receipt_handle() -> str:
    return mock_random.randbytes(185).translate(_alphabet_table(string.ascii_lowercase)).decode()


_ORIGINAL_ENRICH_RESPONSE = vars(BaseResponse)["_enrich_response"]


def _enrich_response(headers: dict[str, str], body: Any) -> tuple[dict[str, str], Any]:
    """moto's ``BaseResponse._enrich_response`` for every answer: it writes the request id into an XML body's
    ``<RequestId>`` by a look-behind pattern run over the whole body (a DynamoDB item with its node table is
    tens of kilobytes). A body without that tag (JSON, bytes) cannot match: moto's other steps only."""
    if isinstance(body, str) and "<RequestId>" in body:
        enriched: tuple[dict[str, str], Any] = _ORIGINAL_ENRICH_RESPONSE.__func__(headers, body)
        return enriched
    if "status" in headers:
        headers["status"] = str(headers["status"])
    gen_amzn_requestid_long(headers)
    return headers, body


def _aws_now(clock: Clock) -> Callable[[], datetime]:
    """S3's LastModified and EC2's LaunchTime are AWS's clock: the emulator's (moto's is naive UTC). EC2's
    topology report delay runs from LaunchTime (sim/aws/network.py)."""
    return lambda: clock.now().astimezone(UTC).replace(tzinfo=None)


def _patches(clock: Clock) -> list[tuple[Any, str, Any]]:
    return [
        (moto.s3.models, "utcnow", _aws_now(clock)),
        (instances_module, "utcnow", _aws_now(clock)),
        (EventTemplateParser, "DEFAULT_EVENT_INPUT_TEMPLATE", EVENT_TEMPLATE_WITH_ACCOUNT),
        (jsonpath_ng.ext, "parse", _cached_jsonpath),
        (Instance, "start", _start_relaunches(clock)),
        (moto.backends, "list_of_moto_modules", _moto_modules),
        (moto.sqs.models, "camelcase_to_underscores", _cached_camelcase_to_underscores),
        (moto.core.responses, "method_names_from_class", _cached_method_names),
        (botocore.session, "create_loader", _shared_loader),
        (BaseJSONSerializer, "_serialize_type_structure", _serialize_structure),
        (moto.dynamodb.models.DynamoDBBackend, "transact_write_items", _transact_write_items),
        (moto.dynamodb.models, "copy", _TransactionCopy()),
        (Item, "project", _project),
        (Table, "all_items", _all_items),
        (UpdateExpressionParser, "make", classmethod(_make_update_expression)),
        (moto.dynamodb.parsing.validators, "deepcopy", _copy_expression),
        (DepthFirstTraverser, "traverse_node_recursively", _traverse_node_recursively),
        (AstNode, "find_clauses", _find_clauses),
        (MotoRandom, "get_random_string", _random_string),
        (moto.sqs.models, "generate_receipt_handle", _receipt_handle),
        (moto.core.responses, "camelcase_to_underscores", _cached_camelcase_to_underscores),
        (BaseResponse, "_enrich_response", staticmethod(_enrich_response)),
    ]


def apply(clock: Clock | None = None) -> None:
    """``clock``: the emulator's (default: real time), which S3 stamps objects with."""
    with _lock:
        for owner, name, value in _patches(clock or SystemClock()):
            key = (owner, name)
            if key not in _originals:
                # A class's own attribute as it is held (a classmethod, not the method it binds to).
                _originals[key] = vars(owner)[name] if name in getattr(owner, "__dict__", {}) else getattr(owner, name)
            setattr(owner, name, value)


def restore() -> None:
    with _lock:
        for (owner, name), original in _originals.items():
            setattr(owner, name, original)
        _originals.clear()


def applied() -> bool:
    with _lock:
        return bool(_originals)
