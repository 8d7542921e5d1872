"""The foresight bound on goodput: the fewest batches that cover the arrivals within their SLO."""

from __future__ import annotations

import numpy as np

from gateway.tools.batching_bound import fewest_batches, foresight_bound_rps
from gateway.tools.goodput import upper_bound_rps
from gateway.tools.simulate import ZooModel


def test_batches_hold_the_arrivals_that_fit_from_the_first_to_its_deadline():
    # l(b) = b + 10 ms, SLO 20 ms: a batch starting with an arrival at t holds those by t + 20 - l(b).
    arrivals = np.array([0.000, 0.002, 0.004, 0.006, 0.030, 0.031, 0.100])
    # 0, 2, 4 ms: 4 ms + l(3) = 17 <= 20; adding 6 ms: 6 + l(4) = 20 <= 20, so four fit.
    # 30, 31 ms: two; 100 ms: alone.
    assert fewest_batches(arrivals, 1.0, 10.0, 20.0) == 3
    # A tighter SLO splits the first group: 4 + l(3) = 17 > 16.
    assert fewest_batches(arrivals, 1.0, 10.0, 16.0) == 4


def test_the_foresight_bound_sits_under_the_bound_that_ignores_arrivals():
    zoo = [ZooModel("a", 1.0, 10.0, 40.0), ZooModel("b", 2.0, 4.0, 30.0)]
    bound = foresight_bound_rps(zoo, gpus=2, shape=None, duration_s=5.0, seed=1)
    assert 0 < bound < upper_bound_rps(zoo, 2)
