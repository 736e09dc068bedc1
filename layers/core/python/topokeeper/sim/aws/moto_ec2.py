"""moto's EC2 models, imported here first whatever the emulator imports first (moto_patches and network.py both
take them from here).

moto's import lists EC2's regions with three new boto3 sessions, each parsing botocore's endpoint data again
(~0.2 s each): one botocore session serves the three. boto3.Session is put back after, and so is the name moto's
regions module bound from it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import boto3
import botocore.session
import moto.core.base_backend  # noqa: F401 - binds boto3's own Session, before the swap below


def _import_moto_ec2() -> Any:
    original = boto3.Session
    boto3.Session = functools.partial(original, botocore_session=botocore.session.get_session())
    try:
        from moto.ec2 import models  # noqa: PLC0415

        return models
    finally:
        boto3.Session = original
        regions = sys.modules.get("moto.ec2.models.availability_zones_and_regions")  # even from a failed import
        if regions is not None:
            vars(regions)["Session"] = original


_models = _import_moto_ec2()
ec2_backends: Any = _models.ec2_backends
instances_module: Any = _models.instances  # its utcnow stamps LaunchTime (moto_patches)
Instance: Any = instances_module.Instance
