"""The reconcile function's SQS FIFO batch handling (topokeeper.wiring.fifo_batch), against the semantics it replaced:
Powertools' SqsFifoPartialProcessor(skip_group_on_error=True) with raise_on_entire_batch_failure off."""

from __future__ import annotations

import random
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from topokeeper.contract.errors import InputError, Retryable
from topokeeper.wiring.fifo_batch import process_fifo_batch


def _record(message_id: str, group: str | None) -> dict[str, Any]:
    attributes = {"ApproximateReceiveCount": "1"} | ({"MessageGroupId": group} if group is not None else {})
    return {"messageId": message_id, "receiptHandle": f"rh-{message_id}", "body": message_id, "attributes": attributes}


def _run(records: list[dict[str, Any]], failing: set[str]) -> tuple[list[str], list[str]]:
    """The bodies handled, in order, and the item failures, for a handler that raises on ``failing`` bodies."""
    handled: list[str] = []

    def handler(record: dict[str, Any]) -> None:
        handled.append(record["body"])
        if record["body"] in failing:
            raise Retryable(f"deferred: {record['body']}")

    response = process_fifo_batch({"Records": records}, handler)
    return handled, [failure["itemIdentifier"] for failure in response["batchItemFailures"]]


def _run_powertools(records: list[dict[str, Any]], failing: set[str]) -> tuple[list[str], list[str]]:
    handled: list[str] = []
    processor = SqsFifoPartialProcessor(skip_group_on_error=True)
    processor.raise_on_entire_batch_failure = False

    def handler(record: SQSRecord) -> None:
        handled.append(record.body)
        if record.body in failing:
            raise Retryable(f"deferred: {record.body}")

    response = process_partial_response(event={"Records": records}, record_handler=handler, processor=processor)
    return handled, [failure["itemIdentifier"] for failure in response["batchItemFailures"]]


def test_a_failed_message_fails_the_rest_of_its_group_unhandled_and_other_groups_go_on() -> None:
    records = [_record("a1", "A"), _record("b1", "B"), _record("a2", "A"), _record("b2", "B"), _record("a3", "A")]
    handled, failed = _run(records, failing={"a1"})
    assert handled == ["a1", "b1", "b2"]
    assert failed == ["a1", "a2", "a3"]


def test_a_group_fails_from_its_first_failure_on_not_before() -> None:
    records = [_record("a1", "A"), _record("a2", "A"), _record("a3", "A"), _record("b1", "B")]
    handled, failed = _run(records, failing={"a2"})
    assert handled == ["a1", "a2", "b1"]
    assert failed == ["a2", "a3"]


def test_every_message_deferred_is_item_failures_not_a_failed_invocation() -> None:
    records = [_record("a1", "A"), _record("b1", "B")]
    handled, failed = _run(records, failing={"a1", "b1"})
    assert handled == ["a1", "b1"]
    assert failed == ["a1", "b1"]


def test_a_message_without_a_group_fails_alone() -> None:
    records = [_record("x1", None), _record("x2", None), _record("a1", "A")]
    handled, failed = _run(records, failing={"x1"})
    assert handled == ["x1", "x2", "a1"]
    assert failed == ["x1"]


def test_a_batch_without_failures_reports_none() -> None:
    assert _run([_record("a1", "A"), _record("b1", "B")], failing=set()) == (["a1", "b1"], [])


@pytest.mark.parametrize("event", [{}, {"Records": []}, {"Records": "a1"}])
def test_an_event_without_records_is_refused_naming_the_field(event: dict[str, Any]) -> None:
    with pytest.raises(InputError, match="Records"):
        process_fifo_batch(event, lambda record: None)


def test_an_error_that_is_not_an_exception_is_not_swallowed() -> None:
    def interrupted(record: dict[str, Any]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        process_fifo_batch({"Records": [_record("a1", "A")]}, interrupted)


def test_random_batches_match_powertools_sqs_fifo_partial_processor_skipping_failed_groups() -> None:
    chance = random.Random(13)
    for _ in range(500):
        groups = ["A", "B", "C", None][: chance.randint(1, 4)]
        records = [_record(f"m{index}", chance.choice(groups)) for index in range(chance.randint(1, 10))]
        failing = {record["body"] for record in records if chance.random() < 0.3}
        assert _run(records, failing) == _run_powertools(records, failing), (records, failing)


def test_a_failure_that_is_no_deferral_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A deferral is routine (debug only); any other failure is an error the operator must see in the logs."""

    def handler(record: dict[str, Any]) -> None:
        if record["body"] == "deferred":
            raise Retryable("deferred 30s")
        raise KeyError("a defect")

    caplog.set_level("DEBUG", logger="topokeeper")
    process_fifo_batch({"Records": [_record("deferred", "a"), _record("broken", "b")]}, handler)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [(r.getMessage(), r.exc_info is not None) for r in errors] == [("record broken failed", True)]
    assert any(r.levelname == "DEBUG" and "deferred" in r.getMessage() for r in caplog.records)
