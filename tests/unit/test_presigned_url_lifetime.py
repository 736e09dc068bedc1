"""A presigned URL lives through the SSM command it travels in, and no longer than SigV4 allows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.helpers import p5_nodes, snapshot
from topokeeper.adapters.ssm_channel import EXECUTION_TIMEOUT_SECONDS, SsmChannel
from topokeeper.contract.constants import PRESIGNED_URL_SECONDS, SIGV4_MAX_EXPIRES_SECONDS
from topokeeper.engine.planner import plan
from topokeeper.render.bundle import render


class LifetimeRecordingS3:
    def __init__(self) -> None:
        self.lifetimes: list[int] = []

    def put_object(self, **_: Any) -> dict[str, str]:
        return {"ETag": '"x"'}

    def generate_presigned_url(self, operation: str, Params: dict[str, str], ExpiresIn: int) -> str:
        self.lifetimes.append(ExpiresIn)
        return f"https://example.invalid/{Params['Key']}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires={ExpiresIn}"


def test_the_lifetime_covers_the_commands_window_within_sigv4s_limit() -> None:
    # SSM may start the command up to its delivery timeout after sending it, then run it up to executionTimeout:
    # both are EXECUTION_TIMEOUT_SECONDS.
    command_window = 2 * EXECUTION_TIMEOUT_SECONDS
    assert command_window <= PRESIGNED_URL_SECONDS <= SIGV4_MAX_EXPIRES_SECONDS == 604_800


def test_every_url_the_ssm_channel_presigns_has_that_lifetime() -> None:
    s3 = LifetimeRecordingS3()
    channel = SsmChannel(
        None, s3, "bucket", "i-0123456789abcdef0", cluster="test-cluster", now=lambda: datetime.now(UTC)
    )

    channel.payload(render(plan(snapshot({"p5": p5_nodes(16, partition="p5")}))).bundle, "apply")

    assert len(s3.lifetimes) >= 2  # the result's PUT and the staged applier's GET at least
    assert set(s3.lifetimes) == {PRESIGNED_URL_SECONDS}
