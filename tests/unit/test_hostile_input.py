"""Hostile and bad input: every loader answers with a valid result or one error naming the field, never a crash.

Each property mutates a valid document (an example snapshot, a shipped scenario, a working config, a rendered
bundle, a documented event) at a random place with a hostile value: shell metacharacters, newlines, quotes,
look-alike Unicode, 10 kB strings, ``../``, deep nesting, wrong types. Whatever is accepted must come out of the
renderer as names the root applier accepts too: hostile text is refused or encoded, never written.

``TOPOKEEPER_FUZZ_EXAMPLES`` sets the examples per property (small by default; ``make reliability`` raises it).
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.unit.service.usecase_support import CLUSTER, HEAD_NODE, Controller
from topokeeper.cli.planning import load_config
from topokeeper.contract.constants import ENV_BUCKET, ENV_CONFIG, ENV_QUEUE, ENV_TABLE
from topokeeper.contract.errors import InputError
from topokeeper.contract.event_schemas import (
    CLOUDTRAIL_DETAIL_TYPE,
    EC2_STATE_DETAIL_TYPE,
    HYPERPOD_DETAIL_TYPES,
    SSM_INVOCATION_DETAIL_TYPE,
    TopokeeperEvent,
)
from topokeeper.contract.ports import Channel
from topokeeper.domain.models import PlannerConfig
from topokeeper.engine.planner import plan
from topokeeper.engine.snapshot import build_snapshot, parse_snapshot_document
from topokeeper.headnode.bundle import parse_bundle
from topokeeper.headnode.failures import Refused
from topokeeper.render.bundle import render
from topokeeper.service.controller import reconcile
from topokeeper.service.ingest import ingest
from topokeeper.service.result import record_result
from topokeeper.sim.scenario import load_scenario
from topokeeper.wire import AGENT_APPLY_DETAIL_TYPE, agent_source
from topokeeper.wiring.runtime import load_environment

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCENARIOS = ROOT / "layers/core/python/topokeeper/sim/scenarios"
EVENTS = ROOT / "tests/fixtures/events"

FUZZ_EXAMPLES = int(os.environ.get("TOPOKEEPER_FUZZ_EXAMPLES", "25"))
# Derandomized when the figures are published: the same run writes the same docs/reliability.md.
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize="TOPOKEEPER_RELIABILITY_OUT" in os.environ,
)

DEEP = 100_000  # past every recursive parser's stack
HOSTILE_TEXT = [
    "a;reboot",
    "$(reboot)",
    "`reboot`",
    "a\nSwitchName=evil Nodes=ALL",
    "a\r\nb",
    "'\"",
    "a b",
    "a#b",
    "a=b",
    "a,b",
    "a[1-2]",
    "a:b",
    "ip\u201010\u20100\u20100\u20101",  # U+2010 hyphens
    "\u0456p-10-0-0-1",  # Cyrillic i
    "node\uff11\uff12",  # full-width digits
    "node\u0661\u0662",  # Arabic-Indic digits: \d matches them, int() reads them
    "x" * 10_240,
    "9" * 5_000,  # past int()'s default digit limit
    "../../etc/passwd",
    "plans/../../x",
    "/etc/slurm/slurm.conf",
    "a\x00b",
    "\ud800",  # a lone surrogate: not encodable as UTF-8
    "",
    " ",
]
_json_leaves = st.one_of(
    st.sampled_from(HOSTILE_TEXT),
    st.text(max_size=20),
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
HOSTILE_VALUES = st.one_of(
    _json_leaves,
    st.lists(_json_leaves, max_size=3),
    st.dictionaries(st.sampled_from(HOSTILE_TEXT[:12]), _json_leaves, max_size=2),
)
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# What each property saw, for docs/reliability.md when make reliability sets TOPOKEEPER_RELIABILITY_OUT.
TALLY: collections.Counter[tuple[str, str]] = collections.Counter()


def _tally(loader: str, outcome: str) -> None:
    TALLY[loader, outcome] += 1


@pytest.fixture(scope="module", autouse=True)
def _reliability_records() -> Iterator[None]:
    yield
    write_fuzz_records(TALLY, {"kind": "hostile", "strings": len(HOSTILE_TEXT), "examples": FUZZ_EXAMPLES})


def write_fuzz_records(tally: collections.Counter[tuple[str, str]], *extra: dict[str, Any]) -> None:
    """One record per loader (and ``extra``) for docs/reliability.md, when make reliability asks for them."""
    out = os.environ.get("TOPOKEEPER_RELIABILITY_OUT")
    if out is None:
        return
    with open(out, "a", encoding="utf-8") as records:
        for loader in sorted({loader for loader, _ in tally}):
            counts = {outcome: tally[loader, outcome] for outcome in ("accepted", "refused")}
            record = {"kind": "fuzz", "loader": loader, "examples": sum(counts.values()), **counts}
            records.write(json.dumps(record, sort_keys=True) + "\n")
        for record in extra:
            records.write(json.dumps(record, sort_keys=True) + "\n")


def _paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document (the root excluded)."""
    places: list[tuple[Any, ...]] = []
    items = (
        document.items() if isinstance(document, dict) else enumerate(document) if isinstance(document, list) else []
    )
    for key, value in items:
        places.append((*prefix, key))
        places.extend(_paths(value, (*prefix, key)))
    return places


