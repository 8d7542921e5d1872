"""ROMA's static baselines (Section 5): RR+max gives each model its share of all the cores,
RR+min the minimum; neither ever changes."""

from __future__ import annotations

from controllers.base import Window


class StaticController:
    def __init__(self, cores: float, period_s: float = 1.0):
        self.cores = cores
        self.period_s = period_s

    def demand(self, window: Window, sla_ms: float) -> float:
        return self.cores

    def granted(self, cores: float) -> None:
        pass
