"""A step's latency at a percentile under Poisson arrivals: our addition to FA2's and Harpagon's
worst case d(b) + (b - 1) / lambda, which holds for evenly spaced arrivals only.

Both papers size a step by stability alone (n b / d(b) >= lambda, FA2's IP (3)), so a plan may run
an instance at 95% of its throughput; with Poisson arrivals its queue then grows long at random and
the step's tail is far over its planned worst case. Here, for a step of n instances taking batches
of b from one queue (batch-aware dispatch):

- collecting a batch: its first request waits for b - 1 more arrivals, a Gamma(b - 1, lambda) time,
  read at the percentile (scipy);
- waiting for an instance: batches form every b / lambda on average (an Erlang-b interarrival, its
  squared coefficient of variation 1 / b) and each takes d(b), a G/D/n queue at utilisation
  rho = lambda d(b) / (n b). Its wait by the Allen-Cunneen approximation: the M/M/n queue's
  probability of waiting (Erlang C) scaled by (c_a^2 + c_s^2) / 2 = 1 / (2b), the conditional wait
  taken as exponential (the heavy-traffic limit; Kingman's formula when n = 1), read at the
  percentile.

A request at place j of its batch (0 first) collects for Gamma(b - 1 - j, lambda), then waits W
with the batch: P(L > t) averages P(X_j + W > t) over the b places (the two taken as independent),
and the percentile is where that tail falls to 1 - p. The sum of the steps' percentiles along a
path is over the path's percentile: the plan errs on the side of the SLA there.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, stats
from scipy.special import gammaincc, gammaln

PERCENTILE = 0.99


def erlang_c(servers: int, offered: float) -> float:
    """The M/M/n probability that an arrival waits, ``offered`` = lambda / mu < ``servers``.

    From Erlang B, the Poisson(offered) probability of n over that of at most n (the regularized
    upper incomplete gamma Q(n + 1, offered)): C = B / (1 - rho (1 - B)). Constant time in n: the
    sum over k < n took minutes and gigabytes at the millions of instances a huge rate plans."""
    if offered <= 0:
        return 0.0
    rho = offered / servers
    if rho >= 1.0:
        return 1.0
    n = float(servers)  # a huge rate's instances are past what gammaln takes as an int
    blocking = math.exp(_log_poisson_at(n, offered)) / float(gammaincc(n + 1, offered))
    return min(1.0, blocking / (1.0 - rho * (1.0 - blocking)))


# From this many servers on, the Poisson probability is read through Stirling's series: its next
# term, 1 / (360 n^3), is then under 1e-17.
STIRLING_FROM = 1e5


def _log_poisson_at(n: float, offered: float) -> float:
    """log P(N = n) for N ~ Poisson(``offered``). In logs, as offered^n / n! overflows past a few
    hundred servers; and past STIRLING_FROM with x = offered / n - 1 as
    n (log1p(x) - x) - log(2 pi n) / 2 - 1 / (12 n), since n log(offered) - offered - log(n!)
    loses the result to cancellation there (a probability of waiting over 1 at 1e16 servers)."""
    if n < STIRLING_FROM:
        return n * math.log(offered) - offered - float(gammaln(n + 1))
    x = (offered - n) / n
    return n * (math.log1p(x) - x) - 0.5 * math.log(2 * math.pi * n) - 1 / (12 * n)


def collection_s(batch: int, rate: float, percentile: float = PERCENTILE) -> float:
    """The time the first request of a batch waits for the other b - 1, at the percentile."""
    if batch <= 1:
        return 0.0
    return float(stats.gamma.ppf(percentile, batch - 1, scale=1.0 / rate))


def _wait(duration_s: float, batch: int, rate: float, instances: int, service_scv: float = 0.0) -> tuple[float, float] | None:
    """W of a batch (Allen-Cunneen G/G/n): (the probability it waits, its mean given that it
    waits); None when the instances cannot keep up."""
    offered = rate / batch * duration_s  # instances' worth of work arriving
    rho = offered / instances
    if rho >= 1.0:
        return None
    variability = (1.0 / batch + service_scv) / 2  # c_a^2 of an Erlang-b interarrival is 1 / b
    return erlang_c(instances, offered), variability * duration_s / (instances * (1.0 - rho))


def queueing_s(
    duration_s: float, batch: int, rate: float, instances: int, percentile: float = PERCENTILE, service_scv: float = 0.0
) -> float:
    """A batch's wait for a free instance at the percentile (``service_scv``: the squared
    coefficient of variation of d(b), 0 for a fixed one); inf when the instances cannot keep up."""
    wait = _wait(duration_s, batch, rate, instances, service_scv)
    if wait is None:
        return math.inf
    waits, mean_given_wait = wait
    if waits <= 1.0 - percentile:
        return 0.0
    # P(W > t) = waits exp(-t / mean_given_wait)
    return mean_given_wait * math.log(waits / (1.0 - percentile))


# Gauss-Legendre nodes on [-1, 1] for the convolution of a collection time with the wait: the
# integrand is smooth, and a fixed rule keeps a plan's hundreds of evaluations fast.
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(64)


def _tail(t: float, batch: int, rate: float, waits: float, mean_given_wait: float) -> float:
    """P(X + W > t) averaged over a request's place in its batch: X ~ Gamma(k, rate) for the k
    requests that complete it after this one (0 to b - 1; none for the last), W as ``_wait``."""
    tail = waits * math.exp(-t / mean_given_wait) if mean_given_wait > 0 else 0.0  # the last one: X = 0
    if batch > 1:
        shapes = np.arange(1, batch, dtype=float)[:, None]
        tail += float(gammaincc(shapes[:, 0], rate * t).sum())  # P(X > t)
        if waits > 0 and mean_given_wait > 0 and t > 0:
            x = (_NODES + 1) * (t / 2)
            density = np.exp(shapes * math.log(rate) + (shapes - 1) * np.log(x) - rate * x - gammaln(shapes))
            convolved = (density * np.exp(-(t - x) / mean_given_wait)) @ _WEIGHTS * (t / 2)
            tail += waits * float(convolved.sum())
    return tail / batch


@functools.lru_cache(maxsize=4096)
def poisson_latency_s(duration_s: float, batch: int, rate: float, instances: int, percentile: float = PERCENTILE) -> float:
    """d(b) plus the percentile of a request's collection and wait together (over its place in
    the batch); inf when the instances cannot keep up."""
    wait = _wait(duration_s, batch, rate, instances)
    if wait is None:
        return math.inf
    waits, mean_given_wait = wait

    def over(t: float) -> float:
        return _tail(t, batch, rate, waits, mean_given_wait) - (1 - percentile)

    if over(0.0) <= 0:
        return duration_s
    # Each part's own percentile, summed, is past the percentile of the sum.
    upper = collection_s(batch, rate, percentile) + queueing_s(duration_s, batch, rate, instances, percentile)
    while over(upper) > 0:
        upper *= 2
    return duration_s + float(optimize.brentq(over, 0.0, upper, xtol=1e-6))
