"""A model's arrival rate, lambda in Symphony's beta x lambda rule (Section 4.3)."""

from __future__ import annotations

import collections

# Arrivals counted over the last second: long enough to be steady at tens of requests per
# second, short enough to follow a step of the workload within a second.
WINDOW_S = 1.0


class ArrivalRate:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._times: collections.deque[float] = collections.deque()

    def observe(self, now: float) -> None:
        self._times.append(now)
        # Trimmed here too: a rate read seldom (a CPU model's, read when its head is late) kept
        # every arrival since it was last read.
        self._trim(now)

    def per_second(self, now: float) -> float:
        self._trim(now)
        return len(self._times) / self.window_s

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self._times and self._times[0] < horizon:
            self._times.popleft()