@st.composite
def mutated(draw: st.DrawFn, document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with one to three places replaced, deleted or given an unknown sibling key."""
    result = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        places = _paths(result)
        if not places:
            break
        *parent_path, key = draw(st.sampled_from(places))
        parent = result
        for part in parent_path:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "replace", "delete", "rename", "sibling"]))
        if action == "replace":
            parent[key] = draw(HOSTILE_VALUES)
        elif action == "delete":
            del parent[key]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(HOSTILE_TEXT[:20]))] = parent.pop(key)
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(HOSTILE_TEXT[:20]))] = draw(HOSTILE_VALUES)
        else:
            parent.append(draw(HOSTILE_VALUES))
    return result


def _refused_naming_a_field(error: InputError, *fields: str) -> None:
    assert error.field, error
    assert str(error).isprintable(), repr(str(error))  # one line, whatever the input's names hold
    assert error.field.split(".")[0].split("[")[0] in fields, error.field


def _dumps(document: Any) -> str:
    return json.dumps(document, allow_nan=True)


# ------------------------------------------------------------------------------------------------------------
# Snapshot loader -> planner -> renderer -> the applier's own bundle check


SNAPSHOT = json.loads((EXAMPLES / "mixed-cluster.json").read_text())
SNAPSHOT_FIELDS = ("describe_cluster", "nodes", "instance_topology", "slurm", "warnings", "partitions", "input")


def _accepted_bundle_is_safe(raw_document: dict[str, Any], config: PlannerConfig) -> str:
    """``accepted`` once the rendered bundle passes the applier's own check, ``refused`` for one named error."""
    try:
        raw = parse_snapshot_document(raw_document)
        planned = plan(build_snapshot(raw, config))
    except InputError as error:
        _refused_naming_a_field(error, *SNAPSHOT_FIELDS)
        return "refused"
    rendered = render(planned)
    checked = parse_bundle(json.dumps(rendered.bundle.document()))
    names = [*checked.nodes, *checked.partitions, *(value for value in checked.partitions.values() if value)]
    for units in checked.topologies.values():
        for unit_name, unit in units.items():
            names += [unit_name, *unit.nodes, *unit.switches]
    assert all(SAFE_NAME.fullmatch(name) for name in names), names
    return "accepted"


@FUZZ
@given(mutated(SNAPSHOT))
def test_a_mutated_snapshot_is_planned_safely_or_refused_naming_the_field(document: dict[str, Any]) -> None:
    _tally("snapshot", _accepted_bundle_is_safe(document, PlannerConfig()))


@pytest.mark.parametrize("name", HOSTILE_TEXT)
@pytest.mark.parametrize("where", ["node", "switch", "partition", "cluster", "ultraserver"])
def test_a_hostile_name_in_the_snapshot_is_refused_or_never_reaches_a_file(where: str, name: str) -> None:
    document = copy.deepcopy(SNAPSHOT)
    node = next(n for n in document["nodes"] if n.get("UltraServerInfo"))
    topology = next(t for t in document["instance_topology"] if t["InstanceId"] == node["InstanceId"])
    if where == "node":
        node["PrivateDnsHostname"] = name
    elif where == "switch":
        topology["NetworkNodes"][-1] = name
    elif where == "partition":
        group = next(g for g in document["describe_cluster"]["InstanceGroups"] if g["InstanceGroupName"] == "p5")
        group["SlurmConfig"]["PartitionNames"] = [name]
    elif where == "cluster":
        document["describe_cluster"]["ClusterName"] = name
    else:
        node["UltraServerInfo"]["Id"] = name
    _accepted_bundle_is_safe(document, PlannerConfig())


def test_a_deeply_nested_snapshot_file_is_refused_naming_the_flag(tmp_path: Path) -> None:
    from topokeeper.contract.operator_files import read_mapping

    for suffix, text in [(".json", "[" * DEEP), (".yaml", "[" * DEEP)]:
        path = tmp_path / f"snapshot{suffix}"
        path.write_text(text)
        with pytest.raises(InputError) as refused:
            read_mapping(path, "--snapshot")
        assert refused.value.field == "--snapshot"


# ------------------------------------------------------------------------------------------------------------
# Config: the planner config file and the deployment's Settings (the Lambda environment)


PLANNER_CONFIG = {
    "partitions": {
        "ml-p5": {"kind": "block", "block_sizes": [2, 4], "instance_groups": ["p5"]},
        "preprocess": {"kind": "flat"},
    }
}
SETTINGS = {
    "clusters": [
        {"name": CLUSTER, "head_node": HEAD_NODE, "mode": "enforce", "channel": "ssm", "partitions": {"gpu": {}}},
        {"name": "agent-cluster", "arn": "arn:aws:sagemaker:us-east-1:111122223333:cluster/abcdefabcdef"},
    ],
    "debounce_seconds": 10,
    "operator_role_arn": "arn:aws:iam::111122223333:role/operator",
}


@FUZZ
@given(mutated(PLANNER_CONFIG), st.sampled_from([".json", ".yaml"]))
def test_a_mutated_planner_config_loads_or_is_refused_naming_the_field(
    tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any], suffix: str
) -> None:
    path = tmp_path_factory.mktemp("config") / f"config{suffix}"
    try:
        path.write_text(_dumps(document) if suffix == ".json" else yaml.safe_dump(document))
    except UnicodeEncodeError:
        path.write_bytes(_dumps(document).encode())  # a lone surrogate: JSON escapes it
    try:
        config = load_config(path)
    except InputError as error:
        _refused_naming_a_field(error, "config", "--config")
        _tally("planner config", "refused")
        return
    _tally("planner config", _accepted_bundle_is_safe(SNAPSHOT, config))


