"""Symphony's autoscaling signals (Section 4.4): how many GPUs to add or to release.

A scheduler with the "flat-top" behaviour gives two robust signals. Over a period with N GPUs:

- the bad rate r (requests refused, dropped or answered late, over those that arrived): above a
  threshold, allocate N r / (1 - r) GPUs more: the offered load o relates to the peak goodput p
  as r = (o - p) / o, so o / p = 1 / (1 - r) and the missing capacity is N (o / p - 1);
- the GPU idle fraction f (idle GPU-time over N x the period): release N f GPUs, since a
  flat-top scheduler idles a fraction (p - o) / p of the cluster when the load o is under p.
"""

from __future__ import annotations

from dataclasses import dataclass

# Below this bad rate no GPUs are asked for: Symphony's goodput allows each model 1% bad (p99).
BAD_RATE_THRESHOLD = 0.01


@dataclass(frozen=True)
class ScalingSignal:
    bad_rate: float
    idle_fraction: float
    gpus_to_add: float  # N r / (1 - r), 0 while r is under the threshold
    gpus_to_release: float  # N f


def scaling_signal(gpus: int, bad_rate: float, idle_fraction: float, threshold: float = BAD_RATE_THRESHOLD) -> ScalingSignal:
    """The signals for a cluster of ``gpus`` GPUs that saw ``bad_rate`` and ``idle_fraction`` over a period."""
    bad_rate = min(max(bad_rate, 0.0), 1.0)
    idle_fraction = min(max(idle_fraction, 0.0), 1.0)
    if bad_rate <= threshold:
        add = 0.0
    elif bad_rate >= 1.0:
        add = float("inf")  # nothing was served: no finite cluster size can be read off the rate
    else:
        add = gpus * bad_rate / (1 - bad_rate)
    return ScalingSignal(bad_rate, idle_fraction, add, gpus * idle_fraction)
