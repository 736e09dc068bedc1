"""One host identity behind one endpoint, with real parts: two login nodes as real sshd processes in Debian
chroots, host keys installed by the shipped installer, and a loopback round-robin TCP proxy standing in
for the NLB. The client trusts one ``@cert-authority`` line and checks host keys strictly."""

from __future__ import annotations

import contextlib
import itertools
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from topokeeper.login.host_keys import HostIdentity, generate
from topokeeper.login.install import install_script
from topokeeper.sim.login_chroot import LoginNode, ensure_login_chroot
from topokeeper.sim.slurm_chroot import free_port

pytestmark = pytest.mark.slurm

ENDPOINT = "login.llm-train.internal"
BUNDLE_ARN = "arn:aws:secretsmanager:us-west-2:111122223333:secret:topokeeper/llm-train/login-host-identity-AbCdEf"
SITE_CONFIG = (
    "# site policy, kept byte for byte\n"
    "Include /etc/ssh/sshd_config.d/*.conf\n"
    "HostKey /etc/ssh/ssh_host_rsa_key\n"
    "#HostKey /etc/ssh/ssh_host_ed25519_key\n"
    "PermitRootLogin prohibit-password\n"
    "ClientAliveInterval   120\n"
    "\tMaxSessions 20\n"
    "hostcertificate=/etc/ssh/old-cert.pub\n"
    "Subsystem sftp /usr/lib/openssh/sftp-server\n"
    "Match User backup\n"
    "    ForceCommand /usr/bin/false\n"
)


