"""Symphony's epoch partitioning (Section 4.7, Appendix A): the MILP's constraints hold, the
solver never does worse than its greedy start, infeasibility is said, the disruption bound (11)
limits the moves, and the GPUs are split in proportion to demand."""

from __future__ import annotations

import random

import pytest

from gateway.tools.simulate import zoo_arrivals
from schedulers.partition import (
    Capacity,
    Disruption,
    InfeasiblePartition,
    ModelLoad,
    fewest_subclusters,
    gpu_demand,
    greedy_partition,
    largest_batch_within_slo,
    partition_fewest,
    partition_models,
    split_gpus,
)

LOOSE = Capacity(max_rate_rps=1e9, max_memory_mb=1e9)
TIME_LIMIT_S = 5.0  # the small instances here solve to optimality in well under a second
QUICK_LIMIT_S = 0.5  # random instances: the solver's best in this time is all a test needs


def model(name: str, rate: float = 1.0, static: float = 1.0, dynamic: float = 0.0) -> ModelLoad:
    return ModelLoad(name, rate, static, dynamic)


def random_models(n: int, seed: int) -> list[ModelLoad]:
    rng = random.Random(seed)
    return [model(f"m{i}", rng.expovariate(1 / 100), rng.uniform(10, 500), rng.uniform(0, 200)) for i in range(n)]


def groups(partition) -> list[set[str]]:
    return sorted((set(sub.models) for sub in partition.subclusters), key=sorted)


# -- (9) and (10): each model in exactly one sub-cluster -----------------------------------------
def test_every_model_is_in_exactly_one_subcluster():
    models = random_models(30, seed=1)
    partition = partition_models(models, 4, LOOSE, time_limit_s=QUICK_LIMIT_S)
    placed = [name for sub in partition.subclusters for name in sub.models]
    assert sorted(placed) == sorted(m.name for m in models)
    assert len(partition.subclusters) == 4
    assert set(partition.assignment()) == {m.name for m in models}


# -- (5) and (6): the capacities --------------------------------------------------------------------
def test_rate_and_memory_capacities_hold_and_memory_counts_the_largest_dynamic_need_once():
    # A and B each need 60 MB at run time but run one at a time: together they need 10 + 10 + 60.
    # A (or B) with C would need 10 + 40 + 60 = 110 > 100, so the only answer is {A, B}, {C, D};
    # summing the dynamic needs instead of taking their max would call it infeasible.
    models = [model("A", 5, 10, 60), model("B", 5, 10, 60), model("C", 5, 40, 0), model("D", 5, 40, 0)]
    capacity = Capacity(max_rate_rps=10, max_memory_mb=100)
    partition = partition_models(models, 2, capacity, time_limit_s=TIME_LIMIT_S)
    assert groups(partition) == [{"A", "B"}, {"C", "D"}]
    for sub in partition.subclusters:
        assert sub.rate_rps <= capacity.max_rate_rps
        assert sub.memory_mb <= capacity.max_memory_mb
    memory = {frozenset(sub.models): sub.memory_mb for sub in partition.subclusters}
    assert memory == {frozenset("AB"): 80.0, frozenset("CD"): 80.0}


def test_a_tight_rate_capacity_is_respected_on_a_larger_instance():
    models = random_models(24, seed=2)
    total = sum(m.rate_rps for m in models)
    capacity = Capacity(max_rate_rps=1.08 * total / 3, max_memory_mb=1e9)
    partition = partition_models(models, 3, capacity, time_limit_s=QUICK_LIMIT_S)
    assert all(sub.rate_rps <= capacity.max_rate_rps * (1 + 1e-9) for sub in partition.subclusters)


# -- what cannot be done is said ------------------------------------------------------------------------
def test_a_model_too_large_for_one_gpu_is_reported_by_name():
    with pytest.raises(InfeasiblePartition, match=r"\(6\): big alone needs 120 MB"):
        partition_models([model("big", 1, 100, 20), model("small")], 2, Capacity(10, 100))


def test_more_rate_than_the_dispatchers_can_take_is_reported_with_the_count_needed():
    models = [model(f"m{i}", rate=6) for i in range(4)]  # 24 requests/s, 10 per dispatcher
    with pytest.raises(InfeasiblePartition, match="use at least 3 sub-clusters"):
        partition_models(models, 2, Capacity(10, 1e9))


def test_an_instance_only_the_solver_can_prove_infeasible_is_reported_not_answered_wrongly():
    # 180 MB of weights fit 2 x 100 MB in total, but any two of the three 60 MB models share a GPU.
    models = [model(name, 1, 60, 0) for name in "XYZ"]
    with pytest.raises(InfeasiblePartition, match="no assignment of 3 models to 2 sub-clusters"):
        partition_models(models, 2, Capacity(10, 100), time_limit_s=TIME_LIMIT_S)
    assert fewest_subclusters(models, Capacity(10, 100)) == 2
    assert len(partition_fewest(models, Capacity(10, 100), time_limit_s=TIME_LIMIT_S).subclusters) == 3


