"""Reconnect delays of the watches (pods, nodes, namespaces, DRA objects, PodGroups).

A watch that cannot reach the API server retries after a delay that doubles from ``initial`` up to
``cap``, with jitter so the watches do not retry in lockstep, and starts again from ``initial`` as
soon as the API server answers. The cap is low on purpose (docs/extender-protocol.md, "Cache mode
and restarts"): with the 30 s cap used before, the watches could sleep through most of the first
half minute after an API server came back, and pods created meanwhile went unseen. A few requests a
second from one extender cost a recovering API server nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable

INITIAL_SECONDS = 0.25
CAP_SECONDS = 2.0


class Backoff:
    """Exponential delays with jitter: the n-th delay lies in [d/2, d], d = min(cap, initial * 2^n)."""

    def __init__(self, initial: float = INITIAL_SECONDS, cap: float = CAP_SECONDS,
                 rand: Callable[[], float] = random.random) -> None:
        self.initial, self.cap, self.rand = initial, cap, rand
        self.failures = 0

    def next(self) -> float:
        """The delay before the next attempt (one more failure)."""
        ceiling = min(self.cap, self.initial * 2 ** min(self.failures, 32))
        self.failures += 1
        return ceiling / 2 + self.rand() * ceiling / 2

    def reset(self) -> None:
        """The API server answered: the next failure waits ``initial`` again."""
        self.failures = 0


# An API answered 403 or 404 (not served, or not ours to read). Look again soon, then every minute:
# right after an API server restart its authorizer can refuse for a second or two, and a watcher
# that then waited a full minute placed pods blind for that minute (seen in CI after the suite's
# API server restart test: DRA device classes read as absent, claim pods placed as CPU pods).
ABSENT_FIRST_SECONDS = 1.0
ABSENT_CAP_SECONDS = 60.0


def absent_backoff() -> Backoff:
    return Backoff(ABSENT_FIRST_SECONDS, ABSENT_CAP_SECONDS)
