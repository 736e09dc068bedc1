"""The one JSON document on stdout, under SSM's cap, and the whole one uploaded when it does not fit."""

from __future__ import annotations

import hashlib
import json
import re
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
)

from topokeeper.headnode import APPLIER_VERSION
from topokeeper.headnode.config_dir import open_regular
from topokeeper.wire import MAX_FULL_RESULT_BYTES, MAX_STDOUT_CHARS, UPLOAD_TIMEOUT_SECONDS, one_line


def new_result(mode: Optional[str]) -> Dict[str, Any]:
    return {
        "outcome": "failed",
        "mode": mode,
        "plan_sha256": None,
        "before_sha256": None,
        "after_sha256": None,
        "partitions_changed": [],
        "reconfigured": False,
        "reconfigure_exit_code": None,
        "apply_path": None,
        "nodes_updated": 0,
        "whole_file_reason": None,
        "readback": {},
        "partition_topologies": {},
        "drift": [],
        "grouping_drift": False,
        "diff": None,
        "slurm_version": None,
        "slurm_format": None,
        "config_dir": None,
        "scontrol": None,
        "backup_dir": None,
        "duration_seconds": 0.0,
        "error": None,
        "dropped": {},
        "applier_version": APPLIER_VERSION,
        "recovery": None,
        "signature": "unchecked",
        "generation": None,
        "slurm_nodes": None,
        "managed_by": None,
        "powered_down": [],
        # Nodes slurmctld already served where this apply puts them (placed at registration): not updated.
        "nodes_placed_before": [],
        # Registering nodes not registered yet, left to their slurmd within their wait: not updated (registered.py).
        "nodes_left_to_registration": [],
        "registration_wait_seconds": None,  # in how many seconds the first of their waits ends
        # Nodes an earlier apply left to registration that this one places (their wait ended, or they registered
        # without their topology).
        "nodes_placed_after_wait": [],
        "deferred": [],
        "full_result": None,
    }


class Caps(NamedTuple):
    items: int  # per list (drift, partitions_changed)
    mismatches: int  # per read-back topology
    entries: int  # per map (readback, partition_topologies)
    diff: int  # characters of the diff
    chars: int  # per text


# Tried in order until the document fits. The last one always fits: every field is then bounded.
_CAPS = (
    Caps(200, 10, 500, 16000, 1000),
    Caps(50, 3, 100, 6000, 300),
    Caps(10, 1, 20, 1500, 160),
    Caps(0, 0, 0, 0, 120),
)


def _capped(result: Mapping[str, Any], caps: Caps) -> Any:
    items, mismatches, entries, diff, chars = caps

    def clip(text: Any) -> Any:
        return text[:chars] + "..." if isinstance(text, str) and len(text) > chars else text

    document = {key: value if key == "diff" else clip(value) for key, value in result.items()}
    dropped = dict(result["dropped"])

    def keep(key: str, values: List[Any]) -> List[Any]:
        if len(values) > items:
            dropped[key] = len(values) - items
        return values[:items]

    document["drift"] = [{k: clip(v) for k, v in entry.items()} for entry in keep("drift", result["drift"])]
    document["partitions_changed"] = keep("partitions_changed", result["partitions_changed"])
    document["powered_down"] = keep("powered_down", result["powered_down"])
    document["nodes_placed_before"] = keep("nodes_placed_before", result["nodes_placed_before"])
    document["nodes_left_to_registration"] = keep("nodes_left_to_registration", result["nodes_left_to_registration"])
    document["nodes_placed_after_wait"] = keep("nodes_placed_after_wait", result["nodes_placed_after_wait"])
    document["deferred"] = keep("deferred", result["deferred"])
    if result["slurm_nodes"]:
        document["slurm_nodes"] = keep("slurm_nodes", result["slurm_nodes"])
    live = result["partition_topologies"]
    if len(live) > entries:
        dropped["partition_topologies"] = len(live) - entries
    document["partition_topologies"] = {name: live[name] for name in sorted(live)[:entries]}
    readback = result["readback"]
    names = sorted(readback, key=lambda name: (readback[name]["matches"], name))  # mismatches first
    if len(names) > entries:
        dropped["readback"] = len(names) - entries
    document["readback"] = {}
    for name in names[:entries]:
        entry = readback[name]
        document["readback"][name] = {
            "units": entry["units"],
            "matches": entry["matches"],
            "mismatches": [clip(problem) for problem in entry["mismatches"][:mismatches]],
            "mismatches_dropped": max(len(entry["mismatches"]) - mismatches, 0),
        }
        if "moved" in entry:
            document["readback"][name]["moved"] = entry["moved"][:items]
        if "powered_down_elsewhere" in entry:
            document["readback"][name]["powered_down_elsewhere"] = entry["powered_down_elsewhere"][:items]
    text = result["diff"]
    if isinstance(text, str) and len(text) > diff:
        cut = text.rfind("\n", 0, diff) + 1
        dropped["diff_chars"] = len(text) - cut
        document["diff"] = text[:cut]
    document["dropped"] = dropped
    return document