# -- (4): the solver against its greedy start -------------------------------------------------------------
def test_the_solver_beats_a_greedy_start_that_is_suboptimal():
    # Largest first: 3 | 3, then 2 on the first, 2 on the second, 2 on the first: rates 7 and 5.
    # The optimum is {3, 3} and {2, 2, 2}: rates 6 and 6 (the model counts, 2 and 3, differ either way).
    models = [model("a", 3), model("b", 3), model("c", 2), model("d", 2), model("e", 2)]
    greedy = greedy_partition(models, 2, LOOSE)
    assert greedy is not None and greedy.rate_spread_rps == pytest.approx(1.0)
    partition = partition_models(models, 2, LOOSE, time_limit_s=TIME_LIMIT_S)
    assert partition.method == "milp"
    assert partition.greedy_objective == pytest.approx(greedy.objective)
    assert partition.objective < greedy.objective
    assert partition.rate_spread_rps == pytest.approx(0.0, abs=1e-6)
    assert groups(partition) == [{"a", "b"}, {"c", "d", "e"}]


def test_the_solver_is_never_worse_than_the_greedy_start():
    for seed in range(3):
        models = random_models(20, seed=10 + seed)
        greedy = greedy_partition(models, 3, LOOSE)
        partition = partition_models(models, 3, LOOSE, time_limit_s=QUICK_LIMIT_S)
        assert greedy is not None
        assert partition.objective <= greedy.objective * (1 + 1e-6)


# -- (11): the disruption bound ------------------------------------------------------------------------
def test_the_disruption_bound_limits_the_models_moved():
    # All the busy models sit in sub-cluster 0: balance wants four moves (two 4s out, two 1s in).
    models = [model(f"busy{i}", 4) for i in range(4)] + [model(f"idle{i}", 1) for i in range(4)]
    current = {m.name: 0 if m.name.startswith("busy") else 1 for m in models}
    free = partition_models(models, 2, LOOSE, time_limit_s=TIME_LIMIT_S)
    moved_free = sum(current[name] != j for name, j in free.assignment().items())
    assert free.objective == pytest.approx(0.0, abs=1e-6) and moved_free >= 4

    one_move = partition_models(models, 2, LOOSE, disruption=Disruption(current, max_cost=2), time_limit_s=TIME_LIMIT_S)
    assert len(one_move.moved) == 1 and one_move.disruption_cost == 2  # unload and load: c_ij = 1 each
    assert one_move.moved[0].startswith("busy")  # the one move that helps: rates 12 and 8 instead of 16 and 4

    stay = partition_models(models, 2, LOOSE, disruption=Disruption(current, max_cost=0), time_limit_s=TIME_LIMIT_S)
    assert stay.moved == () and stay.assignment() == current


def test_a_new_model_costs_its_load_and_a_retired_subcluster_its_unloads():
    models = [model("kept", 1), model("new", 1), model("orphan", 1)]
    current = {"kept": 0, "orphan": 5}  # sub-cluster 5 is gone: "orphan" must unload from it and load
    partition = partition_models(models, 2, LOOSE, disruption=Disruption(current, max_cost=3), time_limit_s=TIME_LIMIT_S)
    assert set(partition.moved) == {"new", "orphan"} and partition.disruption_cost == 3
    with pytest.raises(InfeasiblePartition):
        partition_models(models, 2, LOOSE, disruption=Disruption(current, max_cost=2), time_limit_s=TIME_LIMIT_S)


# -- GPUs per sub-cluster ---------------------------------------------------------------------------------
def test_the_gpu_split_sums_to_the_cluster_and_gives_each_subcluster_one():
    assert split_gpus([3.0, 1.0], 8) == [6, 2]
    assert split_gpus([10.0, 1.0, 0.0], 10) == [8, 1, 1]
    rng = random.Random(3)
    for _ in range(200):
        demands = [rng.expovariate(1.0) * rng.choice((0, 1, 1, 1)) for _ in range(rng.randint(1, 12))]
        gpus = rng.randint(len(demands), 300)
        split = split_gpus(demands, gpus)
        assert sum(split) == gpus and min(split) >= 1
        total = sum(demands)
        if total:  # largest remainders: within one GPU of the quota, save where the floor of 1 lifts it
            assert all(count <= max(1, gpus * d / total + 1) for count, d in zip(split, demands, strict=True))
    with pytest.raises(InfeasiblePartition):
        split_gpus([1.0, 1.0, 1.0], 2)


def test_gpu_demand_is_the_rate_times_l_of_the_largest_batch_within_the_slo_per_request():
    # ResNet50 on a 1080Ti (Symphony Table 5): alpha 2.050, beta 5.378 ms, SLO 27 ms: B = 10, l(10) = 25.878 ms.
    assert largest_batch_within_slo(2.050, 5.378, 27) == 10
    assert gpu_demand(1000.0, 2.050, 5.378, 27) == pytest.approx(2.5878)
    with pytest.raises(ValueError):
        gpu_demand(1.0, 10.0, 20.0, 25.0)


# -- what the benchmark's comparison rests on ----------------------------------------------------------
def test_a_subclusters_arrivals_are_the_whole_trace_restricted_to_its_models():
    rates = {f"m{i}": 50.0 + 10 * i for i in range(6)}
    whole = zoo_arrivals(rates, 0.3, 2.0, random.Random(7))
    mine = {"m1", "m4"}
    part = zoo_arrivals({n: r if n in mine else 0.0 for n, r in rates.items()}, 0.3, 2.0, random.Random(7))
    assert part == [(t, n) for t, n in whole if n in mine]
