"""Symphony's epoch-scale partitioning of models into GPU sub-clusters (Section 4.7, Appendix A).

Every epoch (minutes) the models are split into disjoint sets, one per sub-cluster; each
sub-cluster has a dispatcher of its own and every GPU of it holds all of its models. Two limits
bind a sub-cluster: the request rate its dispatcher can decide (R_max) and the GPU memory that
must hold its models (S_max). Appendix A.1's mixed integer linear program, with x_ij = 1 when
model i goes to sub-cluster j, r_i, s_i, d_i its request rate, static (weights) and dynamic
(runtime) memory, R_bar = sum_i r_i / l and S_bar = sum_i s_i / l over the l sub-clusters:

    minimize    dR + w dS                                             (4)
    subject to  sum_i r_i x_ij <= R_max                         for all j   (5)
                sum_i s_i x_ij + max_i d_i x_ij <= S_max        for all j   (6)
                |sum_i r_i x_ij - R_bar| <= dR                  for all j   (7)
                |sum_i s_i x_ij - S_bar| <= dS                  for all j   (8)
                sum_j x_ij = 1                                  for all i   (9)
                x_ij in {0, 1}                                            (10)

and, at an epoch that re-partitions a running assignment x', the disruption bound

                sum_i sum_j c_ij |x_ij - x'_ij| <= C_max                  (11)

with c_ij the cost of loading (or unloading) model i on sub-cluster j. Here the max in (6) is a
variable z_j >= d_i x_ij for every i (it appears only on the small side of a <=, so the least
z_j the solver can take is the max), and |x_ij - x'_ij| is linear because x' is known: it is
x_ij where x'_ij = 0 and 1 - x_ij where x'_ij = 1.

The program is solved by HiGHS (scipy.optimize.milp) within a time limit (Appendix A.1: an
approximate answer within a time bound, 10 s in Symphony). A greedy assignment comes first;
its objective is given to the solver as a cutoff, so whatever the solver returns is at least
as good, and when the solver has found nothing in time the greedy answer is returned. The
result says which was used. How many GPUs each sub-cluster gets is ``split_gpus``: in
proportion to its GPU demand (sum over its models of r x l(B) / B, Section 3's steady state),
at least one each.

Pure: no I/O, no clock; the solver's own time limit is the only time it knows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array, csr_array, vstack

__all__ = [
    "Capacity",
    "Disruption",
    "InfeasiblePartition",
    "ModelLoad",
    "Partition",
    "PartitionNotFound",
    "SubCluster",
    "fewest_subclusters",
    "gpu_demand",
    "greedy_partition",
    "largest_batch_within_slo",
    "partition_fewest",
    "partition_models",
    "split_gpus",
    "unit_cost",
]

# Symphony's solver ran 10 s per partitioning (Appendix A.1 and A.2).
TIME_LIMIT_S = 10.0
# Slack for float sums checked against a capacity, and for the cutoff at the greedy objective
# (a tolerance of HiGHS' own order: the greedy assignment must stay feasible under it).
TOLERANCE = 1e-6
# HiGHS' answers are floats: a binary above this is taken as 1.
ONE = 0.5


# -- inputs and outputs -----------------------------------------------------------------------
@dataclass(frozen=True)
class ModelLoad:
    """One model as the partitioning sees it (Appendix A.1's r_i, s_i, d_i)."""

    name: str
    rate_rps: float  # r_i: requests/s the model is expected to receive this epoch
    static_mb: float  # s_i: its weights, held by every GPU of its sub-cluster
    dynamic_mb: float  # d_i: runtime memory (activations) while it runs; one model runs at a time


@dataclass(frozen=True)
class Capacity:
    """What one sub-cluster can take (Appendix A.1's R_max and S_max)."""

    max_rate_rps: float  # R_max: requests/s one dispatcher decides
    max_memory_mb: float  # S_max: memory of one GPU of the sub-cluster


def unit_cost(model: str, subcluster: int) -> float:
    """c_ij = 1: every load and every unload counts one, so moving a model costs 2."""
    return 1.0


@dataclass(frozen=True)
class Disruption:
    """The running assignment x' and the bound (11) on re-partitioning it.

    ``current`` maps a model to its sub-cluster now; a model it lacks is new (x'_i = 0, so
    placing it costs its load), and a sub-cluster index at or past the new count is being
    retired (its models must unload: a fixed part of the cost). ``cost(model, j)`` is c_ij.
    """

    current: Mapping[str, int]
    max_cost: float  # C_max
    cost: Callable[[str, int], float] = unit_cost


@dataclass(frozen=True)
class SubCluster:
    index: int
    models: tuple[str, ...]
    rate_rps: float  # sum_i r_i x_ij, the left side of (5)
    static_mb: float  # sum_i s_i x_ij
    dynamic_mb: float  # max_i d_i x_ij

    @property
    def memory_mb(self) -> float:
        """The left side of (6): what one of its GPUs must hold."""
        return self.static_mb + self.dynamic_mb


@dataclass(frozen=True)
class Partition:
    """An assignment of models to sub-clusters, its objective (4) and how it was found.

    ``method``: "milp" (the solver proved it optimal), "milp-time-limit" (the solver's best
    within its time limit, not proven optimal), or "greedy" (the solver found nothing better in
    time). ``greedy_objective`` is the greedy start's (4), None when greedy found no assignment.
    """

    subclusters: tuple[SubCluster, ...]
    rate_spread_rps: float  # dR: the largest |rate_j - R_bar|
    memory_spread_mb: float  # dS: the largest |static_j - S_bar|
    memory_weight: float  # w
    method: str
    greedy_objective: float | None
    solver_status: str
    moved: tuple[str, ...] = ()  # models whose sub-cluster differs from the running assignment
    disruption_cost: float = 0.0  # the left side of (11); 0 without a running assignment
    solver_bound: float | None = None  # HiGHS' lower bound on (4), where it gave one

    @property
    def objective(self) -> float:
        """(4): dR + w dS."""
        return self.rate_spread_rps + self.memory_weight * self.memory_spread_mb

    def assignment(self) -> dict[str, int]:
        return {name: sub.index for sub in self.subclusters for name in sub.models}

    def imbalance(self) -> tuple[float, float]:
        """Appendix A.2's imbalance factors (max - min) / mean, of the rate and of the static memory."""
        return _spread([s.rate_rps for s in self.subclusters]), _spread([s.static_mb for s in self.subclusters])


class InfeasiblePartition(ValueError):
    """No assignment meets the constraints (proven, or plain from the input)."""


class PartitionNotFound(RuntimeError):
    """Neither the solver within its time limit nor the greedy found an assignment; one may exist."""


def _spread(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / mean if mean else 0.0


# -- GPUs per sub-cluster -----------------------------------------------------------------------
def largest_batch_within_slo(per_item_ms: float, fixed_ms: float, slo_ms: float) -> int:
    """B = floor((SLO - beta) / alpha): the largest batch whose l(B) = alpha B + beta fits the SLO
    (Symphony Section 3); 0 when not even one request fits."""
    return max(0, math.floor((slo_ms - fixed_ms) / per_item_ms + 1e-9))


def gpu_demand(rate_rps: float, per_item_ms: float, fixed_ms: float, slo_ms: float) -> float:
    """GPUs a model keeps busy at ``rate_rps`` when it runs its largest batch within its SLO:
    r x l(B) / B (Symphony Section 3, eq. 3's N with b = B)."""
    batch = largest_batch_within_slo(per_item_ms, fixed_ms, slo_ms)
    if batch < 1:
        raise ValueError(f"l(1) = {per_item_ms + fixed_ms:g} ms exceeds the SLO of {slo_ms:g} ms: no batch fits")
    return rate_rps * (per_item_ms * batch + fixed_ms) / batch / 1000


def split_gpus(demands: Sequence[float], gpus: int) -> list[int]:
    """``gpus`` GPUs over sub-clusters in proportion to their ``demands``, at least one each.

    Largest remainders: each gets floor of its quota (at least 1), then the GPUs left go to the
    largest fractional parts; where the floor of 1 overshot, the GPUs come back from those most
    over their quota. The counts sum to ``gpus``.
    """
    if gpus < len(demands):
        raise InfeasiblePartition(f"{gpus} GPUs cannot give each of {len(demands)} sub-clusters one")
    if any(d < 0 for d in demands):
        raise ValueError(f"GPU demands must not be negative, got {list(demands)}")
    total = sum(demands)
    quotas = [gpus * d / total for d in demands] if total > 0 else [gpus / len(demands)] * len(demands)
    counts = [max(1, math.floor(q)) for q in quotas]
    while sum(counts) < gpus:
        j = max(range(len(counts)), key=lambda k: (quotas[k] - counts[k], -k))
        counts[j] += 1
    while sum(counts) > gpus:
        j = max((k for k in range(len(counts)) if counts[k] > 1), key=lambda k: (counts[k] - quotas[k], k))
        counts[j] -= 1
    return counts


# -- the program ---------------------------------------------------------------------------------
def fewest_subclusters(models: Sequence[ModelLoad], capacity: Capacity) -> int:
    """A lower bound on l: enough dispatchers for the total rate, enough memory for the weights
    (every sub-cluster also holds at least the smallest d_i)."""
    _check_models(models, capacity)
    by_rate = math.ceil(sum(m.rate_rps for m in models) / capacity.max_rate_rps - TOLERANCE)
    room = capacity.max_memory_mb - min(m.dynamic_mb for m in models)
    by_memory = math.ceil(sum(m.static_mb for m in models) / room - TOLERANCE)
    return max(1, by_rate, by_memory)


def partition_fewest(
    models: Sequence[ModelLoad],
    capacity: Capacity,
    *,
    max_subclusters: int | None = None,
    memory_weight: float | None = None,
    time_limit_s: float = TIME_LIMIT_S,
) -> Partition:
    """The partition into the fewest sub-clusters that the solver (or the greedy) can find: l
    from ``fewest_subclusters`` up to ``max_subclusters`` (default: one per model)."""
    last = len(models) if max_subclusters is None else max_subclusters
    reasons = []
    for count in range(fewest_subclusters(models, capacity), last + 1):
        try:
            return partition_models(models, count, capacity, memory_weight=memory_weight, time_limit_s=time_limit_s)
        except (InfeasiblePartition, PartitionNotFound) as error:
            reasons.append(f"{count}: {error}")
    raise InfeasiblePartition(f"no partition into at most {last} sub-clusters: " + "; ".join(reasons[-3:]))


def default_memory_weight(models: Sequence[ModelLoad]) -> float:
    """w = R_bar / S_bar: a share of the mean memory weighs as much as the same share of the mean rate."""
    rate, static = sum(m.rate_rps for m in models), sum(m.static_mb for m in models)
    return rate / static if rate > 0 and static > 0 else 1.0


def partition_models(
    models: Sequence[ModelLoad],
    subclusters: int,
    capacity: Capacity,
    *,
    memory_weight: float | None = None,
    disruption: Disruption | None = None,
    time_limit_s: float = TIME_LIMIT_S,
) -> Partition:
    """Appendix A.1's program for ``subclusters`` sub-clusters, with (11) when ``disruption`` is given.

    Raises ``InfeasiblePartition`` when no assignment exists (plain from the input, or proven by
    the solver) and ``PartitionNotFound`` when neither the solver in ``time_limit_s`` nor the
    greedy found one.
    """
    _check_models(models, capacity)
    if not 1 <= subclusters <= len(models):
        raise ValueError(f"need 1 to {len(models)} sub-clusters for {len(models)} models, got {subclusters}")
    total_rate = sum(m.rate_rps for m in models)
    if total_rate > subclusters * capacity.max_rate_rps * (1 + TOLERANCE):
        raise InfeasiblePartition(
            f"(5): {total_rate:.0f} requests/s exceed {subclusters} dispatchers of {capacity.max_rate_rps:.0f}: "
            f"use at least {math.ceil(total_rate / capacity.max_rate_rps)} sub-clusters or a larger max_rate_rps"
        )
    weight = default_memory_weight(models) if memory_weight is None else memory_weight
    greedy = greedy_partition(models, subclusters, capacity, memory_weight=weight, disruption=disruption)
    cutoff = greedy.objective if greedy is not None else None
    if cutoff is not None and cutoff <= TOLERANCE:
        # (4) cannot go below 0: the greedy start is optimal and the solver has nothing to find.
        return _with(greedy, "greedy", cutoff, "greedy start has objective 0, the least possible: solver not run", 0.0)
    result = _solve(models, subclusters, capacity, weight, disruption, time_limit_s, cutoff)
    if result.status == 2 and greedy is None:  # with a cutoff, "infeasible" may only mean "nothing better"
        and_11 = " and (11)" if disruption is not None else ""
        raise InfeasiblePartition(
            f"no assignment of {len(models)} models to {subclusters} sub-clusters meets (5), (6), (9){and_11}: "
            f"more sub-clusters, a larger max_rate_rps or max_memory_mb"
            + (", or a larger disruption bound C_max" if disruption is not None else "")
            + " would be needed"
        )
    bound = getattr(result, "mip_dual_bound", None)
    if result.x is not None:
        found = _partition(models, subclusters, _assignment(result.x, len(models), subclusters), weight, disruption)
        if greedy is None or found.objective <= greedy.objective + TOLERANCE * max(1.0, greedy.objective):
            method = "milp" if result.status == 0 else "milp-time-limit"
            return _with(found, method, cutoff, result.message, bound)
    if greedy is not None:
        return _with(greedy, "greedy", cutoff, result.message, bound)
    raise PartitionNotFound(
        f"neither the solver in {time_limit_s:g} s nor the greedy found an assignment of {len(models)} models to "
        f"{subclusters} sub-clusters ({result.message}): give the solver more time or use more sub-clusters"
    )


def _check_models(models: Sequence[ModelLoad], capacity: Capacity) -> None:
    """What no assignment can repair: a model that alone exceeds a sub-cluster."""
    if not models:
        raise ValueError("no models to partition")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError("model names must be unique")
    if capacity.max_rate_rps <= 0 or capacity.max_memory_mb <= 0:
        raise ValueError(f"capacities must be positive, got {capacity}")
    for model in models:
        if min(model.rate_rps, model.static_mb, model.dynamic_mb) < 0:
            raise ValueError(f"{model.name}: rate and memory must not be negative")
        if model.rate_rps > capacity.max_rate_rps * (1 + TOLERANCE):
            raise InfeasiblePartition(
                f"(5): {model.name} alone receives {model.rate_rps:.0f} requests/s, more than one dispatcher's "
                f"{capacity.max_rate_rps:.0f}: raise max_rate_rps or serve it as several variants"
            )
        if model.static_mb + model.dynamic_mb > capacity.max_memory_mb * (1 + TOLERANCE):
            raise InfeasiblePartition(
                f"(6): {model.name} alone needs {model.static_mb + model.dynamic_mb:.0f} MB, more than a GPU's "
                f"{capacity.max_memory_mb:.0f} MB"
            )


def _solve(
    models: Sequence[ModelLoad],
    count: int,
    capacity: Capacity,
    weight: float,
    disruption: Disruption | None,
    time_limit_s: float,
    cutoff: float | None,
):  # -> scipy.optimize.OptimizeResult
    """The program in HiGHS' form. Variables: x_ij at i * count + j, then z_j (the max of (6)),
    then dR and dS."""
    m = len(models)
    n_x = m * count
    z0, d_r, d_s = n_x, n_x + count, n_x + count + 1
    n = n_x + count + 2
    rate = np.array([model.rate_rps for model in models])
    static = np.array([model.static_mb for model in models])
    dynamic = np.array([model.dynamic_mb for model in models])
    mean_rate, mean_static = rate.sum() / count, static.sum() / count
    rows_i = np.repeat(np.arange(m), count)  # model of each x variable
    cols_x = np.arange(n_x)
    sub_of = np.tile(np.arange(count), m)  # sub-cluster of each x variable

    def per_sub(values: np.ndarray, extra: dict[int, float] | None = None) -> csr_array:
        """count rows: row j is sum_i values_i x_ij (+ the extra columns' coefficients)."""
        rows, cols, data = [sub_of], [cols_x], [values[rows_i]]
        if extra:
            for column, coefficient in extra.items():
                rows.append(np.arange(count))
                cols.append(np.full(count, column) if column != z0 else z0 + np.arange(count))
                data.append(np.full(count, coefficient))
        return coo_array((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))), shape=(count, n)).tocsr()

    blocks: list[tuple[csr_array, np.ndarray, np.ndarray]] = []
    # (9) each model in exactly one sub-cluster
    one = coo_array((np.ones(n_x), (rows_i, cols_x)), shape=(m, n)).tocsr()
    blocks.append((one, np.ones(m), np.ones(m)))
    # (5) and (7) on the rate: rate_j <= R_max, rate_j - dR <= R_bar, rate_j + dR >= R_bar
    blocks.append((per_sub(rate), np.full(count, -np.inf), np.full(count, capacity.max_rate_rps)))
    blocks.append((per_sub(rate, {d_r: -1.0}), np.full(count, -np.inf), np.full(count, mean_rate)))
    blocks.append((per_sub(rate, {d_r: 1.0}), np.full(count, mean_rate), np.full(count, np.inf)))
    # (6): static_j + z_j <= S_max, and (8): static_j -/+ dS around S_bar
    blocks.append((per_sub(static, {z0: 1.0}), np.full(count, -np.inf), np.full(count, capacity.max_memory_mb)))
    blocks.append((per_sub(static, {d_s: -1.0}), np.full(count, -np.inf), np.full(count, mean_static)))
    blocks.append((per_sub(static, {d_s: 1.0}), np.full(count, mean_static), np.full(count, np.inf)))
    # the max of (6): d_i x_ij - z_j <= 0 for every i, j (only where d_i > 0: the rest hold trivially)
    positive = np.flatnonzero(dynamic[rows_i] > 0)
    k = len(positive)
    if k:
        linear = coo_array(
            (
                np.concatenate([dynamic[rows_i][positive], -np.ones(k)]),
                (np.concatenate([np.arange(k), np.arange(k)]), np.concatenate([positive, z0 + sub_of[positive]])),
            ),
            shape=(k, n),
        ).tocsr()
        blocks.append((linear, np.full(k, -np.inf), np.zeros(k)))
    # (11): sum c_ij |x_ij - x'_ij| <= C_max, linear since x' is known
    if disruption is not None:
        coefficients, fixed = _disruption_terms(models, count, disruption)
        row = coo_array((coefficients, (np.zeros(n_x, dtype=int), cols_x)), shape=(1, n)).tocsr()
        blocks.append((row, np.array([-np.inf]), np.array([disruption.max_cost - fixed])))
    # the greedy start's objective as a cutoff: only as good or better is of interest
    if cutoff is not None:
        row = coo_array((np.array([1.0, weight]), (np.zeros(2, dtype=int), np.array([d_r, d_s]))), shape=(1, n)).tocsr()
        blocks.append((row, np.array([-np.inf]), np.array([cutoff + TOLERANCE * max(1.0, cutoff)])))

    matrix = vstack([b[0] for b in blocks]).tocsr()
    lower = np.concatenate([b[1] for b in blocks])
    upper = np.concatenate([b[2] for b in blocks])
    objective = np.zeros(n)
    objective[d_r], objective[d_s] = 1.0, weight
    integrality = np.zeros(n)
    integrality[:n_x] = 1
    bounds = Bounds(np.zeros(n), np.concatenate([np.ones(n_x), np.full(count, dynamic.max()), [np.inf, np.inf]]))
    return milp(
        objective,
        integrality=integrality,
        bounds=bounds,
        constraints=LinearConstraint(matrix, lower, upper),
        options={"time_limit": time_limit_s, "presolve": True},
    )


