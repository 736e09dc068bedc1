"""Where audit records go: the history table (once per audit id), EventBridge (source ``topokeeper``,
detail-type ``UpdatePartitionTopology``), the structured log, and optionally CloudTrail Lake."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors
from topokeeper.adapters.dynamodb import audit_history_key
from topokeeper.errors import Permanent, Retryable, TopokeeperError
from topokeeper.events import AUDIT_DETAIL_TYPE, AUDIT_SOURCE
from topokeeper.ports import AuditRecord

PUT_EVENTS_BATCH = 10
# EventBridge refuses a PutEvents request whose entries total 256 KB or more ("Total size of the entries in
# the request is over the limit."), entries measured as its user guide says (``put_events_entry_size``).
PUT_EVENTS_MAX_BYTES = 256 * 1024
PUT_AUDIT_EVENTS_BATCH = 100
_TRIMMED_ERROR_CHARS = 1000
# A history record names every node its partition gained or lost: larger than one DynamoDB item (400 KB) from
# about 20,000 nodes. Above this size it is stored compressed, in parts of this size under the same partition
# key (sort key ``AUDITPART#...``), written in one transaction with its marker (TransactWriteItems: 4 MB).
HISTORY_ITEM_BYTES = 350_000
MAX_HISTORY_PARTS = 10


def put_events_entry_size(entry: Mapping[str, Any]) -> int:
    """EventBridge's size of one PutEvents entry: 14 bytes for a Time, then the UTF-8 lengths of Source,
    DetailType, Detail and every Resources ARN (EventBridge user guide, "Calculating PutEvents entry size")."""
    size = 14 if entry.get("Time") is not None else 0
    for key in ("Source", "DetailType", "Detail"):
        size += len(str(entry.get(key) or "").encode())
    return size + sum(len(str(resource).encode()) for resource in entry.get("Resources") or [])


def fitted_detail(document: dict[str, Any], room: int) -> dict[str, Any]:
    """The record's document in at most ``room`` bytes of JSON: node lists, then triggers, are cut (their
    counts stay exact), then the error is shortened. Hashes, ids and counts are never touched."""
    fitted = dict(document)

    def size() -> int:
        return len(json.dumps(fitted, sort_keys=True).encode())

    while size() > room:
        longest = max(("nodes_added", "nodes_removed"), key=lambda key: len(fitted[key]))
        if fitted[longest]:
            fitted[longest] = fitted[longest][: len(fitted[longest]) // 2]
        elif len(fitted["triggers"]) > 1:
            fitted["triggers"] = fitted["triggers"][: len(fitted["triggers"]) // 2]
        elif fitted.get("error") and len(fitted["error"]) > _TRIMMED_ERROR_CHARS:
            fitted["error"] = fitted["error"][:_TRIMMED_ERROR_CHARS] + "..."
        else:
            raise Permanent(f"audit record {document.get('audit_id')} cannot fit one PutEvents entry")
    return fitted


class AuditTrail:
    def __init__(
        self,
        *,
        dynamodb: Any,
        table: str,
        events: Any,
        event_bus: str,
        retention: timedelta,
        logger: logging.Logger | Any,
        cloudtrail_data: Any | None = None,
        channel_arn: str | None = None,
        account: str = "",
        function_arn: str = "",
    ) -> None:
        self._db = dynamodb
        self._table = table
        self._events = events
        self._bus = event_bus
        self._retention = retention
        self._logger = logger
        self._lake = cloudtrail_data
        self._channel = channel_arn
        self._account = account
        self._function_arn = function_arn

    @aws_errors()
    def publish(self, records: Sequence[AuditRecord]) -> int:
        new = [record for record in records if not self._seen(record.audit_id)]
        if not new:
            return 0
        # EventBridge first: if storing fails the retry re-publishes with the same audit_id (at least
        # once downstream) rather than losing the event behind an already-written marker.
        self._put_events(new)
        if self._lake is not None and self._channel:
            try:
                with aws_errors():
                    self._put_audit_events(self._lake, self._channel, new)
            except TopokeeperError as error:
                # Optional, and closed to new customers: a Lake failure must not strand the delivery.
                self._logger.error("CloudTrail Lake PutAuditEvents failed: %s", error)
        stored = [record for record in new if self._store(record)]
        for record in stored:
            self._logger.info(AUDIT_DETAIL_TYPE, extra={"audit": record.document()})
        return len(stored)

    @aws_errors()
    def history(self, cluster: str, limit: int = 50) -> list[dict[str, Any]]:
        """The newest audit records of a cluster first (Query pages hold 1 MB: a few large records each)."""
        heads: list[dict[str, Any]] = []
        page: dict[str, Any] = {}
        while len(heads) < limit:
            response = self._db.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={":pk": {"S": f"CLUSTER#{cluster}"}, ":prefix": {"S": "AUDIT#"}},
                ScanIndexForward=False,
                Limit=limit - len(heads),
                **page,
            )
            heads.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                break
            page = {"ExclusiveStartKey": response["LastEvaluatedKey"]}
        return [self._history_record(item) for item in heads]

    def _history_record(self, head: dict[str, Any]) -> dict[str, Any]:
        if "record" in head:
            document: dict[str, Any] = json.loads(head["record"]["S"])
            return document
        keys = [part_key(head, number) for number in range(1, int(head["parts"]["N"]))]
        chunks = {head["sk"]["S"]: head["record_zlib"]["B"]}
        request: dict[str, Any] = {self._table: {"Keys": keys}} if keys else {}
        while request:  # at most MAX_HISTORY_PARTS keys: one BatchGetItem, and its unprocessed keys
            response = self._db.batch_get_item(RequestItems=request)
            chunks.update({item["sk"]["S"]: item["chunk"]["B"] for item in response["Responses"].get(self._table, [])})
            request = response.get("UnprocessedKeys") or {}
        ordered = [head["sk"]["S"], *(key["sk"]["S"] for key in keys)]
        document = json.loads(zlib.decompress(b"".join(chunks[sk] for sk in ordered)))
        return document

    def _seen(self, audit_id: str) -> bool:
        key = {"pk": {"S": f"AUDITID#{audit_id}"}, "sk": {"S": "AUDITID"}}
        return "Item" in self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True)

    def _store(self, record: AuditRecord) -> bool:
        expires = str(int((record.completed_at + self._retention).timestamp()))
        marker = {"pk": {"S": f"AUDITID#{record.audit_id}"}, "sk": {"S": "AUDITID"}, "expires_at": {"N": expires}}
        key = audit_history_key(record.cluster_name, record.completed_at, record.partition, record.audit_id)
        history = [{**item, "expires_at": {"N": expires}} for item in history_items(key, record.document())]
        try:
            self._db.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": marker,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                    *({"Put": {"TableName": self._table, "Item": item}} for item in history),
                ]
            )
        except ClientError as error:
            reasons = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
            if reasons and reasons[0] == "ConditionalCheckFailed":
                return False  # a concurrent invocation stored it
            raise
        return True

    def _entry(self, record: AuditRecord) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "Source": AUDIT_SOURCE,
            "DetailType": AUDIT_DETAIL_TYPE,
            "Detail": "",
            "EventBusName": self._bus,
            "Resources": [record.cluster_arn] if record.cluster_arn else [],
        }
        room = PUT_EVENTS_MAX_BYTES - 1 - put_events_entry_size(entry)
        entry["Detail"] = json.dumps(fitted_detail(record.document(), room), sort_keys=True)
        return entry

    def _put_events(self, records: Sequence[AuditRecord]) -> None:
        """Batches of at most 10 entries whose sizes total under 256 KB, in the records' order."""
        batches: list[list[dict[str, Any]]] = [[]]
        total = 0
        for entry in (self._entry(record) for record in records):
            size = put_events_entry_size(entry)
            if batches[-1] and (len(batches[-1]) == PUT_EVENTS_BATCH or total + size >= PUT_EVENTS_MAX_BYTES):
                batches.append([])
                total = 0
            batches[-1].append(entry)
            total += size
        for entries in batches:
            response = self._events.put_events(Entries=entries)
            if response.get("FailedEntryCount"):
                failed = [e.get("ErrorCode") for e in response.get("Entries", []) if e.get("ErrorCode")]
                raise Retryable(
                    f"PutEvents failed for {len(failed)} record(s): {sorted(set(failed))}",
                    code=failed[0] if failed else None,
                )

    def _put_audit_events(self, lake: Any, channel_arn: str, records: Sequence[AuditRecord]) -> None:
        for start in range(0, len(records), PUT_AUDIT_EVENTS_BATCH):
            batch = records[start : start + PUT_AUDIT_EVENTS_BATCH]
            response = lake.put_audit_events(
                channelArn=channel_arn,
                auditEvents=[
                    {
                        "id": record.audit_id,
                        "eventData": json.dumps(cloudtrail_lake_event(record, self._account, self._function_arn)),
                    }
                    for record in batch
                ],
            )
            if response.get("failed"):
                codes = sorted({f.get("errorCode") for f in response["failed"]})
                raise Retryable(f"PutAuditEvents failed for {len(response['failed'])} record(s): {codes}")


