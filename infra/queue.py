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
from topokeeper.contract import stack_spec as spec

_RETENTION = Duration.seconds(spec.DEAD_LETTER_RETENTION_SECONDS)


class Queues(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, key: DataKey) -> None:
        super().__init__(scope, construct_id)
        self._key = key
        encryption: QueueEncryption = {
            "encryption": sqs.QueueEncryption.KMS,
            "encryption_master_key": key.key,
            "enforce_ssl": True,
        }
        self.work_dlq = sqs.Queue(
            self,
            spec.WORK_DLQ,
            fifo=spec.DEAD_LETTER_QUEUES_FIFO[spec.WORK_DLQ],
            retention_period=_RETENTION,
            **encryption,
        )
        # One message group per cluster: reconciles of a cluster never overlap or reorder. Senders set
        # MessageDeduplicationId themselves (cluster, generation, reason): no content-based deduplication.
        self.work = sqs.Queue(
            self,
            "Work",
            fifo=True,
            visibility_timeout=Duration.seconds(spec.WORK_VISIBILITY_TIMEOUT_SECONDS),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.work_dlq, max_receive_count=spec.WORK_MAX_RECEIVE_COUNT),
            **encryption,
        )
        # Standard, not FIFO: EventBridge and Scheduler dead-letter only into standard queues. It also
        # receives the events that ingest, result and drift failed on after Lambda's async retries.
        self.event_dlq = sqs.Queue(self, spec.EVENT_DLQ, retention_period=_RETENTION, **encryption)
        acknowledge(
            self.event_dlq,
            "SQS3",
            "It is a dead-letter queue: of the EventBridge targets, the drift schedule and the functions' "
            "asynchronous invocations. cdk-nag only recognises DLQs named in another queue's RedrivePolicy.",
        )

    @property
    def dead_letter_queues(self) -> dict[str, sqs.IQueue]:
        return {spec.WORK_DLQ: self.work_dlq, spec.EVENT_DLQ: self.event_dlq}

    def grant_send_work(self, role: iam.IRole) -> None:
        self._grant_send(role, self.work)

    def grant_send_work_dead_letters(self, role: iam.IRole) -> None:
        self._grant_send(role, self.work_dlq)

    def grant_send_event_dead_letters(self, role: iam.IRole) -> None:
        self._grant_send(role, self.event_dlq)

    def grant_resume_work(self, role: iam.IRole) -> None:
        """A delivery's result makes the reconcile message deferred behind it visible at once."""
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["sqs:ChangeMessageVisibility"], resources=[self.work.queue_arn])
        )

    def grant_consume_work(self, role: iam.IRole) -> None:
        """What the reconcile function's SQS event source mapping calls with the function's role."""
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[
                    "sqs:ReceiveMessage",
                    "sqs:ChangeMessageVisibility",
                    "sqs:GetQueueUrl",
                    "sqs:DeleteMessage",
                    "sqs:GetQueueAttributes",
                ],
                resources=[self.work.queue_arn],
            )
        )
        self._key.grant_use(role, "sqs", write=False)

    def _grant_send(self, role: iam.IRole, queue: sqs.Queue) -> None:
        role.add_to_principal_policy(iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[queue.queue_arn]))
        self._key.grant_use(role, "sqs", write=True)


class QueueEncryption(TypedDict):
    """The settings every queue shares, typed so that ``**`` keeps each one's type."""

    encryption: sqs.QueueEncryption
    encryption_master_key: kms.IKey
    enforce_ssl: bool
