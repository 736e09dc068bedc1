"""Who is calling, and may they: the emulator's IAM for the stack's roles (``IamModel``).

A role added with ``add_role`` gets an access key of its own; a request signed with it (by header, or a presigned
URL) is authorized with ``policy.decide`` against the role's identity statements and the resource's policy (the
bucket's, the queue's, the KMS key's), and refused as AWS refuses: ``AccessDenied`` (S3, SQS) or
``AccessDeniedException`` naming the caller, the action and the resource. What a service does with a KMS key on
the caller's behalf is authorized too: reading an SSE-KMS object needs the caller's ``kms:Decrypt`` through S3,
writing one ``kms:GenerateDataKey``, sending to and receiving from a KMS-encrypted queue the same through SQS.
A request with any other key (the test harness's, the operator's) is not the stack's and is not authorized.

In one process every handler shares the cached clients, as the Lambda functions do not: ``acting_as(role)`` makes
every request (and presigned URL) signed meanwhile in this thread carry the role's key, as Lambda hands each
function its role's credentials (``server.ScopeOnlySigning`` reads ``acting_credentials``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from botocore.credentials import ReadOnlyCredentials

from topokeeper.sim.aws.policy import ContextValue, Request, Statement, decide
from topokeeper.sim.aws.protocol import ApiError, ApiRequest
from topokeeper.sim.aws.s3 import bucket_and_key

acting_credentials: ContextVar[ReadOnlyCredentials | None] = ContextVar("acting_credentials", default=None)
_SSE_HEADERS = {
    "x-amz-server-side-encryption": "s3:x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id": "s3:x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-customer-algorithm": "s3:x-amz-server-side-encryption-customer-algorithm",
}
# Batch operations are authorized as the single one (IAM has no action of their own).
_SQS_ACTIONS = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}
_DYNAMODB_TRANSACT = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
_S3_OBJECT_READS = {"GetObject", "HeadObject"}
_S3_BUCKET_ACTIONS = {"ListObjectsV2": "ListBucket", "ListObjects": "ListBucket", "HeadBucket": "ListBucket"}


@dataclass
class Role:
    arn: str
    statements: list[Statement]
    session: str
    # Reads a missing object as absent whether S3 answers 404 or, without s3:ListBucket, 403 (the agent does):
    # that 403 is S3's answer, not a failure of the run.
    missing_as_forbidden: bool = False

    @property
    def caller(self) -> str:
        """As AWS names an assumed role in an error: ``arn:aws:sts::A:assumed-role/<name>/<session>``."""
        account, name = self.arn.split(":")[4], self.arn.rsplit("/", 1)[-1]
        return f"arn:aws:sts::{account}:assumed-role/{name}/{self.session}"


@dataclass(frozen=True)
class Question:
    """One thing a request needs allowed; ``policy``: the resource's own policy (None: it has none)."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)
    policy: Sequence[Statement] | None = None
    key_policy: bool = False
    missing_object: bool = False  # s3:ListBucket asked by a read of an object that does not exist


