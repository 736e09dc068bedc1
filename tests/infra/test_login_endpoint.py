"""The optional login endpoint: every property of the balancer, its absence when disabled, cdk-nag and cfn-lint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.config import ConfigError, load_settings
from infra.constants import REPO_ROOT, STACK_ID
from infra.login_endpoint import installer_statements
from tests.infra.conftest import Synthesized, example_config, synthesize

pytestmark = pytest.mark.infra

VPC = "vpc-0a1b2c3d4e5f60718"
SUBNETS = ["subnet-0a1b2c3d4e5f60001", "subnet-0a1b2c3d4e5f60002"]
CLUSTER_SG = "sg-0a1b2c3d4e5f60001"
BASTION_SG = "sg-0a1b2c3d4e5f60002"
VPN_SG = "sg-0a1b2c3d4e5f60003"
LOGIN = {
    "enabled": True,
    "vpc_id": VPC,
    "vpc_config": {"security_group_ids": [CLUSTER_SG], "subnets": SUBNETS},
    "allowed_cidrs": ["10.20.0.0/16"],
    "allowed_security_group_ids": [BASTION_SG],
    "client_vpn_security_group_id": VPN_SG,
    "deletion_protection": True,
}


def with_login(login: dict[str, Any]) -> dict[str, Any]:
    config = example_config()
    config["clusters"][0]["login"] = login
    return config


@pytest.fixture(scope="module")
def login(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    # One synth with cdk-nag: it raises ValidationFailed on any unacknowledged finding.
    return synthesize(tmp_path_factory.mktemp("login"), with_login(LOGIN), nag=True)


def of_type(synthesized: Synthesized, kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in synthesized.resources.values() if r["Type"] == kind]


def attributes(properties: dict[str, Any], key: str) -> dict[str, str]:
    return {item["Key"]: item["Value"] for item in properties[key]}


def test_an_internal_nlb_across_the_cluster_subnets_with_cross_zone_and_deletion_protection(
    login: Synthesized,
) -> None:
    (balancer,) = of_type(login, "AWS::ElasticLoadBalancingV2::LoadBalancer")
    assert (balancer["Type"], balancer["Scheme"], balancer["Subnets"]) == ("network", "internal", SUBNETS)
    assert attributes(balancer, "LoadBalancerAttributes") == {
        "load_balancing.cross_zone.enabled": "true",
        "deletion_protection.enabled": "true",
    }


def test_one_tcp_22_listener_forwards_to_an_ip_target_group_with_tcp_health_checks(login: Synthesized) -> None:
    (listener,) = of_type(login, "AWS::ElasticLoadBalancingV2::Listener")
    (group,) = of_type(login, "AWS::ElasticLoadBalancingV2::TargetGroup")
    endpoint = login.stack.login_endpoints["llm-train"]
    assert (listener["Protocol"], listener["Port"]) == ("TCP", 22)
    assert listener["DefaultActions"] == [
        {"Type": "forward", "TargetGroupArn": {"Ref": login.stack.get_logical_id(endpoint.target_group)}}
    ]
    assert (group["TargetType"], group["Protocol"], group["Port"], group["VpcId"]) == ("ip", "TCP", 22, VPC)
    assert (group["HealthCheckProtocol"], group["HealthCheckPort"]) == ("TCP", "traffic-port")
    assert "Targets" not in group  # the functions own the targets
    assert attributes(group, "TargetGroupAttributes") == {
        "deregistration_delay.timeout_seconds": "3600",
        "deregistration_delay.connection_termination.enabled": "true",
        "load_balancing.cross_zone.enabled": "true",
    }


def test_ssh_only_from_the_configured_sources_and_the_cluster_admits_the_balancer(login: Synthesized) -> None:
    endpoint = login.stack.login_endpoints["llm-train"]
    (group,) = of_type(login, "AWS::EC2::SecurityGroup")
    sources = {
        (r["IpProtocol"], r["FromPort"], r["ToPort"], r.get("CidrIp") or r.get("SourceSecurityGroupId"))
        for r in group["SecurityGroupIngress"]
    }
    assert sources == {("tcp", 22, 22, "10.20.0.0/16"), ("tcp", 22, 22, BASTION_SG), ("tcp", 22, 22, VPN_SG)}
    assert [(r["DestinationSecurityGroupId"], r["FromPort"]) for r in group["SecurityGroupEgress"]] == [
        (CLUSTER_SG, 22)
    ]
    (balancer,) = of_type(login, "AWS::ElasticLoadBalancingV2::LoadBalancer")
    balancer_sg = {"Fn::GetAtt": [login.stack.get_logical_id(endpoint.security_group), "GroupId"]}
    assert balancer["SecurityGroups"] == [balancer_sg]
    (ingress,) = of_type(login, "AWS::EC2::SecurityGroupIngress")
    assert (ingress["GroupId"], ingress["SourceSecurityGroupId"], ingress["FromPort"]) == (CLUSTER_SG, balancer_sg, 22)


def test_flow_logs_cover_each_balancer_interface(login: Synthesized) -> None:
    flow_logs = of_type(login, "AWS::EC2::FlowLog")
    assert len(flow_logs) == len(SUBNETS)
    assert {(f["ResourceType"], f["TrafficType"]) for f in flow_logs} == {("NetworkInterface", "ALL")}
    (lookup,) = [r["Properties"] for r in login.resources.values() if r["Type"] == "Custom::AWS"]
    assert "ELB " in json.dumps(lookup["Update"]) and "describeNetworkInterfaces" in json.dumps(lookup["Update"])


def test_an_alarm_fires_when_no_login_target_is_healthy(login: Synthesized) -> None:
    (alarm,) = [a for a in of_type(login, "AWS::CloudWatch::Alarm") if a["MetricName"] == "HealthyHostCount"]
    assert (alarm["Namespace"], alarm["ComparisonOperator"], alarm["Threshold"]) == (
        "AWS/NetworkELB",
        "LessThanThreshold",
        1,
    )
    assert alarm["TreatMissingData"] == "breaching"
    assert {d["Name"] for d in alarm["Dimensions"]} == {"LoadBalancer", "TargetGroup"}


def test_nag_acknowledges_access_logs_with_the_tls_reason(login: Synthesized) -> None:
    (report,) = json.loads((login.outdir / "validation-report.json").read_text())["pluginReports"]
    assert report["violations"] == []
    (elb2,) = [f for f in report["suppressedViolations"] if f["ruleName"] == "AwsSolutions-ELB2"]
    assert "TLS" in elb2["reason"]


def test_cfn_lint_is_clean_with_a_login_endpoint(login: Synthesized) -> None:
    template = login.outdir / f"{STACK_ID}.template.json"
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    run = subprocess.run([str(cfn_lint), str(template)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_disabled_by_default_nothing_of_it_is_synthesized(example: Synthesized) -> None:
    text = json.dumps(example.template.to_json())
    assert example.stack.login_endpoints == {}
    for kind in ("ElasticLoadBalancingV2", "AWS::EC2::FlowLog", "AWS::EC2::SecurityGroup", "HealthyHostCount"):
        assert kind not in text


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"vpc_config": None}, "topokeeper.clusters[0].login", "without VpcConfig"),
        ({"vpc_id": "vpc-zz"}, "topokeeper.clusters[0].login.vpc_id", "not a vpc- id"),
        ({"allowed_cidrs": ["10.0.0.1/8"]}, "topokeeper.clusters[0].login.allowed_cidrs[0]", "not an IPv4 CIDR"),
        (
            {"allowed_cidrs": [], "allowed_security_group_ids": [], "client_vpn_security_group_id": None},
            "topokeeper.clusters[0].login",
            "who may connect",
        ),
        ({"deregistration_delay_seconds": 7200}, "login.deregistration_delay_seconds", "less than or equal to 3600"),
        ({"vpc_config": {"security_group_ids": [], "subnets": SUBNETS}}, "vpc_config.security_group_ids", "at least 1"),
    ],
)
def test_bad_login_settings_name_the_key(change: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(with_login({**LOGIN, **change}))
    assert key in str(raised.value) and message in str(raised.value), str(raised.value)


def test_a_login_endpoint_needs_slurm_login_nodes() -> None:
    config = example_config()
    config["clusters"].append({"name": "kueue", "orchestrator": "eks", "login": LOGIN})
    with pytest.raises(ConfigError, match=r"clusters\[2\].*an EKS cluster has no Slurm login nodes"):
        load_settings(config)


def test_disabled_settings_need_nothing_else() -> None:
    settings = load_settings(with_login({"enabled": False}))
    assert not settings.clusters[0].login.enabled


def test_the_login_role_policy_reads_only_the_host_identity_through_secrets_manager(login: Synthesized) -> None:
    endpoint = login.stack.login_endpoints["llm-train"]
    document = login.resource(endpoint.host_identity_policy)["Properties"]["PolicyDocument"]
    read, decrypt = document["Statement"]
    assert read["Action"] == "secretsmanager:GetSecretValue"
    assert "secret:topokeeper/llm-train/login-host-identity-??????" in json.dumps(read["Resource"])
    assert decrypt["Action"] == "kms:Decrypt"
    assert decrypt["Resource"] == {"Fn::GetAtt": [login.logical_id(login.stack.key.key), "Arn"]}
    assert "secretsmanager." in json.dumps(decrypt["Condition"])
    outputs = login.template.to_json()["Outputs"]
    assert {"LoginEndpointllmtrain", "LoginHostIdentityPolicyllmtrain", "DataKeyArn"} <= set(outputs)


def test_ingest_and_drift_get_the_target_groups_and_only_the_sync_permissions(login: Synthesized) -> None:
    endpoint = login.stack.login_endpoints["llm-train"]
    group_ref = {"Ref": login.stack.get_logical_id(endpoint.target_group)}
    for function in (login.stack.functions.ingest, login.stack.functions.drift):
        variables = login.resource(function)["Properties"]["Environment"]["Variables"]
        assert "llm-train" in json.dumps(variables["LOGIN_TARGET_GROUPS"])
    assert "LOGIN_TARGET_GROUPS" not in json.dumps(login.resource(login.stack.functions.result))
    (policy,) = [
        r["Properties"]
        for r in login.resources.values()
        if r["Type"] == "AWS::IAM::Policy" and "LoginTargetSync" in json.dumps(r["Properties"]["PolicyName"])
    ]
    roles = {json.dumps(role) for role in policy["Roles"]}
    assert roles == {
        json.dumps({"Ref": login.logical_id(function.role)})
        for function in (login.stack.functions.ingest, login.stack.functions.drift)
    }
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert statements["Targets"]["Resource"] == group_ref
    assert statements["TargetHealth"]["Resource"] == "*"
    assert statements["AuditEvents"]["Condition"] == {"StringEquals": {"events:source": "topokeeper"}}


def test_the_dashboard_shows_the_login_targets_of_login_clusters_only(login: Synthesized) -> None:
    (dashboard,) = of_type(login, "AWS::CloudWatch::Dashboard")
    text = "".join(part for part in dashboard["DashboardBody"]["Fn::Join"][1] if isinstance(part, str))
    assert "## llm-train login endpoint" in text and "cfd-pcluster login endpoint" not in text
    for metric in ("LoginTargetsHealthy", "LoginTargetsDrift"):
        assert f'"topokeeper","{metric}","cluster","llm-train"' in text, metric
        assert f'"topokeeper","{metric}","cluster","cfd-pcluster"' not in text, metric
    assert '"AWS/NetworkELB","HealthyHostCount"' in text


PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "eu-west-1", "AWS::AccountId": "111122223333"}


def resolved(value: Any) -> Any:
    """Fn::Join over pseudo parameters, as CloudFormation resolves it in one account and region."""
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(str(resolved(part)) for part in parts)
    if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in PSEUDO:
        return PSEUDO[value["Ref"]]
    if isinstance(value, dict):
        return {key: resolved(item) for key, item in value.items()}
    if isinstance(value, list):
        return [resolved(item) for item in value]
    return value


@pytest.fixture(scope="module")
def ec2_login(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """Both example clusters with a login endpoint: llm-train (HyperPod) and cfd-pcluster (EC2), with cdk-nag."""
    config = with_login(LOGIN)
    config["clusters"][1]["login"] = LOGIN
    config["clusters"][1]["ec2"]["login_tag"] = "parallelcluster:login"
    return synthesize(tmp_path_factory.mktemp("ec2-login"), config, nag=True)


def policies_of(synthesized: Synthesized, function: Any) -> list[dict[str, Any]]:
    role = json.dumps({"Ref": synthesized.logical_id(function.role)})
    return [
        r["Properties"]
        for r in synthesized.resources.values()
        if r["Type"] == "AWS::IAM::Policy" and role in {json.dumps(x) for x in r["Properties"]["Roles"]}
    ]


def send_command_statements(synthesized: Synthesized, function: Any) -> list[dict[str, Any]]:
    return [
        statement
        for policy in policies_of(synthesized, function)
        for statement in policy["PolicyDocument"]["Statement"]
        if "ssm:SendCommand" in json.dumps(statement["Action"])
    ]


def test_the_ingest_function_may_send_the_installer_only_to_tagged_login_nodes(ec2_login: Synthesized) -> None:
    stack = ec2_login.stack
    sent = send_command_statements(ec2_login, stack.functions.ingest)
    # Exactly the installer's statements: one pinned document, instances only with the EC2 cluster's login tag.
    assert [resolved(s) for s in sent] == installer_statements([ec2_login.settings.clusters[1]], *PSEUDO.values())
    document, instances = (resolved(s) for s in sent)
    assert document["Resource"] == "arn:aws:ssm:eu-west-1::document/AWS-RunShellScript"
    assert "Condition" not in document
    assert instances["Resource"] == "arn:aws:ec2:eu-west-1:111122223333:instance/*"
    assert instances["Condition"] == {"StringEquals": {"ssm:resourceTag/parallelcluster:login": ["cfd-pcluster"]}}
    # The HyperPod cluster's login nodes get their identity from the lifecycle script: no SendCommand for them.
    assert "llm-train" not in json.dumps(sent)
    # Nobody else gains SendCommand on login nodes: result sends nothing; drift and reconcile only to head nodes.
    assert send_command_statements(ec2_login, stack.functions.result) == []
    for function in (stack.functions.drift, stack.functions.reconcile):
        assert "instance/*" not in json.dumps(send_command_statements(ec2_login, function))


def test_no_installer_permission_without_an_ec2_login_cluster(login: Synthesized) -> None:
    assert send_command_statements(login, login.stack.functions.ingest) == []


def test_nag_and_cfn_lint_are_clean_with_an_ec2_login_endpoint(ec2_login: Synthesized) -> None:
    (report,) = json.loads((ec2_login.outdir / "validation-report.json").read_text())["pluginReports"]
    assert report["violations"] == []
    installer = [
        f
        for f in report["suppressedViolations"]
        if f["ruleName"].startswith("AwsSolutions-IAM5") and "LoginHostIdentityInstaller" in json.dumps(f)
    ]
    assert installer and all("ssm:resourceTag" in f["reason"] for f in installer)
    template = ec2_login.outdir / f"{STACK_ID}.template.json"
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    run = subprocess.run([str(cfn_lint), str(template)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_provisioning_parameters_read_is_of_this_accounts_buckets_only(login: Synthesized) -> None:
    """Bucket ARNs name no account: a sagemaker-* bucket of another account would match without the condition."""
    statements = [
        statement
        for resource in login.resources.values()
        if resource["Type"] in {"AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"}
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
        if "provisioning_parameters.json" in json.dumps(statement["Resource"])
    ]
    assert len(statements) >= 3  # the reconcile's, the drift's and the login sync's
    for statement in statements:
        assert statement["Condition"] == {"StringEquals": {"s3:ResourceAccount": {"Ref": "AWS::AccountId"}}}, statement
