"""What "within the SLA" means for a model, chosen per model: ROMA's mean, a percentile, or each deadline.

- ``mean`` (ROMA Section 5): a control window violates the SLA when the mean response time of
  its requests is over it. The controller reads ``Window.response_ms`` (the mean, raised to the
  age of the oldest request still waiting).
- ``percentile``: a window violates when the p-th percentile of its requests' response times
  is over the SLA (p per model, 99 by default). The controller reads that percentile, raised
  to the oldest waiting request's age in the same way.
- ``deadline``: every request has the SLA as its deadline; a window violates when any of its
  requests ended past it. The controller reads the window's ``DEADLINE_PERCENTILE``-th
  percentile: no finite allocation makes a queue's every response time bounded, so "every
  request" is planned as all but one in a thousand.

The feed-forward term (controllers/feedforward.py) plans the cores from a queueing model whose
response time is exponential (M/M/1, see there): its p-th percentile is its mean times
ln(100 / (100 - p)), so a percentile target T asks for a mean of T / ln(100 / (100 - p)).
``mean_target_ms`` turns each measure's target into the mean that model must hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from controllers.base import Window

Measure = Literal["mean", "percentile", "deadline"]
MEASURES: tuple[str, ...] = ("mean", "percentile", "deadline")
DEFAULT_PERCENTILE = 99.0
DEADLINE_PERCENTILE = 99.9


@dataclass(frozen=True)
class SlaMeasure:
    measure: Measure = "mean"
    percentile: float = DEFAULT_PERCENTILE  # the percentile measure's p

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise ValueError(f"unknown SLA measure {self.measure!r}: one of {', '.join(MEASURES)}")
        if not 0 < self.percentile < 100:
            raise ValueError(f"the SLA percentile must be in (0, 100), got {self.percentile}")

    @property
    def planned_percentile(self) -> float | None:
        """The percentile the controller holds under the set point (None: the mean)."""
        return {"mean": None, "percentile": self.percentile, "deadline": DEADLINE_PERCENTILE}[self.measure]

    def measured_ms(self, window: Window) -> float | None:
        """The response time the controller compares with its set point (None: idle, nothing
        completed and nothing waits)."""
        q = self.planned_percentile
        if q is None:
            return window.response_ms
        measured = window.percentile_ms(q)
        if window.waiting > 0 and window.oldest_wait_ms is not None:
            return window.oldest_wait_ms if measured is None else max(measured, window.oldest_wait_ms)
        return measured

    def violated(self, window: Window, sla_ms: float) -> bool:
        """Whether the window's completed requests violate the SLA under this measure."""
        if not window.count:
            return False
        if self.measure == "mean":
            return window.total_ms / window.count > sla_ms
        if self.measure == "percentile":
            return window.percentile_ms(self.percentile) > sla_ms
        return window.late(sla_ms) > 0

    def mean_target_ms(self, target_ms: float) -> float:
        """The mean response time of an M/M/1 queue whose measure is ``target_ms``."""
        q = self.planned_percentile
        return target_ms if q is None else target_ms / math.log(100 / (100 - q))
