"""The single DynamoDB table (partition key ``pk``, sort key ``sk``, TTL attribute ``expires_at``).

Access patterns (item: pk / sk; who uses it):

- cluster state: ``CLUSTER#<name>`` / ``STATE``; every function: get, atomic change counter, versioned save.
- node facts cache: ``CLUSTER#<name>`` / ``NODE#<instance-id>``; reconcile: BatchGetItem by instance id.
- audit history: ``CLUSTER#<name>`` / ``AUDIT#<completed-at>#<partition>#<id>``; newest first by Query.
- audit marker: ``AUDITID#<id>`` / ``AUDITID``; each record once (one transaction with its history item).
- event seen: ``EVENT#<event-id>`` / ``EVENT``; ingest drops redelivered events (1-day TTL).
- registration entry published: ``CLUSTER#<name>`` / ``REGISTRATION#<instance-id>``; reconcile: Query by prefix
  (which entries exist, their value's digest), one item per entry, deleted with the entry (no TTL: an entry
  outlives neither its instance nor its record, so the items are as many as the cluster's running instances).
- rate token: ``RATE#DescribeInstanceTopology`` / ``RATE``; one call per second across the account.

Change fields (generation, triggers) are native attributes updated atomically by ingest; controller
fields live in one JSON attribute guarded by a version number, so the two writers never clobber
each other. The head node's node table (``slurm_nodes``), the one controller field that grows with the
cluster (a ParallelCluster cluster lists every dynamic node: 20,000 rows are 3 MB of JSON), is saved with
them as gzipped rows in its own binary attribute, so the item stays under DynamoDB's 400 KB.
"""

from __future__ import annotations

import functools
import gzip
import json
import time
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError
from pydantic import TypeAdapter

from topokeeper.adapters.aws import aws_errors
from topokeeper.contract.errors import ConcurrentUpdate, Retryable
from topokeeper.contract.ports import CHANGE_FIELDS, MAX_TRIGGERS, ClusterState, Trigger
from topokeeper.domain.models import SlurmNodeRecord

STATE_SK = "STATE"
EVENT_TTL = timedelta(days=1)
NODE_FACTS_TTL = timedelta(days=30)
REGISTRATION_SK = "REGISTRATION#"
_CONTROLLER_FIELDS = frozenset(ClusterState.model_fields) - CHANGE_FIELDS - {"slurm_nodes"}
NODE_TABLE_ATTRIBUTE = "slurm_nodes_gz"  # [[name, address, hostname, [partition, ...]], ...], JSON, gzipped


@functools.lru_cache(maxsize=1)
def _node_records(table: bytes) -> tuple[SlurmNodeRecord, ...]:
    """The gzipped node table's records. Every change an ingest records returns the whole state item, and the
    table in it changes only when a reconcile saves a new one: one table parsed and validated, not one per event
    (20,000 rows took ~0.1 s each time). The records are shared by the states read from the same table: nothing
    changes a record in place (a new table is new records)."""
    rows = json.loads(gzip.decompress(table))
    return tuple(
        _node_record_list().validate_python(
            [{"name": n, "address": a, "hostname": h, "partitions": p} for n, a, h, p in rows]
        )
    )


@functools.cache
def _node_record_list() -> TypeAdapter[list[SlurmNodeRecord]]:
    return TypeAdapter(list[SlurmNodeRecord])  # validates a table's rows in one call, not one model at a time


