"""A SageMaker HyperPod (Slurm) emulation that replaces moto's cluster support.

It answers CreateCluster, DescribeCluster, ListClusters, ListClusterNodes, DescribeClusterNode,
UpdateCluster, DeleteCluster and BatchDelete/Replace/RebootClusterNodes with AWS's shapes: ARNs
``cluster/<12 lowercase alphanumerics>``, EC2 instance ids, ``ip-a-b-c-d`` host names, SlurmConfig,
UltraServerInfo, pagination by ``NextToken``. The same operations are a Python control API for the
simulator (``scale``, ``replace``, ``set_status``, ...), and every change emits the EventBridge events
HyperPod sends (Cluster State Change, Cluster Node Health Event) and, for API calls, CloudTrail's.

- ``model``: clusters, groups and nodes, and their changes (the control API)
- ``shapes``: the responses, as botocore's SageMaker model declares them
- ``events``: HyperPod's EventBridge events
- ``api``: the HTTP operations the emulator's gateway serves
"""

from topokeeper.sim.aws.hyperpod.api import HyperPodApi
from topokeeper.sim.aws.hyperpod.model import ClusterNode, HyperPodModel

__all__ = ["ClusterNode", "HyperPodApi", "HyperPodModel"]
