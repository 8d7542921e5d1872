"""planner/queueing.py: a step's latency percentile under Poisson arrivals, checked against a
simulation of the same queue (batch-aware dispatch from one FIFO queue to n instances of a fixed
d(b)), and its place in the planner (the papers' even-arrivals model left as it was)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.brute_force import brute_force_plan
from planner.latency_model import LatencyModel
from planner.pipeline import EVEN, POISSON, Device, Path, Pipeline, Step
from planner.plan import plan_pipeline
from planner.queueing import collection_s, erlang_c, poisson_latency_s, queueing_s
from planner.step_options import all_choices, worst_case_latency


def simulated_latency_percentile(duration_s, batch, rate, instances, percentile=0.99, requests=60_000, seed=7):
    """Each request's time from arrival to its batch's end: batches of ``batch`` consecutive
    Poisson arrivals, each taken by the instance free first once complete, FIFO."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, requests))
    free = np.zeros(instances)
    latencies = []
    for first in range(0, requests - batch + 1, batch):
        ready = arrivals[first + batch - 1]  # the batch is complete
        which = int(np.argmin(free))
        start = max(ready, free[which])
        free[which] = start + duration_s
        latencies.extend(free[which] - arrivals[first : first + batch])
    return float(np.quantile(latencies, percentile))


def test_erlang_c_known_values():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: the utilisation
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # a textbook value: 2 servers at a = 1
    assert erlang_c(3, 3.5) == 1.0  # overloaded: every arrival waits
    assert 0 < erlang_c(400, 360.0) < 1  # many servers: no overflow
    assert erlang_c(5, 0.0) == 0.0


def test_erlang_c_is_the_sum_over_the_servers_and_takes_no_time_in_their_count():
    """The closed form (Erlang B through the incomplete gamma) against the textbook sum; then a
    huge rate's billions of instances, where the sum ran for minutes and took gigabytes
    (`gateway plan --rate 1e12`)."""

    def summed(servers: int, offered: float) -> float:
        terms = [k * math.log(offered) - math.lgamma(k + 1) for k in range(servers)]
        top = servers * math.log(offered) - math.lgamma(servers + 1) - math.log(1 - offered / servers)
        peak = max(*terms, top)
        return math.exp(top - peak) / (sum(math.exp(t - peak) for t in terms) + math.exp(top - peak))

    # The last pair is past STIRLING_FROM, where the Poisson term is read through Stirling's series.
    for servers, offered in ((1, 0.3), (2, 1.9), (7, 3.0), (40, 39.5), (300, 250.0), (2000, 1990.0), (150_000, 149_600.0)):
        assert erlang_c(servers, offered) == pytest.approx(summed(servers, offered), rel=1e-9, abs=1e-15)
    # Halfin-Whitt: n = a + beta sqrt(a) servers wait with a probability set by beta alone.
    assert erlang_c(10**10 + 10**5, 1e10) == pytest.approx(erlang_c(10**6 + 10**3, 1e6), rel=1e-3)
    # Read as n log(a) - a - log(n!), cancellation made this over 1.
    assert erlang_c(10**16 + 10**8, 1e16) == pytest.approx(erlang_c(10**6 + 10**3, 1e6), rel=1e-3)
    assert erlang_c(10**300, 0.99e300) == 0.0


@pytest.mark.parametrize(
    ("duration_s", "batch", "rate", "instances"),
    [(0.02, 1, 25.0, 1), (0.02, 1, 40.0, 1), (0.05, 1, 30.0, 2), (0.04, 4, 60.0, 1), (0.06, 2, 40.0, 2)],
)
def test_the_percentile_is_near_a_simulation_of_the_queue(duration_s, batch, rate, instances):
    planned = poisson_latency_s(duration_s, batch, rate, instances)
    simulated = simulated_latency_percentile(duration_s, batch, rate, instances)
    even = worst_case_latency(duration_s, batch, rate)
    # The papers' worst case is far under the simulated tail; the model is within a third of it
    # and errs on the side of the SLA where it errs (it sums the collection's and the wait's
    # percentiles).
    assert even < 0.8 * simulated
    assert 0.85 * simulated <= planned <= 1.35 * simulated


def test_an_instance_past_its_throughput_has_no_finite_latency():
    assert math.isinf(queueing_s(0.1, 1, 10.0, 1))
    assert math.isfinite(queueing_s(0.1, 1, 10.0, 2))
    assert collection_s(1, 5.0) == 0.0
    assert collection_s(3, 10.0) == pytest.approx(-math.log(0.01) * 0.1 * 1.0, rel=0.6)  # Gamma(2) tail


def pipeline_of(arrivals: str, rate: float = 30.0, sla_s: float = 0.12) -> Pipeline:
    one = LatencyModel.linear(0.004, 0.012)
    steps = tuple(
        Step(name, (Device("cpu:1", 1.0, one, (1, 2, 4)), Device("cpu:2", 2.0, LatencyModel.linear(0.002, 0.006), (1, 2, 4))))
        for name in "ab"
    )
    return Pipeline(steps, (("a", "b"),), (Path(("a", "b"), sla_s),), rate, arrivals)


def test_poisson_arrivals_plan_for_the_queue_and_even_ones_as_the_papers():
    even, poisson = pipeline_of(EVEN), pipeline_of(POISSON)
    # Even arrivals: one instance count per configuration, the papers' worst case.
    assert all(
        c.latency_s == pytest.approx(worst_case_latency(0.004 * c.batch + 0.012, c.batch, 30.0))
        for c in all_choices(even, "a")
        if c.device == "cpu:1"
    )
    assert len({(c.device, c.batch) for c in all_choices(even, "a")}) == len(all_choices(even, "a"))
    # Poisson: extra instances are configurations of their own, each shortening the wait.
    one_core_batch_1 = sorted(
        (c for c in all_choices(poisson, "a") if c.device == "cpu:1" and c.batch == 1), key=lambda c: c.instances
    )
    assert [c.instances for c in one_core_batch_1] == [1, 2, 3]
    assert one_core_batch_1[0].latency_s > one_core_batch_1[1].latency_s > one_core_batch_1[2].latency_s
    cheap, planned = plan_pipeline(even), plan_pipeline(poisson)
    assert cheap is not None and planned is not None and planned.feasible
    # The queue costs cores: the even-arrivals plan is cheaper and over the SLA at Poisson's percentile.
    assert planned.cost > cheap.cost
    at_poisson = sum(
        poisson_latency_s(0.004 * c.batch + 0.012 if c.device == "cpu:1" else 0.002 * c.batch + 0.006, c.batch, 30.0, c.instances)
        for c in cheap.choices.values()
    )
    assert at_poisson > 0.12
    # Ours still finds the optimum under Poisson arrivals.
    best = brute_force_plan(poisson)
    assert best is not None and planned.cost == pytest.approx(best.cost)
    assert brute_force_plan(poisson, prune=False).cost == pytest.approx(best.cost)


def test_unknown_arrivals_are_refused():
    with pytest.raises(ValueError, match="arrivals"):
        pipeline_of("bursty")
