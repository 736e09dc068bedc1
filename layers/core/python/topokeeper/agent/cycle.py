"""One cycle of one cluster's pull loop: poll, apply when changed, verify when due or asked, report."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Dict, Optional

from topokeeper.agent.applier_process import agent_result, bounded_result, run_applier
from topokeeper.agent.aws import Aws
from topokeeper.agent.bundle import BundleRefused, check_bundle, plan_sha256_of
from topokeeper.agent.credentials import Clock, CredentialProvider
from topokeeper.agent.errors import AgentError
from topokeeper.agent.log import log
from topokeeper.agent.placement import facts_body
from topokeeper.agent.state import BundleRef, State, exclusive, load_state, save_state, write_atomically
from topokeeper.wire import (
    AGENT_APPLY_DETAIL_TYPE,
    AGENT_VERIFY_DETAIL_TYPE,
    AgentConfig,
    agent_placement_facts_key,
)

MAX_VERIFY_REQUEST_BYTES = 64 * 1024
# Reports that could not be sent wait in the state file for the next cycle; the newest are kept.
MAX_OUTBOX = 20


class Agent:
    """One cluster's pull loop; everything that must outlive a process is in ``state_dir``."""

    def __init__(self, config: AgentConfig, clock: Clock = time.time) -> None:
        self.config = config
        self._clock = clock
        self._aws = Aws(config, CredentialProvider(config.request_timeout_seconds, clock), clock)
        self._host = socket.gethostname()
        self._state_path = os.path.join(config.state_dir, "state.json")
        self._bundle_path = os.path.join(config.state_dir, "bundle.json")
        self._facts_key = agent_placement_facts_key(config.cluster, config.prefix)

    def cycle(self) -> None:
        """Poll, apply when changed, verify when due, put placement facts when due, send the reports. S3,
        EventBridge and applier failures are logged and left for the next cycle, never raised."""
        os.makedirs(self.config.state_dir, mode=0o700, exist_ok=True)
        with exclusive(os.path.join(self.config.state_dir, "lock")) as locked:
            if not locked:
                log("cycle.skipped", reason="another cycle holds the lock")
                return
            state = load_state(self._state_path)
            request = self._verify_request(state)
            applied = self._poll(state, request)
            verified = applied and self.config.mode == "verify"  # _poll verified a new bundle, for the request too
            ran = applied
            if request is not None and not verified and state.bundle is not None:
                # Asked for: verify now, even right after an apply (the live state may have changed since).
                self._verify(state, state.bundle, request)
                ran = True
            elif not applied and state.bundle is not None and self._verify_due(state):
                self._verify(state, state.bundle)
                ran = True
            if not ran and self._facts_due(state):  # one program run per cycle: systemd's bound holds
                self._put_placement_facts(state)
            save_state(self._state_path, state)
            if state.outbox:
                self._send_reports(state)
                save_state(self._state_path, state)

    def _poll(self, state: State, request_id: Optional[str] = None) -> bool:
        """Returns whether the applier ran. In verify mode a new bundle is verified, answering ``request_id``."""
        try:
            fetched = self._aws.get_bundle_if_changed(state.etag)
        except AgentError as error:
            log("poll.failed", level="error", error=str(error))
            return False
        if fetched is None:
            log("poll.not_modified", etag=state.etag)
            return False
        if fetched.etag == state.etag:  # a proxy on the way answered without honouring If-None-Match
            log("poll.unchanged", etag=state.etag)
            return False
        log("poll.changed", etag=fetched.etag, version_id=fetched.version_id, size=len(fetched.body))
        state.etag = fetched.etag
        try:
            bundle = check_bundle(fetched.body, self.config.cluster)
        except BundleRefused as refusal:
            log("bundle.refused", level="error", etag=fetched.etag, outcome=refusal.outcome, error=str(refusal))
            plan_sha256 = plan_sha256_of(fetched.body)
            result = agent_result(refusal.outcome, "apply", plan_sha256, str(refusal))
            self._queue(
                state, AGENT_APPLY_DETAIL_TYPE, BundleRef(fetched.etag, fetched.version_id, plan_sha256), result
            )
            return False
        write_atomically(self._bundle_path, fetched.body)
        reference = BundleRef(fetched.etag, fetched.version_id, bundle["plan_sha256"])
        state.bundle = reference
        if self.config.mode == "verify":
            self._verify(state, reference, request_id)
            return True
        result = run_applier(self.config, "apply", self._bundle_path, reference.plan_sha256)
        log("apply.result", outcome=result.get("outcome"), plan_sha256=reference.plan_sha256, error=result.get("error"))
        state.last_verify_at = self._clock()  # an apply reads the live config back: it counts as a verify
        self._queue(state, AGENT_APPLY_DETAIL_TYPE, reference, result)
        return True

    def _verify_request(self, state: State) -> Optional[str]:
        """The id of a verify request not honoured yet, or None. A request is
        ``{"request_id": "...", ...}``; anything else is logged and skipped."""
        try:
            fetched = self._aws.get_verify_request_if_changed(state.request_etag)
        except AgentError as error:
            log("verify_request.failed", level="error", error=str(error))
            return None
        if fetched is None or fetched.etag == state.request_etag:
            return None
        state.request_etag = fetched.etag
        try:
            request_id = json.loads(fetched.body[:MAX_VERIFY_REQUEST_BYTES].decode("utf-8")).get("request_id")
        except (UnicodeDecodeError, ValueError, AttributeError, RecursionError):  # json recurses per nesting level
            request_id = None
        if not isinstance(request_id, str) or not request_id or len(request_id) > 200:
            log("verify_request.unreadable", level="warning", etag=fetched.etag)
            return None
        if request_id == state.request_id:
            return None
        log("verify_request.received", request_id=request_id)
        state.request_id = request_id
        return request_id

    def _verify_due(self, state: State) -> bool:
        return (
            os.path.exists(self._bundle_path)
            and self._clock() - state.last_verify_at >= self.config.verify_interval_seconds
        )

    def _facts_due(self, state: State) -> bool:
        interval = self.config.placement_facts_interval_seconds
        return interval > 0 and self._clock() - state.last_facts_at >= interval

    def _put_placement_facts(self, state: State) -> None:
        """The facts, or the one line why there are none, in the bucket; a failed PUT waits for the next interval
        (the reader shows the facts' age, and too old ones as stale)."""
        state.last_facts_at = self._clock()
        body, error = facts_body(self.config)
        if error is not None:
            log("placement_facts.refused", level="warning", error=error)
        try:
            self._aws.put_object(self._facts_key, body)
        except AgentError as failure:
            log("placement_facts.failed", level="error", error=str(failure))
            return
        log("placement_facts.put", key=self._facts_key, size=len(body))

    def _verify(self, state: State, reference: BundleRef, request_id: Optional[str] = None) -> None:
        result = run_applier(self.config, "verify", self._bundle_path, reference.plan_sha256)
        log("verify.result", outcome=result.get("outcome"), plan_sha256=reference.plan_sha256, request_id=request_id)
        state.last_verify_at = self._clock()
        self._queue(state, AGENT_VERIFY_DETAIL_TYPE, reference, result, request_id)

    def _queue(
        self,
        state: State,
        detail_type: str,
        reference: BundleRef,
        result: Dict[str, Any],
        request_id: Optional[str] = None,
    ) -> None:
        detail: Dict[str, Any] = {
            "cluster": self.config.cluster,
            "plan_sha256": reference.plan_sha256,
            "etag": reference.etag,
            "version_id": reference.version_id,
            "host": self._host,
            "result": bounded_result(result),
        }
        if request_id is not None:
            detail["verify_request"] = request_id
        state.outbox.append({"detail_type": detail_type, "detail": detail})
        if len(state.outbox) > MAX_OUTBOX:
            log("report.dropped", level="warning", count=len(state.outbox) - MAX_OUTBOX)
            del state.outbox[:-MAX_OUTBOX]

    def _send_reports(self, state: State) -> None:
        """Oldest first; a failure leaves the rest for the next cycle."""
        while state.outbox:
            report = state.outbox[0]
            try:
                self._aws.put_event(report["detail_type"], report["detail"])
            except AgentError as error:
                log("report.failed", level="error", pending=len(state.outbox), error=str(error))
                return
            state.outbox.pop(0)
            log(
                "report.sent",
                detail_type=report["detail_type"],
                outcome=report["detail"]["result"].get("outcome"),
                etag=report["detail"].get("etag"),
            )
