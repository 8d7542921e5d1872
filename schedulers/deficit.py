"""ROMA's deficit of a model (Algorithm 1, Section 3): how far it is from its set point.

For each request waiting in the model's queue, at position n, its estimated response time is
the time it has waited plus n GPU executions ahead of it: Q + n x P_G (Algorithm 1, lines 7-11);
E_m is their mean. R_m is the mean measured response time of the model's recent requests. The
weighted response time is w_m = beta E_m + (1 - beta) R_m, with beta (``queue_weight``) in
[0, 1] giving weight to the queue "to make the system more responsive to workload bursts". The
set point is alpha x SLA, and the deficit is (w_m - set point) / set point when w_m is over it,
0 otherwise (lines 21-25).
"""

from __future__ import annotations

from collections.abc import Sequence

# ROMA Section 5 ran alpha = 0.8, beta = 0.5.
SETPOINT_RATIO = 0.8
QUEUE_WEIGHT = 0.5


def estimated_response_ms(waited_ms: Sequence[float], gpu_ms: float) -> float | None:
    """E_m: mean over the queue of waited + position x profiled GPU time."""
    if not waited_ms:
        return None
    return sum(w + n * gpu_ms for n, w in enumerate(waited_ms)) / len(waited_ms)


def deficit(
    estimated_ms: float | None,
    measured_ms: float | None,
    sla_ms: float,
    setpoint_ratio: float = SETPOINT_RATIO,
    queue_weight: float = QUEUE_WEIGHT,
) -> float:
    if estimated_ms is None and measured_ms is None:
        return 0.0
    if estimated_ms is None:
        weighted = measured_ms
    elif measured_ms is None:
        weighted = estimated_ms
    else:
        weighted = queue_weight * estimated_ms + (1 - queue_weight) * measured_ms
    setpoint = setpoint_ratio * sla_ms
    return (weighted - setpoint) / setpoint if weighted >= setpoint else 0.0
