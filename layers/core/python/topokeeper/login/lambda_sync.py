"""Login target sync inside the ingest and drift functions: which clusters, with which adapters.

The stack names each login endpoint's target group in ``LOGIN_TARGET_GROUPS`` (JSON, cluster -> ARN);
without it (no cluster has a login endpoint) nothing here makes a call. A failing cluster does not stop
the others, nor the function's topology work: the handler raises the failures once that is done.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from topokeeper.adapters.aws import client
from topokeeper.adapters.elbv2 import ElbTargetGroup
from topokeeper.adapters.login_nodes import DynamoLoginLedger, HyperPodLoginNodes
from topokeeper.errors import InputError, Retryable
from topokeeper.service.login import sync_login_targets

if TYPE_CHECKING:
    from topokeeper.runtime import Runtime

LOGIN_TARGET_GROUPS_ENV = "LOGIN_TARGET_GROUPS"
# The longest target group ARN: arn:<partition>:elasticloadbalancing:<region>:<account>:targetgroup/<32>/<16 hex>.
MAX_TARGET_GROUP_ARN_BYTES = 128


def login_environment_bytes(clusters: list[str]) -> int:
    """The most ``LOGIN_TARGET_GROUPS`` can take in a function's environment (its ARNs are known only at deploy)."""
    if not clusters:
        return 0
    longest = {name: "x" * MAX_TARGET_GROUP_ARN_BYTES for name in clusters}
    return len(LOGIN_TARGET_GROUPS_ENV) + len(json.dumps(longest).encode())


class LoginSyncReport(BaseModel):
    model_config = ConfigDict(frozen=True)
    synced: dict[str, dict[str, Any]] = Field(default_factory=dict)
    failures: list[str] = Field(default_factory=list)

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


def sync_login_endpoints(runtime: Runtime, environ: Mapping[str, str], cluster: str | None = None) -> LoginSyncReport:
    """Sync ``cluster`` (a name or ARN), or every cluster with a login endpoint when None."""
    groups = login_target_groups(environ)
    if cluster is not None:
        chosen = runtime.settings.cluster(cluster)
        groups = {chosen.name: groups[chosen.name]} if chosen is not None and chosen.name in groups else {}
    synced: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for name, target_group in sorted(groups.items()):
        try:
            result = sync_login_targets(
                cluster=name,
                target_group_arn=target_group,
                nodes=HyperPodLoginNodes(client("sagemaker"), client("s3")),
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
