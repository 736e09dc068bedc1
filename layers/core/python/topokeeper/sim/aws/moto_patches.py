"""The few fixes that can only be made inside moto, applied while an emulator runs and undone after.

Everything else the emulator adds is served by its own gateway in front of moto (see ``gateway``), so
these are the only changes to moto's module state. ``apply`` is idempotent; ``restore`` puts back
exactly what ``apply`` replaced.
"""

from __future__ import annotations

import threading
from typing import Any

from moto.events.utils import EventTemplateParser

_lock = threading.Lock()
_originals: dict[tuple[Any, str], Any] = {}

# EventBridge's envelope, as delivered to targets, carries ``account``; moto's default template drops it
# (moto/events/utils.py EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE).
EVENT_TEMPLATE_WITH_ACCOUNT = (
    '{"version": "0", "id": "<id>", "detail-type": "<detail-type>", "source": "<source>", '
    '"account": "<account>", "time": <time>, "region": "<region>", "resources": <resources>, "detail": <detail>}'
)


def _patches() -> list[tuple[Any, str, Any]]:
    return [(EventTemplateParser, "DEFAULT_EVENT_INPUT_TEMPLATE", EVENT_TEMPLATE_WITH_ACCOUNT)]


def apply() -> None:
    with _lock:
        for owner, name, value in _patches():
            key = (owner, name)
            if key not in _originals:
                _originals[key] = getattr(owner, name)
            setattr(owner, name, value)


def restore() -> None:
    with _lock:
        for (owner, name), original in _originals.items():
            setattr(owner, name, original)
        _originals.clear()


def applied() -> bool:
    with _lock:
        return bool(_originals)
