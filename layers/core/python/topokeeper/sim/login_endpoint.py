"""A scenario's login endpoint in the emulator: the NLB's IP target group (moto's ELBv2), the stack's setting that
names it to the ingest and drift functions, and what a step shows (targets, login nodes, ``UpdateLoginTargets``).

The balancer itself carries no logic topokeeper touches: only the target group is created. moto runs no health
checks and calls every registered target healthy; ``AwsEmulator.target_health`` sets another state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from topokeeper.adapters.aws import client
from topokeeper.adapters.elbv2 import ElbTargetGroup
from topokeeper.contract.config import ClusterVpcConfig, LoginEndpointConfig
from topokeeper.contract.ports import LoginAuditRecord, Metric

if TYPE_CHECKING:
    from topokeeper.sim.world import World

LOGIN_EVENT = LoginAuditRecord.model_fields["event_name"].default
VPC_CIDR = "10.1.0.0/16"  # the emulated HyperPod's node subnet (its VpcConfig)


class LoginStep(BaseModel):
    """Where the endpoint's targets are when a step ends."""

    targets: dict[str, str]  # IP -> ELBv2 target state
    login_nodes: dict[str, str]  # IP -> instance id of the running login nodes
    in_sync: bool  # the serving targets are exactly the running login nodes
    healthy_min: int | None  # the lowest LoginTargetsHealthy of the step
    audit_records: list[dict[str, Any]]  # UpdateLoginTargets records of the step


class SimLoginEndpoint:
    def __init__(self, world: World) -> None:
        self._world = world
        ec2 = client("ec2")
        vpc = ec2.create_vpc(CidrBlock=VPC_CIDR)["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=VPC_CIDR)["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="cluster", Description="the cluster's VpcConfig", VpcId=vpc)
        self.target_group_arn: str = client("elbv2").create_target_group(
            Name=f"{world.cluster.name}-login"[:32],
            Protocol="TCP",
            Port=22,
            VpcId=vpc,
            TargetType="ip",
            HealthCheckProtocol="TCP",
        )["TargetGroups"][0]["TargetGroupArn"]
        self.config = LoginEndpointConfig(
            enabled=True,
            vpc_id=vpc,
            vpc_config=ClusterVpcConfig(security_group_ids=[group["GroupId"]], subnets=[subnet]),
            allowed_cidrs=["10.0.0.0/8"],
        )
        self._noted = 0

    def targets(self) -> dict[str, str]:
        return ElbTargetGroup(client("elbv2")).states(self.target_group_arn)

    def records(self) -> list[dict[str, Any]]:
        """Oldest first."""
        history = self._world.runtime.audit.history(self._world.cluster.name, 1000, event_name=LOGIN_EVENT)
        return sorted(history, key=lambda record: record["completed_at"])

    def note_changes(self) -> None:
        """Put each new ``UpdateLoginTargets`` record on the timeline."""
        records = self.records()
        for record in records[self._noted :]:
            registered = ", ".join(record["registered"]) or "-"
            deregistered = ", ".join(record["deregistered"]) or "-"
            self._world.note(
                "login",
                f"targets: registered {registered}; deregistered {deregistered}; now {record['target_count']}",
            )
        self._noted = len(records)

    def step(self, started: float, completed_after: Any) -> LoginStep:
        world = self._world
        nodes = {
            node.private_ip: node.instance_id
            for node in world.emulator.hyperpod.nodes(world.cluster.name, self.login_group)
            if node.status == "Running"
        }
        targets = self.targets()
        serving = {ip for ip, state in targets.items() if state not in ("draining", "unused")}
        healthy = [
            v
            for t, c, m, v in world.metrics.points
            if t >= started and c == world.cluster.name and m == Metric.LOGIN_TARGETS_HEALTHY
        ]
        return LoginStep(
            targets=dict(sorted(targets.items())),
            login_nodes=dict(sorted(nodes.items())),
            in_sync=serving == set(nodes),
            healthy_min=int(min(healthy)) if healthy else None,
            audit_records=[r for r in self.records() if completed_after(r, started)],
        )

    @property
    def login_group(self) -> str:
        return next(g.name for g in self._world.scenario.cluster.instance_groups if g.role == "login")
