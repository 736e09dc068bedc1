"""Channel 2: the head-node pull agent (HyperPod nodes cannot receive SSM Run Command).

Delivering writes the desired bundle to ``clusters/<cluster>/bundle.json`` in the versioned bucket; the
agent on the head node polls its ETag, runs the same applier, and reports the same result document
as an EventBridge event. Verifying writes ``clusters/<cluster>/verify.json``, which the agent only
ever verifies against (never applies), and returns the agent's latest report about that plan. A verify
``request`` (the live state just changed) writes ``verify-request.json`` instead, which the agent honours at
its next poll; its report names the request and the result function records it. With ``placement_metrics`` the
agent puts the head node's placement facts in ``placement-facts.json`` beside them (``topokeeper.agent.placement``);
``placement_facts`` reads the newest, with its age by S3's clock, and refuses facts older than ``max_report_age``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors, error_code
from topokeeper.contract.errors import Permanent
from topokeeper.contract.ports import ApplyResult, Channel, DeliveryHandle, Outcome, StateStore
from topokeeper.wire import (
    MAX_FULL_RESULT_BYTES,
    agent_bundle_key,
    agent_placement_facts_key,
    agent_verify_key,
    agent_verify_request_key,
)

if TYPE_CHECKING:  # in signatures only: the functions that deliver load it at init (service.reconcile)
    from topokeeper.render.bundle import Bundle


class AgentChannel:
    def __init__(
        self,
        s3: Any,
        bucket: str,
        state: StateStore,
        *,
        now: Callable[[], datetime],
        max_report_age: timedelta,
        verify_only: bool,
    ) -> None:
        self._s3 = s3
        self._bucket = bucket
        self._state = state
        self._now = now
        self._max_age = max_report_age
        # In enforce mode the agent verifies against the bundle it applied; only verify mode needs verify.json.
        self._verify_only = verify_only

    def _put(self, key: str, bundle: Bundle) -> str:
        body = json.dumps(bundle.document(), sort_keys=True).encode()
        response = self._s3.put_object(
            Bucket=self._bucket,
            Key=key,
            Body=body,
            ContentType="application/json",
            Metadata={"plan-sha256": bundle.plan_sha256},
        )
        reference: str = response.get("VersionId") or response["ETag"].strip('"')
        return reference

    @aws_errors()
    def deliver(self, bundle: Bundle) -> DeliveryHandle:
        return DeliveryHandle(
            channel=Channel.AGENT,
            cluster=bundle.cluster_name,
            plan_sha256=bundle.plan_sha256,
            reference=self._put(agent_bundle_key(bundle.cluster_name), bundle),
            target=f"s3://{self._bucket}/{agent_bundle_key(bundle.cluster_name)}",
            sent_at=self._now(),
        )

    @aws_errors()
    def verify(self, bundle: Bundle, *, request: str | None = None) -> ApplyResult:
        if self._verify_only:
            self._ensure_verify_bundle(bundle)
        if request is not None:
            # The last report predates the change: ask for a fresh one (the result function records it).
            body = {"request_id": request, "plan_sha256": bundle.plan_sha256, "requested_at": self._now().isoformat()}
            self._s3.put_object(
                Bucket=self._bucket,
                Key=agent_verify_request_key(bundle.cluster_name),
                Body=json.dumps(body, sort_keys=True).encode(),
                ContentType="application/json",
            )
            return ApplyResult.from_channel(Outcome.PENDING, f"asked the agent for a fresh verify (request {request})")
        state = self._state.get(bundle.cluster_name)
        report, seen_at = state.last_verify, state.last_verify_at
        if report is None or seen_at is None:
            return ApplyResult.from_channel(Outcome.PENDING, "the agent has not reported a verify result yet")
        if report.plan_sha256 != bundle.plan_sha256:
            return ApplyResult.from_channel(Outcome.PENDING, "the agent's last verify was for another plan")
        if self._now() - seen_at > self._max_age:
            return ApplyResult.from_channel(Outcome.PENDING, f"the agent's last verify is older than {self._max_age}")
        return report

    def _ensure_verify_bundle(self, bundle: Bundle) -> None:
        key = agent_verify_key(bundle.cluster_name)
        try:
            head = self._s3.head_object(Bucket=self._bucket, Key=key)
            if head.get("Metadata", {}).get("plan-sha256") == bundle.plan_sha256:
                return
        except ClientError as error:
            if error_code(error) not in ("404", "NoSuchKey", "NotFound"):
                raise
        self._put(key, bundle)

    @aws_errors()
    def placement_facts(self, cluster: str) -> tuple[dict[str, Any], timedelta]:
        """The newest placement facts the agent put, and their age (now less the object's LastModified). Absent,
        larger than the agent puts, or not a JSON object: ``Permanent`` with the reason in one line."""
        key = agent_placement_facts_key(cluster)
        try:
            response = self._s3.get_object(Bucket=self._bucket, Key=key)
        except ClientError as error:
            if error_code(error) not in ("NoSuchKey", "404"):
                raise
            raise Permanent(
                f"no placement facts at s3://{self._bucket}/{key}: the agent puts them only with placement_metrics"
                " (its install script's --placement-seconds); has it run since?"
            ) from None
        body: bytes = response["Body"].read(MAX_FULL_RESULT_BYTES + 1)
        if len(body) > MAX_FULL_RESULT_BYTES:
            raise Permanent(f"s3://{self._bucket}/{key}: over the {MAX_FULL_RESULT_BYTES} bytes the agent puts")
        try:
            document = json.loads(body)
        except (ValueError, RecursionError) as error:
            raise Permanent(f"s3://{self._bucket}/{key}: not JSON: {str(error)[:200]}") from None
        if not isinstance(document, dict):
            raise Permanent(f"s3://{self._bucket}/{key}: not a JSON object")
        return document, self._now() - response["LastModified"]

    def current_placement_facts(self, cluster: str) -> dict[str, Any]:
        """The newest facts if no older than ``max_report_age`` (the bound on the agent's verify reports); stale
        ones raise ``Permanent`` saying their age, never pass as current."""
        document, age = self.placement_facts(cluster)
        if age > self._max_age:
            raise Permanent(f"{stale_facts(age, self._max_age)}: not current")
        return document

    @property
    def max_report_age(self) -> timedelta:
        return self._max_age


def stale_facts(age: timedelta, bound: timedelta) -> str:
    return (
        f"the agent's placement facts are {age.total_seconds():.0f} s old, over the {bound.total_seconds():.0f} s bound"
    )
