"""``topokeeper login install-script``: the lifecycle-script snippet that installs the host identity.

The shell script ships in this package (install_host_identity.sh); only two validated values are baked
in, each matching a pattern that admits no quote or shell syntax.
"""

from __future__ import annotations

import re
from pathlib import Path

from topokeeper.contract.errors import InputError

SCRIPT = Path(__file__).with_name("install_host_identity.sh")
_SECRET_ARN = re.compile(r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")


def install_script(secret_arn: str, region: str) -> str:
    if not _SECRET_ARN.fullmatch(secret_arn):
        raise InputError("--secret-arn", f"not a Secrets Manager secret ARN: {secret_arn!r}")
    if not _REGION.fullmatch(region):
        raise InputError("--secret-region", f"not an AWS region: {region!r}")
    return SCRIPT.read_text().replace("@SECRET_ID@", secret_arn).replace("@REGION@", region)
