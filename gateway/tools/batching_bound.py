"""An upper bound on Symphony's goodput that accounts for the arrivals: batching with foresight.

The bound quoted for a zoo (every model running its largest batch that fits its SLO on all
GPUs) ignores that a batch can only hold requests that arrived before it starts: at 200
requests/s a model waits 5 ms for each request it adds, so its batches stay far smaller than
the SLO allows. This bound gives a scheduler perfect knowledge of every arrival and GPUs that
are always free when wanted. Per model, a batch holds consecutive arrivals i..j and must start
after the last and end by the first's deadline: (t_j - t_i) + l(j - i + 1) <= SLO. The fewest
batches cover the arrivals greedily (each batch takes as many as fit: a batch that fits stays
feasible without its first or last request, so taking more never hurts), and the GPU time of
the model is alpha n + beta x batches. The load at which the models' GPU time fills the GPUs
is an upper bound on the goodput of any online scheduler on these arrivals (it serves them
all, where goodput may drop 1% per model: a bound within a percent or so).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from gateway.tools.goodput import bisect_load, upper_bound_rps
from gateway.tools.simulate import ZooModel, even_split, zoo_arrivals


def fewest_batches(arrivals_s: np.ndarray, per_item_ms: float, fixed_ms: float, slo_ms: float) -> int:
    """The fewest batches of consecutive arrivals (sorted, seconds) that each finish within the SLO."""
    times_ms = arrivals_s * 1000
    batches, first, count = 0, 0, len(times_ms)
    while first < count:
        last = first
        while last + 1 < count and times_ms[last + 1] - times_ms[first] + per_item_ms * (last + 2 - first) + fixed_ms <= slo_ms:
            last += 1
        batches += 1
        first = last + 1
    return batches


def gpu_seconds_needed(arrivals_by_model: dict[str, np.ndarray], profiles: dict[str, tuple[float, float, float]]) -> float:
    """GPU-seconds that batching with foresight needs for these arrivals (profiles: per-item ms, fixed ms, SLO ms)."""
    total_ms = 0.0
    for model, arrivals in arrivals_by_model.items():
        per_item, fixed, slo = profiles[model]
        total_ms += per_item * len(arrivals) + fixed * fewest_batches(np.sort(arrivals), per_item, fixed, slo)
    return total_ms / 1000


def foresight_bound_rps(
    zoo: Sequence[ZooModel], gpus: int, shape: float | None, duration_s: float, seed: int = 0, tolerance: float = 0.005
) -> float:
    """The highest even-split load whose arrivals (as ``gateway simulate --goodput`` draws them for
    ``seed``) batching with foresight fits on ``gpus`` GPUs: an upper bound on the goodput there."""
    profiles = {m.name: (m.per_item_ms, m.fixed_ms, m.slo_ms) for m in zoo}

    def fits(load: float) -> bool:
        by_model: dict[str, list[float]] = {m.name: [] for m in zoo}
        for t, model in zoo_arrivals(even_split(zoo, load), shape, duration_s, random.Random(seed)):
            by_model[model].append(t)
        arrays = {name: np.asarray(times) for name, times in by_model.items()}
        return gpu_seconds_needed(arrays, profiles) <= gpus * duration_s

    ceiling = upper_bound_rps(zoo, gpus)
    return bisect_load(fits, ceiling / 4, ceiling, tolerance * ceiling)
