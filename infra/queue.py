"""The queues: the FIFO work queue from ingest (and drift) to reconcile, and the dead-letter queues."""

from __future__ import annotations

from typing import TypedDict

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.encryption import DataKey
from infra.nag import acknowledge
from topokeeper.events import WORK_QUEUE_MAX_RECEIVES

# Six times the consumer's timeout, as Lambda recommends for SQS event sources.
VISIBILITY_TIMEOUT_FACTOR = 6
_RETENTION = Duration.days(14)


class Queues(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, key: DataKey, reconcile_timeout: Duration) -> None:
        super().__init__(scope, construct_id)
        self._key = key
        encryption: QueueEncryption = {
            "encryption": sqs.QueueEncryption.KMS,
            "encryption_master_key": key.key,
            "enforce_ssl": True,
        }
        self.work_dlq = sqs.Queue(self, "WorkDlq", fifo=True, retention_period=_RETENTION, **encryption)
        # One message group per cluster: reconciles of a cluster never overlap or reorder. Senders set
        # MessageDeduplicationId themselves (cluster, generation, reason).
        self.work = sqs.Queue(
            self,
            "Work",
            fifo=True,
            visibility_timeout=Duration.seconds(VISIBILITY_TIMEOUT_FACTOR * reconcile_timeout.to_seconds()),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.work_dlq, max_receive_count=WORK_QUEUE_MAX_RECEIVES),
            **encryption,
        )
        # Standard, not FIFO: EventBridge and Scheduler dead-letter only into standard queues. It also
        # receives the events that ingest, result and drift failed on after Lambda's async retries.
        self.event_dlq = sqs.Queue(self, "EventDlq", retention_period=_RETENTION, **encryption)
        acknowledge(
            self.event_dlq,
            "SQS3",
            "It is a dead-letter queue: of the EventBridge targets, the drift schedule and the functions' "
            "asynchronous invocations. cdk-nag only recognises DLQs named in another queue's RedrivePolicy.",
        )

    @property
    def dead_letter_queues(self) -> dict[str, sqs.IQueue]:
        return {"WorkDlq": self.work_dlq, "EventDlq": self.event_dlq}

    def grant_send_work(self, role: iam.IRole) -> None:
        self._grant_send(role, self.work)

    def grant_send_work_dead_letters(self, role: iam.IRole) -> None:
        self._grant_send(role, self.work_dlq)

    def grant_send_event_dead_letters(self, role: iam.IRole) -> None:
        self._grant_send(role, self.event_dlq)

    def _grant_send(self, role: iam.IRole, queue: sqs.Queue) -> None:
        role.add_to_principal_policy(iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[queue.queue_arn]))
        self._key.grant_use(role, "sqs", write=True)


class QueueEncryption(TypedDict):
    """The settings every queue shares, typed so that ``**`` keeps each one's type."""

    encryption: sqs.QueueEncryption
    encryption_master_key: kms.IKey
    enforce_ssl: bool
