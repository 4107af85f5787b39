"""One-line, rate-limited warnings for input we refuse (docs/metrics.md: the counters carry the rate).

A hostile or careless tenant can make every request or watch event fail the same way; logging each
one with a traceback floods the log and costs CPU. Each distinct key logs at most once per interval,
and the next line says how many were suppressed meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

MAX_KEYS = 4096


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def warning(self, key: str, message: str) -> bool:
        """Log ``message`` (one line) unless ``key`` logged within the interval; True if logged."""
        now = time.monotonic()
        with self._lock:
            last, suppressed = self._last.get(key, (-1e18, 0))
            if now - last < self.interval:
                self._last[key] = (last, suppressed + 1)
                return False
            self._last[key] = (now, 0)
            self._last.move_to_end(key)
            while len(self._last) > MAX_KEYS:
                self._last.popitem(last=False)
        line = " ".join(message.split())[:500]
        if suppressed:
            line += f" ({suppressed} similar suppressed)"
        self.logger.warning("%s", line)
        return True
