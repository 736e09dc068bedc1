"""The file-only head node's stand-in state (what the last ``reconfigure`` loaded, and the answers to the reads it
computed then) and those reads answered from it. NOT Slurm.

Both ``topokeeper.sim.standin_reads`` (the front door, run for every ``scontrol`` the applier asks) and
``topokeeper.sim.standin_scontrol`` (the stand-in) use it, so it imports nothing beyond the interpreter's built-in
modules (the state is ``marshal``'s: ``json`` brings ``re``, which cost the stand-in more than its answer).
"""

from __future__ import annotations

import marshal
import os

TYPE_CHECKING = False  # typing and collections are not imported at run time (typing brings re)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

STATE_FILE = "standin-scontrol.state"  # marshal: written and read by this interpreter only
OPTIONS = {"-o", "-a", "--future"}  # output options the applier passes; the stand-in always prints one-liners


def read_state(state_dir: str) -> dict[str, Any]:
    with open(os.path.join(state_dir, STATE_FILE), "rb") as handle:
        state: dict[str, Any] = marshal.load(handle)  # noqa: S302 - the stand-in's own file, written by this interpreter
    return state


def write_state(state_dir: str, state: Mapping[str, Any]) -> None:
    path = os.path.join(state_dir, STATE_FILE)
    with open(f"{path}.tmp", "wb") as handle:
        marshal.dump(dict(state), handle)
    os.replace(f"{path}.tmp", path)


def read_text(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def loaded_answer(state: Mapping[str, Any], arguments: Sequence[str]) -> tuple[str, str] | None:
    """(stdout, stderr) of a read answered from the state, or None for ``standin_scontrol.main`` to answer."""
    options = {argument for argument in arguments if argument.startswith("-")}
    words = [argument for argument in arguments if not argument.startswith("-")]
    if not options <= OPTIONS:
        return None
    if words == ["version"]:
        return f"slurm {state['slurm_version']}\n", ""
    if words == ["show", "config"]:
        return f"SLURM_CONF              = {state['slurm_conf']}\n" + (
            f"SLURM_VERSION           = {state['slurm_version']}\n"
        ), ""
    answers = state.get("answers")
    if state["loaded"] is None or answers is None:
        return None
    if "-o" in options and words in (["show", "partition"], ["show", "nodes"]):
        return answers[words[1]], ""
    if words[:2] == ["show", "topology"] and len(words) <= 3:
        known = answers["topology"] if len(words) == 2 else answers["named topology"].get(words[2])
        return None if known is None else (known[0], known[1])
    return None
