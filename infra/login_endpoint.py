"""One SSH endpoint for a cluster's login nodes: an internal NLB over an IP target group.

The target group starts empty; the functions keep its targets equal to the running login nodes
(topokeeper.service.login). HyperPod nodes are addressed by private IP in the cluster's VpcConfig
subnets, so the balancer sits in those subnets and the cluster's security group admits it on port 22.
EC2 login nodes (plain-EC2 clusters) are the instances whose login tag holds the cluster's name; the
ingest function sends them the host identity installer at launch, allowed only on instances with that tag.
"""

from __future__ import annotations

from typing import cast

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import custom_resources as cr
from constructs import Construct

from infra.alarms import cluster_metric
from infra.constants import EVENT_BUS_NAME, PROVISIONING_PARAMETERS_OBJECTS
from infra.encryption import DataKey
from infra.nag import acknowledge
from topokeeper.contract.config import ClusterConfig, LoginEndpointConfig, Orchestrator
from topokeeper.contract.constants import AUDIT_SOURCE, LOGIN_TARGET_GROUPS_ENV, RUN_SHELL_DOCUMENT, login_secret_names
from topokeeper.contract.ports import Metric

SSH_PORT = 22
# NLB TCP health checks: the fastest interval and the fewest probes ELBv2 accepts for a TCP check.
HEALTH_CHECK_INTERVAL_SECONDS = 10
HEALTH_CHECK_THRESHOLD = 2
# The id CDK gives the one Lambda behind every AwsCustomResource in a stack.
_SDK_CALL_PROVIDER = "AWS679f53fac002430cb0da5b7982bd2287"


def login_clusters(clusters: list[ClusterConfig]) -> list[ClusterConfig]:
    return [cluster for cluster in clusters if cluster.login.enabled]


