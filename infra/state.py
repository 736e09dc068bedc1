"""The state table: one DynamoDB table for every record the functions keep (single-table design)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.encryption import DataKey
from topokeeper.contract import stack_spec as spec

# What the adapters call (TransactWriteItems is authorized per item, as PutItem). Items expire by TTL, but the
# registration records, deleted with their entries by BatchWriteItem (authorized as BatchWriteItem: no DeleteItem).
_READ = ["dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query"]
_WRITE = ["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:BatchWriteItem"]


class StateTable(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, key: DataKey) -> None:
        super().__init__(scope, construct_id)
        self._key = key
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=spec.PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=spec.SORT_KEY, type=dynamodb.AttributeType.STRING),
            time_to_live_attribute=spec.TTL_ATTRIBUTE,
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
            encryption_key=key.key,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Applied generations, delivery records and the audit trail outlive the stack.
            removal_policy=RemovalPolicy.RETAIN,
        )

    def grant_read_write(self, role: iam.IRole) -> None:
        # Item-level actions on the table only: it has no indexes and nothing needs Scan.
        role.add_to_principal_policy(iam.PolicyStatement(actions=_READ + _WRITE, resources=[self.table.table_arn]))
        self._key.grant_use(role, "dynamodb", write=True)
