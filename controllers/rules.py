"""ROMA's RR+rules baseline (Section 5): add a core when the response time reaches 0.8 SLA,
take one away when it falls to 0.2 SLA, every 15 seconds.

The response time read is ``Window.response_ms``: a request still waiting counts with its age,
so a starved executor (nothing completed, work queued) scales up instead of down.
"""

from __future__ import annotations

from controllers.base import Window, clamp

SCALE_UP_AT = 0.8
SCALE_DOWN_AT = 0.2
STEP_CORES = 1.0
PERIOD_S = 15.0


class RuleController:
    def __init__(self, *, initial_cores: float, min_cores: float, max_cores: float, period_s: float = PERIOD_S):
        self.min_cores, self.max_cores = min_cores, max_cores
        self.period_s = period_s
        self._cores = clamp(initial_cores, min_cores, max_cores)

    def demand(self, window: Window, sla_ms: float) -> float:
        mean_rt_ms = window.response_ms
        if mean_rt_ms is not None and mean_rt_ms >= SCALE_UP_AT * sla_ms:
            return clamp(self._cores + STEP_CORES, self.min_cores, self.max_cores)
        if mean_rt_ms is None or mean_rt_ms <= SCALE_DOWN_AT * sla_ms:
            return clamp(self._cores - STEP_CORES, self.min_cores, self.max_cores)
        return self._cores

    def granted(self, cores: float) -> None:
        self._cores = cores