def render_result(result: Mapping[str, Any]) -> str:
    text = ""
    for caps in _CAPS:
        text = json.dumps(_capped(result, caps), ensure_ascii=True)
        if len(text) <= MAX_STDOUT_CHARS:
            break
    return text


class UploadTarget(NamedTuple):
    url: str  # a presigned S3 PUT URL (SigV4), good for this one object
    key: str  # its object key, echoed in full_result for the reader


def read_upload_target(path: str) -> UploadTarget:
    with open(open_regular(path, follow=True), "rb") as handle:
        document = json.loads(handle.read(65536).decode("utf-8"))
    url, key = (document.get("url"), document.get("key")) if isinstance(document, dict) else (None, None)
    if not (isinstance(url, str) and url.startswith(("https://", "http://")) and isinstance(key, str) and key):
        raise ValueError("expected {url: an http(s) URL, key: a string}")
    return UploadTarget(url, key)


def put_object(url: str, body: bytes, timeout: float) -> None:
    """PUT ``body`` to a presigned URL; raise OSError with S3's error code on a refusal."""
    import urllib.error  # noqa: PLC0415 - not in python3-minimal, and only needed here
    import urllib.request  # noqa: PLC0415

    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=body, method="PUT", headers=headers)  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - read_upload_target checks
            response.read()
    except urllib.error.HTTPError as error:
        code = re.search(r"<Code>([^<]{1,64})</Code>", error.read(4096).decode("utf-8", "replace"))
        raise OSError("HTTP %d%s" % (error.code, " " + code.group(1) if code else "")) from None


def publish(result: Dict[str, Any], target: Optional[UploadTarget], target_error: Optional[str]) -> str:
    """The stdout document; when it had to be cut and there is somewhere to put the whole one, the whole one is
    PUT there first and the cut one points at it (full_result)."""
    text = render_result(result)
    whole = json.dumps(result, ensure_ascii=True)
    if (target is None and target_error is None) or json.loads(text) == json.loads(whole):
        return text
    body = whole.encode()
    pointer: Dict[str, Any] = {"key": target.key if target else None, "bytes": len(body), "sha256": None}
    pointer["error"] = target_error
    if target is not None and len(body) > MAX_FULL_RESULT_BYTES:
        pointer["error"] = "%d bytes, over the %d this applier uploads" % (len(body), MAX_FULL_RESULT_BYTES)
    elif target is not None:
        try:
            put_object(target.url, body, UPLOAD_TIMEOUT_SECONDS)
            pointer["sha256"] = hashlib.sha256(body).hexdigest()
        except Exception as error:  # stdout must still carry the document (http.client's errors are no OSError)
            pointer["error"] = one_line("PUT failed: %s" % error)[:300]
    return render_result(dict(result, full_result=pointer))
