"""Plans in S3: ``plans/<cluster>/<sha256>/bundle.json`` and ``plan.json`` (content-addressed, so a
rewrite of the same plan is harmless), read back by the result and drift functions; and the registration
entries a booting node reads (``clusters/<cluster>/registration/<instance-id>.json``, keys from the wire)."""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from topokeeper.adapters.aws import aws_errors
from topokeeper.wire import registration_key

if TYPE_CHECKING:
    from topokeeper.render.bundle import Bundle

T = TypeVar("T")


def plan_prefix(cluster: str, sha256: str) -> str:
    return f"plans/{cluster}/{sha256}/"


def kueue_prefix(cluster: str, sha256: str) -> str:
    """An EKS cluster's Kueue files; ``kueue/<cluster>/latest.json`` names the newest."""
    return f"kueue/{cluster}/{sha256}/"


def kueue_latest_key(cluster: str) -> str:
    return f"kueue/{cluster}/latest.json"


class S3PlanStore:
    def __init__(self, s3: Any, bucket: str) -> None:
        self._s3 = s3
        self._bucket = bucket

    @aws_errors()
    def put(self, cluster: str, bundle: Bundle, plan_document: str) -> str:
        prefix = plan_prefix(cluster, bundle.plan_sha256)
        body = json.dumps(bundle.document(), sort_keys=True)
        self._s3.put_object(
            Bucket=self._bucket, Key=prefix + "bundle.json", Body=body.encode(), ContentType="application/json"
        )
        self._s3.put_object(
            Bucket=self._bucket, Key=prefix + "plan.json", Body=plan_document.encode(), ContentType="application/json"
        )
        return prefix

    @aws_errors()
    def bundle(self, cluster: str, sha256: str) -> Bundle:
        from topokeeper.render.bundle import Bundle  # noqa: PLC0415 - loaded at init by result and drift (their use cases)

        return Bundle.model_validate(self._read(plan_prefix(cluster, sha256) + "bundle.json"))

    @aws_errors()
    def plan_document(self, cluster: str, sha256: str) -> dict[str, Any]:
        document: dict[str, Any] = self._read(plan_prefix(cluster, sha256) + "plan.json")
        return document

    @aws_errors()
    def put_registrations(self, cluster: str, entries: dict[str, str]) -> None:
        """One object per instance under the cluster's registration prefix (the bucket's default encryption, its
        KMS key, applies as to plans)."""

        def put(item: tuple[str, str]) -> None:
            instance, text = item
            key = registration_key(cluster, instance)
            self._s3.put_object(Bucket=self._bucket, Key=key, Body=text.encode(), ContentType="application/json")

        _each(put, sorted(entries.items()))

    @aws_errors()
    def delete_registrations(self, cluster: str, instance_ids: Collection[str]) -> None:
        """Delete the entries of instances that are gone (on a versioned bucket a delete marker: no longer readable
        by the node policy's GetObject; the noncurrent version expires with the bucket's lifecycle)."""

        def delete(instance: str) -> None:
            self._s3.delete_object(Bucket=self._bucket, Key=registration_key(cluster, instance))

        _each(delete, sorted(instance_ids))

    @aws_errors()
    def put_kueue(self, cluster: str, sha256: str, files: dict[str, str]) -> str:
        prefix = kueue_prefix(cluster, sha256)
        for name, content in sorted(files.items()):
            self._s3.put_object(Bucket=self._bucket, Key=prefix + name, Body=content.encode(), ContentType=_type(name))
        # Last: whoever follows ``latest`` finds every file of the plan it names.
        pointer = json.dumps({"plan_sha256": sha256, "prefix": prefix, "files": sorted(files)}, sort_keys=True)
        self._s3.put_object(
            Bucket=self._bucket, Key=kueue_latest_key(cluster), Body=pointer.encode(), ContentType="application/json"
        )
        return prefix

    @aws_errors()
    def kueue_file(self, cluster: str, sha256: str, name: str) -> str:
        body: bytes = self._s3.get_object(Bucket=self._bucket, Key=kueue_prefix(cluster, sha256) + name)["Body"].read()
        return body.decode()

    def _read(self, key: str) -> Any:
        return json.loads(self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read())


def _each(call: Callable[[T], None], items: list[T]) -> None:
    """``call`` for each item, a few at once: a burst of booting (or terminated) nodes should not wait in line. Each
    runs in a copy of the caller's context: what the caller set holds in the workers too (the simulator's acting
    role, whose IAM each request must pass as it does on AWS)."""
    if not items:
        return
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
        list(pool.map(lambda item: context.copy().run(call, item), items))  # list(): the first failure raises here


def _type(name: str) -> str:
    suffix = name.rsplit(".", 1)[-1]
    return {"json": "application/json", "yaml": "application/yaml", "md": "text/markdown"}.get(suffix, "text/plain")
