"""HyperPod's API over HTTP: the emulator's gateway hands SageMaker's cluster operations to these handlers, which
validate the request as AWS does, call the model, shape the response, and report mutating calls to CloudTrail
(success or error) as AWS API Call events."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from topokeeper.sim.aws.hyperpod.model import Cluster, ClusterNode, HyperPodModel, validate_request
from topokeeper.sim.aws.protocol import ApiError, ApiRequest, decode_token, encode_token, epoch, json_params

DEFAULT_LIST_NODES_PAGE = 10  # AWS does not document ListClusterNodes' default page size
_MUTATING = (
    "CreateCluster",
    "UpdateCluster",
    "DeleteCluster",
    "BatchDeleteClusterNodes",
    "BatchReplaceClusterNodes",
    "BatchRebootClusterNodes",
)


def _list_key(node: ClusterNode, by_name: bool) -> list[Any]:
    """ListClusterNodes' order (and its NextToken): by group, or by launch time; then by launch order."""
    return [node.group, node.sequence] if by_name else [epoch(node.launch_time), node.sequence]


def _is_list_key(cursor: Any, by_name: bool) -> bool:
    """Whether ``cursor`` has the shape of ``_list_key``'s keys for this sort."""
    if not (isinstance(cursor, list) and len(cursor) == 2 and type(cursor[1]) is int):
        return False
    return isinstance(cursor[0], str) if by_name else type(cursor[0]) in (int, float)


