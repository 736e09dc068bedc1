"""Where a deployed topokeeper keeps its state, for the operator CLI.

A deployment is found from its CloudFormation stack (outputs plus the reconcile function's
``TOPOKEEPER_CONFIG``), or read from a JSON file (the simulator writes one for the emulated stack).
Either way the CLI then builds the very ``Runtime`` the Lambdas use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from topokeeper.contract.config import Settings
from topokeeper.contract.constants import (
    ENV_BUCKET,
    ENV_CONFIG,
    ENV_DEAD_LETTER_QUEUE,
    ENV_EVENT_BUS,
    ENV_QUEUE,
    ENV_SIGNING_KEY,
    ENV_TABLE,
)
from topokeeper.contract.errors import InputError
from topokeeper.contract.operator_files import read_mapping

# CloudFormation output keys the stack exports (infra/ uses the same names).
OUTPUT_TABLE = "TableName"
OUTPUT_BUCKET = "BucketName"
OUTPUT_QUEUE = "QueueUrl"
OUTPUT_DEAD_LETTER_QUEUE = "DeadLetterQueueUrl"
OUTPUT_RECONCILE_FUNCTION = "ReconcileFunctionName"


class Deployment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    bucket: str
    queue_url: str
    dead_letter_queue_url: str | None = None
    event_bus: str = "default"
    signing_key_id: str | None = None  # the bundle-signing KMS key: an operator's apply signs as reconcile does
    settings: Settings

    def environment(self) -> dict[str, str]:
        """The environment a Lambda of this deployment sees."""
        env = {
            ENV_CONFIG: self.settings.to_env(),
            ENV_TABLE: self.table,
            ENV_BUCKET: self.bucket,
            ENV_QUEUE: self.queue_url,
            ENV_EVENT_BUS: self.event_bus,
        }
        if self.dead_letter_queue_url:
            env[ENV_DEAD_LETTER_QUEUE] = self.dead_letter_queue_url
        if self.signing_key_id:
            env[ENV_SIGNING_KEY] = self.signing_key_id
        return env

    @classmethod
    def from_stack(cls, cloudformation: Any, lambda_client: Any, stack_name: str) -> Deployment:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
        missing = [
            key for key in (OUTPUT_TABLE, OUTPUT_BUCKET, OUTPUT_QUEUE, OUTPUT_RECONCILE_FUNCTION) if key not in outputs
        ]
        if missing:
            raise InputError("--stack-name", f"stack {stack_name} lacks outputs {', '.join(missing)}")
        configuration = lambda_client.get_function_configuration(FunctionName=outputs[OUTPUT_RECONCILE_FUNCTION])
        variables = configuration.get("Environment", {}).get("Variables", {})
        return cls(
            table=outputs[OUTPUT_TABLE],
            bucket=outputs[OUTPUT_BUCKET],
            queue_url=outputs[OUTPUT_QUEUE],
            dead_letter_queue_url=outputs.get(OUTPUT_DEAD_LETTER_QUEUE),
            event_bus=variables.get(ENV_EVENT_BUS, "default"),
            signing_key_id=variables.get(ENV_SIGNING_KEY),
            settings=Settings.model_validate(json.loads(variables[ENV_CONFIG])),
        )


def read_deployment(path: Path, flag: str = "--deployment") -> Deployment:
    """A deployment file (what ``topokeeper simulate`` writes), errors naming ``flag``."""
    document = read_mapping(path, flag)
    try:
        return Deployment.model_validate(document)
    except ValidationError as error:
        raise InputError.from_validation(error, prefix="deployment", model=Deployment) from error
