"""Contract values shared by the package and the stack (``infra/``).

Each value is written once: here, or, when the head node reads it too (the bundle schema, the signature
algorithm, the pull agent's event names, bucket keys and config), in ``topokeeper.wire``.
"""

from __future__ import annotations

import re

# An EC2 instance id: the old 8-digit form or the current 17-digit one.
INSTANCE_ID_PATTERN = r"i-[0-9a-f]{8}(?:[0-9a-f]{9})?"
INSTANCE_ID = re.compile(INSTANCE_ID_PATTERN)


def ssm_payload_key(cluster: str, sha256: str) -> str:
    """Where the SSM channel puts a bundle too large for the command itself, for the head node to fetch
    (named by the sha256 of its bytes: two signed bundles of one plan differ)."""
    return f"payloads/{cluster}/{sha256}.json"


def ssm_program_key(cluster: str, sha256: str) -> str:
    """Where the SSM channel puts the head-node program when the command cannot carry it, for the head node to
    fetch: named by its sha256, so one build is one object."""
    return f"payloads/{cluster}/program-{sha256}.pyz"


RESULT_KEY_PREFIX = "results"


def ssm_result_key(cluster: str, token: str) -> str:
    """Where the head node PUTs, by a presigned URL, an applier document too large for SSM's stdout (one
    random token per command, so two commands never share an object)."""
    return f"{RESULT_KEY_PREFIX}/{cluster}/{token}.json"


# How long a URL the SSM channel presigns for the head node lives (the staged applier and bundle it GETs, the
# result it PUTs). At least the command's whole window: SSM may start the command as late as its delivery timeout
# (SendCommand TimeoutSeconds) after it was sent, then let it run for its executionTimeout (both are the
# channel's EXECUTION_TIMEOUT_SECONDS, the head-node program's CHANNEL_TIMEOUT_SECONDS). At most what SigV4 allows,
# 7 days (S3 refuses a longer X-Amz-Expires); and a URL signed with the Lambda role's temporary credentials ends
# when they do, whatever it says, so nothing may count on more than the window. The bucket keeps payloads/ and
# results/ for a day (infra/storage.py), longer than this. tests/unit/test_presigned_url_lifetime.py checks both bounds.
PRESIGNED_URL_SECONDS = 3600
SIGV4_MAX_EXPIRES_SECONDS = 7 * 24 * 3600


# The Lambdas' environment: the stack sets these (``infra/functions.py``), ``runtime.LambdaEnvironment``
# reads them, and ``deployment.Deployment`` rebuilds them for the operator CLI.
ENV_CONFIG = "TOPOKEEPER_CONFIG"
ENV_TABLE = "TABLE_NAME"
ENV_BUCKET = "BUCKET_NAME"
ENV_QUEUE = "QUEUE_URL"
ENV_DEAD_LETTER_QUEUE = "DEAD_LETTER_QUEUE_URL"
ENV_EVENT_BUS = "EVENT_BUS_NAME"
ENV_CLOUDTRAIL_CHANNEL = "CLOUDTRAIL_CHANNEL_ARN"
ENV_AUDIT_RETENTION = "AUDIT_RETENTION_DAYS"
ENV_SIGNING_KEY = "SIGNING_KEY_ID"  # the bundle-signing KMS key (reconcile and drift sign with it)
# Each login endpoint's target group (JSON, cluster -> ARN), in the ingest and drift functions' environment.
LOGIN_TARGET_GROUPS_ENV = "LOGIN_TARGET_GROUPS"
# Here rather than in topokeeper.contract.event_schemas, whose models the adapters that use these do not need.
AUDIT_SOURCE = "topokeeper"
AUDIT_DETAIL_TYPE = "UpdatePartitionTopology"
RUN_SHELL_DOCUMENT = "AWS-RunShellScript"
HYPERPOD_SOURCE = "aws.sagemaker"
CLOUDTRAIL_DETAIL_TYPE = "AWS API Call via CloudTrail"
CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE = "AWS Service Event via CloudTrail"
# HyperPod's own record of a topology change it made (when it manages the topology). Its shape is designed from
# the documentation, not seen: it may come as an API call or as a service event, so the rule takes both.
MANAGED_TOPOLOGY_EVENT = "UpdatePartitionTopology"
CLOUDTRAIL_DETAIL_TYPES = (CLOUDTRAIL_DETAIL_TYPE, CLOUDTRAIL_SERVICE_EVENT_DETAIL_TYPE)
# The trigger's summary is the only place a trigger keeps the event's name (the audit schema is fixed).
MANAGED_TOPOLOGY_SUMMARY = f"{MANAGED_TOPOLOGY_EVENT} by HyperPod"
NODE_TABLE_REQUEST = "nt-"  # a read the reconcile asked for the node table: an answer that comes later replans


def login_secret_names(cluster: str) -> tuple[str, str]:
    """A login endpoint's secrets: (the host identity bundle login nodes install, the CA private key only the
    operator reads). The stack creates them, the CLI fills them, the ingest function's installer reads the first."""
    return f"topokeeper/{cluster}/login-host-identity", f"topokeeper/{cluster}/login-ssh-ca"
