"""Ingest: HyperPod, CloudTrail and EC2 events -> one reconcile request per changed cluster."""

from topokeeper.wiring.lambda_init import frozen_init

with frozen_init():
    import os
    from typing import Any

    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.utilities.parser import event_parser
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from topokeeper.contract.event_schemas import TopokeeperEvent
    from topokeeper.service.ingest import ingest
    from topokeeper.wiring.login_sync import install_login_host_identity, load_login_modules, sync_login_endpoints
    from topokeeper.wiring.runtime import lambda_runtime, load_adapters

    logger = Logger(service="topokeeper")
    load_adapters("ingest")
    load_login_modules(os.environ)


@logger.inject_lambda_context
@event_parser(model=TopokeeperEvent)
def lambda_handler(event: TopokeeperEvent, context: LambdaContext) -> dict[str, Any]:
    result = ingest(event, lambda_runtime().ingest_deps())
    logger.info("ingested", extra=result.model_dump(mode="json"))
    if result.cluster is not None:  # a node event of a cluster with a login endpoint: its targets follow now
        login = sync_login_endpoints(lambda_runtime(), os.environ, result.cluster)
        logger.info("login targets", extra=login.model_dump(mode="json"))
        # An EC2 login node's first running event: its host identity, sent once per launch (a failed send
        # raises after the target sync, so the retry, and at last the dead-letter queue, carries it).
        installed = install_login_host_identity(lambda_runtime(), os.environ, event)
        if installed is not None:
            logger.info("login host identity", extra=installed.model_dump(mode="json", by_alias=True))
        login.raise_failures()
    return result.model_dump(mode="json")
