"""The interface every core controller implements."""

from __future__ import annotations

from typing import Protocol


class CoreController(Protocol):
    #: Seconds between two calls of ``demand`` (the control period).
    period_s: float

    def demand(self, mean_rt_ms: float | None, sla_ms: float, cpu_s_per_request: float | None = None) -> float:
        """Cores the executor needs, given its mean response time over the last period (None
        when it served nothing), the model's current SLA, and the CPU time the executor spent
        per request served (None when unmeasured)."""

    def granted(self, cores: float) -> None:
        """The cores the supervisor actually granted: the state the next step starts from."""


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
