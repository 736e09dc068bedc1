"""Load a ParallelCluster cluster config with ParallelCluster's own schema (run by .venv-pcluster's python).

Prints nothing and exits 0 when the config loads; prints the schema's errors and exits 1 when it does not. No
AWS call is made: loading a config only needs a region name, which is set to a dummy here.
"""

import json
import os
import sys

os.environ["AWS_DEFAULT_REGION"] = "us-east-1"

import yaml
from marshmallow import ValidationError
from pcluster.schemas.cluster_schema import ClusterSchema

with open(sys.argv[1]) as config_file:
    config = yaml.safe_load(config_file)
try:
    ClusterSchema(cluster_name=sys.argv[2]).load(config)
except ValidationError as refused:
    print(json.dumps(refused.messages, sort_keys=True, default=str))
    sys.exit(1)
