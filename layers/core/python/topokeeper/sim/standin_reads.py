"""The file-only head node's ``scontrol`` for the reads it answers from what the last ``reconfigure`` loaded (see
``topokeeper.sim.standin_scontrol``, which is the stand-in; this is its front door). NOT Slurm.

The applier runs a process for every ``scontrol`` it asks, and most ask what the stand-in computed when the config
loaded: ``version``, ``show config``, ``-o show partition``, ``-o show nodes``, ``show topology``. While slurm.conf
is the text loaded last, this module answers those from the state alone, importing nothing beyond the interpreter's
built-in modules (the state is ``marshal``'s: ``json`` brings ``re``, which cost the stand-in more than its answer);
everything else (``reconfigure``, a changed slurm.conf, a topology name not computed at load, what is not modeled)
goes to ``standin_scontrol.main``, which answers the same for all of these.
"""

from __future__ import annotations

import marshal
import os
import sys

TYPE_CHECKING = False  # typing and collections are not imported at run time (typing brings re)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, TextIO

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


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    slurm_conf: str | None = None,
) -> int:
    """``scontrol ARGS`` for ``argv`` = STATE_DIR ARGS..., as ``standin_scontrol.main`` takes them."""
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    state_dir, *arguments = sys.argv[1:] if argv is None else argv
    state = read_state(state_dir)
    conf_path = (os.environ.get("SLURM_CONF") if slurm_conf is None else slurm_conf) or state["slurm_conf"]
    # Every scontrol reads slurm.conf first: only the text loaded last is known to parse (a missing file never).
    conf_text = read_text(conf_path)
    loaded_conf = conf_text is not None and conf_text == (state["loaded"] or {}).get("slurm.conf")
    answer = loaded_answer(state, arguments) if loaded_conf else None
    if answer is None:
        from topokeeper.sim.standin_scontrol import main as answer_all  # noqa: PLC0415 - only where needed

        return answer_all([state_dir, *arguments], stdout=stdout, stderr=stderr, slurm_conf=slurm_conf)
    stdout.write(answer[0])
    stderr.write(answer[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