@FUZZ
@given(mutated(SETTINGS))
def test_mutated_settings_load_or_are_refused_naming_the_field(document: dict[str, Any]) -> None:
    environ = {ENV_CONFIG: _dumps(document), ENV_TABLE: "table", ENV_BUCKET: "bucket", ENV_QUEUE: "https://sqs"}
    try:
        _, loaded = load_environment(environ)
    except InputError as error:
        _refused_naming_a_field(error, ENV_CONFIG)
        _tally("settings", "refused")
        return
    _tally("settings", "accepted")
    for cluster in loaded.clusters:  # a cluster name becomes an S3 key prefix and a Slurm-side name
        assert SAFE_NAME.fullmatch(cluster.name) and "/" not in cluster.name


@pytest.mark.parametrize("name", HOSTILE_TEXT)
def test_a_hostile_cluster_name_never_becomes_a_key_or_a_path(name: str) -> None:
    document = copy.deepcopy(SETTINGS)
    document["clusters"][0]["name"] = name
    environ = {ENV_CONFIG: _dumps(document), ENV_TABLE: "table", ENV_BUCKET: "bucket", ENV_QUEUE: "https://sqs"}
    with pytest.raises(InputError) as refused:
        load_environment(environ)
    # A lone surrogate is refused by the JSON reader itself, before any field.
    assert refused.value.field in (f"{ENV_CONFIG}.clusters[0].name", ENV_CONFIG), refused.value


# ------------------------------------------------------------------------------------------------------------
# Scenario loader (YAML)


SCENARIO = yaml.safe_load((SCENARIOS / "demo.yaml").read_text())


