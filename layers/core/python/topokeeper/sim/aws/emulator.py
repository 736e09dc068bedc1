"""``AwsEmulator``: the AWS that topokeeper talks to, on 127.0.0.1, for tests, the demo and the simulator.

moto in server mode answers everything it implements; the emulator's gateway in front of it serves
what moto lacks or gets wrong for this project (HyperPod, EC2 DescribeInstanceTopology, SSM Run
Command, KMS Sign and Verify), counts every call and throttles like AWS. boto3 clients reach it
through ``endpoint_url``, or through ``env()`` (``AWS_ENDPOINT_URL`` and dummy credentials) for code that
builds its own clients.

    with AwsEmulator(seed=7, clock=ManualClock()) as aws:
        sagemaker = aws.client("sagemaker")
        ...
        aws.hyperpod.set_status(node_id, "Failure")
        aws.clock.advance(1.0)

moto's state is process-wide, so one emulator runs at a time in a process; starting one resets moto.
"""

from __future__ import annotations

import threading
import urllib.request
from types import TracebackType
from typing import Any

import boto3
import botocore.handlers
from moto.kms.models import kms_backends
from moto.s3.models import FakeDeleteMarker, s3_backends

from topokeeper.sim.aws import moto_patches
from topokeeper.sim.aws.account import ServiceQuotas, publish_public_parameter
from topokeeper.sim.aws.clock import Clock, RateLimits, SystemClock
from topokeeper.sim.aws.events import EventEmitter, refuse_oversized_put_events
from topokeeper.sim.aws.hyperpod import HyperPodApi, HyperPodModel
from topokeeper.sim.aws.iam import IamModel
from topokeeper.sim.aws.ids import IdFactory
from topokeeper.sim.aws.kms import KmsSigning
from topokeeper.sim.aws.load_balancing import TargetHealth
from topokeeper.sim.aws.network import NetworkLayout, NetworkModel
from topokeeper.sim.aws.protocol import PLAIN_HTTP_HEADER
from topokeeper.sim.aws.s3 import S3Refusals
from topokeeper.sim.aws.server import (
    CallCounter,
    EmulatorServer,
    Gateway,
    InProcessTransport,
    ScopeOnlySigning,
    WsgiApp,
)
from topokeeper.sim.aws.ssm import SsmRunCommand

ACCOUNT_ID = "123456789012"  # moto's default account, which dummy credentials map to
ACCESS_KEY = "testing"
SECRET_KEY = "testing"  # noqa: S105 - a dummy credential for the local emulator

_active_lock = threading.Lock()
_active: AwsEmulator | None = None


