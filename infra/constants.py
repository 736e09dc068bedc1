"""Names shared by the constructs and the infra tests: paths, runtime, the handler contract, tags."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_lambda as lambda_

from topokeeper.contract.stack_spec import (
    DRIFT,
    FUNCTION_NAMES,
    INGEST,
    POWERTOOLS_LAYER_PARAMETER,
    PYTHON_VERSION,
    RECONCILE,
    RESULT,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = REPO_ROOT / "functions"
# What a function's code asset leaves out of functions/<name>/: bytecode the working tree compiled for itself.
FUNCTION_ASSET_EXCLUDE = ("__pycache__", "*.pyc")
CORE_LAYER_SOURCE = REPO_ROOT / "layers" / "core"
# Local build output (git-ignored): the core layer and the test stand-in for the Powertools layer.
BUILD_DIR = REPO_ROOT / ".build"

STACK_ID = "Topokeeper"
CONTEXT_KEY = "topokeeper"
# A JSON file holding the same object (the CDK CLI's -c passes only the first line of a multi-line value).
CONFIG_FILE_CONTEXT_KEY = "topokeeper:config-file"
# "true" lets the shipped example values synthesize (make synth, the tests); without it they are refused.
EXAMPLES_CONTEXT_KEY = "topokeeper:examples"

# PYTHON_VERSION's runtime (topokeeper.contract.stack_spec holds the version and the Powertools layer parameter).
RUNTIME = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE = lambda_.Architecture.ARM_64
HANDLER = "handler.lambda_handler"

# The four functions are topokeeper.contract.stack_spec's (the simulator runs the same); each one's code asset is
# functions/<name>/. Re-exported: the constructs and the infra tests name them as constants.INGEST, ...
__all__ = [
    "DRIFT",
    "FUNCTION_NAMES",
    "INGEST",
    "POWERTOOLS_LAYER_PARAMETER",
    "PYTHON_VERSION",
    "RECONCILE",
    "RESULT",
]

SERVICE_NAME = "topokeeper"
EVENT_BUS_NAME = "default"

# Operators tag the head nodes topokeeper may write to (channel ssm) with this tag = "true".
HEAD_NODE_TAG = "topokeeper:head-node"
# HyperPod lifecycle buckets must be named sagemaker-*; legacy clusters keep their partition mapping there.
PROVISIONING_PARAMETERS_OBJECTS = "sagemaker-*/*provisioning_parameters.json"