@FUZZ
@given(mutated(SCENARIO))
def test_a_mutated_scenario_loads_or_is_refused_naming_the_field(
    tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("scenario") / "scenario.yaml"
    try:
        path.write_text(yaml.safe_dump(document))
    except UnicodeEncodeError:
        path.write_bytes(_dumps(document).encode())  # YAML reads JSON; the surrogate stays escaped
    try:
        scenario = load_scenario(path)
    except InputError as error:
        _refused_naming_a_field(error, "scenario", "--scenario")
        _tally("scenario", "refused")
        return
    _tally("scenario", "accepted")
    assert SAFE_NAME.fullmatch(scenario.cluster.name)
    for group in scenario.cluster.instance_groups:
        assert SAFE_NAME.fullmatch(group.name) and (group.partition is None or SAFE_NAME.fullmatch(group.partition))


@pytest.mark.parametrize("text", ["[" * DEEP, "a: " * 2_000 + "b", "\ufeff{", "!!python/object/apply:os.system ['id']"])
def test_a_hostile_scenario_file_is_refused_naming_the_flag(tmp_path: Path, text: str) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as refused:
        load_scenario(path)
    assert refused.value.field.split(".")[0] in ("--scenario", "scenario")


# ------------------------------------------------------------------------------------------------------------
# Bundles: the package's model (what S3 holds) and the root applier's own parser


RENDERED = render(plan(build_snapshot(parse_snapshot_document(SNAPSHOT), PlannerConfig())))
BUNDLE = RENDERED.bundle.document()


@FUZZ
@given(mutated(BUNDLE))
def test_the_applier_parses_a_mutated_bundle_or_refuses_it_naming_the_field(document: dict[str, Any]) -> None:
    try:
        checked = parse_bundle(_dumps(document))
    except Refused as error:
        assert str(error).startswith("bundle"), error
        _tally("applier bundle", "refused")
        return
    _tally("applier bundle", "accepted")
    # Accepted only if every hash still holds: the content is exactly what was rendered.
    assert checked.files == {name: file.content for name, file in RENDERED.bundle.files.items()}


@pytest.mark.parametrize(
    "text",
    ["[" * DEEP, '{"a":' * DEEP, "{" + '"schema": 1,' * 2 + "}", "\ud800", "", "null", json.dumps(BUNDLE)[:-1]],
)
def test_the_applier_refuses_a_hostile_bundle_text(text: str) -> None:
    with pytest.raises(Refused) as refused:
        parse_bundle(text)
    assert str(refused.value).startswith("bundle")


@pytest.mark.parametrize("name", HOSTILE_TEXT)
@pytest.mark.parametrize("where", ["files", "partitions", "nodes", "topologies"])
def test_the_applier_refuses_a_hostile_name_in_a_bundle(where: str, name: str) -> None:
    document = copy.deepcopy(BUNDLE)
    if where == "files":  # a file name is a path: ../ must never leave the config directory
        document["files"][name] = document["files"].pop(document["slurm_format"])
    elif where == "partitions":
        document["partitions"][name] = None
    elif where == "nodes":
        document["nodes"].append(name)
    else:
        topology = next(iter(document["topologies"].values()))
        topology[name] = {"kind": "switch", "nodes": [], "switches": []}
    with pytest.raises(Refused) as refused:
        parse_bundle(_dumps(document))
    assert str(refused.value).startswith(f"bundle.{where}"), refused.value


@FUZZ
@given(mutated(BUNDLE))
def test_the_bundle_model_accepts_a_mutated_bundle_or_refuses_it_naming_the_field(document: dict[str, Any]) -> None:
    from topokeeper.render.bundle import Bundle

    try:
        Bundle.model_validate(document)
    except ValidationError as error:
        _refused_naming_a_field(InputError.from_validation(error, prefix="bundle"), "bundle")
        _tally("bundle model", "refused")
        return
    _tally("bundle model", "accepted")


# ------------------------------------------------------------------------------------------------------------
# Events: ingest and result, on the in-memory ports


def _fixture_event(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / f"{name}.json").read_text())


def _envelope(source: str, detail_type: str, detail: dict[str, Any]) -> dict[str, Any]:
    """A documented sample's envelope around another event's source, type and detail."""
    return {**_fixture_event("ssm-invocation"), "source": source, "detail-type": detail_type, "detail": detail}


INGEST_EVENTS = [
    _fixture_event("hyperpod-state-change"),
    _fixture_event("hyperpod-node-health"),
    _fixture_event("hyperpod-cluster-event"),
    _fixture_event("cloudtrail-batch-delete"),
    _fixture_event("ec2-state-change"),
    _envelope(
        "aws.sagemaker",
        CLOUDTRAIL_DETAIL_TYPE,
        {
            "eventSource": "sagemaker.amazonaws.com",
            "eventName": "MoveClusterNodes",
            "requestParameters": {"sourceClusterArn": CLUSTER, "targetClusterArn": "other"},
        },
    ),
]
for _event in INGEST_EVENTS:  # every sample names our cluster, so a mutation can reach the use case's end
    _details = _event["detail"].get("EventDetails", _event["detail"])
    for _key in ("ClusterName",):
        if _key in _details:
            _details[_key] = CLUSTER
    if "requestParameters" in _event["detail"] and "clusterName" in _event["detail"]["requestParameters"]:
        _event["detail"]["requestParameters"]["clusterName"] = CLUSTER
assert {e["detail-type"] for e in INGEST_EVENTS} >= {*HYPERPOD_DETAIL_TYPES, EC2_STATE_DETAIL_TYPE}


