from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, ValidationError

from topokeeper.contract.errors import InputError
from topokeeper.sim.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "layers/core/python/topokeeper/sim/scenarios"

GOOD = """\
cluster:
  name: demo
  instance_groups:
    - {name: controller, type: ml.m5.xlarge, count: 1, role: controller}
    - {name: p5, type: ml.p5.48xlarge, count: 4, partition: ml-p5}
steps:
  - scale: {group: p5, to: 8}
"""


@pytest.mark.parametrize(
    "name",
    [
        "demo.yaml",
        "verify-mode.yaml",
        "scale-1000.yaml",
        "burst-1000.yaml",
        "full-story.yaml",
        "eks.yaml",
        "login.yaml",
        "parallelcluster.yaml",
        "parallelcluster-registration.yaml",
    ],
)
def test_shipped_scenarios_load(name: str) -> None:
    assert load_scenario(SCENARIOS / name).steps


def test_the_head_node_style_is_debian_unless_the_scenario_says() -> None:
    assert load_scenario(SCENARIOS / "demo.yaml").cluster.head_node_style == "debian"
    assert load_scenario(SCENARIOS / "full-story.yaml").cluster.head_node_style == "hyperpod"
    assert load_scenario(SCENARIOS / "parallelcluster.yaml").cluster.head_node_style == "parallelcluster"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("  - scale: {group: p5, to: 8}", "  - scale: {group: p5, to: 8, speed: 3}"), "scenario.steps[0].scale.speed"),
        (("steps:", "stepz:"), "scenario.stepz"),
        (("  - scale: {group: p5, to: 8}", "  - scale: {group: gpu, to: 8}"), "scenario"),
        (("  - scale: {group: p5, to: 8}", "  - {scale: {group: p5, to: 8}, wait: {seconds: 3}}"), "scenario.steps[0]"),
        # Whether a group needs a partition depends on the cluster's orchestrator: the cluster names the group.
        (("count: 4, partition: ml-p5", "count: 4"), "scenario.cluster"),
        (("  name: demo", "  name: demo\n  mode: fight"), "scenario.cluster.mode"),
        (("  name: demo", "  name: demo\n  head_node_style: centos"), "scenario.cluster.head_node_style"),
    ],
)
def test_unknown_or_bad_keys_are_errors_naming_them(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(InputError) as error:
        load_scenario(path)
    assert error.value.field == field, error.value


@pytest.mark.parametrize(
    ("change", "field", "hint"),
    [
        (("steps:", "stepz:"), "scenario.stepz", "did you mean 'steps'?"),
        (
            ("  name: demo", "  name: demo\n  slurm_verison: '24.11'"),
            "scenario.cluster.slurm_verison",
            "did you mean 'slurm_version'?",
        ),
        (
            ("partition: ml-p5}", "partition: ml-p5, netwrok: {layers: 3}}"),
            "scenario.cluster.instance_groups[1].netwrok",
            "did you mean 'network'?",
        ),
        (
            ("  - scale: {group: p5, to: 8}", "  - scale: {group: p5, to: 8, speed: 3}"),
            "scenario.steps[0].scale.speed",
            "expected one of group, over_seconds, to",  # nothing near: every key it takes there
        ),
    ],
)
def test_an_unknown_key_names_the_nearest_valid_one(
    tmp_path: Path, change: tuple[str, str], field: str, hint: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(InputError) as error:
        load_scenario(path)
    assert error.value.field == field and error.value.message.startswith("Extra inputs are not permitted")
    assert error.value.message.endswith(hint), error.value.message


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        ("ml.p5.48xlargee", "did you mean 'ml.p5.48xlarge'?"),
        ("ml.gpu.huge", "not an instance type SageMaker HyperPod accepts"),
        ("p5.48xlargee", "did you mean 'p5.48xlarge'?"),  # an EC2 name (no ml.) is checked against EC2's
    ],
)
def test_an_instance_type_aws_would_refuse_is_one_error_naming_the_group(tmp_path: Path, wrong: str, hint: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("type: ml.p5.48xlarge", f"type: {wrong}"))
    with pytest.raises(InputError) as error:  # before anything starts, not a CreateCluster traceback
        load_scenario(path)
    assert error.value.field == "scenario.cluster.instance_groups[1].type", error.value
    assert repr(wrong) in error.value.message and hint in error.value.message, error.value.message


def test_an_ec2_type_in_a_hyperpod_cluster_is_one_error_with_the_ml_name(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("type: ml.p5.48xlarge", "type: p5.48xlarge"))  # EC2 knows it; HyperPod does not
    with pytest.raises(InputError) as error:  # before anything starts, not a CreateCluster traceback
        load_scenario(path)
    assert str(error.value).count("\n") == 0
    assert error.value.message.endswith(
        "instance_groups[1].type: 'p5.48xlarge' is not a type SageMaker HyperPod accepts; "
        "did you mean 'ml.p5.48xlarge'?"
    ), error.value.message


