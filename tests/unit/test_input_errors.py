"""Bad input is one error on one line that names the field or option it came from (issue 26, item 10)."""

from __future__ import annotations

import pytest

from topokeeper.contract.errors import InputError
from topokeeper.domain.models import PlannerConfig, check_block_sizes
from topokeeper.kueue.node_list import INSTANCE_TYPE_LABEL, KubeNode, nodes_from_labels
from topokeeper.login.install import install_script

HOSTILE_NAME = "n1\nkind: Secret"
ARN = "arn:aws:secretsmanager:us-east-1:111122223333:secret:topokeeper-login-AbCdEf"


def _one_line(error: InputError) -> str:
    text = str(error)
    assert text.isprintable(), repr(text)  # no newline, carriage return, escape or line separator
    return text


def test_a_node_named_with_a_newline_is_an_error_on_one_line_showing_the_name_escaped() -> None:
    node = KubeNode(HOSTILE_NAME, "i-0123456789abcdef0", {INSTANCE_TYPE_LABEL: "p5.48xlarge"})
    with pytest.raises(InputError) as error:
        nodes_from_labels([node])
    assert _one_line(error.value).startswith("node n1\\nkind: Secret")


@pytest.mark.parametrize("key", ["a\nb", "ml-p5\r\nkind: Secret", "x\x1b[2Jy", "p\u2028q"])
def test_a_key_with_control_characters_is_escaped_in_the_field_path(key: str) -> None:
    with pytest.raises(Exception) as raised:
        PlannerConfig.model_validate({"partitions": {key: {"kind": "tree"}}})
    error = InputError.from_validation(raised.value, prefix="config", model=PlannerConfig)  # type: ignore[arg-type]
    escaped = repr(key)[1:-1]
    assert _one_line(error).startswith(f"config.partitions.{escaped}"), str(error)
    assert error.field.startswith(f"config.partitions.{escaped}")


def test_an_input_error_is_one_line_whatever_its_parts_hold() -> None:
    error = InputError("items[0].metadata.name\nX", "bad\nvalue\r")
    assert _one_line(error) == "items[0].metadata.name\\nX: bad\\nvalue\\r"


def test_a_bad_secret_region_names_the_option_the_command_has() -> None:
    with pytest.raises(InputError) as error:
        install_script(ARN, "us-east-1; id")
    assert error.value.field == "--secret-region" and _one_line(error.value).startswith("--secret-region: ")


@pytest.mark.parametrize(
    ("sizes", "says"),
    [
        ((10**30,), "at most 65535"),  # Slurm keeps the base block size in 16 bits
        ((65536,), "at most 65535"),
        ((65535, 65535 * 2**15), ""),  # the largest Slurm takes: 16 levels below 2^31
        ((1, 2**31), "base x 2\\^15"),  # Slurm refuses a level past 15
    ],
)
def test_block_sizes_are_bounded_by_what_slurm_accepts(sizes: tuple[int, ...], says: str) -> None:
    if not says:
        check_block_sizes(sizes)
        return
    with pytest.raises(ValueError, match=says):
        check_block_sizes(sizes)
