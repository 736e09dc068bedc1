"""Events the emulated services send to EventBridge, delivered through moto's rules and targets.

AWS services put events on the default bus themselves; the emulator does the same by handing each
event to every enabled rule of moto's bus, which matches the pattern and delivers to the targets
(SQS, CloudWatch Logs, ...). Event ids and times come from the emulator's seed and clock.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from moto.events.models import events_backends

from topokeeper.sim.aws.clock import Clock
from topokeeper.sim.aws.ids import IdFactory
from topokeeper.sim.aws.protocol import ApiError, ApiRequest, epoch, json_params, lower_camel

HYPERPOD = "hyperpod"  # SageMaker HyperPod Cluster State Change / Node Health Event
CLOUDTRAIL = "cloudtrail"  # AWS API Call via CloudTrail, for the mutating calls the emulator serves
SSM = "ssm"  # EC2 Command (Invocation) Status-change Notification
EC2 = "ec2"  # EC2 Instance State-change Notification (the simulator's ParallelCluster launches and terminates)
KINDS = (HYPERPOD, CLOUDTRAIL, SSM, EC2)


def iso_z(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def camel_keys(value: Any) -> Any:
    """CloudTrail spells SageMaker request and response keys in lowerCamelCase, nested keys too."""
    if isinstance(value, Mapping):
        return {lower_camel(str(key)): camel_keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [camel_keys(item) for item in value]
    if isinstance(value, datetime):
        return iso_z(value)
    return value


PUT_EVENTS_TOO_LARGE = "Total size of the entries in the request is over the limit."


def refuse_oversized_put_events(request: ApiRequest) -> None:
    """EventBridge refuses a PutEvents request whose entries total 256 KB or more; moto accepts any size.
    Measured on the server's side of the wire, as the user guide documents it (the client measures its own)."""
    if request.operation != "PutEvents" or request.service != "events":
        return
    total = 0
    for entry in json_params(request).get("Entries") or []:
        texts = [entry.get("Source"), entry.get("DetailType"), entry.get("Detail"), *(entry.get("Resources") or [])]
        total += (14 if "Time" in entry else 0) + sum(len(str(text).encode()) for text in texts if text)
    if total >= 256 * 1024:
        raise ApiError("ValidationException", PUT_EVENTS_TOO_LARGE)


class EventEmitter:
    """Puts events on the emulator account's default bus. Switch off all (``enabled``) or by kind."""

    def __init__(self, *, account_id: str, region: str, clock: Clock, ids: IdFactory) -> None:
        self.account_id = account_id
        self.region = region
        self.bus_name = "default"
        self.enabled = True
        self.kinds: dict[str, bool] = dict.fromkeys(KINDS, True)
        self._clock = clock
        self._ids = ids
        self._lock = threading.Lock()
        self._emitted: list[dict[str, Any]] = []

    def emitted(self, detail_type: str | None = None) -> list[dict[str, Any]]:
        """The envelopes emitted so far (all, or of one detail-type), oldest first."""
        with self._lock:
            return [copy.deepcopy(e) for e in self._emitted if detail_type in (None, e["detail-type"])]

    def clear(self) -> None:
        with self._lock:
            self._emitted.clear()

    def emit(
        self, kind: str, *, source: str, detail_type: str, detail: Mapping[str, Any], resources: Iterable[str] = ()
    ) -> dict[str, Any] | None:
        """Build the envelope and deliver it; None when this kind of event is switched off."""
        if not self.enabled or not self.kinds.get(kind, False):
            return None
        now = self._clock.now()
        envelope: dict[str, Any] = {
            "version": "0",
            "id": self._ids.uuid("event"),
            "detail-type": detail_type,
            "source": source,
            "account": self.account_id,
            "time": iso_z(now),
            "region": self.region,
            "resources": list(resources),
            "detail": copy.deepcopy(dict(detail)),
        }
        with self._lock:
            self._emitted.append(copy.deepcopy(envelope))
        self._deliver(envelope, epoch(now))
        return envelope

    def _deliver(self, envelope: Mapping[str, Any], timestamp: float) -> None:
        # Straight to moto's rules, not PutEvents: an AWS service's event is no API call of the account (the
        # emulator would count it), and its id and time must come from the emulator's seed and clock.
        backend = events_backends[self.account_id][self.region]
        bus = backend.describe_event_bus(self.bus_name)
        for rule in list(bus.rules.values()):
            if getattr(rule, "state", "ENABLED") != "ENABLED":
                continue
            # moto's targets format the epoch themselves, in the top level of the message (nothing below it).
            message = {**envelope, "time": timestamp, "ingestion-time": timestamp}
            rule.send_to_targets(cast(Any, message))

    def cloudtrail(
        self,
        request: ApiRequest,
        *,
        event_source: str,
        params: Mapping[str, Any],
        response: Mapping[str, Any] | None,
        error: tuple[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """An ``AWS API Call via CloudTrail`` event for one API call the emulator served."""
        now = self._clock.now()
        user = "emulator"
        detail: dict[str, Any] = {
            "eventVersion": "1.11",
            "userIdentity": {
                "type": "IAMUser",
                "principalId": "AIDAEMULATOREXAMPLE",
                "arn": f"arn:aws:iam::{self.account_id}:user/{user}",
                "accountId": self.account_id,
                "accessKeyId": request.access_key,
                "userName": user,
            },
            "eventTime": iso_z(now),
            "eventSource": event_source,
            "eventName": request.operation,
            "awsRegion": request.region,
            "sourceIPAddress": request.source_ip,
            "userAgent": request.user_agent,
            "requestParameters": camel_keys(params),
            "responseElements": camel_keys(response) if response is not None else None,
            "requestID": self._ids.uuid("cloudtrail-request"),
            "eventID": self._ids.uuid("cloudtrail-event"),
            "readOnly": False,
            "eventType": "AwsApiCall",
            "managementEvent": True,
            "recipientAccountId": self.account_id,
            "eventCategory": "Management",
        }
        if error is not None:
            detail["errorCode"], detail["errorMessage"] = error
        source = "aws." + event_source.split(".", 1)[0]
        return self.emit(CLOUDTRAIL, source=source, detail_type="AWS API Call via CloudTrail", detail=detail)
