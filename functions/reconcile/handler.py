"""Reconcile: SQS FIFO reconcile requests -> facts -> plan -> delivery when the content hash changed."""

from topokeeper.wiring.lambda_init import frozen_init

with frozen_init():
    from typing import Any

    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from topokeeper.contract.errors import Retryable
    from topokeeper.service.controller import newest_generations, process_message, verify_managed_updates
    from topokeeper.wiring.fifo_batch import PartialBatchResponse, process_fifo_batch
    from topokeeper.wiring.runtime import lambda_runtime, load_adapters

    logger = Logger(service="topokeeper")
    load_adapters("reconcile")

# An SSM verify waits up to 120 s for the head node's answer (topokeeper.adapters.ssm_channel).
VERIFY_BUDGET_MILLIS = 130_000


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialBatchResponse:
    deps = lambda_runtime().reconcile_deps(context.get_remaining_time_in_millis() / 1000)
    newest = newest_generations(record.get("body", "") for record in event.get("Records", []))

    def record_handler(record: dict[str, Any]) -> None:
        report = process_message(record["body"], record["receiptHandle"], deps, newest)
        logger.info(
            "reconciled", extra=report.model_dump(mode="json") if report else {"malformed": record["messageId"]}
        )
        if report is not None and report.defer_seconds is not None:
            # A batch item failure keeps the message in the queue, hidden for the time process_message set.
            raise Retryable(f"deferred {report.defer_seconds:.0f}s: {report.reason}")
        if report is None or not report.managed_updates:
            return
        if context.get_remaining_time_in_millis() < VERIFY_BUDGET_MILLIS:
            logger.warning("no time left to verify a managed topology update now; the scheduled check will")
            return
        try:
            verified = verify_managed_updates(report, deps)
        except Exception:  # the message is reconciled; the scheduled drift check verifies later
            logger.exception("verify after a managed topology update failed")
        else:
            if verified is not None:
                logger.info("verified", extra=verified.model_dump(mode="json"))

    # A failed message stops the rest of its cluster's group in this batch; other clusters go on. A deferred
    # message is a batch item failure by design, not an error: the invocation never fails for its records.
    return process_fifo_batch(event, record_handler)
