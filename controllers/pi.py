"""ROMA's CT controller: a discrete PI controller on the response time (ROMA Section 4).

Plant, ROMA equation (8) with the zero at b that the extraction of the paper lost (see
../shared/DESIGN.md, "Facts checked"): Delta tau_R(z) = k (z - b) / (z - 1) Delta u_C(z).
Controller, equation (11): C(z) = K (z - a) / (z - 1), with K and a from equation (12) so that
the two closed-loop poles coincide at z = q:

    K = 4 (a - 1) (b - 1) / (k (b - a)^2),    a = ((2 - b) q - b) / (q - 2 b + 1)

In the time domain (C(z) read on the error e = set point - measured):

    u(t) = u'(t - 1) + K e(t) - K a e(t - 1)

where u'(t - 1) is the value the supervisor granted last period, not the one this controller
asked for: that is the anti-windup (ROMA Algorithm 2 writes the granted value back into each
controller). The response time is measured in fractions of the SLA, so one set of (k, b, q)
fits models whose SLAs differ by orders of magnitude. More cores lower the response time, so
k < 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from controllers.base import clamp

# Set point: alpha * SLA. ROMA Section 5 ran alpha = 0.8.
SETPOINT_RATIO = 0.8
# Plant defaults for the example models, identified with ``controllers.identification`` from
# step tests on this machine kind: one more core takes about 0.5 SLA off the mean response
# time at once (k), and about half of the change remains as queue drains (b).
DEFAULT_GAIN = -0.5
DEFAULT_ZERO = 0.5
# Closed-loop double pole: 0 would be dead-beat, 1 never moves. 0.7 settles in about five
# periods without overshoot on the example models.
DEFAULT_POLE = 0.7
# ROMA's control period (Section 3): one second.
PERIOD_S = 1.0


@dataclass(frozen=True)
class PIGains:
    K: float
    a: float


def pi_gains(k: float, b: float, q: float) -> PIGains:
    """K and a of equation (12): the closed loop with the plant k (z - b) / (z - 1) has a double pole at q."""
    if k == 0:
        raise ValueError("the plant gain k must not be zero")
    if not 0 <= q < 1:
        raise ValueError(f"the closed-loop pole q must be in [0, 1), got {q}")
    denominator = q - 2 * b + 1
    if denominator == 0:
        raise ValueError(f"equation (12) has no solution for b={b}, q={q}")
    a = ((2 - b) * q - b) / denominator
    if a == b:
        raise ValueError(f"equation (12) gives a = b = {a}: the controller would cancel the plant zero")
    return PIGains(K=4 * (a - 1) * (b - 1) / (k * (b - a) ** 2), a=a)


class PIController:
    def __init__(
        self,
        *,
        initial_cores: float,
        min_cores: float,
        max_cores: float,
        k: float = DEFAULT_GAIN,
        b: float = DEFAULT_ZERO,
        q: float = DEFAULT_POLE,
        setpoint_ratio: float = SETPOINT_RATIO,
        period_s: float = PERIOD_S,
    ):
        self.gains = pi_gains(k, b, q)
        self.min_cores, self.max_cores = min_cores, max_cores
        self.setpoint_ratio = setpoint_ratio
        self.period_s = period_s
        self._cores = clamp(initial_cores, min_cores, max_cores)
        self._last_error = 0.0

    def demand(self, mean_rt_ms: float | None, sla_ms: float) -> float:
        # No request in the period: nothing waits, so the executor is over-provisioned.
        measured = 0.0 if mean_rt_ms is None else mean_rt_ms / sla_ms
        error = self.setpoint_ratio - measured
        K, a = self.gains.K, self.gains.a
        wanted = self._cores + K * error - K * a * self._last_error
        self._last_error = error
        return clamp(wanted, self.min_cores, self.max_cores)

    def granted(self, cores: float) -> None:
        self._cores = cores
