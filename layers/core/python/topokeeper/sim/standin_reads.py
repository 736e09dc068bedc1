"""The file-only head node's ``scontrol`` for the reads it answers from what the last ``reconfigure`` loaded (see
``topokeeper.sim.standin_scontrol``, which is the stand-in; this is its front door). NOT Slurm.

The applier runs a process for every ``scontrol`` it asks, and most ask what the stand-in computed when the config
loaded: ``version``, ``show config``, ``-o show partition``, ``-o show nodes``, ``show topology``. While slurm.conf
is the text loaded last, this module answers those from the state alone (``standin_state``: nothing beyond the
interpreter's built-in modules); everything else (``reconfigure``, a changed slurm.conf, a topology name not
computed at load, what is not modeled) goes to ``standin_scontrol.main``, which answers the same for all of these.
"""

from __future__ import annotations

import os
import sys

from topokeeper.sim.standin_state import loaded_answer, read_state, read_text

TYPE_CHECKING = False  # typing and collections are not imported at run time (typing brings re)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TextIO


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
        # Imported only here: most calls never need the stand-in (it does not import this module).
        from topokeeper.sim.standin_scontrol import main as answer_all  # noqa: PLC0415

        return answer_all([state_dir, *arguments], stdout=stdout, stderr=stderr, slurm_conf=slurm_conf)
    stdout.write(answer[0])
    stderr.write(answer[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
