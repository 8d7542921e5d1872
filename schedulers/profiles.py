"""Latency profiles: how long a batch of b requests takes on a device.

Clockwork (Section 4.4, "predictable performance"): per (model, batch size) a rolling window of
the last N measured execution times, read at a high percentile (its controller keeps 10 and
reads the 99th). Symphony (Section 4.3): the profile is linear, l(b) = alpha b + beta, with
alpha the per-item cost (``per_item_ms``) and beta the fixed cost of a batch (``fixed_ms``); the
fit answers for batch sizes not measured yet. A profile is seeded (from a short profiling run
at start-up, or a table such as ../shared/data/symphony_zoo_a100.csv) and learns from every
completed batch.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

# Clockwork's controller keeps the last 10 measurements per batch size, read at the 99th percentile.
WINDOW = 10
PERCENTILE = 99.0


def percentile(samples: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile, in plain Python: the windows here hold ten samples,
    where numpy's call overhead would cost more than the arithmetic."""
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of y = slope x + intercept."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, mean_y - slope * mean_x


class LatencyProfile:
    def __init__(self, per_item_ms: float, fixed_ms: float, window: int = WINDOW, percentile: float = PERCENTILE):
        self.seed_per_item_ms, self.seed_fixed_ms = per_item_ms, fixed_ms
        self.window, self.percentile = window, percentile
        self._samples: dict[int, collections.deque[float]] = {}
        # The linear fit, plain attributes: the schedulers read them several times per request.
        self.per_item_ms, self.fixed_ms = per_item_ms, fixed_ms
        self._read: dict[int, float] = {}
        # Running sums over the read table (x: batch size, y: its read), so that a new sample
        # refits the line in O(1): the fit is updated after every batch a device runs.
        self._sums = [0.0, 0.0, 0.0, 0.0]  # sum x, sum y, sum xy, sum xx
        self._updates = 0

    def observe(self, batch_size: int, latency_ms: float) -> None:
        samples = self._samples.get(batch_size)
        if samples is None:
            samples = self._samples[batch_size] = collections.deque(maxlen=self.window)
        samples.append(latency_ms)
        read = percentile(samples, self.percentile) if len(samples) > 1 else latency_ms
        old = self._read.get(batch_size)
        if old == read:
            return
        self._read[batch_size] = read
        sums = self._sums
        if old is not None:
            sums[1] -= old
            sums[2] -= batch_size * old
        else:
            sums[0] += batch_size
            sums[3] += batch_size * batch_size
        sums[1] += read
        sums[2] += batch_size * read
        self._updates += 1
        if self._updates % 4096 == 0:  # no drift of the float sums over a long run
            self._sums = [
                float(sum(self._read)),
                sum(self._read.values()),
                sum(b * y for b, y in self._read.items()),
                float(sum(b * b for b in self._read)),
            ]
        self._refit()

    def _refit(self) -> None:
        n = len(self._read)
        if n >= 2:
            sx, sy, sxy, sxx = self._sums
            slope = (sxy - sx * sy / n) / (sxx - sx * sx / n)
            self.per_item_ms, self.fixed_ms = max(slope, 0.0), max(sy / n - slope * sx / n, 0.0)
        else:
            # One batch size measured: keep the seed's slope, move the fixed cost to match it.
            ((b, read),) = self._read.items()
            per_item = self.seed_per_item_ms
            self.per_item_ms, self.fixed_ms = per_item, max(0.0, read - per_item * b)

    def measured(self) -> dict[int, float]:
        """Each batch size measured so far and its latency as read (the window's percentile):
        the points a planner fits its own model to (FA2's quadratic, gateway/tools/plan.py)."""
        return dict(sorted(self._read.items()))

    def forget(self, batch_size: int) -> None:
        """Drop what was measured at ``batch_size``: its latency comes from the fit of the other
        sizes again (the seed's, where none is measured)."""
        self._samples.pop(batch_size, None)
        read = self._read.pop(batch_size, None)
        if read is None:
            return
        sums = self._sums
        sums[0] -= batch_size
        sums[1] -= read
        sums[2] -= batch_size * read
        sums[3] -= batch_size * batch_size
        if self._read:
            self._refit()
        else:  # the seed's line again, and no float left over in the sums
            self._sums = [0.0, 0.0, 0.0, 0.0]
            self.per_item_ms, self.fixed_ms = self.seed_per_item_ms, self.seed_fixed_ms

    def mean_ms(self, batch_size: int) -> float:
        """The mean of the window's samples for this batch size, else the linear fit: what a
        batch takes on average, the service time of a queue's load (the high percentile of
        ``latency_ms`` is for deadlines; a CPU quota's throttling can put it far above the mean)."""
        samples = self._samples.get(batch_size)
        if samples:
            return sum(samples) / len(samples)
        return self.per_item_ms * batch_size + self.fixed_ms

    def latency_ms(self, batch_size: int) -> float:
        """The measured high percentile for this batch size, else the linear fit."""
        measured = self._read.get(batch_size)
        if measured is not None:
            return measured
        return self.per_item_ms * batch_size + self.fixed_ms
