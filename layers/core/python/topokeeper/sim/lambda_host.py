"""The stack's four functions, run in this process as Lambda runs them.

The handlers are ``functions/<name>/handler.py``, exactly the files the stack deploys. They live beside the
package in a source checkout (``functions/`` at the repository root); from an installed package, point
``$TOPOKEEPER_FUNCTIONS_DIR`` at that directory.

Invocation follows the stack's wiring: EventBridge rules deliver to inbox queues (moto cannot invoke a Lambda),
drained into the ingest and result handlers as asynchronous invocations; the work queue is drained into reconcile
as Lambda's SQS event source does (batches of up to 10, partial batch failures come back after the queue's
visibility timeout, deferrals when the function asked).
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import inspect
import json
import os
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moto.sqs.models import sqs_backends

from topokeeper.adapters.aws import client
from topokeeper.adapters.queue import SqsWorkQueue
from topokeeper.contract import stack_spec as spec
from topokeeper.sim.slurm_chroot import HarnessError

if TYPE_CHECKING:
    from topokeeper.sim.world import World

FUNCTIONS_DIR_VARIABLE = "TOPOKEEPER_FUNCTIONS_DIR"
_SQS_DEFAULT_VISIBILITY_TIMEOUT = 30
# layers/core/python/topokeeper/sim/lambda_host.py -> the repository root.
_CHECKOUT_FUNCTIONS_DIR = Path(__file__).resolve().parents[5] / "functions"
Handler = Callable[[Any, Any], Any]


def functions_dir() -> Path:
    """Where the handlers are: ``$TOPOKEEPER_FUNCTIONS_DIR``, else the source checkout's ``functions/``."""
    configured = os.environ.get(FUNCTIONS_DIR_VARIABLE)
    directory = Path(configured) if configured else _CHECKOUT_FUNCTIONS_DIR
    missing = [name for name in spec.FUNCTION_NAMES if not (directory / name / "handler.py").is_file()]
    if missing:
        where = f"${FUNCTIONS_DIR_VARIABLE}={configured}" if configured else f"{directory} (not a source checkout?)"
        raise HarnessError(
            f"the simulator runs the stack's Lambda handlers, functions/<name>/handler.py, and {where} lacks "
            f"{', '.join(missing)}: run it from a topokeeper source checkout, or set ${FUNCTIONS_DIR_VARIABLE} "
            "to the checkout's functions/ directory"
        )
    return directory


def load_handler(name: str, directory: Path | None = None) -> Handler:
    """``functions/<name>/handler.py``'s ``lambda_handler``, exactly as the stack deploys it."""
    path = (directory or functions_dir()) / name / "handler.py"
    module_spec = importlib.util.spec_from_file_location(f"topokeeper_function_{name}", path)
    if module_spec is None or module_spec.loader is None:
        raise HarnessError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    finally:
        # A handler imports with the collector off and freezes what its init made (Lambda's execution
        # environment keeps it for good); in this long-lived process the collector goes on as before, even
        # when the import failed halfway.
        gc.unfreeze()
        gc.enable()
    handler: Handler = module.lambda_handler
    return handler


class FunctionTimedOut(HarnessError):
    """An invocation ran longer than its function's timeout in simulated time: Lambda would have killed it
    part way, so the run's figures would not hold. Fails the run (nothing catches it as a function error)."""


@dataclass
class LambdaContext:
    function_name: str
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = ""
    log_group_name: str = ""
    log_stream_name: str = ""

    timeout_millis: int = 300_000
    elapsed_seconds: Callable[[], float] = lambda: 0.0  # simulated time since the invocation started

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self.timeout_millis - int(self.elapsed_seconds() * 1000))


class SimWorkQueue(SqsWorkQueue):
    """The real SQS adapter; a deferral also schedules the message's return in simulated time."""

    def __init__(self, host: LambdaHost, sqs: Any, queue_url: str, dead_letter_url: str) -> None:
        super().__init__(sqs, queue_url, dead_letter_url)
        self._host = host

    def defer(self, receipt_handle: str, seconds: float) -> None:
        self._host.deferred[receipt_handle] = seconds

    def resume(self, receipt_handle: str) -> None:
        super().resume(receipt_handle)
        # Its delivery's result resumed the message: the scheduled return must not keep the world busy.
        scheduled = self._host.returns.pop(receipt_handle, None)
        if scheduled is not None:
            self._host.discard_return(scheduled)