class LoginEndpoint(Construct):
    """The balancer, its listener and target group, its security group, flow logs and a no-healthy-target alarm."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: ClusterConfig,
        topic: sns.ITopic,
        dashboard: cloudwatch.Dashboard,
        key: DataKey,
        log_retention_days: int,
    ) -> None:
        super().__init__(scope, construct_id)
        login = cluster.login
        vpc_config = login.vpc_config
        if not login.enabled or vpc_config is None or login.vpc_id is None:
            raise ValueError(f"cluster {cluster.name}: login endpoint not enabled or incomplete")
        prefix = Stack.of(self).stack_name

        self.security_group = ec2.CfnSecurityGroup(
            self,
            "SecurityGroup",
            vpc_id=login.vpc_id,
            group_description=f"topokeeper login endpoint of {cluster.name}: SSH from the allowed sources only",
            security_group_ingress=self._ingress(login),
            # The balancer only forwards to login nodes on port 22 inside the VPC.
            security_group_egress=[
                ec2.CfnSecurityGroup.EgressProperty(
                    ip_protocol="tcp",
                    from_port=SSH_PORT,
                    to_port=SSH_PORT,
                    destination_security_group_id=vpc_config.security_group_ids[0],
                    description="SSH to the login nodes",
                )
            ],
        )
        # IP targets over TCP do not preserve the client address: the nodes see the balancer's, so the
        # cluster's VpcConfig security group must admit the balancer's.
        self.cluster_ingress = ec2.CfnSecurityGroupIngress(
            self,
            "ClusterIngress",
            group_id=vpc_config.security_group_ids[0],
            ip_protocol="tcp",
            from_port=SSH_PORT,
            to_port=SSH_PORT,
            source_security_group_id=self.security_group.attr_group_id,
            description=f"SSH from the topokeeper login endpoint of {cluster.name}",
        )

        self.load_balancer = elbv2.CfnLoadBalancer(
            self,
            "LoadBalancer",
            type="network",
            scheme="internal",
            ip_address_type="ipv4",
            subnets=list(vpc_config.subnets),
            security_groups=[self.security_group.attr_group_id],
            load_balancer_attributes=[
                _attribute("load_balancing.cross_zone.enabled", True),
                _attribute("deletion_protection.enabled", login.deletion_protection),
            ],
        )
        self.target_group = elbv2.CfnTargetGroup(
            self,
            "TargetGroup",
            target_type="ip",
            protocol="TCP",
            port=SSH_PORT,
            vpc_id=login.vpc_id,
            health_check_enabled=True,
            health_check_protocol="TCP",
            health_check_port="traffic-port",
            health_check_interval_seconds=HEALTH_CHECK_INTERVAL_SECONDS,
            healthy_threshold_count=HEALTH_CHECK_THRESHOLD,
            unhealthy_threshold_count=HEALTH_CHECK_THRESHOLD,
            target_group_attributes=[
                _target_attribute("deregistration_delay.timeout_seconds", login.deregistration_delay_seconds),
                # A session on a deregistered node runs on until the delay ends, then is closed.
                _target_attribute("deregistration_delay.connection_termination.enabled", True),
                _target_attribute("load_balancing.cross_zone.enabled", True),
            ],
        )
        self.listener = elbv2.CfnListener(
            self,
            "Listener",
            load_balancer_arn=self.load_balancer.ref,
            protocol="TCP",
            port=SSH_PORT,
            default_actions=[elbv2.CfnListener.ActionProperty(type="forward", target_group_arn=self.target_group.ref)],
        )
        acknowledge(
            self.load_balancer,
            "ELB2",
            "NLB access logs record only TLS listeners; this balancer has one TCP listener, so flow logs "
            "on its network interfaces record its connections instead",
        )
        self._flow_logs(cluster.name, len(vpc_config.subnets), log_retention_days)

        self.alarm = cloudwatch.Alarm(
            self,
            "NoHealthyTarget",
            alarm_name=f"{prefix}-{cluster.name}-LoginNoHealthyTarget",
            alarm_description=f"{cluster.name}: no login node behind the SSH endpoint passes its health check",
            metric=cloudwatch.Metric(
                namespace="AWS/NetworkELB",
                metric_name="HealthyHostCount",
                dimensions_map={
                    "LoadBalancer": self.load_balancer.attr_load_balancer_full_name,
                    "TargetGroup": self.target_group.attr_target_group_full_name,
                },
                statistic="Minimum",
                period=Duration.minutes(1),
            ),
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            threshold=1,
            evaluation_periods=3,
            # The balancer reports every minute; silence means it is gone or has no targets at all.
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        self.alarm.add_alarm_action(actions.SnsAction(topic))
        dashboard.add_widgets(
            cloudwatch.TextWidget(markdown=f"## {cluster.name} login endpoint", width=4, height=6),
            cloudwatch.GraphWidget(
                title="Login targets",
                left=[
                    cluster_metric(Metric.LOGIN_TARGETS_HEALTHY, cluster.name, "Minimum"),
                    cluster_metric(Metric.LOGIN_TARGETS_DRIFT, cluster.name, "Maximum"),
                    self.alarm.metric,
                ],
                width=8,
                height=6,
            ),
        )

        bundle, _ = login_secret_names(cluster.name)
        # Secrets Manager appends six random characters to a secret's name in its ARN.
        bundle_arn = f"arn:{Aws.PARTITION}:secretsmanager:{Aws.REGION}:{Aws.ACCOUNT_ID}:secret:{bundle}-??????"
        self.host_identity_policy = iam.ManagedPolicy(
            self,
            "HostIdentityPolicy",
            description=f"topokeeper: attach to the ExecutionRole of {cluster.name}'s login group only",
            statements=[
                iam.PolicyStatement(
                    sid="ReadHostIdentity", actions=["secretsmanager:GetSecretValue"], resources=[bundle_arn]
                ),
                iam.PolicyStatement(
                    sid="DecryptHostIdentity",
                    actions=["kms:Decrypt"],
                    resources=[key.key.key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{Aws.REGION}.amazonaws.com"}},
                ),
            ],
        )

    @staticmethod
    def _ingress(login: LoginEndpointConfig) -> list[ec2.CfnSecurityGroup.IngressProperty]:
        def ssh(description: str, **source: str) -> ec2.CfnSecurityGroup.IngressProperty:
            return ec2.CfnSecurityGroup.IngressProperty(
                ip_protocol="tcp", from_port=SSH_PORT, to_port=SSH_PORT, description=description, **source
            )

        rules = [ssh("SSH from an allowed network", cidr_ip=cidr) for cidr in login.allowed_cidrs]
        rules += [
            ssh("SSH from an allowed security group", source_security_group_id=group)
            for group in login.allowed_security_group_ids
        ]
        if login.client_vpn_security_group_id:
            rules.append(
                ssh("SSH from the Client VPN endpoint", source_security_group_id=login.client_vpn_security_group_id)
            )
        return rules

    def _flow_logs(self, cluster: str, interfaces: int, retention_days: int) -> None:
        """Flow logs for the balancer's network interfaces (one per subnet), found by their description."""
        lookup = cr.AwsCustomResource(
            self,
            "NetworkInterfaces",
            on_update=cr.AwsSdkCall(
                service="EC2",
                action="describeNetworkInterfaces",
                parameters={
                    "Filters": [
                        {"Name": "description", "Values": [f"ELB {self.load_balancer.attr_load_balancer_full_name}"]}
                    ]
                },
                physical_resource_id=cr.PhysicalResourceId.of(self.load_balancer.attr_load_balancer_full_name),
                output_paths=[f"NetworkInterfaces.{index}.NetworkInterfaceId" for index in range(interfaces)],
            ),
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [iam.PolicyStatement(actions=["ec2:DescribeNetworkInterfaces"], resources=["*"])]
            ),
            install_latest_aws_sdk=False,
        )
        lookup.node.add_dependency(self.listener)
        acknowledge(
            lookup,
            "IAM5[Resource::*]",
            "ec2:DescribeNetworkInterfaces supports no resource-level permissions; it only reads the "
            "balancer's interface ids for its flow logs",
        )
        provider = Stack.of(self).node.try_find_child(_SDK_CALL_PROVIDER)
        if provider is not None:
            acknowledge(
                provider,
                "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
                "CDK's shared AwsCustomResource provider logs with the basic execution role; it runs only at "
                "deploy time to read the balancer's interface ids",
            )
        log_group = logs.LogGroup(self, "FlowLogs", removal_policy=RemovalPolicy.DESTROY)
        cast(logs.CfnLogGroup, log_group.node.default_child).retention_in_days = retention_days
        role = iam.Role(
            self,
            "FlowLogsRole",
            assumed_by=iam.ServicePrincipal("vpc-flow-logs.amazonaws.com"),
            description=f"topokeeper: flow logs of the {cluster} login endpoint",
        )
        log_group.grant_write(role)
        log_group.grant(role, "logs:DescribeLogGroups", "logs:DescribeLogStreams")
        self.flow_logs = [
            ec2.CfnFlowLog(
                self,
                f"FlowLog{index}",
                resource_type="NetworkInterface",
                resource_id=lookup.get_response_field(f"NetworkInterfaces.{index}.NetworkInterfaceId"),
                traffic_type="ALL",
                log_destination_type="cloud-watch-logs",
                log_group_name=log_group.log_group_name,
                deliver_logs_permission_arn=role.role_arn,
            )
            for index in range(interfaces)
        ]


