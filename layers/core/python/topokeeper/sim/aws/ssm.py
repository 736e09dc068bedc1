"""SSM Run Command as AWS runs it, on top of moto's command store.

moto accepts any instance id, adds every EC2 instance to a command sent without ``Targets``, always
reports ``Success`` with empty output, and has no ``ListCommandInvocations``. Here ``SendCommand``
checks ids as AWS does, targets exactly what was asked, and each invocation is run by the simulator's
``on_command`` hook (at once) or finished later with ``complete``. Every status change is emitted as
``EC2 Command Invocation Status-change Notification`` (and the command's as ``EC2 Command Status-change
Notification``) on the default event bus.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from moto.ec2.models import ec2_backends
from moto.ssm.models import ssm_backends

from topokeeper.sim.aws.clock import Clock
from topokeeper.sim.aws.events import SSM, EventEmitter
from topokeeper.sim.aws.ids import IdFactory
from topokeeper.sim.aws.protocol import (
    ApiError,
    ApiRequest,
    decode_token,
    encode_token,
    json_params,
    operation_model,
    validate_input,
)

INSTANCE_ID = re.compile(r"(^i-(\w{8}|\w{17})$)|(^mi-\w{17}$)")
TERMINAL = ("Success", "Failed", "TimedOut", "Cancelled")
PLUGIN = "aws:runShellScript"
MAX_STDOUT = 24_000
MAX_STDERR = 8_000
MAX_PLUGIN_OUTPUT = 2_500
_DETAILS = {
    "Pending": "Pending",
    "InProgress": "In Progress",
    "Delayed": "Delayed",
    "Success": "Success",
    "Failed": "Failed",
    "TimedOut": "Execution Timed Out",
    "Cancelled": "Cancelled",
}


@dataclass(frozen=True)
class CommandInvocationRequest:
    """One instance's share of a SendCommand, as the ``on_command`` hook receives it."""

    command_id: str
    instance_id: str
    document_name: str
    parameters: Mapping[str, list[str]]
    comment: str
    requested_at: datetime

    @property
    def commands(self) -> list[str]:
        return list(self.parameters.get("commands", []))

    @property
    def script(self) -> str:
        """The shell script AWS-RunShellScript would run: the ``commands`` lines."""
        return "\n".join(self.commands)


class CommandOutcome(NamedTuple):
    status: str  # Success | Failed | TimedOut | Cancelled
    response_code: int = 0
    stdout: str = ""
    stderr: str = ""


Hook = Callable[[CommandInvocationRequest], CommandOutcome | tuple[str, int, str, str] | None]


@dataclass
class _Times:
    started: datetime | None = None
    finished: datetime | None = None
    plugin_output: str = ""


