"""An SQS FIFO batch as the reconcile function handles it: a partial batch response, one message group at a time.

The semantics are those of Powertools' ``SqsFifoPartialProcessor(skip_group_on_error=True)`` with
``raise_on_entire_batch_failure = False`` (what the function used until its import cost counted: that utility
loads asyncio and the data classes of every event source; tests/unit/test_fifo_batch.py checks this against it):

- records are handled in the order Lambda gives them;
- a record whose handler raises is an item failure, and so is every later record of its message group in this
  batch, without being handled (FIFO order within a group holds); other groups go on;
- a record without a group fails alone;
- the invocation itself never fails for its records, even when all of them do (a deferral is an item failure by
  design), so Lambda's event source returns only the failed messages to the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from topokeeper.contract.errors import InputError, Retryable

log = logging.getLogger(__name__)


class ItemFailure(TypedDict):
    itemIdentifier: str


class PartialBatchResponse(TypedDict):
    batchItemFailures: list[ItemFailure]


def process_fifo_batch(
    event: Mapping[str, Any], record_handler: Callable[[dict[str, Any]], object]
) -> PartialBatchResponse:
    """Run ``record_handler`` on each of the event's SQS records; the response names the messages that failed."""
    records = event.get("Records")
    if not records or not isinstance(records, list):
        raise InputError("Records", "an SQS batch event carries a non-empty list of records")
    failed_groups: set[str] = set()
    failed: list[dict[str, Any]] = []
    for record in records:
        group = record.get("attributes", {}).get("MessageGroupId")
        if group not in failed_groups:
            try:
                record_handler(record)
                continue
            except Exception as error:  # any failure of one message is that message's: the batch goes on
                if isinstance(error, Retryable):  # a deferral or a retry: the message comes back
                    log.debug("record %s failed: %r", record.get("messageId"), error)
                else:
                    log.exception("record %s failed", record.get("messageId"))
                if group:
                    failed_groups.add(group)
        failed.append(record)
    return {"batchItemFailures": [{"itemIdentifier": record["messageId"]} for record in failed]}
