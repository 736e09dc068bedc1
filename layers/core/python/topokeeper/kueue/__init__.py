"""HyperPod on EKS: Kueue topology-aware scheduling objects and node-label checks from the canonical Node facts.

Pure: no boto3, no adapters. The facts come from the same snapshot the Slurm planner reads
(``engine.snapshot.eks_nodes``) or from a ``kubectl get nodes -o json`` NodeList (``node_list``).
"""

KUEUE_VERSION = "v0.19.2"
