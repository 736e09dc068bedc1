"""topokeeper head-node pull agent (standard library and ``topokeeper.wire`` only, Python 3.8+).

SSM SendCommand cannot address HyperPod nodes (it only takes i-/mi- ids), so the head node pulls. Each
cycle asks S3 for the cluster's desired bundle with If-None-Match (an unchanged object costs one 304),
runs the applier on a new one, runs ``verify`` on a slower cadence, and reports every result as an
EventBridge event. A verify request (``verify-request.json`` beside the bundle, polled the same way) asks
for a verify at once: the backend writes one when HyperPod changed the topology itself, and the report
echoes its ``verify_request`` id. These modules ship to the head node with ``topokeeper.wire`` and nothing
else of the package.

    python3 -m topokeeper.agent.main --config /etc/topokeeper/agent.json [--once]

The modules, in the order a cycle uses them: ``main`` (CLI and loop), ``cycle`` (poll, apply, verify,
report), ``config``, ``state`` (state file and lock), ``aws`` (the S3 and EventBridge calls), ``sigv4``,
``transport`` (bounded HTTP), ``credentials`` (environment or IMDSv2), ``bundle`` (the check before the
applier), ``applier_process`` (the applier subprocess and its result document), ``placement`` (the placement
facts it puts when ``placement_facts_interval_seconds`` is set, in a cycle that ran no applier), ``log``, ``errors``,
``json_text``. (``install`` is the operator's install-script builder and does not ship.) ``node_start`` is not
the agent's: it is a ParallelCluster compute node's OnNodeStart action (``topokeeper-head-node.pyz node-start``),
here because it signs its one S3 read with the agent's ``sigv4``, ``credentials`` and ``transport``.

IAM for the node's role (the HyperPod instance group's execution role; one role per cluster):
    s3:GetObject      on arn:aws:s3:::BUCKET/PREFIX/CLUSTER/bundle.json (verify.json in verify mode)
                      and arn:aws:s3:::BUCKET/PREFIX/CLUSTER/verify-request.json
    events:PutEvents  on arn:aws:events:REGION:ACCOUNT:event-bus/BUS
                      with the condition events:source = topokeeper.agent.CLUSTER (the source it sends)
    kms:Decrypt on the bucket's key, only if it uses SSE-KMS with a customer managed key.
    With placement_metrics: s3:PutObject on arn:aws:s3:::BUCKET/PREFIX/CLUSTER/placement-facts.json and
    kms:GenerateDataKey on the bucket's key (the object is encrypted with it).
Without s3:ListBucket a missing bundle answers 403 instead of 404; both are logged and retried. A missing
verify request (404 or 403) is the usual case and only means nobody asked.
"""
