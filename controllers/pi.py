"""ROMA's CT controller: a discrete PI controller on the response time (ROMA Section 4).

Plant, ROMA equation (8) with the zero at b that the extraction of the paper lost (see
../shared/DESIGN.md, "Facts checked"): Delta y(z) = k (z - b) / (z - 1) Delta u_C(z).
Controller, equation (11): C(z) = K (z - a) / (z - 1), with K and a from equation (12) so that
the two closed-loop poles coincide at z = q:

    K = 4 (a - 1) (b - 1) / (k (b - a)^2),    a = ((2 - b) q - b) / (q - 2 b + 1)

In the time domain, on the error e = set point - measured:

    u(t) = u'(t - 1) + K e(t) - K a e(t - 1)

where u'(t - 1) is the value the supervisor granted last period, not the one this controller
asked for: that is the anti-windup (ROMA Algorithm 2 writes the granted value back into each
controller).

The measured variable and the gain. ROMA's requests took seconds, so within its 1 s period
the queues were still moving and the plant integrated (equations (3)-(6)). Here a request takes
milliseconds: the queue settles within the period and the mean response time of a queue served
at c cores is close to RT = s / (c - rho) (s: core-seconds per request, rho: the load in
cores). The real loop is then a static gain with one period of measurement delay. Two
consequences, both measured (docs/BENCHMARKS.md):

- The controller reads the response time as a normalized speed y = alpha SLA / RT, linear in
  the cores (y is proportional to c - rho), as ROMA's authors' own controller did (an
  incremental PI on 1/RT). Its physical gain is k = dy/dc = alpha SLA / s, which the control
  loop identifies every period from the executor's measured CPU time per request
  (``plant_gain``). Above the set point the error is read in response time instead,
  e = RT / (alpha SLA) - 1, capped at ``OVERLOAD_ERROR_CAP``: speed saturates near zero in
  overload and would hide how far behind the queue is. Below it, e = 1 - y is capped at -1, so
  an over-provisioned executor gives back cores at a bounded pace (an idle one at -1). The two readings agree to first order
  at the set point.
- The response time read is ``Window.response_ms``: the mean of the requests completed in the
  period, raised to the age of the oldest request still queued or running when that is larger.
  A request's age is a lower bound on its response time, and ROMA's measured variable is the
  response time of the queue (tau_R = tau_Q + tau_P, Section 4), not only of what left it. A
  period with no completion is idle (e = -1) only when nothing waits either: an executor
  starved at its floor (a full queue, a batch still running) reads as late, by as much as its
  oldest request has waited, and gets cores at the next step instead of losing them.
- With a delayed static plant of gain k, the closed loop of (11) has the characteristic
  polynomial z^2 + (Kk - 1) z - Kk a. The defaults b = 2 (sqrt 2 - 1) and q = 1 / sqrt 2 make
  equation (12) give a = 0 and K = 1 / k exactly, so that with the identified k the real loop
  is dead-beat (both poles at 0) while the design model of (12) has its double pole at q.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controllers.base import Window, clamp

# Set point: alpha x SLA. ROMA Section 5 ran alpha = 0.8.
SETPOINT_RATIO = 0.8
# ROMA's control period (Section 3): one second.
PERIOD_S = 1.0
# Error caps (see above): at most 4 set points of lateness; below the set point half a unit,
# so cores are given back at half the pace they are taken (an SLA is lost faster than a core).
OVERLOAD_ERROR_CAP = 4.0
UNDERLOAD_ERROR_CAP = -0.5
# Plant defaults, (k, b, q) of equations (8)-(12). k is used until the first identification (a
# model whose SLA is 12.5 service times at alpha = 0.8); b and q make a = 0, K = 1 / k (above).
DEFAULT_GAIN = 10.0
DEFAULT_ZERO = 2 * (math.sqrt(2) - 1)
DEFAULT_POLE = 1 / math.sqrt(2)


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
    try:
        gain = 4 * (a - 1) * (b - 1) / (k * (b - a) ** 2)
    except (OverflowError, ZeroDivisionError):
        gain = math.inf
    if not (math.isfinite(gain) and math.isfinite(a)):
        raise ValueError(f"equation (12) gives no finite gain for k={k}, b={b}, q={q}")
    return PIGains(K=gain, a=a)


def tracking_error(mean_rt_ms: float | None, sla_ms: float, setpoint_ratio: float) -> float:
    """How far the executor is from the set point, in set points: > 0 too slow, < 0 too fast."""
    if mean_rt_ms is None or mean_rt_ms <= 0:
        return -1.0  # nothing completed and nothing waits (Window.response_ms): give back at the full pace
    ratio = mean_rt_ms / (setpoint_ratio * sla_ms)
    if ratio >= 1:
        return min(OVERLOAD_ERROR_CAP, ratio - 1)
    return max(UNDERLOAD_ERROR_CAP, 1 - 1 / ratio)


def plant_gain(sla_ms: float, setpoint_ratio: float, cpu_s_per_request: float) -> float:
    """k = d(alpha SLA / RT) / dc = alpha SLA / s for a queue served at c cores (see above)."""
    return setpoint_ratio * sla_ms / 1000 / cpu_s_per_request


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
        self.b, self.q = b, q
        self.gain = k
        self.gains = pi_gains(k, b, q)
        self.min_cores, self.max_cores = min_cores, max_cores
        self.setpoint_ratio = setpoint_ratio
        self.period_s = period_s
        self._cores = clamp(initial_cores, min_cores, max_cores)
        self._last_error = 0.0

    def identify(self, sla_ms: float, cpu_s_per_request: float | None) -> None:
        """Re-derive K and a from the plant gain measured this period (kept when unmeasured)."""
        if cpu_s_per_request is not None and cpu_s_per_request > 0:
            self.gain = plant_gain(sla_ms, self.setpoint_ratio, cpu_s_per_request)
            self.gains = pi_gains(self.gain, self.b, self.q)

    def demand(self, window: Window, sla_ms: float) -> float:
        """u(t) = u'(t - 1) + K e(t) - K a e(t - 1), equation (11) in the time domain, on the
        response time ``window.response_ms`` (completed requests and the age of the waiting ones)."""
        self.identify(sla_ms, window.cpu_s_per_request)
        error = tracking_error(window.response_ms, sla_ms, self.setpoint_ratio)
        K, a = self.gains.K, self.gains.a
        wanted = self._cores + K * error - K * a * self._last_error
        self._last_error = error
        return clamp(wanted, self.min_cores, self.max_cores)

    def granted(self, cores: float) -> None:
        self._cores = cores
