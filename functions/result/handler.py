"""Result: SSM command status and head-node agent reports -> state, UpdatePartitionTopology audit, metrics."""

from topokeeper.wiring.lambda_init import frozen_init

with frozen_init():
    from typing import Any

    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.utilities.parser import event_parser
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from topokeeper.contract.event_schemas import TopokeeperEvent
    from topokeeper.service.result import record_result
    from topokeeper.wiring.runtime import lambda_runtime, load_adapters

    logger = Logger(service="topokeeper")
    load_adapters("result")


@logger.inject_lambda_context
@event_parser(model=TopokeeperEvent)
def lambda_handler(event: TopokeeperEvent, context: LambdaContext) -> dict[str, Any]:
    report = record_result(event, lambda_runtime().result_deps())
    # A refused report is someone reporting on a cluster that is not theirs: a warning, with the reason.
    log = logger.warning if report.status == "refused" else logger.info
    log("result", extra=report.model_dump(mode="json"))
    return report.model_dump(mode="json")