class LambdaHost:
    """Runs the handlers for the world; ``drain()`` handles whatever is waiting and returns how much."""

    def __init__(self, world: World) -> None:
        self._world = world
        directory = functions_dir()
        self.handlers = {name: load_handler(name, directory) for name in spec.FUNCTION_NAMES}
        self._observe_managed_verify()
        self.deferred: dict[str, float] = {}  # receipt handle -> seconds, filled by SimWorkQueue.defer
        self.returns: dict[str, Callable[[], None]] = {}  # receipt handle -> its scheduled return to the queue
        # AWS calls made by asynchronous invocations that Lambda would have run at the same time as another
        # of the same drain: the world charges simulated time for the longest invocation only.
        self.concurrent_calls = 0

    def _observe_managed_verify(self) -> None:
        """The reconcile function's verify after HyperPod's own topology update only logs its report (which
        the simulator's quiet log level drops): hand the report to the world's timeline as well."""
        namespace = inspect.unwrap(self.handlers[spec.RECONCILE]).__globals__
        verify = namespace["verify_managed_updates"]

        def observed(reconciled: Any, deps: Any) -> Any:
            report = verify(reconciled, deps)
            if report is not None:
                self._world.verified(report)
            return report

        namespace["verify_managed_updates"] = observed

    def work_queue(self) -> SimWorkQueue:
        stack = self._world.stack
        return SimWorkQueue(self, client("sqs"), stack.queue_url, stack.dead_letter_url)

    def invoke(self, function: str, event: Any) -> Any:
        """Run one invocation; its simulated time (its waits, and whatever the world ran meanwhile) must stay
        within the function's timeout, which its context counts down."""
        clock, timeout = self._world.clock, spec.FUNCTION_TIMEOUT_SECONDS[function]
        started = clock.monotonic()

        def elapsed() -> float:
            return clock.monotonic() - started

        context = LambdaContext(function, timeout_millis=timeout * 1000, elapsed_seconds=elapsed)
        try:
            with self.acting_as(function):
                return self.handlers[function](event, context)
        finally:
            if elapsed() > timeout:
                raise FunctionTimedOut(
                    f"the {function} function ran {elapsed():.1f} s of simulated time from t={started:.1f} s, over "
                    f"its {timeout} s timeout: Lambda would have killed it"
                )

    def acting_as(self, function: str) -> AbstractContextManager[None]:
        """Requests made meanwhile carry ``function``'s role credentials, as Lambda gives each function its own."""
        return self._world.emulator.iam.acting_as(self._world.iam.function_roles[function])

    def drain(self) -> int:
        return self._drain_inbox(spec.INGEST) + self._drain_inbox(spec.RESULT) + self._drain_work()

    def _queue_backend(self) -> Any:
        """moto's in-process SQS, for what AWS does without an API call of the account."""
        emulator = self._world.emulator
        return sqs_backends[emulator.account_id][emulator.region]

    def _has_visible_messages(self, queue_url: str) -> bool:
        """A peek into moto's in-process queue, so an idle loop costs no ReceiveMessage requests (which the
        emulator would count and charge simulated time for). moto has no public way to look without a request."""
        return bool(self._queue_backend().get_queue(queue_url.rsplit("/", 1)[-1]).approximate_number_of_messages)

    def _drain_inbox(self, function: str) -> int:
        """EventBridge invokes the function with each event; the inbox queue only stands in for that invocation
        (moto cannot invoke a Lambda), which AWS makes without an API call of the account. So the inbox is read
        from moto's backend, neither counted as a request nor charged simulated time."""
        world, backend = self._world, self._queue_backend()
        inbox = world.stack.inboxes[function].rsplit("/", 1)[-1]
        handled = 0
        calls = world.emulator.calls
        spent: list[int] = []
        # Deleted as soon as received, so the visibility timeout (SQS's default) never runs out.
        while messages := backend.receive_message(inbox, 10, 0, _SQS_DEFAULT_VISIBILITY_TIMEOUT):
            for message in messages:
                backend.delete_message(inbox, message.receipt_handle)
            for message in messages:
                event = json.loads(message.body)
                deliveries = world.event_filter(event) if function == spec.INGEST else [event]
                for delivery in deliveries:
                    handled += 1
                    before = calls.total
                    self._invoke_async(function, delivery)
                    spent.append(calls.total - before)
        # Events that wait in the inbox together are handled by concurrent invocations, not one after another.
        self.concurrent_calls += sum(spent) - max(spent, default=0)
        return handled

    def _invoke_async(self, function: str, event: dict[str, Any]) -> None:
        try:
            result = self.invoke(function, event)
        except FunctionTimedOut:
            raise
        except Exception as error:  # an async invocation that fails: Lambda would retry, then dead-letter
            self._world.note(
                "error", f"{function} failed on {event.get('detail-type')}: {type(error).__name__}: {error}"
            )
            self._send_to_on_failure_destination(function, event, error)
            return
        self._world.handled(function, event, result)

    def _send_to_on_failure_destination(self, function: str, event: dict[str, Any], error: Exception) -> None:
        """What Lambda does with an asynchronous event that still fails: it sends an invocation record to the
        function's on-failure destination (the event dead-letter queue) with the function's role. The simulator
        runs each invocation once, where Lambda would have retried it first."""
        world = self._world
        record = {
            "version": "1.0",
            "timestamp": world.now().isoformat(),
            "requestContext": {
                "requestId": str(uuid.uuid4()),
                "functionArn": f"arn:aws:lambda:{world.emulator.region}:{world.emulator.account_id}:function:"
                f"topokeeper-{function}:$LATEST",
                "condition": "RetriesExhausted",
                "approximateInvokeCount": 1,
            },
            "requestPayload": event,
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "responsePayload": {"errorMessage": str(error), "errorType": type(error).__name__},
        }
        with self.acting_as(function):
            client("sqs").send_message(
                QueueUrl=world.stack.dead_letter_urls[spec.EVENT_DLQ], MessageBody=json.dumps(record, default=str)
            )

    def _drain_work(self) -> int:
        world = self._world
        queue_url = world.stack.queue_url
        if not self._has_visible_messages(queue_url):
            return 0
        sqs = client("sqs")
        with self.acting_as(spec.RECONCILE):  # Lambda's event source polls with the function's role
            response = sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=10,
                VisibilityTimeout=43_200,  # the host decides when a failed or deferred message returns
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        messages = response.get("Messages", [])
        if not messages:
            return 0
        event = {"Records": [_sqs_record(message, queue_url, world.emulator.region) for message in messages]}
        self.deferred.clear()
        result = self.invoke("reconcile", event)
        failed = {item["itemIdentifier"] for item in result.get("batchItemFailures", [])}
        with self.acting_as(spec.RECONCILE):
            _delete(sqs, queue_url, [m for m in messages if m["MessageId"] not in failed])
        for message in messages:
            receipt = message["ReceiptHandle"]
            if message["MessageId"] not in failed:
                continue
            # A failed message comes back when the queue's visibility timeout ends, a deferred one when asked.
            delay = self.deferred.get(receipt, spec.WORK_VISIBILITY_TIMEOUT_SECONDS)
            self.returns[receipt] = functools.partial(self._make_visible, receipt)
            world.agenda.add(world.clock.monotonic() + delay, self.returns[receipt])
        return len(messages)

    def discard_return(self, scheduled: Callable[[], None]) -> None:
        self._world.agenda.discard(scheduled)

    def _make_visible(self, receipt: str) -> None:
        self.returns.pop(receipt, None)
        # What SQS does when the visibility timeout ends: no request of the account's.
        client("sqs").change_message_visibility(
            QueueUrl=self._world.stack.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
        )


def _delete(sqs: Any, queue_url: str, messages: list[dict[str, Any]]) -> None:
    """What Lambda's event source does with the messages a batch handled."""
    if messages:
        entries = [{"Id": str(index), "ReceiptHandle": m["ReceiptHandle"]} for index, m in enumerate(messages)]
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)


def _sqs_record(message: dict[str, Any], queue_url: str, region: str) -> dict[str, Any]:
    """A received message as Lambda's SQS event source hands it to the function."""
    attributes = message.get("Attributes", {})
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": {
            "ApproximateReceiveCount": attributes.get("ApproximateReceiveCount", "1"),
            "SentTimestamp": attributes.get("SentTimestamp", "0"),
            "SenderId": attributes.get("SenderId", "simulator"),
            "ApproximateFirstReceiveTimestamp": attributes.get("ApproximateFirstReceiveTimestamp", "0"),
            "MessageGroupId": attributes.get("MessageGroupId"),
            "MessageDeduplicationId": attributes.get("MessageDeduplicationId"),
            "SequenceNumber": attributes.get("SequenceNumber"),
        },
        "messageAttributes": {},
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{region}:123456789012:{queue_url.rsplit('/', 1)[-1]}",
        "awsRegion": region,
    }
