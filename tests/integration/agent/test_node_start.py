"""The compute node's start action (``topokeeper-head-node.pyz node-start``), run as it ships (the built program,
its own process) against a local IMDS and S3: its entry present, missing, slow (within and past the bound),
another cluster's, another instance's, hostile, denied, garbled. Every run exits 0 (a node's bootstrap never
fails because of topokeeper) with one log line; only a valid entry of its own writes the slurmd drop-in, which
``systemd-analyze verify`` accepts with the cookbook's slurmd.service."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.agent_support import agent_program
from topokeeper.wire import Registration, registration_key, registration_text

CLUSTER = "pc1"
INSTANCE = "i-0123456789abcdef0"
BUCKET = "topo-plans"
KEY = registration_key(CLUSTER, INSTANCE)
TOPOLOGY = "tree-q1:spine-1:leaf-7"
IMDS_TOKEN = "imds-session"  # noqa: S105 (a fake IMDS's session token)
FAKE_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}
# ParallelCluster's slurmd.service (aws-parallelcluster-cookbook, slurm/compute/slurmd.service.erb), its slurmd
# and slurm.conf in a temporary root.
UNIT = """[Unit]
Description=Slurm node daemon
After=munge.service network.target remote-fs.target
ConditionPathExists={root}/opt/slurm/etc/slurm.conf

[Service]
Type=simple
EnvironmentFile=-/etc/sysconfig/slurmd
ExecStart={root}/opt/slurm/sbin/slurmd -D $SLURMD_OPTIONS
ExecReload=/bin/kill -HUP $MAINPID
KillMode=process
LimitNOFILE=131072
Delegate=yes

[Install]
WantedBy=multi-user.target
"""

Answer = tuple[int, bytes]


def entry(**changes: object) -> bytes:
    values: dict[str, object] = {
        "cluster": CLUSTER,
        "instance_id": INSTANCE,
        "topology": TOPOLOGY,
        "generation": 7,
        "plan_sha256": "ab" * 32,
    }
    values.update(changes)
    return registration_text(Registration(**values)).encode()  # type: ignore[arg-type]


def raw_entry(**changes: object) -> bytes:
    """An entry as a hostile or broken writer could store it: not checked on the way in."""
    document = json.loads(entry())
    document.update(changes)
    return json.dumps(document).encode()


NOT_FOUND: Answer = (404, b"<Error><Code>NoSuchKey</Code></Error>")


class Endpoint:
    """IMDS and S3 on one local port; ``answers`` gives S3's answer to the n-th GET of the entry."""

    def __init__(self, answers: Callable[[int], Answer]) -> None:
        self.answers = answers
        self.gets = 0
        self.paths: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                self._reply(200, IMDS_TOKEN.encode()) if self.path == "/latest/api/token" else self._reply(404, b"")

            def do_GET(self) -> None:
                endpoint.paths.append(self.path)
                if self.path == "/latest/meta-data/instance-id":
                    token = self.headers.get("X-aws-ec2-metadata-token")
                    self._reply(200, INSTANCE.encode()) if token == IMDS_TOKEN else self._reply(401, b"")
                elif self.path == f"/{BUCKET}/{KEY}" and self.headers.get("Authorization", "").startswith("AWS4-"):
                    endpoint.gets += 1
                    self._reply(*endpoint.answers(endpoint.gets))
                else:
                    self._reply(400, b"<Error><Code>Unexpected</Code></Error>")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int], Answer]], Endpoint]]:
    started: list[Endpoint] = []

    def start(answers: Callable[[int], Answer]) -> Endpoint:
        endpoint = Endpoint(answers)
        threading.Thread(target=endpoint.server.serve_forever, daemon=True).start()
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.server.shutdown()
        endpoint.server.server_close()


