"""The agent's placement step (topokeeper.agent.placement): the program's ``placement-facts`` run as a subprocess
(a stand-in program printing what a hostile or broken one could), put in the bucket as escaped, bounded JSON, at
most once per interval and never in a cycle that ran the applier. The real program on slurmctld and the emulated
bucket: tests/integration/backend/test_placement_live.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.agent_support import CLUSTER, events_named
from topokeeper.agent import placement
from topokeeper.agent.aws import S3Object
from topokeeper.agent.cycle import Agent
from topokeeper.agent.errors import AgentError
from topokeeper.agent.state import BundleRef, State, load_state, save_state
from topokeeper.wire import PLACEMENT_FACTS_SCHEMA, AgentConfig, agent_placement_facts_key

# A job's reason and partition as a hostile slurmctld line could make them: escape sequences, a shell, bidi
# overrides, a lone surrogate (valid JSON text, invalid UTF-8).
HOSTILE = "\x1b[31m$(touch /tmp/pwned)`id`\u202e\n<script>\ud800"


def _facts(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "schema": PLACEMENT_FACTS_SCHEMA,
        "now": 1_760_000_000,
        "slurm_version": "slurm 26.05.0",
        "partition_topologies": {"ml-p5": None},
        "topologies": {"": [["leaf1", "p5-[1-4]"]]},
        "topology_kinds": {"": "tree"},
        "jobs": [["7", "ml-p5", "PENDING", 2, "", 1, 0, 1_759_999_000, HOSTILE]],
        "nodes": [["IDLE", "ml-p5", "p5-[1-4]"]],
        "error": None,
    }
    document.update(changes)
    return document


def _program(tmp_path: Path, stdout: str, exit_code: int = 0, stderr: str = "") -> AgentConfig:
    """A stand-in head-node program: checks it is asked for placement-facts only, prints ``stdout``."""
    path = tmp_path / "program.py"
    path.write_text(
        "import sys\n"
        "assert sys.argv[1:] == ['placement-facts'], sys.argv\n"
        f"sys.stdout.write({stdout!r})\n"
        f"sys.stderr.write({stderr!r})\n"
        f"sys.exit({exit_code})\n"
    )
    return AgentConfig(
        cluster=CLUSTER,
        bucket="b",
        region="us-east-1",
        applier=str(path),
        state_dir=str(tmp_path / "state"),
        placement_facts_interval_seconds=600,
    )


def test_hostile_strings_travel_escaped_in_ascii_json_and_read_back_the_same(tmp_path: Path) -> None:
    document = _facts()
    config = _program(tmp_path, "a login banner\n" + json.dumps(document) + "\n")

    body, error = placement.facts_body(config)

    assert error is None
    assert body.isascii() and b"\x1b" not in body and b"$(touch" in body  # data, escaped where it is not text
    assert b"\\u001b[31m" in body and b"\\ud800" in body and b"\\u202e" in body and b"\n" not in body
    assert json.loads(body) == document


def test_the_program_s_error_is_put_printable_and_without_facts(tmp_path: Path) -> None:
    """slurmctld could not be read: the reason, whatever its bytes, reads back as printable ASCII in one line."""
    document = _facts(error=HOSTILE + "\U0001f600", jobs=[["1", "p", "RUNNING", 1, "x", 0, 0, 0, HOSTILE]])
    config = _program(tmp_path, json.dumps(document) + "\n", 1)

    body, error = placement.facts_body(config)

    expected = "\\x1b[31m$(touch /tmp/pwned)`id`\\u202e | <script>\\ud800\\U0001f600"
    assert error == expected
    assert json.loads(body) == {"schema": PLACEMENT_FACTS_SCHEMA, "error": expected}  # no facts beside an error


@pytest.mark.parametrize(
    ("stdout", "exit_code", "says"),
    [
        ("", 1, "placement-facts exited 1 without a topokeeper.placement-facts/1 document: Traceback"),
        ('{"outcome": "applied"}\n', 0, "exited 0 without a topokeeper.placement-facts/1 document"),
        ('{"schema": "topokeeper.placement-facts/1", "now": NaN}\n', 0, "without a topokeeper.placement-facts/1"),
        ("[" * 100_000 + "\n", 0, "without a topokeeper.placement-facts/1 document"),
    ],
)
def test_no_document_is_put_as_a_refusal_in_one_line(tmp_path: Path, stdout: str, exit_code: int, says: str) -> None:
    config = _program(tmp_path, stdout, exit_code, "Traceback (most recent call last):\n  boom\n")

    body, error = placement.facts_body(config)

    assert error is not None and says in error and "\n" not in error, error
    assert json.loads(body) == {"schema": PLACEMENT_FACTS_SCHEMA, "error": error}


def test_oversized_facts_are_refused_in_one_line_naming_size_and_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = _facts(jobs=[[str(i), "ml-p5", "PENDING", 1, "", 0, 0, 0, "Priority"] for i in range(200)])
    config = _program(tmp_path, json.dumps(document) + "\n")
    size = len(json.dumps(document, separators=(",", ":")))
    monkeypatch.setattr(placement, "MAX_FACTS_BYTES", size - 1)

    body, error = placement.facts_body(config)

    assert error == f"placement facts of {size} bytes, over the {size - 1} the agent puts"
    assert json.loads(body) == {"schema": PLACEMENT_FACTS_SCHEMA, "error": error}
    monkeypatch.setattr(placement, "MAX_FACTS_BYTES", size)  # at the bound: put as it is
    assert placement.facts_body(config) == (json.dumps(document, separators=(",", ":")).encode(), None)


class Bucket:
    """S3 with no bundle change and no verify request; records the objects put."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.puts: list[tuple[str, bytes]] = []

    def get_bundle_if_changed(self, etag: str | None) -> S3Object | None:
        return None

    def get_verify_request_if_changed(self, etag: str | None) -> S3Object | None:
        return None

    def put_object(self, key: str, body: bytes) -> None:
        if self.fail:
            raise AgentError(f"PUT s3://b/{key}: HTTP 403 AccessDenied")
        self.puts.append((key, body))

    def put_event(self, detail_type: str, detail: dict[str, Any]) -> None:
        raise AssertionError("no report expected")


