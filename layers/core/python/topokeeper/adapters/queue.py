"""The SQS FIFO work queue: one message group per cluster, so a cluster is never reconciled twice at
once while different clusters run in parallel."""

from __future__ import annotations

import hashlib
from typing import Any

from topokeeper.events import ReconcileRequest

# SQS allows 12 hours counted from the first receive and refuses more; reconcile defers for minutes at most.
MAX_VISIBILITY_SECONDS = 3_600


class SqsWorkQueue:
    def __init__(self, sqs: Any, queue_url: str, dead_letter_url: str | None = None) -> None:
        self._sqs = sqs
        self._url = queue_url
        self._dead_letter_url = dead_letter_url

    def send(self, request: ReconcileRequest) -> None:
        self._sqs.send_message(
            QueueUrl=self._url,
            MessageBody=request.model_dump_json(),
            MessageGroupId=request.cluster,
            MessageDeduplicationId=request.deduplication_id,
        )

    def defer(self, receipt_handle: str, seconds: float) -> None:
        """Hide a received message for ``seconds``; its FIFO group waits behind it."""
        timeout = min(MAX_VISIBILITY_SECONDS, max(1, round(seconds)))
        self._sqs.change_message_visibility(QueueUrl=self._url, ReceiptHandle=receipt_handle, VisibilityTimeout=timeout)

    def dead_letter(self, body: str, reason: str) -> None:
        """Park a message that can never succeed, with the reason, instead of retrying it."""
        if self._dead_letter_url is None:
            raise RuntimeError(f"no dead-letter queue configured for: {reason}")
        self._sqs.send_message(
            QueueUrl=self._dead_letter_url,
            MessageBody=body,
            MessageGroupId="malformed",
            MessageDeduplicationId=hashlib.sha256(body.encode()).hexdigest(),
            MessageAttributes={"reason": {"DataType": "String", "StringValue": reason[:1000]}},
        )
