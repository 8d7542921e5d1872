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

import numpy as np

# Clockwork's controller keeps the last 10 measurements per batch size, read at the 99th percentile.
WINDOW = 10
PERCENTILE = 99.0


class LatencyProfile:
    def __init__(self, per_item_ms: float, fixed_ms: float, window: int = WINDOW, percentile: float = PERCENTILE):
        self.seed_per_item_ms, self.seed_fixed_ms = per_item_ms, fixed_ms
        self.window, self.percentile = window, percentile
        self._samples: dict[int, collections.deque[float]] = {}
        self._fit: tuple[float, float] = (per_item_ms, fixed_ms)
        self._read: dict[int, float] = {}

    def observe(self, batch_size: int, latency_ms: float) -> None:
        samples = self._samples.setdefault(batch_size, collections.deque(maxlen=self.window))
        samples.append(latency_ms)
        self._read[batch_size] = float(np.percentile(samples, self.percentile))
        self._refit()

    def _refit(self) -> None:
        sizes = sorted(self._read)
        if len(sizes) >= 2:
            slope, intercept = np.polyfit(sizes, [self._read[b] for b in sizes], 1)
            self._fit = (max(float(slope), 0.0), max(float(intercept), 0.0))
        else:
            # One batch size measured: keep the seed's slope, move the fixed cost to match it.
            (b,) = sizes
            per_item = self.seed_per_item_ms
            self._fit = (per_item, max(0.0, self._read[b] - per_item * b))

    @property
    def per_item_ms(self) -> float:
        return self._fit[0]

    @property
    def fixed_ms(self) -> float:
        return self._fit[1]

    def latency_ms(self, batch_size: int) -> float:
        """The measured high percentile for this batch size, else the linear fit."""
        measured = self._read.get(batch_size)
        if measured is not None:
            return measured
        return self.per_item_ms * batch_size + self.fixed_ms