@pytest.mark.parametrize("version", ["23.02", "25.05", "24.05"])
def test_a_slurm_version_the_simulator_does_not_run_is_refused(tmp_path: Path, version: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("  name: demo", f'  name: demo\n  slurm_version: "{version}"'))
    with pytest.raises(InputError) as error:
        load_scenario(path)
    assert error.value.field == "scenario.cluster.slurm_version", error.value
    assert "24.11" in str(error.value) and "26.05" in str(error.value)


@pytest.mark.parametrize("version", ["24.11", "25.11", "26.05", "24.11.5"])
def test_the_slurm_versions_the_simulator_runs_load(tmp_path: Path, version: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("  name: demo", f'  name: demo\n  slurm_version: "{version}"'))
    assert load_scenario(path).cluster.slurm_version == version


def test_booting_slurmd_nodes_are_refused_outside_parallelcluster(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("  name: demo", "  name: demo\n  slurmd: true"))
    with pytest.raises(InputError) as error:
        load_scenario(path)
    assert "slurmd: real slurmd for booting nodes is modelled for orchestrator parallelcluster only" in str(error.value)


def test_hyperpods_misplacing_bug_needs_the_topology_it_manages(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("  - scale: {group: p5, to: 8}", "  - hyperpod_misplace: {group: p5}"))
    with pytest.raises(InputError, match="managed_topology"):
        load_scenario(path)
    path.write_text(path.read_text().replace("  name: demo", "  name: demo\n  managed_topology: true"))
    assert load_scenario(path).steps[0].action == "hyperpod_misplace"


def test_an_eks_scenario_has_compute_groups_without_partitions_only() -> None:
    groups = [{"name": "p5", "type": "ml.p5.48xlarge", "count": 2}]
    eks = Scenario.model_validate({"cluster": {"name": "k", "orchestrator": "eks", "instance_groups": groups}})
    assert eks.cluster.orchestrator == "eks"
    with_controller = [*groups, {"name": "controller", "type": "ml.m5.xlarge", "count": 1, "role": "controller"}]
    with pytest.raises(ValidationError, match="compute groups without a partition"):
        Scenario.model_validate({"cluster": {"name": "k", "orchestrator": "eks", "instance_groups": with_controller}})
    with pytest.raises(ValidationError, match="compute groups need a partition"):
        Scenario.model_validate({"cluster": {"name": "k", "instance_groups": with_controller}})


PARALLELCLUSTER = """\
cluster:
  name: pc
  orchestrator: parallelcluster
  instance_groups:
    - {name: head, type: c5.2xlarge, count: 1, role: controller}
    - {name: p5, type: p5.48xlarge, count: 2, dynamic: 4, partition: q1}
steps:
  - scale: {group: p5, to: 6}
"""


def test_a_parallelcluster_world_runs_its_own_head_node_style_and_nothing_only_hyperpod_does(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(PARALLELCLUSTER)
    assert load_scenario(path).cluster.head_node_style == "parallelcluster"
    refused = [
        (("  - scale: {group: p5, to: 6}", "  - scale: {group: p5, to: 7}"), "between 2 and 6"),
        (("  - scale: {group: p5, to: 6}", "  - scale: {group: p5, to: 1}"), "between 2 and 6"),
        (
            ("  - scale: {group: p5, to: 6}", "  - reboot: {group: p5}"),
            "not simulated for orchestrator parallelcluster",
        ),
        (("  orchestrator: parallelcluster", "  orchestrator: parallelcluster\n  head_node_style: hyperpod"), "goes"),
        (("  orchestrator: parallelcluster", "  orchestrator: parallelcluster\n  managed_topology: true"), "HyperPod"),
        (("count: 1, role: controller", "count: 2, role: controller"), "one head node"),
        (("  orchestrator: parallelcluster\n", ""), "dynamic nodes are ParallelCluster's"),
    ]
    for change, message in refused:
        path.write_text(PARALLELCLUSTER.replace(*change))
        with pytest.raises(InputError, match=message):
            load_scenario(path)


_SIX_THOUSAND = "\n".join(
    f"    - {{name: g{n}, type: ml.p5.48xlarge, count: 6000, partition: ml-p5}}" for n in range(4)
)


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        # Each ran until killed, hung, or ended in a MemoryError traceback before it was bounded.
        (("scale: {group: p5, to: 8}", "wait: {seconds: .inf}"), "scenario.steps[0].wait.seconds", "finite"),
        (("scale: {group: p5, to: 8}", "wait: {seconds: .nan}"), "scenario.steps[0].wait.seconds", "finite"),
        (("scale: {group: p5, to: 8}", "wait: {seconds: 86401}"), "scenario.steps[0].wait.seconds", "86400"),
        (("to: 8}", "to: 8, over_seconds: .inf}"), "scenario.steps[0].scale.over_seconds", "finite"),
        (("to: 8}", "to: 8, over_seconds: 1e9}"), "scenario.steps[0].scale.over_seconds", "86400"),
        (("to: 8}", "to: 100000000}"), "scenario.steps[0].scale.to", "6758"),
        (
            ("scale: {group: p5, to: 8}", "replace: {group: p5, count: 10000000}"),
            "scenario.steps[0].replace.count",
            "6758",
        ),
        (
            ("partition: ml-p5}", "partition: ml-p5, network: {nodes_per_leaf: 1000000000}}"),
            "scenario.cluster.instance_groups[1].network.nodes_per_leaf",
            "6758",
        ),
        (
            ("partition: ml-p5}", "partition: ml-p5, network: {ultraserver_size: 1000000000}}"),
            "scenario.cluster.instance_groups[1].network.ultraserver_size",
            "6758",
        ),
        (("  name: demo", "  name: demo\n  seed: 1000000000000000000000000000000"), "scenario.cluster.seed", ""),
        (("steps:", "timing: {step_timeout_seconds: .inf}\nsteps:"), "scenario.timing.step_timeout_seconds", "finite"),
        (("steps:", "timing: {api_call_seconds: 1e300}\nsteps:"), "scenario.timing.api_call_seconds", "3600"),
        (
            ("steps:", "timing: {drift_interval_seconds: 6000000000}\nsteps:"),
            "scenario.timing.drift_interval_seconds",
            "86400",
        ),
        (("steps:", "debounce_seconds: 1000000000\nsteps:"), "scenario.debounce_seconds", "900"),
        (("steps:", "drift_alarm_periods: 1000000000\nsteps:"), "scenario.drift_alarm_periods", "100"),
        (("steps:", "steps:" + "\n  - wait: {seconds: 1}" * 1001), "scenario.steps", "1000"),
        # Together: 4 x 6,000 nodes and then a scale-up past 25,000; eight simulated days of waiting.
        (
            (
                "\nsteps:\n  - scale: {group: p5, to: 8}",
                f"\n{_SIX_THOUSAND}\nsteps:\n  - scale: {{group: p5, to: 1000}}",
            ),
            "scenario",
            "steps[0].scale.to: the cluster would reach 25001 nodes; the simulator runs at most 25000",
        ),
        (
            ("  - scale: {group: p5, to: 8}", "  - wait: {seconds: 86400}\n" * 8),
            "scenario",
            "steps[7].wait.seconds: the story's waits and spreads add up to 691200 s; at most 604800",
        ),
    ],
)
def test_every_scenario_number_is_finite_and_bounded_in_one_line_naming_it(
    tmp_path: Path, change: tuple[str, str], field: str, says: str
) -> None:
    path = tmp_path / "s.yaml"
    assert change[0] in GOOD
    path.write_text(GOOD.replace(*change))
    with pytest.raises(InputError) as error:
        load_scenario(path)
    assert error.value.field == field, error.value
    assert says in error.value.message and "\n" not in str(error.value), error.value


