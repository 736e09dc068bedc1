"""The SQS FIFO work queue: one message group per cluster, so a cluster is never reconciled twice at
once while different clusters run in parallel."""

from __future__ import annotations

import hashlib
from typing import Any

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors, error_code
from topokeeper.contract.errors import Permanent
from topokeeper.contract.ports import ReconcileRequest

# SQS refuses a visibility timeout that reaches past 12 hours from the message's first receive. A
# reconcile defers for at most its delivery timeout (25 minutes) after a receive, so this cap leaves
# the rest of the 12 hours to the receives before it.
MAX_VISIBILITY_SECONDS = 6 * 3_600
# ChangeMessageVisibility on a handle that is no longer in flight: deleted, received again, or expired
# (SQS answers an expired handle with InvalidParameterValue).
_STALE_HANDLE_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
        "InvalidParameterValue",
    }
)


class SqsWorkQueue:
    def __init__(self, sqs: Any, queue_url: str, dead_letter_url: str | None = None) -> None:
        self._sqs = sqs
        self._url = queue_url
        self._dead_letter_url = dead_letter_url

    @aws_errors()
    def send(self, request: ReconcileRequest) -> None:
        self._sqs.send_message(
            QueueUrl=self._url,
            MessageBody=request.model_dump_json(),
            MessageGroupId=request.cluster,
            MessageDeduplicationId=request.deduplication_id,
        )

    @aws_errors()
    def defer(self, receipt_handle: str, seconds: float) -> None:
        """Hide a received message for ``seconds`` (one call: FIFO queues take no per-message delay); its
        FIFO group waits behind it."""
        timeout = min(MAX_VISIBILITY_SECONDS, max(1, round(seconds)))
        self._sqs.change_message_visibility(QueueUrl=self._url, ReceiptHandle=receipt_handle, VisibilityTimeout=timeout)

    @aws_errors()
    def resume(self, receipt_handle: str) -> None:
        """Make a deferred message visible now; a handle no longer in flight has nothing to resume."""
        try:
            self._sqs.change_message_visibility(QueueUrl=self._url, ReceiptHandle=receipt_handle, VisibilityTimeout=0)
        except ClientError as error:
            if error_code(error) not in _STALE_HANDLE_CODES:
                raise

    @aws_errors()
    def dead_letter(self, body: str, reason: str) -> None:
        """Park a message that can never succeed, with the reason, instead of retrying it."""
        if self._dead_letter_url is None:
            raise Permanent(f"no dead-letter queue configured for: {reason}")
        self._sqs.send_message(
            QueueUrl=self._dead_letter_url,
            MessageBody=body,
            MessageGroupId="malformed",
            MessageDeduplicationId=hashlib.sha256(body.encode()).hexdigest(),
            MessageAttributes={"reason": {"DataType": "String", "StringValue": reason[:1000]}},
        )
