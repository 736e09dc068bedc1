"""What runs on a compute node, inside a job: standard library and ``topokeeper.wire`` only (Python 3.8+), packed
into the head-node program (``topokeeper-head-node.pyz hostfile``)."""