def _agent_delivery_in_flight() -> tuple[Controller, str]:
    """A controller with an agent delivery in flight, and the S3 version id its report must name."""
    controller = Controller(channel_kind=Channel.AGENT)
    assert reconcile(controller.change(), controller.deps()).action == "delivered"
    pending = controller.now_state().pending
    assert pending is not None
    return controller, pending.handle.reference


RESULT_EVENTS = [
    _fixture_event("ssm-invocation"),
    _envelope(
        agent_source(CLUSTER),
        AGENT_APPLY_DETAIL_TYPE,
        {
            "cluster": CLUSTER,
            "version_id": _agent_delivery_in_flight()[1],
            "result": {"outcome": "applied", "applier_version": "1.0.0", "partitions_changed": ["gpu"]},
        },
    ),
]
assert RESULT_EVENTS[0]["detail-type"] == SSM_INVOCATION_DETAIL_TYPE
RESULT_EVENTS[0]["detail"]["instance-id"] = HEAD_NODE


def _detail_mutated(events: list[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """One of ``events`` with its detail mutated (mostly), or its envelope (the handler's parser refuses those)."""
    return st.sampled_from(events).flatmap(
        lambda event: st.one_of(
            mutated(event["detail"]).map(lambda detail: {**event, "detail": detail}),
            mutated(event["detail"]).map(lambda detail: {**event, "detail": detail}),
            mutated(event),
        )
    )


def _parsed_envelope(document: dict[str, Any]) -> TopokeeperEvent | None:
    """The envelope as the handler's parser reads it; a malformed envelope is refused there, before the use case."""
    try:
        return TopokeeperEvent.model_validate(document)
    except ValidationError:
        return None


@FUZZ
@given(_detail_mutated(INGEST_EVENTS))
def test_ingest_takes_a_mutated_event_or_refuses_it_naming_the_field(document: dict[str, Any]) -> None:
    event = _parsed_envelope(document)
    if event is None:
        _tally("event envelope", "refused")
        return
    controller = Controller()
    try:
        result = ingest(event, controller.ingest_deps(tags={"ClusterName": CLUSTER}))
    except InputError as error:
        _refused_naming_a_field(error, "detail")
        assert controller.queue.sent == [], "a refused event queues nothing"
        _tally("ingest", "refused")
        return
    _tally("ingest", "accepted")
    assert result.status in ("queued", "ignored", "duplicate")
    assert all(cluster == CLUSTER for cluster in result.clusters)


@FUZZ
@given(_detail_mutated(RESULT_EVENTS))
def test_a_result_event_is_recorded_or_refused_naming_the_field(document: dict[str, Any]) -> None:
    event = _parsed_envelope(document)
    if event is None:
        _tally("event envelope", "refused")
        return
    controller, _ = _agent_delivery_in_flight()
    try:
        report = record_result(event, controller.result_deps())
    except InputError as error:
        _refused_naming_a_field(error, "detail")
        _tally("result", "refused")
        return
    _tally("result", "accepted")
    assert report.status in ("ignored", "refused", "pending", "outdated", "recorded", "verify-recorded")


@pytest.mark.parametrize("name", HOSTILE_TEXT)
def test_a_hostile_cluster_name_in_an_event_is_never_managed(name: str) -> None:
    document = copy.deepcopy(INGEST_EVENTS[0])
    document["detail"]["ClusterName"] = name
    controller = Controller()
    result = ingest(TopokeeperEvent.model_validate(document), controller.ingest_deps())
    assert (result.status, controller.queue.sent) == ("ignored", [])


def test_an_unknown_result_key_is_logged_quoted_and_cut(caplog: pytest.LogCaptureFixture) -> None:
    from topokeeper.contract.ports import ApplyResult

    hostile = {"a\nERROR forged line": 1, "x" * 10_240: 2}
    ApplyResult.model_validate({"outcome": "applied", "applier_version": "1.0.0", **hostile})
    (record,) = [r for r in caplog.records if "does not know" in r.getMessage()]
    assert "\n" not in record.getMessage() and len(record.getMessage()) < 300


@pytest.mark.parametrize("millis", [2**70, -(2**70), 1e300, float("nan"), float("inf")])
def test_an_epoch_time_out_of_range_is_refused_naming_the_field(millis: float) -> None:
    document = copy.deepcopy(INGEST_EVENTS[0])
    document["detail"]["CreationTime"] = millis
    with pytest.raises(InputError) as refused:
        ingest(TopokeeperEvent.model_validate(document), Controller().ingest_deps())
    assert refused.value.field == "detail.CreationTime"