@dataclass
class IamModel:
    account_id: str
    region: str
    lock: threading.RLock = field(default_factory=threading.RLock)
    roles: dict[str, Role] = field(default_factory=dict)  # access key -> role
    secrets: dict[str, str] = field(default_factory=dict)  # access key -> secret
    resource_policies: dict[str, list[Statement]] = field(default_factory=dict)  # bucket or queue ARN
    key_policies: dict[str, list[Statement]] = field(default_factory=dict)  # KMS key ARN
    bucket_keys: dict[str, str] = field(default_factory=dict)  # bucket -> its default KMS key ARN
    queue_keys: dict[str, str] = field(default_factory=dict)  # queue ARN -> its KMS key ARN
    table_keys: dict[str, str] = field(default_factory=dict)  # table name -> its KMS key ARN
    key_ids: Callable[[str], str | None] = lambda key_id: None  # KeyId (id, ARN, alias) -> key ARN
    object_exists: Callable[[str, str], bool] = lambda bucket, key: True
    instance_tags: Callable[[str], Mapping[str, str]] = lambda instance_id: {}
    refused: list[str] = field(default_factory=list)  # every refusal's message, for tests and the report
    record: bool = False  # keep every authorized question in ``asked`` (for ``replay``)
    asked: list[tuple[Request, Question]] = field(default_factory=list)  # the allowed ones, in order

    def add_role(
        self, arn: str, statements: Sequence[Statement], session: str = "", *, missing_as_forbidden: bool = False
    ) -> ReadOnlyCredentials:
        """The role ``arn`` with its identity ``statements``; its credentials (a key of its own)."""
        digest = hashlib.sha256(arn.encode()).hexdigest().upper()
        access_key, secret = f"ASIA{digest[:16]}", digest[16:56]
        with self.lock:
            name = session or arn.rsplit("/", 1)[-1]
            self.roles[access_key] = Role(arn, list(statements), name, missing_as_forbidden)
            self.secrets[access_key] = secret
        return ReadOnlyCredentials(access_key, secret, None)

    def role(self, arn: str) -> Role:
        return next(role for role in self.roles.values() if role.arn == arn)

    def credentials(self, arn: str) -> ReadOnlyCredentials:
        key = next(key for key, role in self.roles.items() if role.arn == arn)
        return ReadOnlyCredentials(key, self.secrets[key], None)

    @contextmanager
    def acting_as(self, arn: str) -> Iterator[None]:
        """Requests signed in this thread meanwhile carry role ``arn``'s key."""
        token = acting_credentials.set(self.credentials(arn))
        try:
            yield
        finally:
            acting_credentials.reset(token)

    @contextmanager
    def as_harness(self) -> Iterator[None]:
        """Requests signed in this thread meanwhile are the harness's (what AWS does with no call of the role)."""
        token = acting_credentials.set(None)
        try:
            yield
        finally:
            acting_credentials.reset(token)

    # ------------------------------------------------------------------ authorization

    def check(self, request: ApiRequest) -> None:
        """A gateway refusal: raise what AWS answers when the caller's policies do not allow the request."""
        role = self.roles.get(request.access_key)
        if role is None:
            return
        base = {"aws:PrincipalArn": role.arn, "aws:SecureTransport": str(request.secure).lower()}
        for question in self.questions(request):
            context = {**base, **question.context}
            asked = Request(role.arn, question.action, question.resource, context, self.account_id)
            decision = decide(asked, role.statements, question.policy, key_policy=question.key_policy)
            if self.record and decision.allowed:
                with self.lock:
                    self.asked.append((asked, question))
            if not decision.allowed:
                message = (
                    f"User: {role.caller} is not authorized to perform: {question.action} on resource: "
                    f"{question.resource} because {decision.reason}"
                )
                if not (question.missing_object and role.missing_as_forbidden):
                    with self.lock:
                        self.refused.append(message)
                code = "AccessDenied" if request.service in ("s3", "sqs") else "AccessDeniedException"
                raise ApiError(code, message, 403)

    def replay(
        self, identity: Mapping[str, Sequence[Statement]], resource: Mapping[int, Sequence[Statement]]
    ) -> Request | None:
        """The first recorded question refused when roles' statements are ``identity`` (by role ARN) and
        resource policies are ``resource`` (by ``id`` of the policy list a question carried), else as they were.
        Evaluation is a function of the statements and the request alone, so a run with those policies would
        have gone as the recorded one up to exactly this request, and been refused there."""
        statements = {role.arn: role.statements for role in self.roles.values()}
        for asked, question in self.asked:
            policy = question.policy
            policy = resource.get(id(policy), policy) if policy is not None else None
            own = identity.get(asked.principal, statements[asked.principal])
            if not decide(asked, own, policy, key_policy=question.key_policy).allowed:
                return asked
        return None

    def questions(self, request: ApiRequest) -> list[Question]:
        by_service = {
            "s3": self._s3,
            "sqs": self._sqs,
            "dynamodb": self._dynamodb,
            "kms": self._kms,
            "events": self._events,
            "sagemaker": self._sagemaker,
            "ssm": self._ssm,
            "elasticloadbalancing": self._elbv2,
            "servicequotas": self._servicequotas,
        }
        ask = by_service.get(request.service)
        if ask is not None:
            return ask(request)
        return [Question(f"{request.service}:{request.operation}", "*")]

    def _kms_use(self, key_arn: str | None, action: str, service: str) -> list[Question]:
        """What a service asks KMS on the caller's behalf, with ``kms:ViaService``."""
        if key_arn is None:
            return []
        via = {"kms:ViaService": f"{service}.{self.region}.amazonaws.com"}
        return [Question(action, key_arn, via, self.key_policies.get(key_arn, _DEFAULT_KEY_POLICY(self)), True)]

    def _s3(self, request: ApiRequest) -> list[Question]:
        bucket, key = bucket_and_key(request)
        operation = request.operation
        bucket_arn = f"arn:aws:s3:::{bucket}"
        policy = self.resource_policies.get(bucket_arn)
        context = {"s3:ResourceAccount": self.account_id}
        versioned = "versionId" in parse_qs(request.query)
        if operation in _S3_OBJECT_READS:
            action = "s3:GetObjectVersion" if versioned else "s3:GetObject"
            asked = [Question(action, f"{bucket_arn}/{key}", context, policy)]
            if self.object_exists(bucket, key):
                return asked + self._kms_use(self.bucket_keys.get(bucket), "kms:Decrypt", "s3")
            # S3 answers NoSuchKey only to a caller who may list the bucket; to any other AccessDenied.
            return [*asked, Question("s3:ListBucket", bucket_arn, context, policy, missing_object=True)]
        if operation == "PutObject":
            headers = {k.lower(): v for k, v in request.headers.items()}
            sse = {name: headers[h] for h, name in _SSE_HEADERS.items() if h in headers}
            asked = [Question("s3:PutObject", f"{bucket_arn}/{key}", {**context, **sse}, policy)]
            kms_key = sse.get("s3:x-amz-server-side-encryption-aws-kms-key-id") or self.bucket_keys.get(bucket)
            return asked + self._kms_use(kms_key, "kms:GenerateDataKey", "s3")
        if operation == "DeleteObject":
            action = "s3:DeleteObjectVersion" if versioned else "s3:DeleteObject"
            return [Question(action, f"{bucket_arn}/{key}", context, policy)]
        action = _S3_BUCKET_ACTIONS.get(operation, operation)
        return [Question(f"s3:{action}", bucket_arn, context, policy)]

    def _queue_arn(self, url_or_name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account_id}:{url_or_name.rsplit('/', 1)[-1]}"

    def _sqs(self, request: ApiRequest) -> list[Question]:
        params = _json(request)
        queue = self._queue_arn(str(params.get("QueueUrl") or params.get("QueueName") or "*"))
        action = _SQS_ACTIONS.get(request.operation, request.operation)
        asked = [Question(f"sqs:{action}", queue, {}, self.resource_policies.get(queue))]
        kms_action = {"SendMessage": "kms:GenerateDataKey", "ReceiveMessage": "kms:Decrypt"}.get(action)
        if kms_action is not None:
            asked += self._kms_use(self.queue_keys.get(queue), kms_action, "sqs")
        return asked

    def _dynamodb(self, request: ApiRequest) -> list[Question]:
        params = _json(request)
        table = f"arn:aws:dynamodb:{self.region}:{self.account_id}:table/"
        asked = []
        if request.operation in ("TransactWriteItems", "TransactGetItems"):
            for item in params.get("TransactItems", []):
                for kind, body in item.items():
                    action = "GetItem" if kind == "Get" else _DYNAMODB_TRANSACT[kind]
                    asked.append(Question(f"dynamodb:{action}", table + str(body["TableName"])))
        elif request.operation in ("BatchWriteItem", "BatchGetItem"):
            names = list(params.get("RequestItems", {}))
            asked = [Question(f"dynamodb:{request.operation}", table + name) for name in names]
        else:
            asked = [Question(f"dynamodb:{request.operation}", table + str(params.get("TableName", "*")))]
        # A table encrypted with a customer managed key: DynamoDB decrypts its table key with the caller's
        # permission, through DynamoDB.
        keys = {self.table_keys.get(q.resource.rsplit("/", 1)[-1]) for q in asked} - {None}
        for key in sorted(k for k in keys if k is not None):
            asked += self._kms_use(key, "kms:Decrypt", "dynamodb")
        return asked

    def _kms(self, request: ApiRequest) -> list[Question]:
        key_id = str(_json(request).get("KeyId", ""))
        arn = self.key_ids(key_id) or f"arn:aws:kms:{self.region}:{self.account_id}:key/{key_id}"
        policy = self.key_policies.get(arn, _DEFAULT_KEY_POLICY(self))
        return [Question(f"kms:{request.operation}", arn, {}, policy, True)]

    def _events(self, request: ApiRequest) -> list[Question]:
        if request.operation != "PutEvents":
            return [Question(f"events:{request.operation}", "*")]
        asked = []
        for entry in _json(request).get("Entries", []):
            bus = str(entry.get("EventBusName") or "default")
            arn = bus if bus.startswith("arn:") else f"arn:aws:events:{self.region}:{self.account_id}:event-bus/{bus}"
            asked.append(Question("events:PutEvents", arn, {"events:source": str(entry.get("Source", ""))}))
        return asked

    def _sagemaker(self, request: ApiRequest) -> list[Question]:
        name = str(_json(request).get("ClusterName", "*"))
        arn = name if name.startswith("arn:") else f"arn:aws:sagemaker:{self.region}:{self.account_id}:cluster/{name}"
        return [Question(f"sagemaker:{request.operation}", arn)]

    def _elbv2(self, request: ApiRequest) -> list[Question]:
        form = parse_qs(request.body.decode("utf-8", "replace"))
        target_group = form.get("TargetGroupArn", ["*"])[0]
        return [Question(f"elasticloadbalancing:{request.operation}", target_group)]

    def _servicequotas(self, request: ApiRequest) -> list[Question]:
        params = _json(request)
        service, code = params.get("ServiceCode", "*"), params.get("QuotaCode", "*")
        quota = f"arn:aws:servicequotas:{self.region}:{self.account_id}:{service}/{code}"
        return [Question(f"servicequotas:{request.operation}", quota)]

    def _ssm(self, request: ApiRequest) -> list[Question]:
        if request.operation != "SendCommand":
            return [Question(f"ssm:{request.operation}", "*")]
        params = _json(request)
        document = f"arn:aws:ssm:{self.region}::document/{params.get('DocumentName')}"
        asked = [Question("ssm:SendCommand", document)]
        for instance_id in params.get("InstanceIds") or []:
            kind = "managed-instance" if str(instance_id).startswith("mi-") else "instance"
            service = "ssm" if kind == "managed-instance" else "ec2"
            arn = f"arn:aws:{service}:{self.region}:{self.account_id}:{kind}/{instance_id}"
            tags = {f"ssm:resourceTag/{k}": v for k, v in self.instance_tags(str(instance_id)).items()}
            asked.append(Question("ssm:SendCommand", arn, tags))
        return asked


def _DEFAULT_KEY_POLICY(iam: IamModel) -> list[Statement]:
    """AWS's default key policy: the account root, which delegates to IAM."""
    root = {"AWS": f"arn:aws:iam::{iam.account_id}:root"}
    return [{"Effect": "Allow", "Principal": root, "Action": "kms:*", "Resource": "*"}]


def _json(request: ApiRequest) -> dict[str, Any]:
    try:
        value = json.loads(request.body or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