def run(tmp_path: Path, endpoint: Endpoint, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    program = agent_program(tmp_path / "program")
    drop_in_dir = tmp_path / "etc" / "systemd" / "system" / "slurmd.service.d"
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment |= FAKE_KEYS | {"AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint.url}
    completed = subprocess.run(
        [
            *(sys.executable, str(program), "node-start", "--cluster", CLUSTER, "--bucket", BUCKET),
            *("--region", "us-east-1", "--endpoint-url", endpoint.url, "--slurmd", f"{tmp_path}/opt/slurm/sbin/slurmd"),
            *("--drop-in-dir", str(drop_in_dir), "--no-daemon-reload", "--poll-seconds", "0.05", *extra),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    return completed, drop_in_dir / "topokeeper-topology.conf"


def one_line(completed: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert completed.returncode == 0  # never fails the bootstrap
    lines = completed.stderr.splitlines()
    assert len(lines) == 1, completed.stderr
    record: dict[str, object] = json.loads(lines[0])
    return record


def test_its_entry_becomes_a_drop_in_that_systemd_accepts(tmp_path: Path, serve: Callable[..., Endpoint]) -> None:
    endpoint = serve(lambda n: (200, entry()))

    completed, drop_in = run(tmp_path, endpoint)

    record = one_line(completed)
    assert (record["event"], record["topology"], record["generation"]) == ("node_start.placed", TOPOLOGY, 7)
    assert drop_in.read_text().splitlines()[-2:] == [
        "ExecStart=",
        f"ExecStart={tmp_path}/opt/slurm/sbin/slurmd -D $SLURMD_OPTIONS --conf topology={TOPOLOGY}",
    ]
    assert oct(drop_in.stat().st_mode & 0o777) == "0o644"
    units = drop_in.parent.parent
    (units / "slurmd.service").write_text(UNIT.format(root=tmp_path))
    for path, text in [("opt/slurm/etc/slurm.conf", ""), ("opt/slurm/sbin/slurmd", "#!/bin/sh\n")]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "opt/slurm/sbin/slurmd").chmod(0o755)
    assert verify(units) == (0, "")
    # The drop-in is read with the unit: without its ExecStart= reset, systemd refuses the second ExecStart.
    drop_in.write_text(drop_in.read_text().replace("ExecStart=\n", "", 1))
    assert "more than one ExecStart" in verify(units)[1]


def verify(units: Path) -> tuple[int, str]:
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(units / "slurmd.service")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"},  # the unit's directory first, then the defaults
    )
    return verified.returncode, verified.stderr


def test_a_slow_entry_that_arrives_within_the_bound_is_taken(tmp_path: Path, serve: Callable[..., Endpoint]) -> None:
    endpoint = serve(lambda n: (200, entry()) if n >= 4 else NOT_FOUND)

    completed, drop_in = run(tmp_path, endpoint)

    assert one_line(completed)["event"] == "node_start.placed"
    assert endpoint.gets == 4 and drop_in.exists()


@pytest.mark.parametrize("answers", [lambda n: NOT_FOUND, lambda n: (503, b"<Error><Code>SlowDown</Code></Error>")])
def test_a_missing_or_late_entry_ends_at_the_bound_without_a_drop_in(
    tmp_path: Path, serve: Callable[..., Endpoint], answers: Callable[[int], Answer]
) -> None:
    endpoint = serve(answers)

    completed, drop_in = run(tmp_path, endpoint, "--wait-seconds", "0.5")

    record = one_line(completed)
    assert record["event"] == "node_start.refused" and "no entry within 0.5 s" in str(record["reason"])
    assert endpoint.gets > 1 and not drop_in.exists()  # asked again until the bound, then gave up


def test_a_denied_read_ends_at_once(tmp_path: Path, serve: Callable[..., Endpoint]) -> None:
    endpoint = serve(lambda n: (403, b"<Error><Code>AccessDenied</Code></Error>"))

    completed, drop_in = run(tmp_path, endpoint)

    reason = str(one_line(completed)["reason"])
    assert "HTTP 403 AccessDenied" in reason and KEY in reason
    assert endpoint.gets == 1 and not drop_in.exists()


def test_a_refused_entry_removes_a_drop_in_left_from_an_earlier_boot(
    tmp_path: Path, serve: Callable[..., Endpoint]
) -> None:
    # An image baked from a placed node carries its drop-in: on 25.11 a powering-up CLOUD node takes any
    # --conf topology= as it registers, so left in place it would place this node where that one was.
    drop_in_dir = tmp_path / "etc" / "systemd" / "system" / "slurmd.service.d"
    drop_in_dir.mkdir(parents=True)
    stale = drop_in_dir / "topokeeper-topology.conf"
    stale.write_text(
        "[Service]\nExecStart=\nExecStart=/opt/slurm/sbin/slurmd -D $SLURMD_OPTIONS --conf topology=t:old\n"
    )
    endpoint = serve(lambda n: (403, b"<Error><Code>AccessDenied</Code></Error>"))

    completed, drop_in = run(tmp_path, endpoint)

    record = one_line(completed)
    assert record["event"] == "node_start.refused" and "slurmd starts without a topology" in str(record["reason"])
    assert not drop_in.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (raw_entry(cluster="other-cluster"), "cluster: 'other-cluster', not this node's cluster"),
        (raw_entry(instance_id="i-0fedcba9876543210"), "instance_id: 'i-0fedcba9876543210', not this instance"),
        (raw_entry(topology="t:leaf --conf x"), "topology: not <topology>:<path>"),
        (raw_entry(topology="t:leaf\nExecStartPre=/bin/sh"), "topology: not <topology>:<path>"),
        (raw_entry(topology="t:%h:$HOME"), "topology: not <topology>:<path>"),
        (raw_entry(topology='t:"a"'), "topology: not <topology>:<path>"),
        (raw_entry(schema="topokeeper.registration/9"), "schema: "),
        (b'{"cluster": "pc1", "topology": ', "entry: not JSON text"),
        (b"\xff\xfe", "entry: not JSON text"),
        (b"[]", "entry: expected an object"),
        (b"x" * 70_000, "larger than"),
    ],
)
def test_an_entry_that_is_not_its_own_or_not_safe_is_refused_in_one_line(
    tmp_path: Path, serve: Callable[..., Endpoint], body: bytes, field: str
) -> None:
    endpoint = serve(lambda n: (200, body))

    completed, drop_in = run(tmp_path, endpoint, "--wait-seconds", "2")

    record = one_line(completed)
    assert record["event"] == "node_start.refused" and field in str(record["reason"])
    assert not drop_in.exists()
    assert "\n" not in str(record["reason"])


def test_bad_arguments_never_fail_the_bootstrap(tmp_path: Path) -> None:
    program = agent_program(tmp_path / "program")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    completed = subprocess.run(
        [sys.executable, str(program), "node-start", "--cluster"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )

    assert completed.returncode == 0
    assert json.loads(completed.stderr.splitlines()[-1])["event"] == "node_start.refused"


def test_a_full_etc_leaves_no_drop_in_and_no_partial_file(tmp_path: Path, serve: Callable[..., Endpoint]) -> None:
    # A real tmpfs over the drop-in directory, filled to its last page: the drop-in's write fails.
    drop_in_dir = tmp_path / "etc" / "systemd" / "system" / "slurmd.service.d"
    drop_in_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(drop_in_dir)], check=True, timeout=30)
    try:
        descriptor = os.open(drop_in_dir / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while os.write(descriptor, b"x" * 4096):
                pass
        except OSError as error:
            assert error.errno == errno.ENOSPC
        finally:
            os.close(descriptor)
        endpoint = serve(lambda n: (200, entry()))

        completed, _ = run(tmp_path, endpoint)

        record = one_line(completed)
        assert record["event"] == "node_start.refused" and "No space left" in str(record["reason"])
        assert sorted(path.name for path in drop_in_dir.iterdir()) == ["filler"]  # nothing half-written left
    finally:
        subprocess.run(["umount", str(drop_in_dir)], check=True, timeout=30)


def test_a_python3_that_cannot_import_it_still_never_fails_the_bootstrap(tmp_path: Path) -> None:
    # ParallelCluster runs the action with the image's python3 (RHEL 8 and Rocky 8: 3.6, which refuses
    # `from __future__ import annotations` with a SyntaxError at import); a non-zero exit fails the node.
    program = agent_program(tmp_path / "program")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class Old:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('topokeeper.'):\n"
        "            raise SyntaxError('future feature annotations is not defined')\n"
        "sys.meta_path.insert(0, Old())\n"
    )
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    completed = subprocess.run(
        [sys.executable, str(program), "node-start", "--cluster", CLUSTER, "--bucket", BUCKET, "--region", "r"],
        capture_output=True,
        text=True,
        env={**environment, "PYTHONPATH": str(site)},
        timeout=60,
        check=False,
    )

    record = one_line(completed)
    assert record["event"] == "node_start.crashed" and "SyntaxError" in str(record["reason"])
