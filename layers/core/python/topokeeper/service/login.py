"""Keep a login endpoint's target group equal to the cluster's running login nodes (level-triggered).

Every call compares the whole desired set (running login nodes' private IPs) with the whole registered
set, so a missed event is healed by the next call (the drift schedule). Only IPs topokeeper registered
itself (the ledger) are ever deregistered: a target someone else added stays. The endpoint belongs to
topokeeper once enabled, so this writes in both modes (``mode`` governs the Slurm topology only).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from topokeeper.contract.errors import Retryable
from topokeeper.contract.ports import (
    Clock,
    HostIdentitySender,
    InstallClaim,
    LaunchedInstance,
    LoginAudit,
    LoginAuditRecord,
    LoginInstallLedger,
    LoginInstallRecord,
    LoginNodeSource,
    LoginTargetGroup,
    LoginTargetLedger,
    Metric,
    Metrics,
)

RUNNING = "Running"
# ELBv2 target states of a target on its way out: it no longer takes new connections.
LEAVING_STATES = frozenset({"draining", "unused"})
HEALTHY = "healthy"
MAX_LISTED_TARGETS = 200


class LoginSync(BaseModel):
    """What one sync found and did."""

    model_config = ConfigDict(frozen=True)
    has_login_group: bool
    registered: tuple[str, ...]
    deregistered: tuple[str, ...]
    healthy: int
    audit: LoginAuditRecord | None

    @property
    def drift(self) -> int:
        return len(self.registered) + len(self.deregistered)


def sync_login_targets(
    *,
    cluster: str,
    target_group_arn: str,
    nodes: LoginNodeSource,
    targets: LoginTargetGroup,
    ledger: LoginTargetLedger,
    audit: LoginAudit,
    metrics: Metrics,
    clock: Clock,
) -> LoginSync:
    login_nodes = nodes.login_nodes(cluster)
    desired = {
        node.private_ip: node.node_id
        for node in sorted(login_nodes or [], key=lambda n: n.node_id)
        if node.status == RUNNING and node.private_ip
    }
    states = targets.states(target_group_arn)
    serving = {ip for ip, state in states.items() if state not in LEAVING_STATES}
    managed = ledger.managed(cluster)
    to_register = sorted(set(desired) - serving)
    to_deregister = sorted((serving & managed) - set(desired))

    if to_register:
        # Ledger first: a crash after RegisterTargets must not leave a target nobody may remove.
        ledger.record(cluster, managed | set(to_register))
        targets.register(target_group_arn, to_register)
    if to_deregister:
        # Existing sessions keep running for the target group's deregistration delay.
        targets.deregister(target_group_arn, to_deregister)
    if to_register or to_deregister or managed != frozenset(desired):
        ledger.record(cluster, frozenset(desired))

    healthy = sum(1 for ip in desired if states.get(ip) == HEALTHY)
    record = None
    if to_register or to_deregister:
        after = sorted((serving - set(to_deregister)) | set(to_register))
        completed = clock.now()
        record = LoginAuditRecord(
            audit_id=_audit_id(cluster, target_group_arn, to_register, to_deregister, completed),
            cluster_name=cluster,
            target_group_arn=target_group_arn,
            registered=to_register[:MAX_LISTED_TARGETS],
            deregistered=to_deregister[:MAX_LISTED_TARGETS],
            targets=after[:MAX_LISTED_TARGETS],
            target_count=len(after),
            login_nodes=desired,
            completed_at=completed,
        )
        audit.publish_login(record)
    result = LoginSync(
        has_login_group=login_nodes is not None,
        registered=tuple(to_register),
        deregistered=tuple(to_deregister),
        healthy=healthy,
        audit=record,
    )
    metrics.emit(cluster, Metric.LOGIN_TARGETS_HEALTHY, result.healthy)
    metrics.emit(cluster, Metric.LOGIN_TARGETS_DRIFT, result.drift)
    return result


def _audit_id(cluster: str, group: str, registered: list[str], deregistered: list[str], at: datetime) -> str:
    key = json.dumps([cluster, group, registered, deregistered, at.isoformat()])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


EC2_RUNNING = "running"


class LoginInstall(BaseModel):
    """What one EC2 state-change event did for the host identity of an EC2 login node."""

    model_config = ConfigDict(frozen=True)
    status: Literal["sent", "sent-before", "not-a-login-node", "not-running"]
    instance_id: str
    command_id: str | None = None
    audit: LoginInstallRecord | None = None


def install_host_identity_at_launch(
    *,
    cluster: str,
    login_tag: str,
    instance: LaunchedInstance,
    document_name: str,
    script: str,
    sender: HostIdentitySender,
    ledger: LoginInstallLedger,
    audit: LoginAudit,
    clock: Clock,
) -> LoginInstall:
    """Send the installer once per launch of a running instance with the cluster's login tag.

    The ledger makes a redelivered event (or a second event of the same launch) send nothing; a failed send
    releases its claim and raises, so the function's retries send again and the last failure lands in the
    event dead-letter queue with its reason. A stopped and started instance is a new launch: it is sent again
    (the installer is idempotent)."""
    if instance.tags.get(login_tag) != cluster:
        return LoginInstall(status="not-a-login-node", instance_id=instance.instance_id)
    if instance.state != EC2_RUNNING:
        return LoginInstall(status="not-running", instance_id=instance.instance_id)
    launch = (cluster, instance.instance_id, instance.launch_time)
    claim = ledger.claim(*launch, clock.now())
    if claim is InstallClaim.SENT:
        return LoginInstall(status="sent-before", instance_id=instance.instance_id)
    if claim is InstallClaim.IN_FLIGHT:
        raise Retryable(f"{instance.instance_id}: another invocation is sending the installer for this launch")
    try:
        (command_id,) = sender.send([instance.instance_id], script, cluster)
    except Exception:
        ledger.release(*launch, clock.now())
        raise
    sent_at = clock.now()
    ledger.sent(*launch, command_id, sent_at)
    key = json.dumps([cluster, instance.instance_id, instance.launch_time.isoformat()])
    record = LoginInstallRecord(
        audit_id=hashlib.sha256(key.encode()).hexdigest()[:32],
        cluster_name=cluster,
        instance_id=instance.instance_id,
        launch_time=instance.launch_time,
        private_ip=instance.private_ip,
        document_name=document_name,
        command_id=command_id,
        completed_at=sent_at,
    )
    audit.publish_login(record)
    return LoginInstall(status="sent", instance_id=instance.instance_id, command_id=command_id, audit=record)