def part_key(head: dict[str, Any], number: int) -> dict[str, Any]:
    """The key of a large history record's part ``number`` (1...): outside the ``AUDIT#`` prefix the history
    queries, so a page of records holds no parts."""
    return {"pk": head["pk"], "sk": {"S": f"AUDITPART#{head['sk']['S'].removeprefix('AUDIT#')}#{number:02d}"}}


def history_items(key: dict[str, Any], document: dict[str, Any]) -> list[dict[str, Any]]:
    """The history items of one record: one with its JSON, or (larger than an item) its compressed JSON in
    parts. A record too large even for ``MAX_HISTORY_PARTS`` parts keeps its node lists cut, counts exact."""
    text = json.dumps(document, sort_keys=True).encode()
    if len(text) <= HISTORY_ITEM_BYTES:
        return [{**key, "record": {"S": text.decode()}}]
    packed = zlib.compress(text, 6)
    if len(packed) > HISTORY_ITEM_BYTES * MAX_HISTORY_PARTS:
        fitted = fitted_detail(document, HISTORY_ITEM_BYTES * MAX_HISTORY_PARTS)
        packed = zlib.compress(json.dumps(fitted, sort_keys=True).encode(), 6)
    chunks = [packed[start : start + HISTORY_ITEM_BYTES] for start in range(0, len(packed), HISTORY_ITEM_BYTES)]
    head = {**key, "record_zlib": {"B": chunks[0]}, "parts": {"N": str(len(chunks))}}
    return [head, *({**part_key(key, n), "chunk": {"B": chunk}} for n, chunk in enumerate(chunks[1:], start=1))]


def cloudtrail_lake_event(record: AuditRecord, account: str, function_arn: str) -> dict[str, Any]:
    """The record as CloudTrail Lake's integration ``eventData`` (PutAuditEvents)."""
    return {
        "version": "1.0",
        "userIdentity": {"type": "AWSLambda", "principalId": function_arn},
        "userAgent": "topokeeper",
        "eventSource": "topokeeper",
        "eventName": record.event_name,
        "eventTime": record.completed_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "UID": record.audit_id,
        "recipientAccountId": account,
        "requestParameters": {
            "clusterArn": record.cluster_arn,
            "clusterName": record.cluster_name,
            "partitionName": record.partition,
            "kind": record.kind,
            "previousSha256": record.before_sha256,
            "newSha256": record.after_sha256,
            "nodeCount": record.node_count,
        },
        "responseElements": {
            "outcome": record.outcome.value,
            "channel": record.channel,
            "deliveryReference": record.delivery_reference,
        },
        "additionalEventData": {
            "addedNodes": record.nodes_added[:50],
            "removedNodes": record.nodes_removed[:50],
            "switchCount": record.switch_count,
            "blockCount": record.block_count,
        },
        **({"errorMessage": record.error[:256]} if record.error else {}),
    }