class RoundRobinProxy:
    """A TCP proxy on 127.0.0.1 that sends each new connection to the next backend port."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self._turn = itertools.count()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            backend = self.backends[next(self._turn) % len(self.backends)]
            upstream = socket.create_connection(("127.0.0.1", backend))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, target), daemon=True).start()

    def close(self) -> None:
        self._server.close()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def base() -> Path:
    return ensure_login_chroot()


@pytest.fixture(scope="module")
def user_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("user") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


@pytest.fixture
def nodes(base: Path, tmp_path: Path, user_key: Path) -> Iterator[Callable[[str], LoginNode]]:
    made: list[LoginNode] = []

    def make(name: str) -> LoginNode:
        node = LoginNode(base=base, workdir=tmp_path / name, port=free_port())
        made.append(node)
        node.mount()
        (node.root / "etc/topokeeper-node").write_text(name + "\n")
        ssh = node.root / "root/.ssh"
        ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
        (ssh / "authorized_keys").chmod(0o600)
        return node

    yield make
    for node in made:
        node.stop()


def install(node: LoginNode, identity: HostIdentity) -> subprocess.CompletedProcess[str]:
    (node.root / "tmp/install.sh").write_text(install_script(BUNDLE_ARN, "us-west-2"))
    (node.root / "tmp/bundle").write_text(identity.bundle)
    return node.chroot("sh", "/tmp/install.sh", "--bundle-file", "/tmp/bundle", check=False)


def ssh(port: int, known_hosts: Path, user_key: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh", "-F", "/dev/null", "-i", str(user_key), "-p", str(port),
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"HostKeyAlias={ENDPOINT}", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=10", "root@127.0.0.1", "cat /etc/topokeeper-node",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_one_cert_authority_line_reaches_both_nodes_through_the_proxy_and_after_a_replacement(
    nodes: Callable[[str], LoginNode], user_key: Path, tmp_path: Path
) -> None:
    identity = generate("llm-train", [ENDPOINT])
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(identity.known_hosts_line + "\n")
    assert len(known_hosts.read_text().splitlines()) == 1
    first, second = nodes("login-a"), nodes("login-b")
    for node in (first, second):
        assert install(node, identity).returncode == 0
        node.start_sshd()
    proxy = RoundRobinProxy([first.port, second.port])
    try:
        answers = [ssh(proxy.port, known_hosts, user_key) for _ in range(4)]
        assert all(a.returncode == 0 for a in answers), [a.stderr for a in answers]
        assert {a.stdout.strip() for a in answers} == {"login-a", "login-b"}
        assert not any("WARNING" in a.stderr or "host key" in a.stderr.lower() for a in answers)

        # Replacement: new volumes (a fresh chroot, no host keys), a new address; the installer runs again.
        second.stop()
        replacement = nodes("login-b2")
        assert install(replacement, identity).returncode == 0
        replacement.start_sshd()
        proxy.backends[:] = [first.port, replacement.port]
        answers = [ssh(proxy.port, known_hosts, user_key) for _ in range(4)]
        assert all(a.returncode == 0 for a in answers), [a.stderr for a in answers]
        assert {a.stdout.strip() for a in answers} == {"login-a", "login-b2"}
        assert not any("WARNING" in a.stderr or "host key" in a.stderr.lower() for a in answers)
        assert known_hosts.read_text() == identity.known_hosts_line + "\n"  # ssh added nothing
    finally:
        proxy.close()


def test_a_node_with_another_identity_is_refused(
    nodes: Callable[[str], LoginNode], user_key: Path, tmp_path: Path
) -> None:
    trusted, stranger = generate("llm-train", [ENDPOINT]), generate("llm-train", [ENDPOINT])
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(trusted.known_hosts_line + "\n")
    node = nodes("login-x")
    assert install(node, stranger).returncode == 0
    node.start_sshd()

    answer = ssh(node.port, known_hosts, user_key)

    assert answer.returncode != 0
    assert "Host key verification failed" in answer.stderr


def test_plain_shared_host_keys_pin_one_key_for_every_node(
    nodes: Callable[[str], LoginNode], user_key: Path, tmp_path: Path
) -> None:
    identity = generate("llm-train", [ENDPOINT], certificate=False)
    assert identity.ca_private_key is None and not identity.known_hosts_line.startswith("@")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(identity.known_hosts_line + "\n")
    first, second = nodes("plain-a"), nodes("plain-b")
    for node in (first, second):
        assert install(node, identity).returncode == 0
        node.start_sshd()
        answer = ssh(node.port, known_hosts, user_key)
        assert answer.returncode == 0, answer.stderr
    assert "HostCertificate" not in (first.root / "etc/ssh/sshd_config").read_text()


def test_only_host_key_lines_change_and_keys_get_owners_and_modes(nodes: Callable[[str], LoginNode]) -> None:
    node = nodes("site")
    config = node.root / "etc/ssh/sshd_config"
    config.write_text(SITE_CONFIG)
    config.chmod(0o640)
    identity = generate("llm-train", [ENDPOINT])

    for _ in range(2):  # a second run (rotation) replaces the block, never stacks it
        run = install(node, identity)
        assert run.returncode == 0, run.stderr

    kept = [
        line
        for line in SITE_CONFIG.splitlines(keepends=True)
        if not line.lower().startswith(("hostkey", "hostcertificate"))
    ]
    block = (
        "# topokeeper: login host identity (topokeeper login install-script)\n"
        "HostKey /etc/ssh/topokeeper/ssh_host_ed25519_key\n"
        "HostCertificate /etc/ssh/topokeeper/ssh_host_ed25519_key-cert.pub\n"
        "# topokeeper: end of login host identity\n"
    )
    assert config.read_text() == block + "".join(kept)
    assert config.stat().st_mode & 0o777 == 0o640
    keys = node.root / "etc/ssh/topokeeper"
    modes = {path.name: (path.stat().st_mode & 0o777, path.stat().st_uid) for path in keys.iterdir()}
    assert modes == {
        "ssh_host_ed25519_key": (0o600, 0),
        "ssh_host_ed25519_key.pub": (0o644, 0),
        "ssh_host_ed25519_key-cert.pub": (0o644, 0),
    }
    assert keys.stat().st_mode & 0o777 == 0o755


def test_a_config_sshd_rejects_is_left_untouched(nodes: Callable[[str], LoginNode]) -> None:
    node = nodes("broken")
    config = node.root / "etc/ssh/sshd_config"
    broken = SITE_CONFIG + "NotAnSshdOption yes\n"
    config.write_text(broken)
    first = generate("llm-train", [ENDPOINT])
    (node.root / "etc/ssh/topokeeper").mkdir()
    (node.root / "etc/ssh/topokeeper/ssh_host_ed25519_key").write_text("previous\n")

    run = install(node, first)

    assert run.returncode == 1
    assert "sshd -t rejected" in run.stderr
    assert config.read_text() == broken
    assert (node.root / "etc/ssh/topokeeper/ssh_host_ed25519_key").read_text() == "previous\n"
    assert sorted(p.name for p in (node.root / "etc/ssh").iterdir() if "topokeeper" in p.name) == ["topokeeper"]


def test_a_bundle_with_an_unexpected_file_is_refused(nodes: Callable[[str], LoginNode]) -> None:
    node = nodes("evil")
    config = node.root / "etc/ssh/sshd_config"
    before = config.read_bytes()
    identity = generate("llm-train", [ENDPOINT])
    evil = HostIdentity(identity.bundle + "../../root/.ssh/authorized_keys 644 ZXZpbAo=\n", "", None)

    run = install(node, evil)

    assert run.returncode == 1 and "unexpected file" in run.stderr
    assert config.read_bytes() == before
    assert not (node.root / "etc/ssh/topokeeper").exists()


def served_host_key(port: int) -> str:
    scan = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", "-p", str(port), "127.0.0.1"], capture_output=True, text=True, check=False
    )
    return " ".join(scan.stdout.split()[1:3])


def test_rotation_on_a_running_node_reloads_sshd_and_users_keep_their_line(
    nodes: Callable[[str], LoginNode], user_key: Path, tmp_path: Path
) -> None:
    first = generate("llm-train", [ENDPOINT])
    rotated = generate("llm-train", [ENDPOINT], ca_private_key=first.ca_private_key, serial=2)
    assert rotated.known_hosts_line == first.known_hosts_line
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(first.known_hosts_line + "\n")
    node = nodes("rotating")
    assert install(node, first).returncode == 0
    node.start_sshd()
    old_key = served_host_key(node.port)

    run = install(node, rotated)

    assert run.returncode == 0, run.stderr
    new_key = (node.root / "etc/ssh/topokeeper/ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert old_key != " ".join(new_key)
    for _ in range(100):  # sshd re-executes itself on SIGHUP; wait until it serves the new key
        if served_host_key(node.port) == " ".join(new_key):
            break
    assert served_host_key(node.port) == " ".join(new_key)
    answer = ssh(node.port, known_hosts, user_key)
    assert answer.returncode == 0, answer.stderr
