"""What an account holds that no API call of its own creates: its service quotas, and the public SSM parameters
AWS publishes under ``/aws/service/`` (in some regions, not others).

moto's Service Quotas knows only VPC's quotas, so ``GetServiceQuota`` is answered here from ``quotas.set``. A
public parameter is ``publish``ed into moto's SSM parameter store, as moto itself loads the public AMI parameters
(``PutParameter`` refuses ``/aws/`` names, as AWS does), so moto's ``GetParameter`` answers it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from moto.core.utils import utcnow
from moto.ssm.models import Parameter, ssm_backends

from topokeeper.sim.aws.protocol import ApiError, ApiRequest, json_params, operation_model, validate_input


class ServiceQuotas:
    """``GetServiceQuota`` and ``GetAWSDefaultServiceQuota`` for the quotas a test sets; any other is
    NoSuchResourceException, as for a wrong code. Who may ask is the emulator's IAM's question
    (``iam.IamModel``, the quota's ARN), asked before this handler runs."""

    def __init__(self, account_id: str, region: str, lock: threading.RLock) -> None:
        self._account_id = account_id
        self._region = region
        self._lock = lock
        self._values: dict[tuple[str, str], float] = {}
        self._defaults: dict[tuple[str, str], float] = {}

    def set(self, service_code: str, quota_code: str, value: float) -> None:
        """The account's applied value (GetServiceQuota)."""
        with self._lock:
            self._values[(service_code, quota_code)] = value

    def forget(self, service_code: str, quota_code: str) -> None:
        """No applied value: GetServiceQuota answers NoSuchResourceException."""
        with self._lock:
            self._values.pop((service_code, quota_code), None)

    def set_default(self, service_code: str, quota_code: str, value: float) -> None:
        """AWS's default value (GetAWSDefaultServiceQuota)."""
        with self._lock:
            self._defaults[(service_code, quota_code)] = value

    def handlers(self) -> dict[tuple[str, str], Callable[[ApiRequest], Mapping[str, Any]]]:
        return {
            ("servicequotas", "GetServiceQuota"): lambda request: self._answer(request, "GetServiceQuota"),
            ("servicequotas", "GetAWSDefaultServiceQuota"): lambda request: self._answer(
                request, "GetAWSDefaultServiceQuota"
            ),
        }

    def _answer(self, request: ApiRequest, operation: str) -> dict[str, Any]:
        params = json_params(request)
        validate_input(operation_model("service-quotas", operation), params)
        service, code = str(params["ServiceCode"]), str(params["QuotaCode"])
        arn = f"arn:aws:servicequotas:{request.region}:{self._account_id}:{service}/{code}"
        with self._lock:
            value = (self._values if operation == "GetServiceQuota" else self._defaults).get((service, code))
        if value is None:
            raise ApiError("NoSuchResourceException", f"The request failed because the quota {code} does not exist.")
        return {
            "Quota": {
                "ServiceCode": service,
                "QuotaCode": code,
                "QuotaArn": arn,
                "Value": value,
                "Unit": "None",
                "Adjustable": True,
                "GlobalQuota": False,
            }
        }


def publish_public_parameter(account_id: str, region: str, name: str, value: str) -> None:
    """A public ``/aws/service/...`` parameter AWS publishes in ``region`` (moto's GetParameter then answers it)."""
    if not name.startswith("/aws/service/"):
        raise ValueError(f"not a public parameter name: {name}")
    parameters = ssm_backends[account_id][region]._parameters  # as moto loads its own public ones
    parameters[name].append(
        Parameter(  # type: ignore[abstract]  # moto's own loaders make it so
            account_id=account_id,
            name=name,
            value=value,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=utcnow(),
            version=1,
            data_type="text",
        )
    )
