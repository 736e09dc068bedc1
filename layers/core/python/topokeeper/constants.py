"""Contract values shared by the package, the stack (``infra/``) and the head-node files.

Each value is written once here. What the pull agent shares (its event names, the keys it polls, its config)
is in ``topokeeper.wire``, which the agent imports on the head node. The stdlib-only applier
(``applier/applier.py``) cannot import the package and keeps literal copies; ``tests/unit/test_constants.py``
asserts that they carry the same values.
"""

from __future__ import annotations

import re

# An EC2 instance id: the old 8-digit form or the current 17-digit one.
INSTANCE_ID_PATTERN = r"i-[0-9a-f]{8}(?:[0-9a-f]{9})?"
INSTANCE_ID = re.compile(INSTANCE_ID_PATTERN)

# The bundle document the applier and the agent accept (``render/bundle.py`` writes it).
BUNDLE_SCHEMA = "topokeeper.bundle/2"

# How bundles are signed (KMS SigningAlgorithm); the applier checks exactly this.
SIGNATURE_ALGORITHM = "RSASSA_PKCS1_V1_5_SHA_256"


def ssm_payload_key(cluster: str, sha256: str) -> str:
    """Where the SSM channel puts a bundle too large for the command itself, for the head node to fetch
    (named by the sha256 of its bytes: two signed bundles of one plan differ)."""
    return f"payloads/{cluster}/{sha256}.json"


def ssm_applier_key(cluster: str, sha256: str) -> str:
    """Where the SSM channel puts the applier when the command cannot carry it, for the head node to fetch."""
    return f"payloads/{cluster}/applier-{sha256}.py"


RESULT_KEY_PREFIX = "results"


def ssm_result_key(cluster: str, token: str) -> str:
    """Where the head node PUTs, by a presigned URL, an applier document too large for SSM's stdout (one
    random token per command, so two commands never share an object)."""
    return f"{RESULT_KEY_PREFIX}/{cluster}/{token}.json"


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
# Here rather than in topokeeper.events, whose models the adapters that use these do not need.
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
