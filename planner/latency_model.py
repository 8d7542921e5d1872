"""FA2's latency model of a batch (Section IV-A): d(b) = alpha b^2 + beta b + gamma, h(b) = b / d(b).

The gateway's learned profile (schedulers/profiles.py, Symphony's l(b) = per_item b + fixed) is the
special case alpha = 0. Times are in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatencyModel:
    """d(b) = quadratic_s b^2 + per_item_s b + fixed_s (FA2's alpha, beta, gamma)."""

    quadratic_s: float
    per_item_s: float
    fixed_s: float

    @classmethod
    def linear(cls, per_item_s: float, fixed_s: float) -> LatencyModel:
        """The gateway's l(b) = per_item b + fixed: FA2's model with alpha = 0."""
        return cls(0.0, per_item_s, fixed_s)

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]]) -> LatencyModel:
        """Least-squares fit of (batch size, seconds) points; fewer than three distinct batch sizes
        cannot fix a parabola, so those fit the line (alpha = 0)."""
        batches = np.array([b for b, _ in points], dtype=float)
        seconds = np.array([s for _, s in points], dtype=float)
        distinct = len(set(batches.tolist()))
        if distinct >= 3:
            design = np.column_stack([batches**2, batches, np.ones_like(batches)])
            (quadratic, per_item, fixed), *_ = np.linalg.lstsq(design, seconds, rcond=None)
            return cls(float(quadratic), float(per_item), float(fixed))
        if distinct == 2:
            design = np.column_stack([batches, np.ones_like(batches)])
            (per_item, fixed), *_ = np.linalg.lstsq(design, seconds, rcond=None)
            return cls.linear(float(per_item), float(fixed))
        if distinct == 1:
            return cls.linear(0.0, float(seconds.mean()))
        raise ValueError("fitting a latency model needs at least one (batch, seconds) point")

    def duration(self, batch: int) -> float:
        """d(b): seconds one instance takes for a batch of b."""
        return self.quadratic_s * batch * batch + self.per_item_s * batch + self.fixed_s

    def throughput(self, batch: int) -> float:
        """h(b) = b / d(b): requests per second one busy instance serves."""
        return batch / self.duration(batch)


@dataclass(frozen=True)
class TableLatency:
    """Measured d(b) for the batch sizes of a table (Harpagon's Table I gives d only at 2, 8, 32)."""

    seconds_by_batch: tuple[tuple[int, float], ...]

    def duration(self, batch: int) -> float:
        for size, seconds in self.seconds_by_batch:
            if size == batch:
                return seconds
        raise KeyError(f"batch size {batch} was not measured")

    def throughput(self, batch: int) -> float:
        return batch / self.duration(batch)
