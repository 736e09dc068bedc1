"""A Lambda handler's init phase: the first thing each handler imports, so stdlib only (nothing a handler's cold
import does not load anyway)."""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_init() -> Iterator[None]:
    """Run a handler's imports and setup with the cyclic collector off, then freeze what they made.

    What init makes lives as long as the execution environment: collecting it is wasted work, and frozen it stays
    out of every later collection. The collector resumes (if it ran) for the invocations' own objects.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if collecting:
            gc.enable()