def test_a_cluster_over_the_node_limit_is_refused_naming_its_groups(tmp_path: Path) -> None:
    groups = _SIX_THOUSAND + "\n    - {name: g4, type: ml.p5.48xlarge, count: 1001, partition: ml-p5}"
    path = tmp_path / "s.yaml"
    path.write_text(
        GOOD.replace(
            "    - {name: p5, type: ml.p5.48xlarge, count: 4, partition: ml-p5}",
            groups + "\n    - {name: p5, type: ml.p5.48xlarge, count: 4, partition: ml-p5}",
        )
    )
    with pytest.raises(InputError) as error:
        load_scenario(path)
    assert str(error.value) == "scenario.cluster: instance_groups: 25006 nodes; the simulator runs at most 25000"


def _numbers_without_a_maximum(model: type[BaseModel], path: str) -> list[str]:
    """Every int or float field under ``model`` (nested models, their lists and optionals) without ``le``/``lt``."""
    found = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        members = [m for m in get_args(annotation) if m is not type(None)] or [annotation]
        inner = [a for m in members for a in (get_args(m) or [m])]
        for member in inner:
            if isinstance(member, type) and issubclass(member, BaseModel):
                found += _numbers_without_a_maximum(member, f"{path}.{name}")
            elif member in (int, float) and not any(hasattr(m, "le") or hasattr(m, "lt") for m in info.metadata):
                found.append(f"{path}.{name}")
    return found


def test_no_scenario_number_is_without_a_maximum() -> None:
    assert _numbers_without_a_maximum(Scenario, "scenario") == []


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ("{partition: ml-p9, nodes: 2}", "steps[0].submit.jobs[0].partition: no partition 'ml-p9'"),
        ('{partition: ml-p5, nodes: 2, name: "two\\nlines"}', "String should match pattern"),
        ("{partition: ml-p5, nodes: 0}", "greater than or equal to 1"),
    ],
)
def test_a_submitted_job_names_a_partition_and_a_one_line_name(tmp_path: Path, job: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("  - scale: {group: p5, to: 8}", f"  - submit: {{jobs: [{job}]}}"))
    with pytest.raises(InputError) as error:
        load_scenario(path)
    assert message in str(error.value), error.value
    hostile = '{partition: ml-p5, nodes: 2, switches: 1, name: "$(reboot) <b>"}'
    path.write_text(GOOD.replace("  - scale: {group: p5, to: 8}", f"  - submit: {{jobs: [{hostile}]}}"))
    (request,) = load_scenario(path).steps[0].submit.jobs  # type: ignore[union-attr]
    assert (request.name, request.switches, request.segment) == ("$(reboot) <b>", 1, None)
