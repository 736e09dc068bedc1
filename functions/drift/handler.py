"""Drift: on a schedule, verify every managed cluster's live topology and its plan against AWS."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from topokeeper.runtime import lambda_runtime
from topokeeper.service.drift import DriftRequest, check_requested

logger = Logger(service="topokeeper")


@logger.inject_lambda_context
@event_parser(model=DriftRequest)
def lambda_handler(event: DriftRequest, context: LambdaContext) -> list[dict[str, Any]]:
    reports = [report.model_dump(mode="json") for report in check_requested(event, lambda_runtime().drift_deps())]
    logger.info("drift", extra={"reports": reports})
    return reports