def _iso_ms(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _naive_utc(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None)


class SsmRunCommand:
    """Run Command for the simulator: ``on_command`` runs invocations, ``complete`` finishes deferred ones.

    ``on_command(invocation)`` returns a ``CommandOutcome`` (or a ``(status, response_code, stdout,
    stderr)`` tuple) to finish the invocation at once, or None to leave it ``InProgress`` until
    ``complete``. Without a hook every invocation succeeds with empty output, as in moto. As AWS does (and
    moto does not), only running EC2 instances and ``register_managed_instance`` ids are accepted
    (``strict_targets``, on unless a test turns it off). Who may send is the emulator's IAM's question
    (``iam.IamModel``: the document and every instance, with its tags), asked before this handler runs.
    """

    def __init__(
        self, *, account_id: str, region: str, clock: Clock, ids: IdFactory, events: EventEmitter, lock: threading.RLock
    ) -> None:
        self.on_command: Hook | None = None
        self.strict_targets = True  # as AWS: only running EC2 instances and registered managed nodes
        self.errors: list[BaseException] = []  # exceptions raised by on_command (the invocation Failed)
        self._account_id = account_id
        self._region = region
        self._clock = clock
        self._ids = ids
        self._events = events
        self._lock = lock
        self._managed: set[str] = set()
        self._managed_tags: dict[str, dict[str, str]] = {}
        self._ping: dict[str, str] = {}  # PingStatus other than Online, by instance id
        self._pending: dict[tuple[str, str], CommandInvocationRequest] = {}
        self._times: dict[tuple[str, str], _Times] = {}

    # ------------------------------------------------------------ control

    def register_managed_instance(self, instance_id: str, tags: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._managed.add(instance_id)
            self._managed_tags[instance_id] = dict(tags or {})

    def instance_tags(self, instance_id: str) -> dict[str, str]:
        """An EC2 instance's tags, or a registered managed node's (what ``ssm:resourceTag/...`` reads)."""
        with self._lock:
            if instance_id in self._managed_tags:
                return dict(self._managed_tags[instance_id])
        found = {i.id: i for i in ec2_backends[self._account_id][self._region].all_instances()}.get(instance_id)
        return {tag["key"]: tag["value"] for tag in found.get_tags()} if found is not None else {}

    def set_ping_status(self, instance_id: str, status: str) -> None:
        """What DescribeInstanceInformation reports for a managed instance: Online, ConnectionLost or Inactive."""
        with self._lock:
            self._ping[instance_id] = status

    def pending(self) -> list[CommandInvocationRequest]:
        """Invocations still InProgress (the hook returned None), oldest first."""
        with self._lock:
            return list(self._pending.values())

    def complete(
        self,
        command_id: str,
        instance_id: str | None = None,
        *,
        status: str = "Success",
        response_code: int = 0,
        stdout: str = "",
        stderr: str = "",
    ) -> list[str]:
        """Finish a deferred invocation (or all of the command's); returns the instance ids finished."""
        if status not in TERMINAL:
            raise ValueError(f"status must be one of {', '.join(TERMINAL)}: {status!r}")
        with self._lock:
            keys = [k for k in self._pending if k[0] == command_id and instance_id in (None, k[1])]
            if not keys:
                raise KeyError(f"no pending invocation of {command_id}" + (f" on {instance_id}" if instance_id else ""))
            for key in keys:
                self._finish(key, CommandOutcome(status, response_code, stdout, stderr))
            return [k[1] for k in keys]

    def invocation(self, command_id: str, instance_id: str) -> dict[str, Any]:
        """GetCommandInvocation's answer, without HTTP."""
        with self._lock:
            return copy.deepcopy(self._command(command_id).get_invocation(instance_id, None))

    # ------------------------------------------------------------ internals

    def _backend(self, region: str) -> Any:
        return ssm_backends[self._account_id][region]

    def _command(self, command_id: str, region: str | None = None) -> Any:
        try:
            return self._backend(region or self._region).get_command_by_id(command_id)
        except Exception as error:
            raise ApiError("InvalidCommandId", "Invalid command id.") from error

    def _managed_now(self, region: str) -> set[str]:
        running = {i.id for i in ec2_backends[self._account_id][region].all_instances() if i.state == "running"}
        return running | self._managed

    def _set(self, key: tuple[str, str], status: str, outcome: CommandOutcome | None = None) -> None:
        command = self._command(key[0])
        invocation = command.get_invocation(key[1], None)
        times = self._times[key]
        now = self._clock.now()
        invocation["Status"] = status
        invocation["StatusDetails"] = _DETAILS[status]
        if status == "InProgress":
            times.started = now
            invocation["ExecutionStartDateTime"] = _iso_ms(now)
        if outcome is not None:
            times.finished = now
            started = times.started or now
            invocation["ResponseCode"] = outcome.response_code
            invocation["StandardOutputContent"] = outcome.stdout[:MAX_STDOUT]
            invocation["StandardErrorContent"] = outcome.stderr[:MAX_STDERR]
            invocation["ExecutionEndDateTime"] = _iso_ms(now)
            invocation["ExecutionElapsedTime"] = f"PT{(now - started).total_seconds():.3f}S"
            output = outcome.stdout
            if outcome.stderr:
                output += "\n----------ERROR-------\n" + outcome.stderr
            times.plugin_output = output[:MAX_PLUGIN_OUTPUT]
        self._emit_invocation(command, key[1], status)
        self._aggregate(command)

    def _aggregate(self, command: Any) -> None:
        statuses = [i["Status"] for i in command.invocations]
        done = [s for s in statuses if s in TERMINAL]
        if len(done) < len(statuses):
            status = "InProgress" if any(s != "Pending" for s in statuses) else "Pending"
        elif all(s == "Success" for s in statuses):
            status = "Success"
        elif "Failed" in statuses:
            status = "Failed"
        elif "TimedOut" in statuses:
            status = "TimedOut"
        else:
            status = "Cancelled"
        command.completed_count = len(done)
        command.error_count = len([s for s in statuses if s in ("Failed", "TimedOut")])
        previous = command.status
        command.status = status
        command.status_details = _DETAILS[status]
        if status != previous:
            self._events.emit(
                SSM,
                source="aws.ssm",
                detail_type="EC2 Command Status-change Notification",
                detail={
                    "command-id": command.command_id,
                    "document-name": command.document_name,
                    "expire-after": _iso_ms(command.expires_after.replace(tzinfo=UTC)),
                    "parameters": copy.deepcopy(command.parameters),
                    "requested-date-time": _iso_ms(command.requested_date_time.replace(tzinfo=UTC)),
                    "status": status,
                },
                resources=[self._instance_arn(i) for i in command.instance_ids],
            )

    def _emit_invocation(self, command: Any, instance_id: str, status: str) -> None:
        self._events.emit(
            SSM,
            source="aws.ssm",
            detail_type="EC2 Command Invocation Status-change Notification",
            detail={
                "command-id": command.command_id,
                "document-name": command.document_name,
                "instance-id": instance_id,
                "requested-date-time": _iso_ms(command.requested_date_time.replace(tzinfo=UTC)),
                "status": status,
            },
            resources=[self._instance_arn(instance_id)],
        )

    def _instance_arn(self, instance_id: str) -> str:
        return f"arn:aws:ec2:{self._region}:{self._account_id}:instance/{instance_id}"

    def _finish(self, key: tuple[str, str], outcome: CommandOutcome) -> None:
        self._pending.pop(key, None)
        self._set(key, outcome.status, outcome)

    def _run(self, request: CommandInvocationRequest) -> None:
        key = (request.command_id, request.instance_id)
        with self._lock:
            self._set(key, "InProgress")
        hook = self.on_command
        outcome: CommandOutcome | None
        if hook is None:
            outcome = CommandOutcome("Success")
        else:
            try:
                result = hook(request)
            except Exception as error:  # a broken hook fails the invocation, visibly
                self.errors.append(error)
                result = CommandOutcome("Failed", 1, "", f"on_command raised {type(error).__name__}: {error}")
            outcome = None if result is None else CommandOutcome(*result)
            if outcome is not None and outcome.status not in TERMINAL:
                self.errors.append(ValueError(f"on_command returned status {outcome.status!r}"))
                outcome = CommandOutcome("Failed", 1, outcome.stdout, f"invalid status {outcome.status!r}")
        with self._lock:
            if outcome is None:
                self._pending[key] = request
            else:
                self._finish(key, outcome)

    # ------------------------------------------------------------ API

    def handlers(self) -> dict[tuple[str, str], Callable[[ApiRequest], Mapping[str, Any]]]:
        return {
            ("ssm", "SendCommand"): self.send_command,
            ("ssm", "ListCommandInvocations"): self.list_command_invocations,
            ("ssm", "DescribeInstanceInformation"): self.describe_instance_information,
        }

    def describe_instance_information(self, request: ApiRequest) -> dict[str, Any]:
        """The managed instances (running EC2 instances and registered ones), by the ``InstanceIds`` filter only:
        moto has no DescribeInstanceInformation. One page; other filters are refused rather than ignored."""
        params = json_params(request)
        validate_input(operation_model("ssm", "DescribeInstanceInformation"), params)
        wanted: set[str] | None = None
        for entry in params.get("Filters") or []:
            if entry.get("Key") != "InstanceIds":
                raise ApiError("InvalidFilterKey", f"the emulator filters by InstanceIds only: {entry.get('Key')}")
            wanted = set(entry.get("Values") or [])
        if params.get("InstanceInformationFilterList"):
            raise ApiError("InvalidFilterKey", "the emulator filters by Filters InstanceIds only")
        with self._lock:
            managed = sorted(self._managed_now(request.region))
            rows = [
                {
                    "InstanceId": instance_id,
                    "PingStatus": self._ping.get(instance_id, "Online"),
                    "LastPingDateTime": self._clock.now().timestamp(),
                    "ResourceType": "ManagedInstance" if instance_id.startswith("mi-") else "EC2Instance",
                }
                for instance_id in managed
                if wanted is None or instance_id in wanted
            ]
        return {"InstanceInformationList": rows}

    def send_command(self, request: ApiRequest) -> dict[str, Any]:
        params = json_params(request)
        explicit = list(params.get("InstanceIds") or [])
        targets = list(params.get("Targets") or [])
        for target in targets:
            if target.get("Key") == "InstanceIds":
                explicit.extend(target.get("Values") or [])
        bad = [i for i in explicit if not isinstance(i, str) or not INSTANCE_ID.search(i)]
        if bad:
            raise self._invalid_instances(bad)
        validate_input(operation_model("ssm", "SendCommand"), params)
        if len(set(explicit)) != len(explicit):
            raise ApiError("DuplicateInstanceId", "Duplicate instance ids are not allowed.")
        if self.strict_targets:
            unknown = [i for i in explicit if i not in self._managed_now(request.region)]
            if unknown:
                raise self._invalid_instances(unknown)
        tag_targets = [t for t in targets if t.get("Key") != "InstanceIds"]
        backend = self._backend(request.region)
        with self._lock:
            command = backend.send_command(
                comment=params.get("Comment", ""),
                document_name=params.get("DocumentName"),
                timeout_seconds=params.get("TimeoutSeconds"),
                instance_ids=list(explicit),
                max_concurrency=params.get("MaxConcurrency", "50"),
                max_errors=params.get("MaxErrors", "0"),
                notification_config=params.get("NotificationConfig"),
                output_s3_bucket_name=params.get("OutputS3BucketName", ""),
                output_s3_key_prefix=params.get("OutputS3KeyPrefix", ""),
                output_s3_region=params.get("OutputS3Region", ""),
                parameters=params.get("Parameters", {}),
                service_role_arn=params.get("ServiceRoleArn", ""),
                targets=tag_targets,
            )
            # moto adds every EC2 instance when Targets is empty; AWS targets what was asked, in order.
            resolved = list(explicit)
            if tag_targets:
                resolved += [i for i in command._get_instance_ids_from_targets() if i not in resolved]
            requested_at = self._clock.now()
            command.requested_date_time = _naive_utc(requested_at)
            command.expires_after = command.requested_date_time + timedelta(seconds=command.timeout_seconds)
            command.targets = targets
            command.instance_ids = resolved
            command.target_count = len(resolved)
            command.invocations = []
            for instance_id in resolved:
                invocation = command.invocation_response(instance_id, PLUGIN)
                invocation.update(
                    Status="Pending",
                    StatusDetails="Pending",
                    ResponseCode=-1,
                    ExecutionStartDateTime="",
                    ExecutionEndDateTime="",
                    ExecutionElapsedTime="",
                )
                command.invocations.append(invocation)
                self._times[(command.command_id, instance_id)] = _Times()
            command.status = "Pending"
            command.status_details = "Pending"
            command.completed_count = 0
            command.error_count = 0
            response = {"Command": copy.deepcopy(command.response_object())}
        for instance_id in resolved:
            self._run(
                CommandInvocationRequest(
                    command_id=command.command_id,
                    instance_id=instance_id,
                    document_name=str(command.document_name),
                    parameters=copy.deepcopy(command.parameters),
                    comment=command.comment,
                    requested_at=requested_at,
                )
            )
        return response

    def _invalid_instances(self, instance_ids: list[str]) -> ApiError:
        shown = ", ".join(instance_ids)
        return ApiError(
            "InvalidInstanceId", f"Instances [[{shown}]] not in a valid state for account {self._account_id}"
        )

    def list_command_invocations(self, request: ApiRequest) -> dict[str, Any]:
        params = json_params(request)
        instance_filter = params.get("InstanceId")
        if instance_filter is not None and not INSTANCE_ID.search(str(instance_filter)):
            raise ApiError("InvalidInstanceId", f"Instance {instance_filter} is not valid.")
        validate_input(operation_model("ssm", "ListCommandInvocations"), params)
        checks = [_filter(f) for f in params.get("Filters") or []]
        with self._lock:
            if params.get("CommandId"):
                commands = [self._command(params["CommandId"], request.region)]
            else:
                commands = list(self._backend(request.region)._commands)
            rows: list[tuple[datetime, int, dict[str, Any]]] = []
            for order, command in enumerate(commands):
                for invocation in command.invocations:
                    if instance_filter not in (None, invocation["InstanceId"]):
                        continue
                    row = self._row(command, invocation, bool(params.get("Details")))
                    if all(check(row) for check in checks):
                        rows.append((command.requested_date_time, order, row))
        rows.sort(key=lambda r: (r[0], r[1]), reverse=True)  # newest first
        start = int(decode_token(params["NextToken"])) if params.get("NextToken") else 0
        page = int(params.get("MaxResults") or 50)
        result: dict[str, Any] = {"CommandInvocations": [r[2] for r in rows[start : start + page]]}
        if start + page < len(rows):
            result["NextToken"] = encode_token(start + page)
        return result

    def _row(self, command: Any, invocation: Mapping[str, Any], details: bool) -> dict[str, Any]:
        times = self._times.get((command.command_id, invocation["InstanceId"]), _Times())
        row: dict[str, Any] = {
            "CommandId": command.command_id,
            "InstanceId": invocation["InstanceId"],
            "InstanceName": "",
            "Comment": command.comment,
            "DocumentName": command.document_name,
            "DocumentVersion": "$DEFAULT",
            "RequestedDateTime": command.requested_date_time.replace(tzinfo=UTC),
            "Status": invocation["Status"],
            "StatusDetails": invocation["StatusDetails"],
            "TraceOutput": "",
            "StandardOutputUrl": "",
            "StandardErrorUrl": "",
            "CommandPlugins": [],
            "ServiceRole": command.service_role_arn,
            "NotificationConfig": command.notification_config,
            "CloudWatchOutputConfig": {"CloudWatchLogGroupName": "", "CloudWatchOutputEnabled": False},
        }
        if details:
            plugin: dict[str, Any] = {
                "Name": invocation.get("PluginName", PLUGIN),
                "Status": invocation["Status"] if invocation["Status"] != "Delayed" else "Pending",
                "StatusDetails": invocation["StatusDetails"],
                "ResponseCode": invocation["ResponseCode"],
                "Output": times.plugin_output,
                "StandardOutputUrl": "",
                "StandardErrorUrl": "",
                "OutputS3Region": command.output_s3_region or self._region,
                "OutputS3BucketName": command.output_s3_bucket_name,
                "OutputS3KeyPrefix": command.output_s3_key_prefix,
            }
            if times.started:
                plugin["ResponseStartDateTime"] = times.started
            if times.finished:
                plugin["ResponseFinishDateTime"] = times.finished
            row["CommandPlugins"] = [plugin]
        return row


def _filter(entry: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
    key, value = entry.get("key"), str(entry.get("value", ""))
    if key in ("InvokedAfter", "InvokedBefore"):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as error:
            raise ApiError("InvalidFilterValue", f"{key} must be an ISO 8601 time: {value!r}") from error
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        if key == "InvokedAfter":
            return lambda row: bool(row["RequestedDateTime"] >= moment)
        return lambda row: bool(row["RequestedDateTime"] <= moment)
    if key == "Status":
        return lambda row: bool(row["Status"] == value)
    if key == "DocumentName":
        return lambda row: bool(row["DocumentName"] == value)
    if key == "ExecutionStage":
        if value not in ("Executing", "Complete"):
            raise ApiError("InvalidFilterValue", f"ExecutionStage must be Executing or Complete: {value!r}")
        return lambda row: (row["Status"] in TERMINAL) == (value == "Complete")
    raise ApiError("InvalidFilterKey", f"Unknown filter key {key!r}")
