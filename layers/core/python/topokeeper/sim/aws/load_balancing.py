"""Target health for moto's ELBv2, which runs no health checks and calls every registered target healthy.

``TargetHealth.set`` gives one target of one target group the state a real health check would
(``unhealthy`` for a login node whose sshd is down); registering the target again does not clear it,
as a real failing check would not clear either. ``clear`` forgets the override.
"""

from __future__ import annotations

import threading
from typing import Any

from moto.elbv2.models import FakeHealthStatus, FakeTargetGroup

_REASONS = {
    "unhealthy": ("Target.FailedHealthChecks", "Health checks failed"),
    "initial": ("Elb.RegistrationInProgress", "Target registration is in progress"),
    "healthy": (None, None),
}


class TargetHealth:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[tuple[str, str], str] = {}
        self._original: Any = None

    def set(self, target_group_arn: str, target_id: str, state: str) -> None:
        if state not in _REASONS:
            raise ValueError(f"target state must be one of {sorted(_REASONS)}: {state!r}")
        with self._lock:
            self._states[(target_group_arn, target_id)] = state

    def clear(self, target_group_arn: str, target_id: str) -> None:
        with self._lock:
            self._states.pop((target_group_arn, target_id), None)

    def apply(self) -> None:
        """Route moto's health answers through the overrides (while this emulator runs)."""
        original = FakeTargetGroup.health_for
        self._original = original
        control = self

        def health_for(group: FakeTargetGroup, target: dict[str, Any], ec2_backend: Any) -> FakeHealthStatus:
            status = original(group, target, ec2_backend)
            with control._lock:
                state = control._states.get((group.arn, target["Id"]))
            if state is None or target["Id"] not in group.targets:
                return status
            reason, description = _REASONS[state]
            return FakeHealthStatus(
                status.instance_id, status.port, status.health_check_port, state, reason, description
            )

        setattr(FakeTargetGroup, "health_for", health_for)  # noqa: B010 - undone by restore()

    def restore(self) -> None:
        if self._original is not None:
            setattr(FakeTargetGroup, "health_for", self._original)  # noqa: B010
            self._original = None
        with self._lock:
            self._states.clear()
