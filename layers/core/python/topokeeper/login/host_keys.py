"""Host keys for login nodes, made with ``ssh-keygen``: a per-cluster SSH CA signing host certificates
(users trust the CA with one ``@cert-authority`` line that rotation never changes), or plain shared host
keys (users pin the key itself; rotation changes their line).

The installable bundle is text the node's shell can read without a JSON parser: a header line, then one
line per file ``<name> <mode> <base64>``; the installer accepts only the names in ``BUNDLE_FILES``.
"""

from __future__ import annotations

import base64
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from topokeeper.contract.errors import InputError

BUNDLE_HEADER = "topokeeper-host-identity/1"
HOST_KEY = "ssh_host_ed25519_key"
HOST_CERT = f"{HOST_KEY}-cert.pub"
BUNDLE_FILES = {HOST_KEY: "600", f"{HOST_KEY}.pub": "644", HOST_CERT: "644"}
# Host names a certificate may carry (the NLB's DNS name, aliases users type).
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_CLUSTER = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


@dataclass(frozen=True)
class HostIdentity:
    bundle: str  # what login nodes install (secret value)
    known_hosts_line: str  # what users put in ~/.ssh/known_hosts
    ca_private_key: str | None  # kept by the operator (its own secret), never on a node


def _keygen(*argv: str) -> None:
    run = subprocess.run(["ssh-keygen", "-q", *argv], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"ssh-keygen failed: {run.stderr.strip()}")


def check_names(cluster: str, names: list[str]) -> None:
    if not _CLUSTER.fullmatch(cluster):
        raise InputError("--cluster", f"not a HyperPod cluster name: {cluster!r}")
    if not names:
        raise InputError("--name", "give at least one host name users connect to (the NLB's DNS name)")
    for name in names:
        if not _HOST_NAME.fullmatch(name):
            raise InputError("--name", f"not a DNS host name: {name!r}")


def generate(
    cluster: str,
    names: list[str],
    *,
    certificate: bool = True,
    ca_private_key: str | None = None,
    validity_days: int = 365,
    serial: int = 1,
) -> HostIdentity:
    """A new host key; with ``certificate``, signed by ``ca_private_key`` (a new CA when None)."""
    check_names(cluster, names)
    if not 1 <= validity_days <= 3650:
        raise InputError("--validity-days", f"must be 1..3650: {validity_days}")
    with tempfile.TemporaryDirectory(prefix="topokeeper-hostkeys-") as scratch:
        work = Path(scratch)
        host = work / HOST_KEY
        _keygen("-t", "ed25519", "-N", "", "-C", f"{cluster} login nodes", "-f", str(host))
        files = {HOST_KEY: host.read_bytes(), f"{HOST_KEY}.pub": host.with_suffix(".pub").read_bytes()}
        ca_text = None
        if certificate:
            ca = work / "ca"
            if ca_private_key is None:
                _keygen("-t", "ed25519", "-N", "", "-C", f"{cluster} login host CA", "-f", str(ca))
            else:
                ca.write_text(ca_private_key)
                ca.chmod(0o600)
                _keygen("-y", "-f", str(ca))  # refuses anything that is not a private key
            ca_text = ca.read_text()
            public = subprocess.run(
                ["ssh-keygen", "-y", "-f", str(ca)], capture_output=True, text=True, check=True
            ).stdout.strip()
            _keygen(
                "-s", str(ca), "-h", "-I", f"{cluster}-login-{serial}", "-z", str(serial),
                "-n", ",".join(names), "-V", f"-5m:+{validity_days}d", str(host.with_suffix(".pub")),
            )  # fmt: skip
            files[HOST_CERT] = (work / HOST_CERT).read_bytes()
            known = f"@cert-authority {','.join(names)} {public}"
        else:
            known = f"{','.join(names)} {' '.join(files[f'{HOST_KEY}.pub'].decode().split()[:2])}"
    lines = [BUNDLE_HEADER] + [
        f"{name} {BUNDLE_FILES[name]} {base64.b64encode(content).decode()}" for name, content in files.items()
    ]
    return HostIdentity(bundle="\n".join(lines) + "\n", known_hosts_line=known, ca_private_key=ca_text)
