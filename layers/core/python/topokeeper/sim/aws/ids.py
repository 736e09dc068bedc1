"""Deterministic AWS-looking identifiers from a seed.

Every kind of id has its own counter, so the same scenario gives the same ids whatever else happens
(turning events off does not change instance ids). Ids that name a place (network nodes, UltraServers)
are derived from the place, not from a counter.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter

_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


class IdFactory:
    def __init__(self, seed: int | str) -> None:
        self.seed = str(seed)
        self._counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _next(self, kind: str) -> str:
        with self._lock:
            number = self._counters[kind]
            self._counters[kind] += 1
        return self.digest(kind, number)

    def digest(self, *parts: object) -> str:
        text = "/".join([self.seed, *(str(part) for part in parts)])
        return hashlib.sha256(text.encode()).hexdigest()

    def rng(self, stream: str) -> random.Random:
        """A seeded pseudo-random stream (for choices, never for security)."""
        return random.Random(self.digest("rng", stream))  # noqa: S311

    def instance_id(self) -> str:
        """``i-`` and 17 hex digits; like today's EC2 ids, the first digit is 0."""
        return "i-0" + self._next("instance")[:16]

    def uuid(self, kind: str) -> str:
        h = self._next(kind)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:32]}"

    def cluster_suffix(self) -> str:
        """12 lowercase alphanumerics, as in ``arn:aws:sagemaker:...:cluster/h4k2x9q7m1ab``."""
        h = bytes.fromhex(self._next("cluster"))
        return "".join(_ALNUM[b % len(_ALNUM)] for b in h[:12])

    def hex_id(self, prefix: str, *parts: object) -> str:
        """``prefix`` + 17 hex digits derived from ``parts`` (stable for the same place)."""
        return prefix + self.digest(prefix, *parts)[:17]
