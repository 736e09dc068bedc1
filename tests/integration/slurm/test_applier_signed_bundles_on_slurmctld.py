"""Authentic and fresh bundles on a real slurmctld: with a trusted key installed, the applier applies only what
the stack's key signed, for this cluster, newer than what it applied last; anything else is refused with exit 2
before anything is written."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.integration.slurm.test_applier_on_slurmctld import (
    _assert_applied,
    _cluster,
    _etc_files,
    _plan,
    _run,
    _start,
    _with_content,
)
from tests.signing_support import sign, signing_key, write_trusted_key
from topokeeper.domain.models import PartitionSettings
from topokeeper.headnode.config_dir import BACKUP_DIR
from topokeeper.headnode.signature import GENERATION_FILE
from topokeeper.sim.slurm_chroot import SlurmController

pytestmark = pytest.mark.slurm

CLUSTER = "test-cluster"  # what tests.helpers.snapshot names the cluster


def _key_option(controller: SlurmController) -> tuple[str, str]:
    base = controller.root / controller.inner_dir.lstrip("/")
    write_trusted_key(base / "trusted-key.json", CLUSTER)
    return "--trusted-key", f"{controller.inner_dir}/trusted-key.json"


def _refused(
    controller: SlurmController, bundle: dict[str, Any], option: tuple[str, str], outcome: str
) -> dict[str, Any]:
    conf = (controller.etc / "slurm.conf").read_bytes()
    files = _etc_files(controller)
    backups = sorted(p.name for p in (controller.etc / BACKUP_DIR).iterdir())
    pid = controller.current_pid()

    code, document = _run(controller, "apply", bundle, *option)

    assert (code, document["outcome"]) == (2, outcome), document["error"]
    assert (document["reconfigured"], document["partitions_changed"]) == (False, [])
    assert (controller.etc / "slurm.conf").read_bytes() == conf
    assert _etc_files(controller) == files
    assert sorted(p.name for p in (controller.etc / BACKUP_DIR).iterdir()) == backups  # no backup, no journal
    assert controller.current_pid() == pid
    return document


def test_only_signed_fresh_bundles_for_this_cluster_apply(sid_root: Path, controllers) -> None:
    first = _plan(_cluster())
    second = _plan(_cluster(), gb=PartitionSettings(kind="flat"))
    controller = controllers(sid_root)
    _start(controller, first)
    option = _key_option(controller)
    older, newer = sign(first.bundle.document(), 1), sign(second.bundle.document(), 2)
    assert first.bundle.cluster_name == CLUSTER

    code, document = _run(controller, "apply", older, *option)
    _assert_applied(code, document)
    assert (document["signature"], document["generation"]) == ("verified", 1)
    code, document = _run(controller, "apply", newer, *option)
    _assert_applied(code, document)
    recorded = controller.etc / BACKUP_DIR / GENERATION_FILE
    assert json.loads(recorded.read_text()) == {"generation": 2, "plan_sha256": second.sha256}
    assert stat.S_IMODE(recorded.stat().st_mode) == 0o600 and recorded.stat().st_uid == 0
    # The same bundle again (a retried command) is a no-op, not a replay.
    assert _run(controller, "apply", newer, *option)[1]["outcome"] == "unchanged"

    # Forged: the attacker's own key, a newer generation, the first plan back.
    forged = _refused(
        controller, sign(first.bundle.document(), 3, key=signing_key("attacker")), option, "bad_signature"
    )
    assert "does not verify with the trusted key" in forged["error"]

    # Edited and rehashed: every self-hash recomputed, signed fields kept, or the signature dropped altogether.
    edited = _with_content(newer, first.topology_text)
    assert "does not verify" in _refused(controller, edited, option, "bad_signature")["error"]
    unsigned = {k: v for k, v in edited.items() if k not in ("generation", "purpose", "signature")}
    assert "not signed" in _refused(controller, unsigned, option, "bad_signature")["error"]

    # Replayed: the older signed bundle put back (an older S3 version restored).
    replayed = _refused(controller, older, option, "replayed")
    assert "generation 1 is not newer than generation 2" in replayed["error"]

    # Another cluster's validly signed bundle.
    other = sign({**first.bundle.document(), "cluster_name": "another-cluster"}, 4)
    assert "this head node is" in _refused(controller, other, option, "refused")["error"]

    # Verify and dry-run change nothing: any generation answers (a state table rebuilt signs them below the one
    # recorded here), echoed for the backend to match with its request; only the apply generation is recorded.
    assert _run(controller, "verify", sign(second.bundle.document(), 2, purpose="verify"), *option)[1]["outcome"] == (
        "in_sync"
    )
    code, verified = _run(controller, "verify", sign(second.bundle.document(), 1, purpose="verify"), *option)
    assert (code, verified["outcome"], verified["generation"]) == (0, "in_sync", 1), verified["error"]
    code, dry = _run(controller, "dry-run", sign(first.bundle.document(), 1, purpose="verify"), *option)
    assert (code, dry["outcome"], dry["generation"]) == (0, "would_apply", 1), dry["error"]
    assert json.loads(recorded.read_text()) == {"generation": 2, "plan_sha256": second.sha256}
    assert _refused(controller, older, option, "replayed")["generation"] == 1  # an old apply bundle still is not
