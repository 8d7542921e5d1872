"""ROMA's supervisor, Algorithm 2 (Section 3): fit the controllers' demands to the node.

available cores AC = MC - GC (the node's cores minus those reserved to feed the GPUs);
eta = AC / sum(u) (line 8). With eta < 1 every demand is scaled by eta (under-provisioning,
line 12); with eta >= 1 every demand is granted, and with spare_share gamma > 0 each model also
gets that share of the spare cores in proportion to its demand: u' = u (1 + gamma (eta - 1))
(line 14), so gamma = 1 hands out all of AC.

Minimum cores. Algorithm 2 knows no minimum, so scaling by eta can push a model under the
floor its controller clamps to (an executor under it is not expected to serve at all). Here
each model keeps at least its minimum: the models whose scaled share would fall under it get
exactly their minimum, and the others share what is left, still scaled by one common factor
(the paper's proportional rule among the models above their minimum). The result never exceeds
AC as long as the minimums fit in it, and is the paper's own whenever no minimum binds.
"""

from __future__ import annotations

from collections.abc import Mapping

# ROMA Section 3: "The default value (gamma = 0) implies that u' = u".
SPARE_SHARE = 0.0


def arbitrate(
    demands: Mapping[str, float],
    node_cores: float,
    reserved_cores: float = 0.0,
    spare_share: float = SPARE_SHARE,
    min_cores: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """The granted cores u' of ROMA Algorithm 2, each at least ``min_cores[name]`` (or its
    demand, if that is lower: a minimum never grants more than was asked).

    When even the minimums do not fit in AC, they are scaled down together by AC / sum(min):
    every model then runs under its minimum, and the grant still does not exceed the node. That
    is a configuration the node cannot honour (the control loop logs it at start).
    """
    if not 0 <= spare_share <= 1:
        raise ValueError(f"spare_share must be in [0, 1], got {spare_share}")
    available = max(0.0, node_cores - reserved_cores)
    total = sum(demands.values())
    if total <= 0:
        return dict(demands)
    if available >= total:
        # u (1 + s (eta - 1)) with eta = AC / sum(u), written with each model's share u / sum(u):
        # eta itself overflows to inf for a demand near zero (then 0 x inf is NaN).
        return {name: u + spare_share * (available * (u / total) - u) for name, u in demands.items()}
    floors = {name: max(0.0, min(u, (min_cores or {}).get(name, 0.0))) for name, u in demands.items()}
    floor_total = sum(floors.values())
    if floor_total >= available:
        scale = available / floor_total if floor_total > 0 else 0.0
        return {name: floor * scale for name, floor in floors.items()}
    # Fix at their minimum the models that eta would push under it, rescale the rest; each
    # round can only fix more models (the factor only falls), so this ends within len(demands).
    fixed: set[str] = set()
    while True:
        free = {name: u for name, u in demands.items() if name not in fixed}
        factor = (available - sum(floors[name] for name in fixed)) / sum(free.values())
        under = {name for name, u in free.items() if u * factor < floors[name]}
        if not under:
            break
        fixed |= under
    return {name: floors[name] if name in fixed else u * factor for name, u in demands.items()}


def arbitrate_by_deficit(
    demands: Mapping[str, float],
    deficits: Mapping[str, float],
    node_cores: float,
    reserved_cores: float = 0.0,
    spare_share: float = SPARE_SHARE,
    min_cores: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Ours, beside Algorithm 2's proportional eta: under contention the models furthest from
    their targets get the largest shares.

    ``deficits[name]`` is how far the model is from its target (its measured response time
    over its set point; larger is further behind). Without contention it is Algorithm 2
    exactly (every demand granted, the spare shared by gamma). With it, every model first gets
    its minimum (as ``arbitrate``), then what is left is shared in proportion to demand x
    deficit (a deficit under 1, a model ahead of its target, counted as 1), no model above its
    demand, the excess of those capped going to the others in the same proportion
    (water-filling). Algorithm 2 shares by demand alone and leaves the models behind as short
    as those ahead. Handing whole demands out in deficit order instead (an earlier version of
    this rule) starves everything but the furthest model when all are behind: measured on
    ROMA's AllApps test on CPUs alone, each model in turn got all the cores and the others
    their floor, period after period.
    """
    available = max(0.0, node_cores - reserved_cores)
    total = sum(demands.values())
    if total <= available or total <= 0:
        return arbitrate(demands, node_cores, reserved_cores, spare_share, min_cores)
    floors = {name: max(0.0, min(u, (min_cores or {}).get(name, 0.0))) for name, u in demands.items()}
    if sum(floors.values()) >= available:
        return arbitrate(demands, node_cores, reserved_cores, spare_share, min_cores)
    granted = dict(floors)
    left = available - sum(floors.values())
    wanting = {name for name, u in demands.items() if u > floors[name]}
    # Each round grants every wanting model its weighted share of what is left; those it would
    # take past their demand are capped and leave the round. Ends within len(demands) rounds.
    while left > 1e-12 and wanting:
        weights = {name: (demands[name] - floors[name]) * max(1.0, deficits.get(name, 0.0)) for name in wanting}
        total_weight = sum(weights.values())
        capped = {name for name in wanting if left * weights[name] / total_weight >= demands[name] - granted[name]}
        if not capped:
            for name in wanting:
                granted[name] += left * weights[name] / total_weight
            break
        for name in capped:
            left -= demands[name] - granted[name]
            granted[name] = demands[name]
        wanting -= capped
    return granted