def cluster_key(cluster: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": f"CLUSTER#{cluster}"}, "sk": {"S": STATE_SK}}


def _epoch(moment: datetime) -> str:
    return str(int(moment.timestamp()))


def _conditional_failed(error: ClientError) -> bool:
    return bool(error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException")


class DynamoStateStore:
    def __init__(self, dynamodb: Any, table: str) -> None:
        self._db = dynamodb
        self._table = table
        # (cluster, version, records): the node table the state item held at that version, as this store last
        # read (get) or saved it. Only a save writes the table and every save bumps the version, so a save
        # conditioned on that version need not send the same table again (nor gzip 20,000 rows to find it
        # unchanged). One cluster's only: a reconcile gets and saves one cluster, and a table can be 16 MB.
        self._stored_table: tuple[str, int, tuple[SlurmNodeRecord, ...]] | None = None

    @staticmethod
    def _node_table(records: list[SlurmNodeRecord]) -> bytes:
        rows = [[r.name, r.address, r.hostname, r.partitions] for r in records]
        return gzip.compress(json.dumps(rows, separators=(",", ":")).encode(), mtime=0)

    @aws_errors()
    def get(self, cluster: str) -> ClusterState:
        item = self._db.get_item(TableName=self._table, Key=cluster_key(cluster), ConsistentRead=True).get("Item")
        state = self._state(cluster, item or {})
        stored = item is not None and NODE_TABLE_ATTRIBUTE in item and state.slurm_nodes is not None
        self._stored_table = (cluster, state.version, tuple(state.slurm_nodes or ())) if stored else None
        return state

    @staticmethod
    def _state(cluster: str, item: dict[str, Any]) -> ClusterState:
        controller = json.loads(item["controller"]["S"]) if "controller" in item else {}
        # An empty table is a table: only None falls back.
        table = list(_node_records(item[NODE_TABLE_ATTRIBUTE]["B"])) if NODE_TABLE_ATTRIBUTE in item else None
        state = ClusterState.model_validate(
            {
                **controller,
                # A state saved before the table had its own attribute keeps it in the JSON.
                "slurm_nodes": controller.get("slurm_nodes") if table is None else table,
                "cluster": cluster,
                "generation": int(item.get("generation", {}).get("N", "0")),
                "last_event_at": item.get("last_event_at", {}).get("S"),
                "first_pending_at": item.get("first_pending_at", {}).get("S"),
                "triggers": [json.loads(t["S"]) for t in item.get("triggers", {}).get("L", [])],
                "trigger_count": int(item.get("trigger_count", {}).get("N", "0")),
                "version": int(item.get("version", {}).get("N", "0")),
            }
        )
        return state

    @aws_errors()
    def record_change(self, cluster: str, trigger: Trigger, now: datetime) -> ClusterState:
        response = self._db.update_item(
            TableName=self._table,
            Key=cluster_key(cluster),
            UpdateExpression="SET last_event_at = :now, first_pending_at = if_not_exists(first_pending_at, :now) "
            "ADD generation :one, trigger_count :one",
            ExpressionAttributeValues={":now": {"S": now.isoformat()}, ":one": {"N": "1"}},
            ReturnValues="ALL_NEW",
        )
        state = self._state(cluster, response["Attributes"])
        if state.trigger_count <= MAX_TRIGGERS:
            # The first triggers since the last reconcile explain the change; a burst beyond is counted only.
            self._db.update_item(
                TableName=self._table,
                Key=cluster_key(cluster),
                UpdateExpression="SET triggers = list_append(if_not_exists(triggers, :empty), :t)",
                ExpressionAttributeValues={":t": {"L": [{"S": trigger.model_dump_json()}]}, ":empty": {"L": []}},
            )
            state = state.model_copy(update={"triggers": [*state.triggers, trigger]})
        return state

    @aws_errors()
    def save(self, state: ClusterState) -> ClusterState:
        controller = state.model_dump_json(include=set(_CONTROLLER_FIELDS))
        values: dict[str, dict[str, str | bytes]] = {
            ":c": {"S": controller},
            ":next": {"N": str(state.version + 1)},
            ":seen": {"N": str(state.version)},
        }
        expression = "SET controller = :c, version = :next"
        condition = "attribute_not_exists(version) OR version = :seen"
        stored, self._stored_table = self._stored_table, None
        if state.slurm_nodes is None:
            expression += f" REMOVE {NODE_TABLE_ATTRIBUTE}"
        elif stored == (state.cluster, state.version, tuple(state.slurm_nodes)):
            # Not sent again; the item must still hold a table (it may have been deleted and made anew since).
            condition = f"({condition}) AND attribute_exists({NODE_TABLE_ATTRIBUTE})"
        else:
            expression += f", {NODE_TABLE_ATTRIBUTE} = :t"
            values[":t"] = {"B": self._node_table(state.slurm_nodes)}
        try:
            self._db.update_item(
                TableName=self._table,
                Key=cluster_key(state.cluster),
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        except ClientError as error:
            if _conditional_failed(error):
                raise ConcurrentUpdate(f"cluster {state.cluster} state changed concurrently") from error
            raise
        if state.slurm_nodes is not None:
            self._stored_table = (state.cluster, state.version + 1, tuple(state.slurm_nodes))
        return state.model_copy(update={"version": state.version + 1})

    @aws_errors()
    def consume_triggers(self, cluster: str, generation: int) -> None:
        """Forget the triggers a reconcile took, unless newer changes arrived meanwhile."""
        try:
            self._db.update_item(
                TableName=self._table,
                Key=cluster_key(cluster),
                UpdateExpression="REMOVE triggers, first_pending_at SET trigger_count = :zero",
                ConditionExpression="generation = :g",
                ExpressionAttributeValues={":zero": {"N": "0"}, ":g": {"N": str(generation)}},
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise

    @aws_errors()
    def seen(self, event_id: str) -> bool:
        key = {"pk": {"S": f"EVENT#{event_id}"}, "sk": {"S": "EVENT"}}
        return "Item" in self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True)

    @aws_errors()
    def mark_seen(self, event_id: str, now: datetime) -> None:
        self._db.put_item(
            TableName=self._table,
            Item={"pk": {"S": f"EVENT#{event_id}"}, "sk": {"S": "EVENT"}, "expires_at": {"N": _epoch(now + EVENT_TTL)}},
        )

    @aws_errors()
    def registrations(self, cluster: str) -> dict[str, str]:
        found: dict[str, str] = {}
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": {"S": f"CLUSTER#{cluster}"}, ":prefix": {"S": REGISTRATION_SK}},
            "ProjectionExpression": "sk, #d",
            "ExpressionAttributeNames": {"#d": "digest"},
        }
        while True:
            response = self._db.query(**request)
            for item in response.get("Items", []):
                found[item["sk"]["S"].removeprefix(REGISTRATION_SK)] = item["digest"]["S"]
            if not response.get("LastEvaluatedKey"):
                return found
            request["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    @aws_errors()
    def record_registrations(self, cluster: str, published: dict[str, str], deleted: Collection[str]) -> None:
        pk = {"S": f"CLUSTER#{cluster}"}
        requests: list[dict[str, Any]] = [
            {"PutRequest": {"Item": {"pk": pk, "sk": {"S": REGISTRATION_SK + i}, "digest": {"S": digest}}}}
            for i, digest in sorted(published.items())
        ]
        requests += [{"DeleteRequest": {"Key": {"pk": pk, "sk": {"S": REGISTRATION_SK + i}}}} for i in sorted(deleted)]
        _batch_write(self._db, self._table, requests)


def _batch_write(db: Any, table: str, requests: list[dict[str, Any]]) -> None:
    for start in range(0, len(requests), 25):  # BatchWriteItem takes 25 requests
        pending: dict[str, Any] = {table: requests[start : start + 25]}
        while pending:
            pending = db.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}


class DynamoNodeFactsCache:
    def __init__(self, dynamodb: Any, table: str) -> None:
        self._db = dynamodb
        self._table = table

    @aws_errors()
    def get_many(self, cluster: str, instance_ids: Iterable[str]) -> dict[str, dict[str, object]]:
        ids = sorted(set(instance_ids))
        found: dict[str, dict[str, object]] = {}
        for start in range(0, len(ids), 100):  # BatchGetItem takes 100 keys
            keys = [{"pk": {"S": f"CLUSTER#{cluster}"}, "sk": {"S": f"NODE#{i}"}} for i in ids[start : start + 100]]
            request: dict[str, Any] = {self._table: {"Keys": keys, "ProjectionExpression": "facts"}}
            while request:
                response = self._db.batch_get_item(RequestItems=request)
                for item in response.get("Responses", {}).get(self._table, []):
                    facts = json.loads(item["facts"]["S"])
                    found[facts["InstanceId"]] = facts
                request = response.get("UnprocessedKeys") or {}
        return found

    @aws_errors()
    def put_many(self, cluster: str, items: dict[str, dict[str, object]], now: datetime) -> None:
        expires = _epoch(now + NODE_FACTS_TTL)
        requests = [
            {
                "PutRequest": {
                    "Item": {
                        "pk": {"S": f"CLUSTER#{cluster}"},
                        "sk": {"S": f"NODE#{instance_id}"},
                        "facts": {"S": json.dumps(facts, sort_keys=True, default=str)},
                        "expires_at": {"N": expires},
                    }
                }
            }
            for instance_id, facts in sorted(items.items())
        ]
        _batch_write(self._db, self._table, requests)


class DynamoRateLimiter:
    """A token shared by every function in the account: one slot per ``interval`` seconds."""

    def __init__(
        self,
        dynamodb: Any,
        table: str,
        *,
        name: str = "DescribeInstanceTopology",
        interval: float = 1.0,
        now: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._db = dynamodb
        self._table = table
        self._key = {"pk": {"S": f"RATE#{name}"}, "sk": {"S": "RATE"}}
        self._interval = interval
        self._now = now
        self._sleep = sleep

    @aws_errors()
    def acquire(self) -> None:
        for _ in range(100):
            item = self._db.get_item(TableName=self._table, Key=self._key, ConsistentRead=True).get("Item", {})
            current = float(item["next_at"]["N"]) if "next_at" in item else None
            slot = max(self._now(), current or 0.0)
            try:
                self._db.put_item(
                    TableName=self._table,
                    Item={**self._key, "next_at": {"N": repr(slot + self._interval)}},
                    ConditionExpression="attribute_not_exists(next_at)" if current is None else "next_at = :seen",
                    **({} if current is None else {"ExpressionAttributeValues": {":seen": item["next_at"]}}),
                )
            except ClientError as error:
                if _conditional_failed(error):
                    continue  # another caller took this slot
                raise
            wait = slot - self._now()
            if wait > 0:
                self._sleep(wait)
            return
        raise Retryable("could not obtain a DescribeInstanceTopology slot: 100 callers took the slot first")


def audit_history_key(cluster: str, completed_at: datetime, partition: str, audit_id: str) -> dict[str, Any]:
    stamp = completed_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"pk": {"S": f"CLUSTER#{cluster}"}, "sk": {"S": f"AUDIT#{stamp}#{partition}#{audit_id}"}}