class HyperPodApi:
    def __init__(self, model: HyperPodModel) -> None:
        self._model = model
        # ListClusterNodes' last selection: (cluster, what it asked, (keys, nodes)); see _listed.
        self._listing: tuple[Cluster, tuple[Any, ...], tuple[list[list[Any]], list[ClusterNode]]] | None = None

    def handlers(self) -> dict[tuple[str, str], Callable[[ApiRequest], Mapping[str, Any]]]:
        operations: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "CreateCluster": self._api_create_cluster,
            "DescribeCluster": self._api_describe_cluster,
            "ListClusters": self._api_list_clusters,
            "ListClusterNodes": self._api_list_cluster_nodes,
            "DescribeClusterNode": self._api_describe_cluster_node,
            "UpdateCluster": self._api_update_cluster,
            "DeleteCluster": self._api_delete_cluster,
            "BatchDeleteClusterNodes": self._api_batch_delete,
            "BatchReplaceClusterNodes": self._api_batch_replace,
            "BatchRebootClusterNodes": self._api_batch_reboot,
        }
        return {("sagemaker", name): self._endpoint(name, fn) for name, fn in operations.items()}

    def _endpoint(
        self, name: str, fn: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> Callable[[ApiRequest], Mapping[str, Any]]:
        def handle(request: ApiRequest) -> Mapping[str, Any]:
            params = json_params(request)
            try:
                validate_request(name, params)
                if request.region != self._model.region:
                    raise ApiError(
                        "ResourceNotFound" if name != "CreateCluster" else "ValidationException",
                        f"the emulator models HyperPod in {self._model.region} only, not {request.region}",
                    )
                result = fn(params)
            except ApiError as error:
                if name in _MUTATING:
                    self._cloudtrail(request, params, None, (error.code, error.message))
                raise
            if name in _MUTATING:
                self._cloudtrail(request, params, result, None)
            return result

        return handle

    def _cloudtrail(
        self,
        request: ApiRequest,
        params: Mapping[str, Any],
        result: Mapping[str, Any] | None,
        error: tuple[str, str] | None,
    ) -> None:
        self._model.emitter.cloudtrail(
            request, event_source="sagemaker.amazonaws.com", params=params, response=result, error=error
        )

    def _api_create_cluster(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ClusterArn": self._model.create_cluster(params)}

    def _api_update_cluster(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ClusterArn": self._model.update_cluster(params)}

    def _api_delete_cluster(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ClusterArn": self._model.delete_cluster(params["ClusterName"])}

    def _api_describe_cluster(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._model.describe_cluster(params["ClusterName"])

    def _api_list_clusters(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._model.lock:
            clusters = list(self._model.all_clusters())
        after = _timestamp(params.get("CreationTimeAfter"))
        before = _timestamp(params.get("CreationTimeBefore"))
        contains = params.get("NameContains")
        chosen = [
            c
            for c in clusters
            if (contains is None or contains in c.name)
            and (after is None or c.creation_time > after)
            and (before is None or c.creation_time < before)
        ]
        by_name = params.get("SortBy") == "NAME"
        chosen.sort(key=lambda c: c.name if by_name else (c.creation_time, c.name))
        if params.get("SortOrder") == "Descending":
            chosen.reverse()
        start = int(decode_token(params["NextToken"])) if params.get("NextToken") else 0
        page = int(params.get("MaxResults") or 100)
        summaries = [
            {"ClusterArn": c.arn, "ClusterName": c.name, "CreationTime": c.creation_time, "ClusterStatus": c.status}
            for c in chosen[start : start + page]
        ]
        result: dict[str, Any] = {"ClusterSummaries": summaries}
        if start + page < len(chosen):
            result["NextToken"] = encode_token(start + page)
        return result

    def _api_list_cluster_nodes(self, params: dict[str, Any]) -> dict[str, Any]:
        by_name = params.get("SortBy") == "NAME"
        descending = params.get("SortOrder") == "Descending"
        page = int(params.get("MaxResults") or DEFAULT_LIST_NODES_PAGE)
        with self._model.lock:
            cluster = self._model.cluster(params["ClusterName"])
            keys, nodes = self._listed(cluster, by_name, params)
            begin, end = 0, len(nodes)  # nodes[begin:end] ascending by key; descending reads it from the end
            if params.get("NextToken"):
                cursor = decode_token(params["NextToken"])
                if not _is_list_key(cursor, by_name):  # another sort's token, or not ours
                    raise ApiError("ValidationException", "Invalid pagination token.")
                if descending:
                    end = bisect_left(keys, cursor)  # the keys below the cursor
                else:
                    begin = bisect_right(keys, cursor)  # the keys above it
            chosen = nodes[max(begin, end - page) : end][::-1] if descending else nodes[begin : begin + page]
            logical_ids = bool(params.get("IncludeNodeLogicalIds"))
            result: dict[str, Any] = {
                "ClusterNodeSummaries": [self._model.shapes.summary(n, logical_ids=logical_ids) for n in chosen]
            }
            if end - begin > page:
                result["NextToken"] = encode_token(_list_key(chosen[-1], by_name))
            return result

    def _listed(
        self, cluster: Cluster, by_name: bool, params: Mapping[str, Any]
    ) -> tuple[list[list[Any]], list[ClusterNode]]:
        """The nodes a listing selects and their keys, ascending. Kept while the cluster's nodes are the same: a
        20,000-node cluster is listed in 200 pages, and sorting it for each made listing it quadratic."""
        after = _timestamp(params.get("CreationTimeAfter"))
        before = _timestamp(params.get("CreationTimeBefore"))
        contains = params.get("InstanceGroupNameContains")
        question = (cluster.changes, by_name, contains, after, before)
        if self._listing is not None and self._listing[0] is cluster and self._listing[1] == question:
            return self._listing[2]
        keyed = sorted(
            (
                (_list_key(n, by_name), n)
                for n in cluster.nodes.values()
                if (contains is None or contains in n.group)
                and (after is None or n.launch_time > after)
                and (before is None or n.launch_time < before)
            ),
            key=itemgetter(0),
        )
        listed = ([key for key, _ in keyed], [node for _, node in keyed])
        self._listing = (cluster, question, listed)
        return listed

    def _api_describe_cluster_node(self, params: dict[str, Any]) -> dict[str, Any]:
        node_id, logical_id = params.get("NodeId"), params.get("NodeLogicalId")
        if (node_id is None) == (logical_id is None):
            raise ApiError("ValidationException", "Specify exactly one of NodeId and NodeLogicalId.")
        with self._model.lock:
            cluster = self._model.cluster(params["ClusterName"])
            node = cluster.nodes.get(node_id) if node_id else self._by_logical_id(cluster, str(logical_id))
            if node is None:
                raise ApiError("ResourceNotFound", f"Node {node_id or logical_id} not found in {cluster.name}.")
            return {"NodeDetails": self._model.shapes.details(cluster, node)}

    @staticmethod
    def _by_logical_id(cluster: Cluster, logical_id: str) -> ClusterNode | None:
        return next((n for n in cluster.nodes.values() if n.logical_id == logical_id), None)

    def _resolve(self, cluster: Cluster, params: dict[str, Any]) -> tuple[list[str], list[str], list[str], list[str]]:
        """(found ids, missing ids, found logical ids, missing logical ids) of a Batch* request."""
        node_ids = list(dict.fromkeys(params.get("NodeIds") or []))
        logical_ids = list(dict.fromkeys(params.get("NodeLogicalIds") or []))
        if not node_ids and not logical_ids:
            raise ApiError("ValidationException", "Specify NodeIds or NodeLogicalIds.")
        found_ids = [i for i in node_ids if i in cluster.nodes]
        found_logical = [i for i in logical_ids if self._by_logical_id(cluster, i)]
        missing_ids = [i for i in node_ids if i not in cluster.nodes]
        missing_logical = [i for i in logical_ids if i not in found_logical]
        return found_ids, missing_ids, found_logical, missing_logical

    def _api_batch_delete(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._model.lock:
            cluster = self._model.cluster(params["ClusterName"])
            _, _, found_logical, missing_logical = self._resolve(cluster, params)
            logical_nodes = {i: self._by_logical_id(cluster, i) for i in found_logical}
            successful, failed = self._model.delete_nodes(cluster.name, params.get("NodeIds") or [])
            result: dict[str, Any] = {}
            if "NodeIds" in params:
                result["Successful"], result["Failed"] = successful, failed
            if "NodeLogicalIds" in params:
                ok, bad = self._model.delete_nodes(cluster.name, [n.instance_id for n in logical_nodes.values() if n])
                by_instance = {n.instance_id: i for i, n in logical_nodes.items() if n}
                result["SuccessfulNodeLogicalIds"] = [by_instance[i] for i in ok]
                result["FailedNodeLogicalIds"] = [
                    {"Code": f["Code"], "Message": f["Message"], "NodeLogicalId": by_instance[f["NodeId"]]} for f in bad
                ] + [
                    {"Code": "NodeIdNotFound", "Message": f"Node {i} not found.", "NodeLogicalId": i}
                    for i in missing_logical
                ]
            return result

    def _api_batch_replace(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._batch(params, self._model.replace)

    def _api_batch_reboot(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._batch(params, self._model.reboot)

    def _batch(self, params: dict[str, Any], action: Callable[[list[str]], object]) -> dict[str, Any]:
        with self._model.lock:
            cluster = self._model.cluster(params["ClusterName"])
            found, missing, found_logical, missing_logical = self._resolve(cluster, params)
            logical_nodes = [self._by_logical_id(cluster, i) for i in found_logical]
            action(found + [n.instance_id for n in logical_nodes if n])
            result: dict[str, Any] = {}
            if "NodeIds" in params:
                result["Successful"] = found
                result["Failed"] = [
                    {"NodeId": i, "ErrorCode": "InstanceIdNotFound", "Message": f"Node {i} not found."} for i in missing
                ]
            if "NodeLogicalIds" in params:
                result["SuccessfulNodeLogicalIds"] = found_logical
                result["FailedNodeLogicalIds"] = [
                    {"NodeLogicalId": i, "ErrorCode": "InstanceIdNotFound", "Message": f"Node {i} not found."}
                    for i in missing_logical
                ]
            return result


def _timestamp(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
