"""Identifying the plant gain k of ROMA's equation (8) from a step test.

Hold a model's executor at ``low`` cores under a steady load and measure its mean response
time, then at ``high`` cores under the same load. The PI controller (controllers/pi.py) reads
the response time as the normalized speed y = alpha SLA / RT, so the gain is the change in
speed per core:

    k = (y_high - y_low) / (high - low)

The control loop also identifies k every period from the executor's CPU time per request
(``controllers.pi.plant_gain``, k = alpha SLA / s); a step test measures the same quantity
without the queueing model behind that formula, so the two can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepPoint:
    cores: float
    mean_rt_ms: float


def gain_from_step(low: StepPoint, high: StepPoint, sla_ms: float, setpoint_ratio: float) -> float:
    if high.cores == low.cores:
        raise ValueError("a step test needs two different core allocations")
    if low.mean_rt_ms <= 0 or high.mean_rt_ms <= 0:
        raise ValueError("both points need a measured response time")
    speed_low = setpoint_ratio * sla_ms / low.mean_rt_ms
    speed_high = setpoint_ratio * sla_ms / high.mean_rt_ms
    return (speed_high - speed_low) / (high.cores - low.cores)
