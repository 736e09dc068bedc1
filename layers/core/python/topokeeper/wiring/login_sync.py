"""Login target sync inside the ingest and drift functions, and the host identity installer the ingest function
sends to EC2 login nodes at launch: which clusters, with which adapters.

The stack names each login endpoint's target group in ``LOGIN_TARGET_GROUPS`` (JSON, cluster -> ARN);
without it (no cluster has a login endpoint) nothing here makes a call. A failing cluster does not stop
the others, nor the function's topology work: the handler raises the failures once that is done.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from topokeeper.adapters.aws import client
from topokeeper.contract.config import ClusterConfig, Orchestrator
from topokeeper.contract.constants import LOGIN_TARGET_GROUPS_ENV, RUN_SHELL_DOCUMENT, login_secret_names
from topokeeper.contract.errors import InputError, Retryable
from topokeeper.domain.models import empty_dict, empty_list

if TYPE_CHECKING:
    from topokeeper.contract.event_schemas import TopokeeperEvent
    from topokeeper.contract.ports import LoginNodeSource
    from topokeeper.service.login import LoginInstall
    from topokeeper.wiring.runtime import Runtime

# What syncing and installing run, when the stack gave some cluster a login endpoint (load_login_modules); imported
# where they are used, as without a login endpoint ingest and drift must not load them.
LOGIN_MODULES = (
    "topokeeper.adapters.elbv2",
    "topokeeper.adapters.login_nodes",
    "topokeeper.adapters.login_run_command",
    "topokeeper.login.install",
    "topokeeper.service.login",
)
# Twice the ingest function's timeout (30 s): an install claim older than this has no living holder.
INSTALL_CLAIM_LEASE = timedelta(minutes=1)


class LoginSyncReport(BaseModel):
    model_config = ConfigDict(frozen=True)
    synced: dict[str, dict[str, Any]] = Field(default_factory=empty_dict)
    failures: list[str] = Field(default_factory=empty_list)

    def raise_failures(self) -> None:
        if self.failures:
            raise Retryable(f"login target sync failed: {'; '.join(self.failures)}")


def login_target_groups(environ: Mapping[str, str]) -> dict[str, str]:
    text = environ.get(LOGIN_TARGET_GROUPS_ENV)
    if not text:
        return {}
    try:
        groups = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(LOGIN_TARGET_GROUPS_ENV, f"not JSON: {error}") from None
    if not isinstance(groups, dict) or not all(isinstance(v, str) for v in groups.values()):
        raise InputError(LOGIN_TARGET_GROUPS_ENV, "expected an object of cluster name -> target group ARN")
    return groups


def load_login_modules(environ: Mapping[str, str]) -> None:
    """At init (the ingest and drift handlers), the modules of the login endpoints the stack has, if any: every
    invocation syncs them; without one, nothing here runs past ``login_target_groups``."""
    if environ.get(LOGIN_TARGET_GROUPS_ENV):
        for module in LOGIN_MODULES:
            importlib.import_module(module)


def sync_login_endpoints(runtime: Runtime, environ: Mapping[str, str], cluster: str | None = None) -> LoginSyncReport:
    """Sync ``cluster`` (a name or ARN), or every cluster with a login endpoint when None."""
    groups = login_target_groups(environ)
    if cluster is not None:
        chosen = runtime.settings.cluster(cluster)
        groups = {chosen.name: groups[chosen.name]} if chosen is not None and chosen.name in groups else {}
    synced: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for name, target_group in sorted(groups.items()):
        from topokeeper.adapters.elbv2 import ElbTargetGroup  # noqa: PLC0415 - see LOGIN_MODULES
        from topokeeper.adapters.login_nodes import DynamoLoginLedger  # noqa: PLC0415 - see LOGIN_MODULES
        from topokeeper.service.login import sync_login_targets  # noqa: PLC0415 - see LOGIN_MODULES

        try:
            result = sync_login_targets(
                cluster=name,
                target_group_arn=target_group,
                nodes=_login_nodes(runtime.settings.cluster(name)),
                targets=ElbTargetGroup(client("elbv2")),
                ledger=DynamoLoginLedger(client("dynamodb"), runtime.env.table),
                # The audit trail every record goes through: the history table, the bus, the log.
                audit=runtime.audit,
                metrics=runtime.metrics,
                clock=runtime.clock,
            )
        except Exception as error:  # reported per cluster; the handler raises after its other work
            failures.append(f"{name}: {type(error).__name__}: {error}")
            continue
        synced[name] = {"registered": list(result.registered), "deregistered": list(result.deregistered)}
    return LoginSyncReport(synced=synced, failures=failures)


def _login_nodes(cluster: ClusterConfig | None) -> LoginNodeSource:
    from topokeeper.adapters.login_nodes import Ec2LoginNodes, HyperPodLoginNodes  # noqa: PLC0415 - see LOGIN_MODULES

    if cluster is not None and cluster.orchestrator is Orchestrator.EC2:
        return Ec2LoginNodes(client("ec2"), cluster.ec2.login_tag)
    return HyperPodLoginNodes(client("sagemaker"), client("s3"))


def host_identity_secret_arn(cluster: str, target_group_arn: str) -> tuple[str, str]:
    """The host identity secret's ARN (without Secrets Manager's random suffix, which GetSecretValue accepts) and
    region: the secret lives in the stack's account and region, which the endpoint's target group ARN names."""
    fields = target_group_arn.split(":")
    if len(fields) < 6 or fields[0] != "arn" or fields[2] != "elasticloadbalancing":
        raise InputError(LOGIN_TARGET_GROUPS_ENV, f"{cluster}: not a target group ARN: {target_group_arn!r}")
    partition, region, account = fields[1], fields[3], fields[4]
    return f"arn:{partition}:secretsmanager:{region}:{account}:secret:{login_secret_names(cluster)[0]}", region


def install_login_host_identity(
    runtime: Runtime, environ: Mapping[str, str], event: TopokeeperEvent
) -> LoginInstall | None:
    """On an EC2 instance's ``running`` event: the installer to it when it is a login node of an EC2 cluster with a
    login endpoint (its login tag holds the cluster's name), once per launch. None for any other event."""
    # Drift does not load the event models.
    from topokeeper.contract.event_schemas import EC2_STATE_DETAIL_TYPE, Ec2StateDetail  # noqa: PLC0415

    if event.source != "aws.ec2" or event.detail_type != EC2_STATE_DETAIL_TYPE:
        return None
    detail = Ec2StateDetail.model_validate(event.detail)
    groups = login_target_groups(environ)
    clusters = [c for c in runtime.settings.clusters if c.orchestrator is Orchestrator.EC2 and c.name in groups]
    if not clusters:
        return None
    from topokeeper.adapters.login_nodes import launched_instance  # noqa: PLC0415 - see LOGIN_MODULES
    from topokeeper.service.login import EC2_RUNNING  # noqa: PLC0415 - see LOGIN_MODULES

    if detail.state != EC2_RUNNING:
        return None
    instance = launched_instance(client("ec2"), detail.instance_id)
    if instance is None:  # not known to DescribeInstances yet: no tags to tell whose it is
        return None
    for cluster in clusters:
        if instance.tags.get(cluster.ec2.login_tag) != cluster.name:
            continue
        from topokeeper.adapters.login_nodes import DynamoLoginInstallLedger  # noqa: PLC0415 - see LOGIN_MODULES
        from topokeeper.adapters.login_run_command import RunCommandInstaller  # noqa: PLC0415 - see LOGIN_MODULES
        from topokeeper.login.install import install_script  # noqa: PLC0415 - see LOGIN_MODULES
        from topokeeper.service.login import install_host_identity_at_launch  # noqa: PLC0415 - see LOGIN_MODULES

        secret_arn, region = host_identity_secret_arn(cluster.name, groups[cluster.name])
        return install_host_identity_at_launch(
            cluster=cluster.name,
            login_tag=cluster.ec2.login_tag,
            instance=instance,
            document_name=RUN_SHELL_DOCUMENT,
            script=install_script(secret_arn, region),
            sender=RunCommandInstaller(client("ssm"), time.sleep),
            ledger=DynamoLoginInstallLedger(client("dynamodb"), runtime.env.table, INSTALL_CLAIM_LEASE),
            audit=runtime.audit,
            clock=runtime.clock,
        )
    return None
