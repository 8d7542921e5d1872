"""A model's arrival rate, lambda in Symphony's beta x lambda rule (Section 4.3), in requests and
in rows a second.

Symphony's requests are one item each, so its lambda and its batch size b share a unit. Here a
request may carry several rows and a batch is sized in rows: beta x lambda compares with b in
rows a second (``rows_per_second``), and a rule about requests served one at a time reads the
requests (``per_second``) and the rows each brings (``rows_per_request``).
"""

from __future__ import annotations

import collections

# Arrivals counted over the last second: long enough to be steady at tens of requests per
# second, short enough to follow a step of the workload within a second.
WINDOW_S = 1.0


class ArrivalRate:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._times: collections.deque[float] = collections.deque()
        self._rows: collections.deque[int] = collections.deque()
        self._rows_total = 0  # the rows of the arrivals in the window

    def observe(self, now: float, rows: int = 1) -> None:
        self._times.append(now)
        self._rows.append(rows)
        self._rows_total += rows
        # Trimmed here too: a rate read seldom (a CPU model's, read when its head is late) kept
        # every arrival since it was last read.
        self._trim(now)

    def per_second(self, now: float) -> float:
        """Requests a second."""
        self._trim(now)
        return len(self._times) / self.window_s

    def rows_per_second(self, now: float) -> float:
        """Rows a second: the requests' rows summed."""
        self._trim(now)
        return self._rows_total / self.window_s

    def rows_per_request(self, now: float) -> float:
        """The mean rows of the window's requests (1 where none came)."""
        self._trim(now)
        return self._rows_total / len(self._times) if self._times else 1.0

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        times, rows = self._times, self._rows
        while times and times[0] < horizon:
            times.popleft()
            self._rows_total -= rows.popleft()
