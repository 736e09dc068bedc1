"""Where audit records go: the history table (once per audit id), EventBridge (source ``topokeeper``,
detail-type the record's ``event_name``: ``UpdatePartitionTopology``, ``UpdateKueueTopology``,
``UpdateLoginTargets``), the structured log, and optionally CloudTrail Lake.

Each kind has its own history in the table (``AUDIT#`` for the partition records, ``AUDIT-<event>#`` for the
others), so a reader of one kind never meets the fields of another."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta
from typing import Any

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors
from topokeeper.adapters.dynamodb import audit_history_key
from topokeeper.contract.constants import AUDIT_DETAIL_TYPE, AUDIT_SOURCE
from topokeeper.contract.errors import Permanent, Retryable, TopokeeperError
from topokeeper.contract.ports import AnyAuditRecord, AuditRecord

PUT_EVENTS_BATCH = 10
# EventBridge refuses a PutEvents request whose entries total 256 KB or more ("Total size of the entries in
# the request is over the limit."), entries measured as its user guide says (``put_events_entry_size``).
PUT_EVENTS_MAX_BYTES = 256 * 1024
PUT_AUDIT_EVENTS_BATCH = 100
_TRIMMED_ERROR_CHARS = 1000
# The lists a record may cut to fit one entry (their counts stay exact).
_CUTTABLE_LISTS = (
    "nodes_added",
    "nodes_removed",
    "nodes_moved",
    "nodes_relabeled",
    "nodes_without_topology_data",
    "registered",
    "deregistered",
    "targets",
)


def history_prefix(event_name: str) -> str:
    return "AUDIT#" if event_name == AUDIT_DETAIL_TYPE else f"AUDIT-{event_name}#"


def history_key(record: AnyAuditRecord) -> dict[str, Any]:
    if isinstance(record, AuditRecord):
        return audit_history_key(record.cluster_name, record.completed_at, record.partition, record.audit_id)
    stamp = record.completed_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "pk": {"S": f"CLUSTER#{record.cluster_name}"},
        "sk": {"S": f"{history_prefix(record.event_name)}{stamp}#{record.audit_id}"},
    }


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
        longest = max(_CUTTABLE_LISTS, key=lambda key: len(fitted.get(key) or ()))
        if fitted.get(longest):
            fitted[longest] = fitted[longest][: len(fitted[longest]) // 2]
        elif len(fitted.get("triggers") or ()) > 1:
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
    def publish(self, records: Sequence[AnyAuditRecord]) -> int:
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
            self._logger.info(record.event_name, extra={"audit": record.document()})
        return len(stored)

    def publish_login(self, record: AnyAuditRecord) -> None:
        """The login sync's port (``LoginAudit``): the same trail as every other record."""
        self.publish([record])

    @aws_errors()
    def history(self, cluster: str, limit: int = 50, event_name: str = AUDIT_DETAIL_TYPE) -> list[dict[str, Any]]:
        """The newest audit records of one kind of a cluster first, across Query's 1 MB pages (a page holds ~100 records
        of a large cluster: 200 node names a list)."""
        items: list[dict[str, Any]] = []
        page: dict[str, Any] = {}
        while len(items) < limit:
            response = self._db.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={
                    ":pk": {"S": f"CLUSTER#{cluster}"},
                    ":prefix": {"S": history_prefix(event_name)},
                },
                ScanIndexForward=False,
                Limit=limit - len(items),
                **page,
            )
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                break
            page = {"ExclusiveStartKey": response["LastEvaluatedKey"]}
        return [json.loads(item["record"]["S"]) for item in items]

    def _seen(self, audit_id: str) -> bool:
        key = {"pk": {"S": f"AUDITID#{audit_id}"}, "sk": {"S": "AUDITID"}}
        return "Item" in self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True)

    def _store(self, record: AnyAuditRecord) -> bool:
        expires = str(int((record.completed_at + self._retention).timestamp()))
        marker = {"pk": {"S": f"AUDITID#{record.audit_id}"}, "sk": {"S": "AUDITID"}, "expires_at": {"N": expires}}
        history = {
            **history_key(record),
            "record": {"S": json.dumps(record.document(), sort_keys=True)},
            "expires_at": {"N": expires},
        }
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
                    {"Put": {"TableName": self._table, "Item": history}},
                ]
            )
        except ClientError as error:
            reasons = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
            if reasons and reasons[0] == "ConditionalCheckFailed":
                return False  # a concurrent invocation stored it
            raise
        return True

    def _entry(self, record: AnyAuditRecord) -> dict[str, Any]:
        arn = getattr(record, "cluster_arn", None)
        entry: dict[str, Any] = {
            "Source": AUDIT_SOURCE,
            "DetailType": record.event_name,
            "Detail": "",
            "EventBusName": self._bus,
            "Resources": [arn] if arn else [],
        }
        room = PUT_EVENTS_MAX_BYTES - 1 - put_events_entry_size(entry)
        entry["Detail"] = json.dumps(fitted_detail(record.document(), room), sort_keys=True)
        return entry

    def _put_events(self, records: Sequence[AnyAuditRecord]) -> None:
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

    def _put_audit_events(self, lake: Any, channel_arn: str, records: Sequence[AnyAuditRecord]) -> None:
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


def cloudtrail_lake_event(record: AnyAuditRecord, account: str, function_arn: str) -> dict[str, Any]:
    """The record as CloudTrail Lake's integration ``eventData`` (PutAuditEvents)."""
    header = {
        "version": "1.0",
        "userIdentity": {"type": "AWSLambda", "principalId": function_arn},
        "userAgent": "topokeeper",
        "eventSource": "topokeeper",
        "eventName": record.event_name,
        "eventTime": record.completed_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "UID": record.audit_id,
        "recipientAccountId": account,
    }
    if not isinstance(record, AuditRecord):
        return {**header, "requestParameters": {"clusterName": record.cluster_name}}
    return {
        **header,
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
