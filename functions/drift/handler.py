"""Drift: on a schedule, verify every managed cluster's live topology and its plan against AWS."""

from topokeeper.wiring.lambda_init import frozen_init

with frozen_init():
    import os
    from typing import Any

    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.utilities.parser import event_parser
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from topokeeper.service.controller import DriftRequest, check_requested
    from topokeeper.wiring.login_sync import load_login_modules, sync_login_endpoints
    from topokeeper.wiring.runtime import lambda_runtime, load_adapters

    logger = Logger(service="topokeeper")
    load_adapters("drift")
    load_login_modules(os.environ)


@logger.inject_lambda_context
@event_parser(model=DriftRequest)
def lambda_handler(event: DriftRequest, context: LambdaContext) -> list[dict[str, Any]]:
    # Login targets are synced in both modes, and before the topology check so that its failures cannot skip it.
    login = sync_login_endpoints(lambda_runtime(), os.environ, event.cluster)
    logger.info("login targets", extra=login.model_dump(mode="json"))
    reports = [report.model_dump(mode="json") for report in check_requested(event, lambda_runtime().drift_deps())]
    logger.info("drift", extra={"reports": reports})
    login.raise_failures()
    return reports