def _disruption_terms(models: Sequence[ModelLoad], count: int, disruption: Disruption) -> tuple[np.ndarray, float]:
    """(11) as coefficients of the x_ij and a fixed cost: c_ij (1 - 2 x'_ij) for every i, j < count,
    plus sum c_ij x'_ij (the x'_ij = 1 terms), including the unloading from retired sub-clusters."""
    coefficients = np.empty(len(models) * count)
    fixed = 0.0
    for i, model in enumerate(models):
        now = disruption.current.get(model.name)
        for j in range(count):
            cost = disruption.cost(model.name, j)
            coefficients[i * count + j] = -cost if now == j else cost
        if now is not None:
            fixed += disruption.cost(model.name, now)
    return coefficients, fixed


def _assignment(x: np.ndarray, m: int, count: int) -> list[int]:
    return [int(np.argmax(x[i * count : (i + 1) * count])) for i in range(m)]


def _with(partition: Partition, method: str, greedy_objective: float | None, status: str, bound: float | None) -> Partition:
    """``partition`` labelled with how it was found."""
    return replace(partition, method=method, greedy_objective=greedy_objective, solver_status=status, solver_bound=bound)


def _partition(
    models: Sequence[ModelLoad], count: int, chosen: Sequence[int], weight: float, disruption: Disruption | None
) -> Partition:
    """The assignment ``chosen`` (model i -> sub-cluster) measured: per sub-cluster sums, the
    spreads (7) and (8) at their least, and what moved from the running assignment."""
    members: list[list[ModelLoad]] = [[] for _ in range(count)]
    for model, j in zip(models, chosen, strict=True):
        members[j].append(model)
    subs = tuple(
        SubCluster(
            j,
            tuple(m.name for m in group),
            sum(m.rate_rps for m in group),
            sum(m.static_mb for m in group),
            max((m.dynamic_mb for m in group), default=0.0),
        )
        for j, group in enumerate(members)
    )
    mean_rate = sum(m.rate_rps for m in models) / count
    mean_static = sum(m.static_mb for m in models) / count
    moved: list[str] = []
    cost = 0.0
    if disruption is not None:
        for model, j in zip(models, chosen, strict=True):
            now = disruption.current.get(model.name)
            if now != j:
                moved.append(model.name)
                cost += disruption.cost(model.name, j) + (disruption.cost(model.name, now) if now is not None else 0.0)
    return Partition(
        subs,
        max(abs(s.rate_rps - mean_rate) for s in subs),
        max(abs(s.static_mb - mean_static) for s in subs),
        weight,
        "assignment",
        None,
        "",
        tuple(moved),
        cost,
    )


