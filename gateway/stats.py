"""Per-model accounting: response times, SLA violations, core-seconds. Pure: time is passed in."""

from __future__ import annotations

import collections
import math

import numpy as np

# Enough recent requests for a stable 99th percentile without unbounded memory.
WINDOW = 10_000


class ResponseTimes:
    def __init__(self, window: int = WINDOW):
        self.requests = 0
        self.violations = 0
        self.total_ms = 0.0
        self.total_sq_ms = 0.0
        self.max_ms = 0.0
        self.recent: collections.deque[float] = collections.deque(maxlen=window)

    def observe(self, rt_ms: float, sla_ms: float) -> None:
        self.requests += 1
        self.total_ms += rt_ms
        self.total_sq_ms += rt_ms * rt_ms
        self.max_ms = max(self.max_ms, rt_ms)
        if rt_ms > sla_ms:
            self.violations += 1
        self.recent.append(rt_ms)

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.requests if self.requests else 0.0

    @property
    def std_ms(self) -> float:
        if not self.requests:
            return 0.0
        return math.sqrt(max(0.0, self.total_sq_ms / self.requests - self.mean_ms**2))

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.recent, 99)) if self.recent else 0.0


class CoreMeter:
    """Core-seconds allocated: the integral of an executor's cores over time."""

    def __init__(self, cores: float, now: float):
        self.cores = cores
        self._since = now
        self._accumulated = 0.0

    def set(self, cores: float, now: float) -> None:
        self._accumulated += self.cores * (now - self._since)
        self.cores, self._since = cores, now

    def total(self, now: float) -> float:
        return self._accumulated + self.cores * (now - self._since)
