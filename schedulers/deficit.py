"""ROMA's deficit of a model (Algorithm 1, Section 3): how far it is from its set point.

Algorithm 1 (lines 7-11) estimates each queued request's response time as the time it has
waited plus the GPU executions ahead of it, Q + n x P_G for the request at position n, and
takes E_m as their mean. ROMA's GPUs ran one request at a time. Ours run batches, and charging
one single-request time per position overstates the queue many times over (64 queued requests
with P_G = l(1) = 11 ms give a mean of 346 ms ahead, where one batch of 64 takes 74 ms). So the
queue's time is counted in the batches it will run in: batches of B rows, B the largest batch
that fits the SLA (capped by the model's max batch size), and request i finishes when its
batch does, after i // B full batches and its own:

    E_m = mean waited + (1/n) sum_i ((i // B) l(B) + l(own batch))

computed in O(1) from the queue's running sums (``schedulers.request.RequestQueue``). With
B = 1 this is the paper's estimate plus the request's own execution, which makes E_m a response
time like the set point it is compared with.

R_m is the mean measured response time of the model's recent requests. The weighted response
time is w_m = beta E_m + (1 - beta) R_m, with beta (``queue_weight``) in [0, 1] giving weight to
the queue "to make the system more responsive to workload bursts". The set point is alpha x
SLA, and the deficit is (w_m - set point) / set point when w_m is over it, 0 otherwise (lines
21-25).
"""

from __future__ import annotations

from schedulers.profiles import LatencyProfile

# ROMA Section 5 ran alpha = 0.8, beta = 0.5.
SETPOINT_RATIO = 0.8
QUEUE_WEIGHT = 0.5


def sla_batch(profile: LatencyProfile, sla_ms: float, max_batch: int) -> int:
    """B: the largest batch whose execution fits the SLA (at least 1, at most ``max_batch``)."""
    if profile.per_item_ms <= 0:
        return max_batch
    return max(1, min(max_batch, int((sla_ms - profile.fixed_ms) / profile.per_item_ms)))


def estimated_response_ms(count: int, mean_wait_ms: float, profile: LatencyProfile, batch: int) -> float | None:
    """E_m for ``count`` queued requests that waited ``mean_wait_ms`` on average, run in batches of ``batch``."""
    if count <= 0:
        return None
    full, rest = divmod(count, batch)
    full_ms = profile.latency_ms(batch)
    # Sum over requests of the full batches ahead of each: B l(B) (0 + 1 + ... + (full - 1)) + rest full l(B).
    ahead_ms = full_ms * (batch * full * (full - 1) / 2 + rest * full)
    own_ms = full * batch * full_ms + (rest * profile.latency_ms(rest) if rest else 0.0)
    return mean_wait_ms + (ahead_ms + own_ms) / count


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