# -- the greedy start ----------------------------------------------------------------------------
def greedy_partition(
    models: Sequence[ModelLoad],
    subclusters: int,
    capacity: Capacity,
    *,
    memory_weight: float | None = None,
    disruption: Disruption | None = None,
) -> Partition | None:
    """Largest first into the least loaded sub-cluster that still has room; None when it gets stuck.

    "Largest" weighs rate and static memory by their means (r / R_bar + s / S_bar); "least loaded"
    is the sub-cluster whose larger share of its mean, rate or memory, is the smallest once the
    model is in.
    With a running assignment, every model stays where it is (new models and those of retired
    sub-clusters are placed as above); then, while a sub-cluster exceeds (5) or (6), its largest
    model moves to the least loaded sub-cluster with room. None also when that exceeds C_max.
    """
    weight = default_memory_weight(models) if memory_weight is None else memory_weight
    mean_rate = sum(m.rate_rps for m in models) / subclusters or 1.0
    mean_static = sum(m.static_mb for m in models) / subclusters or 1.0

    def size(model: ModelLoad) -> float:
        return model.rate_rps / mean_rate + model.static_mb / mean_static

    rate = [0.0] * subclusters
    static = [0.0] * subclusters
    members: list[list[ModelLoad]] = [[] for _ in range(subclusters)]
    chosen: dict[str, int] = {}

    def fits(model: ModelLoad, j: int) -> bool:
        peak = max([model.dynamic_mb, *(m.dynamic_mb for m in members[j])])
        rate_fits = rate[j] + model.rate_rps <= capacity.max_rate_rps * (1 + TOLERANCE)
        return rate_fits and static[j] + model.static_mb + peak <= capacity.max_memory_mb * (1 + TOLERANCE)

    def load_with(model: ModelLoad, j: int) -> float:
        """The larger of sub-cluster j's rate and memory over their means once ``model`` is in."""
        return max((rate[j] + model.rate_rps) / mean_rate, (static[j] + model.static_mb) / mean_static)

    def put(model: ModelLoad, j: int) -> None:
        rate[j] += model.rate_rps
        static[j] += model.static_mb
        members[j].append(model)
        chosen[model.name] = j

    def place(model: ModelLoad, avoid: int = -1) -> bool:
        room = [j for j in range(subclusters) if j != avoid and fits(model, j)]
        if not room:
            return False
        put(model, min(room, key=lambda j: (load_with(model, j), j)))
        return True

    current = disruption.current if disruption is not None else {}
    staying = [m for m in models if current.get(m.name, subclusters) < subclusters]
    for model in staying:
        put(model, current[model.name])
    for model in sorted((m for m in models if m.name not in chosen), key=lambda m: (-size(m), m.name)):
        if not place(model):
            return None
    if disruption is not None and not _repair(members, rate, static, capacity, size, place):
        return None
    found = _partition(models, subclusters, [chosen[m.name] for m in models], weight, disruption)
    if disruption is not None and found.disruption_cost > disruption.max_cost * (1 + TOLERANCE):
        return None
    return found


def _repair(
    members: list[list[ModelLoad]],
    rate: list[float],
    static: list[float],
    capacity: Capacity,
    size: Callable[[ModelLoad], float],
    place: Callable[[ModelLoad, int], bool],
) -> bool:
    """Move the largest model out of each sub-cluster over (5) or (6) until none is; False when stuck."""

    def over(j: int) -> bool:
        memory = static[j] + max((m.dynamic_mb for m in members[j]), default=0.0)
        return rate[j] > capacity.max_rate_rps * (1 + TOLERANCE) or memory > capacity.max_memory_mb * (1 + TOLERANCE)

    for j in range(len(members)):
        while over(j):
            largest = max(members[j], key=size)
            members[j].remove(largest)
            rate[j] -= largest.rate_rps
            static[j] -= largest.static_mb
            if not place(largest, j):
                return False
    return True
