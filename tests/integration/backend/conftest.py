"""The backend end to end: emulated AWS (moto server + the project's extensions), the stack's rules and
queues, the four real handlers, and a real slurmctld head node in a Debian chroot, in simulated time."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from topokeeper.adapters.aws import client
from topokeeper.sim.scenario import Scenario
from topokeeper.sim.world import World, running


def small_scenario(**cluster: Any) -> Scenario:
    """A controller, 8 p5 (two leaves of 4), one UltraServer of 18 p6e-gb200, 2 CPU nodes."""
    spec = {
        "name": "topo-test",
        "slurm_version": "26.05",
        "mode": "enforce",
        "channel": "ssm",
        "instance_groups": [
            {"name": "controller", "type": "ml.m5.xlarge", "count": 1, "role": "controller"},
            {
                "name": "p5",
                "type": "ml.p5.48xlarge",
                "count": 8,
                "partition": "ml-p5",
                "network": {"nodes_per_leaf": 4, "leaves_per_spine": 4},
            },
            {
                "name": "gb200",
                "type": "ml.p6e-gb200.36xlarge",
                "count": 18,
                "partition": "ml-p6e",
                "network": {"ultraserver_size": 18},
            },
            {"name": "cpu", "type": "ml.c6i.4xlarge", "count": 2, "partition": "cpu"},
        ],
        **cluster,
    }
    return Scenario.model_validate({"cluster": spec, "drift_alarm_periods": 1})


@pytest.fixture
def world_factory() -> Iterator[Callable[..., World]]:
    """Start worlds; each stops (head node by pid, emulator) when the test ends."""
    stack: list[Any] = []

    def make(scenario: Scenario | None = None, **options: Any) -> World:
        context = running(scenario or small_scenario(), **options)
        world = context.__enter__()
        stack.append(context)
        return world

    yield make
    while stack:
        stack.pop().__exit__(None, None, None)


def reconcile_batches(world: World) -> list[dict[str, Any]]:
    """Every SQS batch the reconcile function is invoked with from now on (each an event of ``Records``)."""
    batches: list[dict[str, Any]] = []
    reconcile = world.functions.handlers["reconcile"]

    def recorded(event: dict[str, Any], context: Any) -> Any:
        batches.append(event)
        return reconcile(event, context)

    world.functions.handlers["reconcile"] = recorded
    return batches


class AuditCapture:
    """UpdatePartitionTopology events as an EventBridge consumer receives them."""

    def __init__(self) -> None:
        sqs, events = client("sqs"), client("events")
        self.url = sqs.create_queue(QueueName="audit-capture")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="audit-capture", EventPattern=json.dumps({"source": ["topokeeper"]}))
        events.put_targets(Rule="audit-capture", Targets=[{"Id": "q", "Arn": arn}])

    def events(self) -> list[dict[str, Any]]:
        sqs = client("sqs")
        found = []
        while messages := sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10).get("Messages"):
            for message in messages:
                found.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])
        return found
