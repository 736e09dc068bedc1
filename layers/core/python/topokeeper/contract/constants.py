"""Contract values shared by the package, the stack (``infra/``) and the head-node files.

Each value is written once here. The stdlib-only files that run on the head node (``applier/applier.py``,
``agent/agent.py``) cannot import the package and keep literal copies; ``tests/unit/test_constants.py``
asserts that they carry the same values.
"""

from __future__ import annotations

import re

# An EC2 instance id: the old 8-digit form or the current 17-digit one.
INSTANCE_ID_PATTERN = r"i-[0-9a-f]{8}(?:[0-9a-f]{9})?"
INSTANCE_ID = re.compile(INSTANCE_ID_PATTERN)

# The bundle document the applier and the agent accept (``render/bundle.py`` writes it).
BUNDLE_SCHEMA = "topokeeper.bundle/2"

# The head-node agent's result events (EventBridge source and detail types). Each agent cluster reports
# with its own source, AGENT_SOURCE.<cluster>, which its IAM policy enforces (events:source): the source,
# not the detail, says which cluster a report is about. The bare AGENT_SOURCE is what agents before
# per-cluster sources sent; it only ever counts as an outdated agent.
AGENT_SOURCE = "topokeeper.agent"
AGENT_APPLY_DETAIL_TYPE = "Topology Apply Result"
AGENT_VERIFY_DETAIL_TYPE = "Topology Verify Result"


# How bundles are signed (KMS SigningAlgorithm); the applier checks exactly this.
SIGNATURE_ALGORITHM = "RSASSA_PKCS1_V1_5_SHA_256"


def agent_source(cluster: str) -> str:
    """The event source only ``cluster``'s agent may send (its IAM policy's events:source condition)."""
    return f"{AGENT_SOURCE}.{cluster}"


def agent_source_cluster(source: str) -> str | None:
    """The cluster an agent source belongs to; None for the legacy shared source and for other sources."""
    prefix = AGENT_SOURCE + "."
    if not source.startswith(prefix):
        return None
    return source[len(prefix) :] or None


# Where the agent channel puts a cluster's desired bundle in the plans bucket (the agent's default
# ``--prefix``): ``bundle.json`` to apply, ``verify.json`` to verify against only.
AGENT_KEY_PREFIX = "clusters"


def agent_bundle_key(cluster: str) -> str:
    return f"{AGENT_KEY_PREFIX}/{cluster}/bundle.json"


def agent_verify_key(cluster: str) -> str:
    return f"{AGENT_KEY_PREFIX}/{cluster}/verify.json"


def agent_verify_request_key(cluster: str) -> str:
    """Where the backend asks the agent for a verify at once (HyperPod changed the topology itself)."""
    return f"{AGENT_KEY_PREFIX}/{cluster}/verify-request.json"


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
