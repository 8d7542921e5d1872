"""Our planner against the exhaustive search on small pipelines: chains, a shared node (fork) and a
join, random cases with fixed seeds; the baselines' plans meet the SLAs and never beat it."""

import random

import pytest

from planner.brute_force import brute_force_plan
from planner.dag_program import fa2_plan
from planner.latency_model import LatencyModel
from planner.pipeline import Device, Path, Pipeline, Step
from planner.plan import even_split_plan, plan_pipeline
from planner.step_options import all_choices, frontier
from planner.synthetic import random_pipeline

BATCHES = (1, 2, 4, 8)


def devices(rng: random.Random) -> tuple[Device, ...]:
    per_item, fixed = rng.uniform(0.004, 0.02), rng.uniform(0.002, 0.01)
    return (
        Device("cpu-2", 2.0, LatencyModel.linear(per_item, fixed), BATCHES),
        Device("gpu", 10.0, LatencyModel(rng.uniform(1e-5, 1e-4), rng.uniform(5e-4, 2e-3), rng.uniform(0.004, 0.012)), BATCHES),
    )


def build(rng: random.Random, names: list[str], edges, routes) -> Pipeline:
    rate = rng.uniform(20, 300)
    steps = tuple(Step(n, devices(rng)) for n in names)
    by_name = {s.name: s for s in steps}
    paths = tuple(
        Path(r, sum(min(d.latency.duration(1) for d in by_name[s].devices) + 1 / rate for s in r) * rng.uniform(1.5, 5.0))
        for r in routes
    )
    return Pipeline(steps, tuple(edges), paths, rate)


def chain(rng, length):
    names = [f"m{i}" for i in range(length)]
    return build(rng, names, list(zip(names, names[1:], strict=False)), [tuple(names)])


def fork(rng):
    """m0 is shared by two paths of different SLAs."""
    return build(rng, ["m0", "m1", "m2"], [("m0", "m1"), ("m0", "m2")], [("m0", "m1"), ("m0", "m2")])


def diamond(rng):
    """m0 and m3 are shared; m3 is a join."""
    edges = [("m0", "m1"), ("m0", "m2"), ("m1", "m3"), ("m2", "m3")]
    return build(rng, ["m0", "m1", "m2", "m3"], edges, [("m0", "m1", "m3"), ("m0", "m2", "m3")])


CASES = [("chain2", lambda r: chain(r, 2)), ("chain3", lambda r: chain(r, 3)), ("fork", fork)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("kind", "make"), CASES, ids=[c[0] for c in CASES])
def test_plan_costs_the_exhaustive_optimum(kind, make, seed):
    pipeline = make(random.Random(seed))
    optimum = brute_force_plan(pipeline, prune=False)  # every device, batch size and instance count
    plan = plan_pipeline(pipeline)
    assert (plan is None) == (optimum is None)
    if optimum is not None:
        assert plan.feasible
        assert plan.cost == pytest.approx(optimum.cost)


@pytest.mark.parametrize("seed", range(8))
def test_plan_costs_the_optimum_on_a_four_step_chain_and_a_join(seed):
    for pipeline in (chain(random.Random(seed), 4), diamond(random.Random(seed))):
        optimum = brute_force_plan(pipeline)
        plan = plan_pipeline(pipeline)
        assert (plan is None) == (optimum is None)
        if optimum is not None:
            assert plan.feasible
            assert plan.cost == pytest.approx(optimum.cost)


@pytest.mark.parametrize("seed", range(4))
def test_pruned_search_finds_the_same_optimum_as_the_plain_one(seed):
    for pipeline in (chain(random.Random(seed), 3), fork(random.Random(seed + 10))):
        plain, pruned = brute_force_plan(pipeline, prune=False), brute_force_plan(pipeline)
        assert (plain is None) == (pruned is None)
        if plain is not None:
            assert pruned.cost == pytest.approx(plain.cost)