class LoginTargetSync(Construct):
    """What the ingest and drift functions need to keep the endpoints' targets equal to the login nodes."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        endpoints: dict[str, LoginEndpoint],
        functions: list[lambda_.Function],
        node_readers: list[lambda_.Function],
    ) -> None:
        """``node_readers``: those of ``functions`` whose own policy does not already read HyperPod's nodes and
        a legacy cluster's provisioning_parameters.json (drift's does): a second grant proves nothing needed."""
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        groups = {name: endpoint.target_group.ref for name, endpoint in sorted(endpoints.items())}

        def arn(service: str, resource: str, region: str = Aws.REGION, account: str = Aws.ACCOUNT_ID) -> str:
            return f"arn:{Aws.PARTITION}:{service}:{region}:{account}:{resource}"

        self.policy = iam.Policy(
            self,
            "Policy",
            statements=[
                iam.PolicyStatement(
                    sid="Targets",
                    actions=["elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"],
                    resources=list(groups.values()),
                ),
                iam.PolicyStatement(
                    sid="TargetHealth", actions=["elasticloadbalancing:DescribeTargetHealth"], resources=["*"]
                ),
                iam.PolicyStatement(
                    sid="AuditEvents",
                    actions=["events:PutEvents"],
                    resources=[arn("events", f"event-bus/{EVENT_BUS_NAME}")],
                    conditions={"StringEquals": {"events:source": AUDIT_SOURCE}},
                ),
            ],
        )
        for function in functions:
            function.add_environment(LOGIN_TARGET_GROUPS_ENV, stack.to_json_string(groups))
            if function.role is not None:
                self.policy.attach_to_role(function.role)
        for function in node_readers:
            if function.role is not None:
                _grant_login_node_reads(function.role, arn("sagemaker", "cluster/*"))
        acknowledge(
            self.policy,
            "IAM5[Resource::*]",
            "No resource-level permissions exist for elasticloadbalancing:DescribeTargetHealth (Service "
            "Authorization Reference); read-only",
        )


def _grant_login_node_reads(role: iam.IRole, clusters: str) -> None:
    """Find the login group's nodes and their IPs: in the role's own policy, where CDK merges the Describe/List
    calls with a DescribeCluster the role already has."""
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["sagemaker:DescribeCluster", "sagemaker:ListClusterNodes", "sagemaker:DescribeClusterNode"],
            resources=[clusters],
        )
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["s3:GetObject"],
            resources=[f"arn:{Aws.PARTITION}:s3:::{PROVISIONING_PARAMETERS_OBJECTS}"],
            # Bucket ARNs name no account: without this, any account's sagemaker-* bucket would do.
            conditions={"StringEquals": {"s3:ResourceAccount": Aws.ACCOUNT_ID}},
        )
    )
    acknowledge(
        role,
        "IAM5[Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:cluster/*]",
        "HyperPod cluster ARNs carry a generated id, not the configured name; read-only Describe/List calls "
        "that find the login group's nodes and their IPs",
    )
    acknowledge(
        role,
        "IAM5[Resource::arn:<AWS::Partition>:s3:::sagemaker-*/*provisioning_parameters.json]",
        "Legacy HyperPod clusters name their login group in provisioning_parameters.json in a lifecycle "
        "bucket HyperPod requires to be named sagemaker-*; read-only, only that file name, only in this account",
    )


def installer_statements(
    clusters: list[ClusterConfig], partition: str, region: str, account: str
) -> list[dict[str, object]]:
    """SendCommand for the host identity installer: the one document, on EC2 instances whose login tag holds one
    of these clusters' names; nothing else (one statement per login tag key)."""
    by_tag: dict[str, list[str]] = {}
    for cluster in sorted(clusters, key=lambda c: c.name):
        by_tag.setdefault(cluster.ec2.login_tag, []).append(cluster.name)
    statements: list[dict[str, object]] = [
        {
            "Sid": "InstallerDocument",
            "Effect": "Allow",
            "Action": "ssm:SendCommand",
            "Resource": f"arn:{partition}:ssm:{region}::document/{RUN_SHELL_DOCUMENT}",
        }
    ]
    for index, (tag, names) in enumerate(sorted(by_tag.items())):
        statements.append(
            {
                "Sid": f"TaggedLoginNodes{index}",
                "Effect": "Allow",
                "Action": "ssm:SendCommand",
                "Resource": f"arn:{partition}:ec2:{region}:{account}:instance/*",
                "Condition": {"StringEquals": {f"ssm:resourceTag/{tag}": names}},
            }
        )
    return statements