def test_the_cycle_puts_facts_at_most_once_per_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _program(tmp_path, json.dumps(_facts()) + "\n")
    now = [1000.0]
    agent = Agent(config, clock=lambda: now[0])
    bucket = Bucket()
    agent._aws = bucket  # type: ignore[assignment]

    for seconds in (0, 300, 599, 600, 601):
        now[0] = 1000.0 + seconds
        agent.cycle()

    assert [key for key, _ in bucket.puts] == [agent_placement_facts_key(CLUSTER)] * 2  # at 0 s and 600 s
    assert json.loads(bucket.puts[0][1]) == _facts()
    logged = capsys.readouterr().err
    assert [record["size"] for record in events_named(logged, "placement_facts.put")] == [len(bucket.puts[0][1])] * 2
    assert "\x1b" not in logged and "touch" not in logged  # the agent logs sizes, never the facts


def test_a_failed_put_is_logged_and_waits_for_the_next_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _program(tmp_path, json.dumps(_facts()) + "\n")
    agent = Agent(config, clock=lambda: 5000.0)
    agent._aws = Bucket(fail=True)  # type: ignore[assignment]

    agent.cycle()
    agent.cycle()

    (failed,) = events_named(capsys.readouterr().err, "placement_facts.failed")
    assert failed["error"] == "PUT s3://b/clusters/llm-train-slurm/placement-facts.json: HTTP 403 AccessDenied"
    assert load_state(str(tmp_path / "state" / "state.json")).last_facts_at == 5000.0


def test_no_facts_without_an_interval_or_in_a_cycle_that_ran_the_applier(tmp_path: Path) -> None:
    config = _program(tmp_path, json.dumps(_facts()) + "\n")
    off = Agent(replace(config, placement_facts_interval_seconds=0.0), clock=lambda: 9e9)
    off._aws = bucket = Bucket()  # type: ignore[assignment]
    off.cycle()
    assert bucket.puts == []  # the default: an agent installed without placement_metrics puts nothing

    (tmp_path / "state").mkdir(exist_ok=True)
    save_state(str(tmp_path / "state" / "state.json"), State(bundle=BundleRef('"e"', None, "a" * 64)))
    agent = Agent(config, clock=lambda: 9e9)
    agent._aws = bucket  # type: ignore[assignment]
    verified: list[str] = []
    due = [True]
    agent._verify_due = lambda state: due[0]  # type: ignore[method-assign]
    agent._verify = lambda state, reference, request_id=None: verified.append("verify")  # type: ignore[method-assign]
    agent.cycle()
    assert (verified, bucket.puts) == (["verify"], [])  # one program run per cycle: systemd's bound holds
    due[0] = False
    agent.cycle()
    assert (verified, len(bucket.puts)) == (["verify"], 1)  # the next cycle puts them
