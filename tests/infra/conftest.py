"""The example deployment (cdk.json) synthesized once per test session, and helpers to vary it."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# jsii prints an end-of-life banner for Node 20 unless told which major version is acknowledged.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import pytest
from aws_cdk.assertions import Template

from infra.app import cdk_json_context, create_app
from infra.config import load_settings
from infra.constants import CONTEXT_KEY, EXAMPLES_CONTEXT_KEY
from infra.stack import TopokeeperStack
from topokeeper.contract.config import Settings


@dataclass(frozen=True)
class Synthesized:
    settings: Settings
    stack: TopokeeperStack
    template: Template
    outdir: Path

    @property
    def resources(self) -> dict[str, Any]:
        resources: dict[str, Any] = self.template.to_json()["Resources"]
        return resources

    def logical_id(self, construct: Any) -> str:
        return str(self.stack.get_logical_id(construct.node.default_child))

    def resource(self, construct: Any) -> dict[str, Any]:
        return dict(self.resources[self.logical_id(construct)])


def example_config() -> dict[str, Any]:
    return copy.deepcopy(cdk_json_context()[CONTEXT_KEY])


def synthesize(outdir: Path, config: dict[str, Any] | None = None, *, nag: bool = False) -> Synthesized:
    context = {**cdk_json_context(), EXAMPLES_CONTEXT_KEY: "true"}  # the shipped examples' values synthesize
    if config is not None:
        context[CONTEXT_KEY] = config
    app, stack = create_app(context, str(outdir), nag=nag)
    app.synth()
    return Synthesized(load_settings(context[CONTEXT_KEY]), stack, Template.from_stack(stack), outdir)


@pytest.fixture(scope="session")
def example(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(tmp_path_factory.mktemp("cdk.out"))