def ec2_login_clusters(clusters: list[ClusterConfig]) -> list[ClusterConfig]:
    return [c for c in login_clusters(clusters) if c.orchestrator is Orchestrator.EC2]


class LoginHostIdentityInstaller(Construct):
    """The ingest function's Run Command to EC2 login nodes at launch: the one documented exception to
    SendCommand only on the listed head nodes, scoped by the login tag and pinned to one document."""

    def __init__(self, scope: Construct, construct_id: str, *, clusters: list[ClusterConfig], role: iam.IRole) -> None:
        super().__init__(scope, construct_id)
        document = iam.PolicyDocument.from_json(
            {"Statement": installer_statements(clusters, Aws.PARTITION, Aws.REGION, Aws.ACCOUNT_ID)}
        )
        self.policy = iam.Policy(self, "Policy", document=document)
        self.policy.attach_to_role(role)
        acknowledge(
            self.policy,
            "IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]",
            "EC2 login nodes are replaced with new instance ids; the ssm:resourceTag condition admits only "
            "instances whose login tag holds the cluster's name, and the document is pinned to AWS-RunShellScript",
        )


def _text(value: bool | int) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _attribute(key: str, value: bool | int) -> elbv2.CfnLoadBalancer.LoadBalancerAttributeProperty:
    return elbv2.CfnLoadBalancer.LoadBalancerAttributeProperty(key=key, value=_text(value))


def _target_attribute(key: str, value: bool | int) -> elbv2.CfnTargetGroup.TargetGroupAttributeProperty:
    return elbv2.CfnTargetGroup.TargetGroupAttributeProperty(key=key, value=_text(value))
