"""Builds the CDK app: ``python app.py`` directly, or through ``npx cdk`` with cdk.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.config import ConfigError, load_settings, read_context_config, refuse_placeholders
from infra.constants import CONFIG_FILE_CONTEXT_KEY, CONTEXT_KEY, EXAMPLES_CONTEXT_KEY, REPO_ROOT, STACK_ID
from infra.stack import TopokeeperStack

CDK_JSON = REPO_ROOT / "cdk.json"


def cdk_json_context(path: Path = CDK_JSON) -> dict[str, Any]:
    """cdk.json's context. The CLI passes it itself; a direct ``python app.py`` needs it too."""
    context: dict[str, Any] = json.loads(path.read_text()).get("context", {})
    return context


def create_app(
    context: dict[str, Any] | None = None, outdir: str | None = None, *, nag: bool = True
) -> tuple[cdk.App, TopokeeperStack]:
    """The app with the stack. Context from the CLI (cdk.json, -c) overrides ``context``."""
    app = cdk.App(context=cdk_json_context() if context is None else context, outdir=outdir)
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))
    raw = read_context_config(app.node.try_get_context(CONTEXT_KEY), app.node.try_get_context(CONFIG_FILE_CONTEXT_KEY))
    settings = load_settings(raw)
    if str(app.node.try_get_context(EXAMPLES_CONTEXT_KEY)).lower() != "true":
        refuse_placeholders(raw)
    stack = TopokeeperStack(
        app,
        STACK_ID,
        settings=settings,
        env=cdk.Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION")),
    )
    return app, stack


def main() -> int:
    # Under the CLI, CDK_OUTDIR names the output; run directly, synthesize into ./cdk.out like the CLI.
    outdir = None if "CDK_OUTDIR" in os.environ else str(REPO_ROOT / "cdk.out")
    try:
        app, _ = create_app(outdir=outdir)
    except ConfigError as error:
        for line in str(error).splitlines():
            print(f"topokeeper: error: {line}", file=sys.stderr)
        return 2
    app.synth()
    return 0
