"""The few fixes (and savings of work moto repeats per request) that can only be made inside moto, applied while
an emulator runs and undone after.

Everything else the emulator adds is served by its own gateway in front of moto (``server.Gateway``), so
these are the only changes to moto's module state. ``apply`` is idempotent; ``restore`` puts back
exactly what ``apply`` replaced.

Besides these, the emulator reads (never replaces) moto's in-process backends where AWS itself acts
without an API call of the account, or where a request would be counted and charged simulated time:
``events.EventEmitter`` (services put their events on the bus), ``network`` (EC2 instances to place),
``ssm`` (moto's command store, including its ``_commands`` list: moto lists commands only by filter) and
``topokeeper.sim.lambda_host`` (a peek at a queue's depth). moto's internals are not a stable API, so
pyproject.toml pins moto to the minor version these were written against.
"""

from __future__ import annotations

import functools
import threading
from datetime import timedelta
from typing import Any

import jsonpath_ng.ext
import moto.backends
import moto.sqs.models
from moto.core.utils import camelcase_to_underscores, utcnow
from moto.ec2.models.instances import Instance
from moto.events.utils import EventTemplateParser

_lock = threading.Lock()
_originals: dict[tuple[Any, str], Any] = {}

# EventBridge's envelope, as delivered to targets, carries ``account``; moto's default template drops it
# (moto/events/utils.py EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE).
EVENT_TEMPLATE_WITH_ACCOUNT = (
    '{"version": "0", "id": "<id>", "detail-type": "<detail-type>", "source": "<source>", '
    '"account": "<account>", "time": <time>, "region": "<region>", "resources": <resources>, "detail": <detail>}'
)


@functools.lru_cache(maxsize=256)
def _cached_jsonpath(expression: str) -> Any:
    """moto parses the same few JSONPaths again for every event it delivers to a target; jsonpath_ng builds a
    whole parser each time (about 10 ms). Parsed expressions are immutable, so one per text is enough."""
    return _ORIGINAL_JSONPATH_PARSE(expression)


_ORIGINAL_JSONPATH_PARSE = getattr(jsonpath_ng.ext, "parse")  # noqa: B009 - not in its __all__


@functools.cache
def _moto_modules() -> tuple[str, ...]:
    """moto's server lists its package directory (a stat per backend) twice for every request it routes; the
    directory does not change while a process runs."""
    return tuple(_ORIGINAL_LIST_OF_MOTO_MODULES())


_ORIGINAL_LIST_OF_MOTO_MODULES = moto.backends.list_of_moto_modules

# SQS converts each of a queue's attribute names from camelCase whenever it reads the queue's attributes.
_cached_camelcase_to_underscores = functools.lru_cache(maxsize=1024)(camelcase_to_underscores)

_ORIGINAL_INSTANCE_START = Instance.start


def _start_relaunches(self: Any) -> Any:
    """EC2's LaunchTime is the instance's last start (moto keeps the first). LaunchTime has whole seconds and a
    start follows its stop by more than a second on AWS, so a restart never shows the previous LaunchTime."""
    previous = _ORIGINAL_INSTANCE_START(self)
    self.launch_time = max(utcnow(), self.launch_time + timedelta(seconds=1))
    return previous


def _patches() -> list[tuple[Any, str, Any]]:
    return [
        (EventTemplateParser, "DEFAULT_EVENT_INPUT_TEMPLATE", EVENT_TEMPLATE_WITH_ACCOUNT),
        (jsonpath_ng.ext, "parse", _cached_jsonpath),
        (Instance, "start", _start_relaunches),
        (moto.backends, "list_of_moto_modules", _moto_modules),
        (moto.sqs.models, "camelcase_to_underscores", _cached_camelcase_to_underscores),
    ]


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
