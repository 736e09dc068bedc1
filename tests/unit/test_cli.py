import argparse
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.helpers import powered_down_pcluster
from tests.installed_command import TOPOKEEPER, block_buffered_environment, run_installed
from topokeeper.adapters.aws import clear_clients, client
from topokeeper.cli.main import EXIT_BAD_INPUT, EXIT_FLUSH_FAILED, EXIT_OK, main
from topokeeper.cli.options import apply_endpoint_option

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_plan_writes_the_files_and_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--out", str(tmp_path)])
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle.json", "plan.json", "topology.mmd", "topology.yaml"]
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["PARTITION", "KIND", "NODES", "SWITCHES/BLOCKS", "LARGEST", "LEAF/BLOCK", "WARNINGS"]
    assert table[1].split() == ["ml-p5", "tree", "17", "9", "switches", "4", "1"]
    assert table[2].split() == ["ml-p6e", "block", "36", "2", "blocks", "18", "0"]
    assert table[3].split() == ["preprocess", "flat", "4", "-", "-", "0"]


def test_plan_names_parallelcluster_nodes_from_the_slurm_node_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unbound instance is a warning, not a refusal; powered-down dynamic nodes are written under no-topology
    (and are no nodes without topology data: the partition has no such warning)."""
    assert main(["plan", "--snapshot", str(EXAMPLES / "pcluster-p5-cluster.json"), "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert table[1].split() == ["cpu", "flat", "2", "-", "-", "0"]
    q1 = table[2].split()
    assert q1[:5] == ["q1", "tree", "8", "6", "switches"] and q1[6] == "1"  # its powered-down nodes' warning
    printed = captured.out + captured.err
    assert "instance i-05c1a000000000007 (10.0.1.30) is no Slurm node's NodeAddr; left out" in printed
    topology = (tmp_path / "topology.yaml").read_text()
    assert "      - switch: no-topology\n        nodes: q1-dy-p5-[3-4]\n" in topology
    bundle = json.loads((tmp_path / "bundle.json").read_text())
    assert "q1-st-p5-1" in bundle["nodes"] and not any(name.startswith("ip-") for name in bundle["nodes"])


def test_powered_down_nodes_are_no_leaf_a_job_fits_in_and_their_warning_is_their_partitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ten powered-down dynamic nodes under no-topology are not the largest job in one leaf (the real leaves hold
    at most 4), and the warning about them is counted in their partition's row above it."""
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(powered_down_pcluster()))
    assert main(["show", "--snapshot", str(snapshot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    q1 = next(line.split() for line in lines if line.startswith("q1 "))
    assert q1[:4] == ["q1", "tree", "16", "6"] and q1[5:] == ["4", "1"]  # LARGEST LEAF/BLOCK, WARNINGS
    assert (
        "warning: q1: 10 Slurm node(s) with no instance (powered down?) planned without topology: q1-dy-p5-[3-12]"
        in lines
    )


def test_show_leaves_lists_every_leaf_and_block_with_its_full_hostlist(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--leaves"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("PARTITION  LEAF/BLOCK")))
    rows = [line.split() for line in lines[start + 1 :]]
    assert sum(int(row[2]) for row in rows if row[0] == "ml-p5") == 17  # every node, no-topology included
    assert ["ml-p6e", "us-0ed3afa7df1cbb165", "18", "ip-10-2-0-[28-45]"] in rows
    assert not any(row[0] == "preprocess" for row in rows)  # flat: no leaves


def test_plan_for_old_slurm_writes_topology_conf(tmp_path: Path) -> None:
    assert (
        main(
            [
                "plan",
                "--snapshot",
                str(EXAMPLES / "mixed-cluster.json"),
                "--out",
                str(tmp_path),
                "--slurm-version",
                "24.11",
            ]
        )
        == 0
    )
    assert (tmp_path / "topology.conf").exists() and not (tmp_path / "topology.yaml").exists()
    assert json.loads((tmp_path / "plan.json").read_text())["slurm"]["topology_plugin"] == "topology/tree"


def test_config_overrides_a_partition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("partitions:\n  ml-p6e:\n    block_sizes: [9, 18]\n  ml-p5:\n    kind: flat\n")
    assert main(["show", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "ml-p5       flat" in out


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("partitions:\n  ml-p6e:\n    block_sizes: [18, 54]\n", "config.partitions.ml-p6e.block_sizes"),
        ("partitions:\n  ml-p6e:\n    kind: ring\n", "config.partitions.ml-p6e.kind"),
        ("partitions:\n  'bad name':\n    kind: tree\n", "config.partitions.bad name"),
        ("partitions: [\n", "--config"),
        (
            "partitions:\n  ml-p5x:\n    kind: flat\n",
            "config.partitions.ml-p5x: llm-train-slurm has no partition ml-p5x: did you mean 'ml-p5'?",
        ),
        (
            "partitions:\n  ml-p5x:\n    kind: block\n",
            "config.partitions.ml-p5x: llm-train-slurm has no partition ml-p5x: did you mean 'ml-p5'?",
        ),
        (
            "partitions:\n  gpu:\n    kind: tree\n",
            "config.partitions.gpu: llm-train-slurm has no partition gpu (its partitions: ml-p5, ml-p6e, preprocess)",
        ),
        (
            "partitions:\n  ml-p6e:\n    blok_sizes: [18]\n",
            "config.partitions.ml-p6e.blok_sizes: Extra inputs are not permitted: did you mean 'block_sizes'?",
        ),
    ],
)
def test_bad_config_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, message: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    out = tmp_path / "out"
    assert (
        main(["plan", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--config", str(path), "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"topokeeper: error: {message}")
    assert not out.exists()  # nothing half-written


def test_hostile_snapshot_is_refused_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads((EXAMPLES / "mixed-cluster.json").read_text())
    document["nodes"][4]["PrivateDnsHostname"] = "ip-$(reboot).ec2.internal"
    snapshot = tmp_path / "s.json"
    snapshot.write_text(json.dumps(document))
    out = tmp_path / "out"
    assert main(["plan", "--snapshot", str(snapshot), "--out", str(out)]) == 2
    assert "nodes[4].PrivateDnsHostname" in capsys.readouterr().err
    assert not out.exists()


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err  # one line, no traceback
    assert captured.err.startswith("topokeeper: error: ")
    return captured.err


NOT_UTF8 = b"partitions: {}\n# caf\xe9\n"


@pytest.mark.parametrize("flag", ["--snapshot", "--config"])
def test_a_file_that_is_not_utf8_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    inputs = {"--snapshot": str(EXAMPLES / "mixed-cluster.json"), flag: str(bad)}
    out = tmp_path / "out"
    assert main(["plan", *[x for pair in inputs.items() for x in pair], "--out", str(out)]) == 2
    error = _one_error_line(capsys)
    assert error.startswith(f"topokeeper: error: {flag}: {bad} is not UTF-8")
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--snapshot", "--config"])
@pytest.mark.parametrize(
    ("name", "document"), [("doc.json", "[]"), ("doc.json", "0"), ("doc.yaml", "[]\n"), ("doc.yaml", "0\n")]
)
def test_a_document_that_is_not_a_mapping_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, name: str, document: str
) -> None:
    path = tmp_path / name
    path.write_text(document)
    inputs = {"--snapshot": str(EXAMPLES / "mixed-cluster.json"), flag: str(path)}
    assert main(["show", *[x for pair in inputs.items() for x in pair]]) == 2
    assert _one_error_line(capsys).startswith(f"topokeeper: error: {flag}: {path} must hold a mapping")


def test_an_empty_yaml_config_means_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("# nothing overridden\n")
    assert main(["show", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--config", str(config)]) == 0
    assert "ml-p5" in capsys.readouterr().out


def test_plan_out_that_is_a_file_or_cannot_be_created_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "taken"
    a_file.write_text("mine\n")
    for out, reason in ((a_file, "is a file"), (a_file / "sub", "cannot create")):
        assert main(["plan", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--out", str(out)]) == 2
        error = _one_error_line(capsys)
        assert error.startswith(f"topokeeper: error: --out: {out}") and reason in error, error
    assert a_file.read_text() == "mine\n"


@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_snapshot_out_that_cannot_be_written_is_refused_before_reading_aws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # No AWS endpoint answers here: the refusal must come before the first call.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    a_file = tmp_path / "taken"
    a_file.write_text("mine\n")
    out = tmp_path if where == "directory" else a_file / "snapshot.json"
    assert main(["--region", "us-east-1", "snapshot", "--cluster", "c1", "--out", str(out)]) == 2
    assert _one_error_line(capsys).startswith(f"topokeeper: error: --out: {out}")
    assert a_file.read_text() == "mine\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [(NOT_UTF8, "is not UTF-8"), (b"[]\n", "must hold a mapping"), (b"0\n", "must hold a mapping")],
)
@pytest.mark.parametrize(
    ("flag", "name", "command"),
    [
        ("--scenario", "scenario.yaml", ["simulate", "--out", "{tmp}/out"]),
        ("--deployment", "deployment.json", ["diff", "--cluster", "c1"]),
    ],
)
def test_a_bad_scenario_or_deployment_file_is_one_line_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    name: str,
    command: list[str],
    content: bytes,
    message: str,
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert main([*(argument.format(tmp=tmp_path) for argument in command), flag, str(path)]) == 2
    assert _one_error_line(capsys).startswith(f"topokeeper: error: {flag}: {path} {message}")
    assert not (tmp_path / "out").exists()  # refused before anything starts


def test_simulate_refuses_an_out_that_is_a_file_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "taken"
    a_file.write_text("mine\n")
    scenario = Path(__file__).resolve().parents[2] / "layers/core/python/topokeeper/sim/scenarios/demo.yaml"
    assert main(["simulate", "--scenario", str(scenario), "--out", str(a_file)]) == 2
    assert _one_error_line(capsys).startswith(f"topokeeper: error: --out: {a_file} is a file")


def test_show_and_plan_say_what_24_11_folded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = str(EXAMPLES / "mixed-cluster.json")
    assert main(["show", "--snapshot", snapshot, "--slurm-version", "24.11"]) == 0
    shown = capsys.readouterr().out
    assert "block partition ml-p6e is folded into the cluster tree" in shown
    rows = {line.split()[0]: line for line in shown.splitlines()[1:4]}  # the KIND column: what topology.conf holds
    assert " block, folded into tree " in rows["ml-p6e"] and " flat, folded into tree " in rows["preprocess"]
    assert "folded" not in rows["ml-p5"]
    assert "flat partition preprocess is folded into the cluster tree (ip-10-3-0-[10-13] in no-topology)" in shown
    assert main(["plan", "--snapshot", snapshot, "--slurm-version", "24.11", "--out", str(tmp_path)]) == 0
    warnings = json.loads((tmp_path / "plan.json").read_text())["warnings"]
    assert [w for w in warnings if "folded" in w] == [
        line.removeprefix("warning: ")
        for line in shown.splitlines()
        if line.startswith("warning: ") and "folded" in line
    ]


def test_plan_prints_each_file_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--out", str(tmp_path)]) == 0
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert wrote == [f"wrote {tmp_path / name}" for name in sorted(p.name for p in tmp_path.iterdir())]


def test_show_and_plan_json_print_the_plan_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = str(EXAMPLES / "mixed-cluster.json")
    assert main(["show", "--snapshot", snapshot, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert main(["plan", "--snapshot", snapshot, "--out", str(tmp_path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert shown == planned["plan"] == json.loads((tmp_path / "plan.json").read_text())
    assert planned["written"] == [str(tmp_path / name) for name in sorted(p.name for p in tmp_path.iterdir())]


@pytest.fixture
def no_aws_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name in ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    clear_clients()  # no client made with another test's region or credentials


@pytest.mark.usefixtures("no_aws_configuration")
def test_the_operator_cli_without_a_region_says_what_to_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "--cluster", "llm-train"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("topokeeper: error: --region:"), error
    assert "AWS_REGION" in error


@pytest.mark.usefixtures("no_aws_configuration")
def test_region_after_the_subcommand_is_taken_and_missing_credentials_say_what_to_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["snapshot", "--cluster", "llm-train", "--region", "us-west-2"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("topokeeper: error: credentials:"), error
    assert "AWS_PROFILE" in error


@pytest.mark.usefixtures("no_aws_configuration")
@pytest.mark.parametrize(
    ("environment", "field"),
    [
        ({"AWS_PROFILE": "no-such-profile", "AWS_REGION": "us-west-2"}, "AWS_PROFILE"),  # a typo'd profile
        ({"AWS_REGION": "us_west_2"}, "--region"),  # botocore refuses the format before any request
        ({"AWS_REGION": "us-west-2", "AWS_CONFIG_FILE": "broken"}, "AWS config"),
        ({"AWS_PROFILE": "sso", "AWS_CONFIG_FILE": "sso-config"}, "aws sso login"),  # no or an expired SSO token
    ],
    ids=["unknown-profile", "malformed-region", "unparsable-config", "sso-not-logged-in"],
)
def test_a_wrong_profile_region_or_config_file_is_one_line_not_a_traceback(
    environment: dict[str, str],
    field: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "broken").write_text("[default\nregion=us-west-2\n")
    (tmp_path / "sso-config").write_text(
        "[profile sso]\nsso_session = s\nsso_account_id = 123456789012\nsso_role_name = Admin\nregion = us-west-2\n"
        "[sso-session s]\nsso_start_url = https://example.awsapps.com/start\nsso_region = us-west-2\n"
    )
    monkeypatch.setenv("HOME", str(tmp_path))  # no SSO token cache
    for name, value in environment.items():
        monkeypatch.setenv(name, str(tmp_path / value) if name == "AWS_CONFIG_FILE" else value)
    assert main(["snapshot", "--cluster", "llm-train"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("topokeeper: error: "), error
    assert field in error


@pytest.mark.usefixtures("no_aws_configuration")
@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"AWS_REGION": "us-west-2"}, "us-west-2"),
        ({"AWS_DEFAULT_REGION": "eu-west-1"}, "eu-west-1"),
        ({"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "eu-west-1"}, "us-west-2"),  # the AWS CLI v2's order
    ],
)
def test_the_clients_take_aws_region_before_aws_default_region(
    environment: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert client("ec2").meta.region_name == expected


@pytest.mark.usefixtures("no_aws_configuration")
def test_region_flag_wins_over_aws_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    args = argparse.Namespace(endpoint_url=None, region="ap-south-1")
    apply_endpoint_option(args)
    assert client("ec2").meta.region_name == "ap-south-1"


def test_plan_and_show_print_the_slurm_conf_edit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = str(EXAMPLES / "mixed-cluster.json")
    assert main(["plan", "--snapshot", snapshot, "--out", str(tmp_path)]) == 0
    (edit,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("slurm.conf: ")]
    assignments = json.loads((tmp_path / "bundle.json").read_text())["partitions"]
    assert edit == (
        f"slurm.conf: PartitionName=ml-p5 Topology={assignments['ml-p5']},"
        f" PartitionName=ml-p6e Topology={assignments['ml-p6e']},"
        " PartitionName=preprocess without Topology= (the cluster default)"
    )
    assert main(["show", "--snapshot", snapshot, "--slurm-version", "24.11"]) == 0
    (edit,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("slurm.conf: ")]
    assert edit.startswith("slurm.conf: TopologyPlugin=topology/tree, PartitionName=ml-p5 without Topology=")


# Every subcommand that talks to AWS, as an operator would type it: region after the subcommand, no credentials.
AWS_COMMANDS = [
    ["verify", "--snapshot", str(EXAMPLES / "mixed-cluster.json"),
     "--head-node", "i-0123456789abcdef0", "--bucket", "b"],
    ["kueue", "--cluster", "llm-train", "--out", "{tmp}/kueue"],
    [
        "login", "rotate-host-keys", "--cluster", "llm-train", "--name", "login.example.com",
        "--login-role-arn", "arn:aws:iam::111122223333:role/login",
        "--kms-key-id", "arn:aws:kms:us-west-2:111122223333:key/abc",
    ],
    ["login", "install-run-command", "--cluster", "llm-train", "--tag", "role=login",
     "--secret-arn", "arn:aws:secretsmanager:us-west-2:111122223333:secret:x", "--secret-region", "us-west-2"],
]  # fmt: skip


@pytest.mark.usefixtures("no_aws_configuration")
@pytest.mark.parametrize("command", AWS_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_aws_command_takes_region_after_it_and_says_what_to_set_in_one_line(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [part.format(tmp=tmp_path) for part in command]
    if command[1] != "install-run-command":  # it names the secret's region itself (--secret-region)
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and error.startswith("topokeeper: error: --region:"), error
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):  # main sets them from --region; undone after the test
        monkeypatch.setenv(name, "")
    assert main([*argv, "--region", "us-west-2"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("topokeeper: error: credentials:"), error


def test_a_folded_block_partition_reports_its_largest_leaf_in_the_tree_slurm_reads() -> None:
    """Before 25.05 a block partition folded into the cluster tree is placed by that tree's leaves: 18-node
    UltraServers whose nodes hang under two leaves of 9 fit a 9-node job in one leaf, not 18."""
    from topokeeper.cli.planning import plan_table
    from topokeeper.domain.models import ClusterSnapshot, Node, Partition, SlurmVersion
    from topokeeper.engine.planner import plan
    from topokeeper.render.bundle import render

    def node(group: str, number: int, leaf: str, ultraserver: str | None, kind: str) -> Node:
        return Node(
            name=f"{group}-{number}", instance_id=f"i-{group == 'gb':d}{number:016x}", instance_type=kind,
            partition=group, network_nodes=("nn-spine", "nn-agg", leaf), ultraserver_id=ultraserver,
        )  # fmt: skip

    gb = tuple(node("gb", n, f"nn-gb{n // 9}", "us-a" if n < 18 else "us-b", "p6e-gb200.36xlarge") for n in range(36))
    p5 = tuple(node("p5", n, f"nn-p5{n // 4}", None, "p5.48xlarge") for n in range(8))
    snapshot = ClusterSnapshot(
        cluster_name="c", slurm_version=SlurmVersion.parse("24.11"),
        partitions=(Partition(name="gb", nodes=gb), Partition(name="p5", nodes=p5)),
    )  # fmt: skip
    rows = {line.split()[0]: line.split() for line in plan_table(render(plan(snapshot))).splitlines()[1:3]}
    assert rows["gb"][1:5] == ["block,", "folded", "into", "tree"]
    assert rows["gb"][8] == "9"  # LARGEST LEAF/BLOCK: a leaf of the written tree, not an 18-node block
    assert rows["p5"][5] == "4"


def test_the_topokeeper_command_is_run_which_ends_a_plan_without_teardown() -> None:
    (script,) = entry_points(group="console_scripts", name="topokeeper")
    assert script.value == "topokeeper.cli:run"


def test_ending_without_teardown_runs_the_exit_functions_and_keeps_the_status(tmp_path: Path) -> None:
    ran_marker = tmp_path / "exit-function-ran"
    program = (
        "import atexit, pathlib\n"
        f"atexit.register(pathlib.Path({str(ran_marker)!r}).write_text, 'ran')\n"
        "from topokeeper.cli.main import end_without_teardown\n"
        "print('printed', end='')\n"
        "end_without_teardown(3)\n"
    )
    environment = block_buffered_environment()
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=environment, check=False)
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, "printed", "")
    assert ran_marker.read_text() == "ran"  # as sys.exit runs them (temporary directories' finalizers, logging)


def test_a_plan_ended_without_teardown_has_printed_and_written_everything(tmp_path: Path) -> None:
    ran = run_installed("plan", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), "--out", str(tmp_path))
    assert ran.returncode == EXIT_OK, ran.stderr
    files = sorted(path for path in tmp_path.iterdir() if path.stat().st_size > 0)
    # Its last lines, left in the stream's buffer until the exit flushed them.
    assert files and ran.stdout.endswith("".join(f"wrote {path}\n" for path in files))
    bad = run_installed("show", "--snapshot", str(tmp_path / "missing.json"))
    assert bad.returncode == EXIT_BAD_INPUT
    assert bad.stderr.startswith("topokeeper: error: ") and bad.stdout == ""


@pytest.mark.parametrize("output", ["table", "json"])
def test_output_that_cannot_be_written_is_an_error_never_a_success(output: str, tmp_path: Path) -> None:
    """A full disk: a flush that fails drops what it could not write, so a second flush (the interpreter's own, at
    exit) finds nothing to report. The JSON document (6 kB) is past the stream's buffer, the table within it."""
    argv = ["show", "--snapshot", str(EXAMPLES / "mixed-cluster.json"), *(["--json"] if output == "json" else [])]
    with open("/dev/full", "w") as full:
        ran = run_installed(*argv, stdout=full)
    assert ran.returncode == EXIT_FLUSH_FAILED
    assert ran.stderr == "topokeeper: error: cannot write the output: No space left on device\n"
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the command writes (head -1 done, a consumer died)
    with os.fdopen(writer, "w") as gone:
        ran = run_installed(*argv, stdout=gone)
    assert ran.returncode == EXIT_FLUSH_FAILED and ran.stderr.endswith("cannot write the output: Broken pipe\n")


def test_a_closed_standard_stream_is_no_error() -> None:
    """Started with its output or error descriptor closed (``>&-``), as before: nothing is printed there."""
    snapshot = str(EXAMPLES / "mixed-cluster.json")
    closed_out = subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" >&-', TOPOKEEPER, "show", "--snapshot", snapshot], check=False
    )
    assert closed_out.returncode == EXIT_OK
    missing = str(EXAMPLES / "no-such-snapshot.json")
    closed_error = subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" 2>&-', TOPOKEEPER, "show", "--snapshot", missing], capture_output=True, check=False
    )
    assert closed_error.returncode == EXIT_BAD_INPUT


def test_verify_names_each_drift_entry_once_with_its_kind() -> None:
    """A grouping entry's kind and what are both "grouping": said once, not "grouping grouping q1"."""
    from topokeeper.cli.readonly_commands import result_lines
    from topokeeper.contract.ports import ApplyResult

    drift = [
        {"what": "grouping", "kind": "grouping", "name": "q1", "detail": "live tree-q1: 2 leaves differ"},
        {"what": "partition", "kind": "naming", "name": "cpu", "detail": "Topology=flat-x live"},
    ]
    result = ApplyResult.model_validate({"outcome": "drift", "applier_version": "1", "drift": drift})
    assert result_lines("verify", result) == [
        "verify: drift",
        "  grouping q1: live tree-q1: 2 leaves differ",
        "  naming partition cpu: Topology=flat-x live",
    ]