class AwsEmulator:
    """Start with ``start()`` or ``with``; everything below is usable once started.

    - ``endpoint_url``, ``env()``, ``client(service)``: how to reach it
    - ``hyperpod``: HyperPod clusters (``HyperPodModel``: create_cluster, scale, replace, set_status, ...)
    - ``network``: EC2 topology (``NetworkModel``: layouts, hold, new_instance_delay_*)
    - ``ssm``: Run Command (``SsmRunCommand``: on_command, complete, pending)
    - KMS Sign and Verify as AWS answers them (``kms.KmsSigning``: MessageType, the RAW cap); moto keeps the keys
    - ``target_health``: ELBv2 target health, which moto never checks (``TargetHealth``: set, clear)
    - ``events``: what the services emit to EventBridge (``EventEmitter``: enabled, kinds, emitted)
    - ``quotas``: Service Quotas values (``account.ServiceQuotas``: set); ``publish_public_parameter``: an
      ``/aws/service/`` SSM parameter AWS publishes in the region
    - ``calls``: requests received, by operation (``CallCounter``); ``rate_limits``: AWS throttling
    - ``clock``: the time source (``SystemClock`` by default, ``ManualClock`` for simulated time)
    """

    def __init__(
        self,
        *,
        seed: int | str = 0,
        region: str = "us-east-1",
        availability_zone: str | None = None,
        clock: Clock | None = None,
        layout: NetworkLayout | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.seed = seed
        self.region = region
        self.account_id = ACCOUNT_ID
        self.clock: Clock = clock or SystemClock()
        self.ids = IdFactory(seed)
        self.calls = CallCounter()
        self.rate_limits = RateLimits(self.clock)
        self.rate_limits.set("DescribeInstanceTopology", capacity=1, refill_per_second=1.0)
        self._lock = threading.RLock()
        self.events = EventEmitter(account_id=self.account_id, region=region, clock=self.clock, ids=self.ids)
        self.network = NetworkModel(
            ids=self.ids, clock=self.clock, lock=self._lock, account_id=self.account_id, region=region, layout=layout
        )
        self.hyperpod = HyperPodModel(
            account_id=self.account_id,
            region=region,
            availability_zone=availability_zone or f"{region}a",
            clock=self.clock,
            ids=self.ids,
            network=self.network,
            events=self.events,
            lock=self._lock,
        )
        self.ssm = SsmRunCommand(
            account_id=self.account_id,
            region=region,
            clock=self.clock,
            ids=self.ids,
            events=self.events,
            lock=self._lock,
        )
        self.target_health = TargetHealth()
        self.quotas = ServiceQuotas(self.account_id, region, self._lock)
        self.iam = IamModel(self.account_id, region, self._lock)
        self.iam.secrets[ACCESS_KEY] = SECRET_KEY
        self.iam.key_ids = self._key_arn
        self.iam.object_exists = self._object_exists
        self.iam.instance_tags = self.ssm.instance_tags
        self._host = host
        self._server: EmulatorServer | None = None
        self._endpoint_url: str | None = None
        self._transport: tuple[str, InProcessTransport] | None = None
        self._signing: ScopeOnlySigning | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> AwsEmulator:
        global _active  # noqa: PLW0603 - moto's state is process-wide: one emulator at a time
        with _active_lock:
            if _active is not None:
                raise RuntimeError("an AwsEmulator is already running in this process (moto's state is global)")
            _active = self
        try:
            moto_patches.apply(self.clock)
            self.target_health.apply()
            handlers = {
                **HyperPodApi(self.hyperpod).handlers(),
                **self.network.handlers(),
                **self.ssm.handlers(),
                **KmsSigning(self.account_id, self.region).handlers(),
                **self.quotas.handlers(),
            }

            def wrap(app: WsgiApp) -> WsgiApp:
                return Gateway(
                    app,
                    region=self.region,
                    handlers=handlers,
                    calls=self.calls,
                    rate_limits=self.rate_limits,
                    ids=self.ids,
                    refusals=[
                        S3Refusals(self.account_id, self.iam.secrets).check,
                        self.iam.check,
                        refuse_oversized_put_events,
                    ],
                )

            self._server = EmulatorServer(wrap, host=self._host)
            self._server.start()
            host, port = self._server.get_host_and_port()
            self._endpoint_url = f"http://{host}:{port}"
            assert self._server.in_process_app is not None  # noqa: S101 - set by start()
            # botocore sessions made from now on (every client made after start) call the application in process.
            transport = InProcessTransport(self._server.in_process_app, host, port)
            self._transport = ("before-send", transport)
            botocore.handlers.BUILTIN_HANDLERS.append(self._transport)
            self._signing = ScopeOnlySigning(transport.answers)
            self._signing.apply()
            self._reset_moto()  # whatever an earlier user of moto in this process left
        except BaseException:
            if self._server is not None:
                self._server.stop()
            self._server = self._endpoint_url = None
            self._release()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (joins its threads, frees the port), undo the moto patches, reset moto."""
        if self._server is not None:
            try:
                self._reset_moto()  # nothing of this emulator stays in moto's process-wide state
            finally:
                self._server.stop()
            self._server = None
            self._endpoint_url = None
        self._release()

    def _release(self) -> None:
        global _active  # noqa: PLW0603
        if self._signing is not None:
            self._signing.restore()
            self._signing = None
        if self._transport is not None:
            botocore.handlers.BUILTIN_HANDLERS.remove(self._transport)
            self._transport[1].close()
            self._transport = None
        with _active_lock:
            if _active is self:
                moto_patches.restore()
                self.target_health.restore()
                _active = None

    def __enter__(self) -> AwsEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    # ------------------------------------------------------------ reaching it

    @property
    def endpoint_url(self) -> str:
        if self._endpoint_url is None:
            raise RuntimeError("the emulator is not running")
        return self._endpoint_url

    def env(self) -> dict[str, str]:
        """Environment for processes (or os.environ) that build their own boto3 clients."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
        }

    def client(self, service: str, **kwargs: Any) -> Any:
        """A boto3 client for ``service`` pointed at the emulator (``kwargs`` go to ``boto3.client``).
        ``use_ssl=False``: its requests count as sent over plain HTTP (``aws:SecureTransport`` false), as boto3's
        would be without an endpoint URL (with one, boto3 ignores the flag)."""
        options: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
        }
        options.update(kwargs)
        made = boto3.client(service, **options)
        if options.get("use_ssl") is False:
            made.meta.events.register("before-sign", _mark_plain_http)
        return made

    def _reset_moto(self) -> None:
        """moto's documented reset (``POST /moto-api/reset``, server mode): forget every resource."""
        url = f"{self.endpoint_url}/moto-api/reset"  # our own server on 127.0.0.1
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30):  # noqa: S310
            pass

    def _key_arn(self, key_id: str) -> str | None:
        """A KMS KeyId (id, ARN, alias name or ARN) as the key's ARN, from moto's keys."""
        backend = kms_backends[self.account_id][self.region]
        try:
            return str(backend.describe_key(key_id).arn)
        except Exception:
            return None

    def _object_exists(self, bucket: str, key: str) -> bool:
        found = s3_backends[self.account_id]["aws"].buckets.get(bucket)
        # In a versioned bucket a deleted (or expired) object's current version is a delete marker: it is missing.
        current = found.keys.get(key) if found is not None else None
        return current is not None and not isinstance(current, FakeDeleteMarker)

    def publish_public_parameter(self, name: str, value: str) -> None:
        publish_public_parameter(self.account_id, self.region, name, value)

    def reset_counters(self) -> None:
        """Forget counted calls and refill the throttling buckets."""
        self.calls.reset()
        self.rate_limits.reset()


def _mark_plain_http(request: Any, **_: Any) -> None:
    request.headers[PLAIN_HTTP_HEADER] = "1"