def test_plan_reports_each_paths_worst_case_as_the_sum_of_its_steps():
    pipeline = fork(random.Random(4))
    plan = plan_pipeline(pipeline)
    for path in plan.paths:
        assert path.worst_case_s == pytest.approx(sum(plan.choices[s].latency_s for s in path.steps))
        assert path.worst_case_s <= path.sla_s + 1e-9
    prices = {d.name: d.price for step in pipeline.steps for d in step.devices}
    assert plan.cost == pytest.approx(sum(c.instances * prices[c.device] for c in plan.choices.values()))
    for c in plan.choices.values():  # the fewest instances whose throughput covers the rate
        device = next(d for d in pipeline.step(c.step).devices if d.name == c.device)
        per_instance = device.latency.throughput(c.batch)
        assert c.instances * per_instance >= pipeline.rate * (1 - 1e-9)
        assert (c.instances - 1) * per_instance < pipeline.rate


def test_no_plan_where_even_the_fastest_configurations_miss_the_sla():
    pipeline = chain(random.Random(1), 3)
    tight = Pipeline(pipeline.steps, pipeline.edges, (Path(pipeline.paths[0].steps, 0.001),), pipeline.rate)
    assert plan_pipeline(tight) is None and brute_force_plan(tight) is None


@pytest.mark.parametrize("seed", range(5))
def test_even_split_keeps_every_step_within_its_share(seed):
    pipeline = chain(random.Random(seed), 3)
    plan = even_split_plan(pipeline)
    if plan is not None:
        share = pipeline.paths[0].sla_s / 3
        assert all(c.latency_s <= share + 1e-9 for c in plan.choices.values())
        assert plan.cost >= brute_force_plan(pipeline).cost - 1e-9


def test_frontier_keeps_only_undominated_configurations():
    pipeline = chain(random.Random(2), 2)
    everything = all_choices(pipeline, "m0")
    kept = frontier(everything)
    for c in everything:
        assert any(k.latency_s <= c.latency_s and k.cost <= c.cost for k in kept)
    for a, b in zip(kept, kept[1:], strict=False):
        assert a.latency_s <= b.latency_s and a.cost > b.cost


@pytest.mark.parametrize("seed", range(10))
def test_plan_costs_the_optimum_on_random_five_and_six_step_dags(seed):
    rng = random.Random(seed)
    pipeline = random_pipeline(rng, rng.randint(5, 6), join_probability=0.5)
    optimum = brute_force_plan(pipeline)
    plan = plan_pipeline(pipeline)
    assert (plan is None) == (optimum is None)
    if optimum is not None:
        assert plan.feasible
        assert plan.cost == pytest.approx(optimum.cost)


# FA2's Table III: the application's execution paths and their CPU SLAs in ms. QUAN is a join of
# ALPR, SUMR and AUTT; the path SUMR -> QUAN starts at SUMR, which AUTT feeds. The paper gives no
# latency profiles, so the steps' models here are random.
FA2_TABLE_III_CPU = (
    (("OBJD", "ALPR", "QUAN"), 3020),
    (("OBJD", "NSFW", "FACR"), 3505),
    (("OBJD", "OBJR", "IMGS"), 3095),
    (("SUMR", "QUAN"), 13580),
    (("AUTT", "QUAN"), 12245),
    (("AUTT", "SUMR", "TCLS"), 25710),
)


def fa2_application(rng: random.Random, ms_to_s: float) -> Pipeline:
    names = sorted({n for route, _ in FA2_TABLE_III_CPU for n in route})
    edges = sorted({pair for route, _ in FA2_TABLE_III_CPU for pair in zip(route, route[1:], strict=False)})
    steps = tuple(Step(n, devices(rng)) for n in names)
    paths = tuple(Path(route, sla * ms_to_s) for route, sla in FA2_TABLE_III_CPU)
    return Pipeline(steps, tuple(edges), paths, rng.uniform(20, 300))


@pytest.mark.parametrize("seed", range(4))
def test_fa2_table_iii_application_planned_at_the_optimum(seed):
    # Table III's SLAs scaled so that the paths are tight for these models (3020 ms -> 45 ms).
    pipeline = fa2_application(random.Random(seed), 0.015 / 1000)
    optimum = brute_force_plan(pipeline)
    plan = plan_pipeline(pipeline)
    assert optimum is not None
    assert plan.feasible
    assert plan.cost == pytest.approx(optimum.cost)
    fa2 = fa2_plan(pipeline)
    if fa2 is not None:
        assert fa2.feasible and fa2.cost >= optimum.cost - 1e-9
