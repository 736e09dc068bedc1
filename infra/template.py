"""``python -m infra.template CONFIG OUT``: the stack's CloudFormation template for one configuration, for the
simulator, which authorizes every emulated request with the template's own roles and policies
(``topokeeper.sim.stack_iam``). CONFIG is the ``topokeeper`` context value as a JSON file; OUT gets the template."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from infra.app import cdk_json_context, create_app
from infra.constants import CONTEXT_KEY, EXAMPLES_CONTEXT_KEY


def main(argv: list[str]) -> int:
    config, out = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    # Placeholder values (a simulated head node's id) synthesize as the shipped examples' do.
    context = {**cdk_json_context(), CONTEXT_KEY: config, EXAMPLES_CONTEXT_KEY: "true"}
    with tempfile.TemporaryDirectory(prefix="topokeeper-synth-") as outdir:
        app, stack = create_app(context, outdir, nag=False)
        assembly = app.synth()
        template = assembly.get_stack_by_name(stack.stack_name).template
    out.write_text(json.dumps(template))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
