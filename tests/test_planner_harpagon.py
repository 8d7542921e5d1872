"""Harpagon's worked examples (Sections II, III-B, III-C, III-D) reproduced from Table I's profiles."""

import random

import pytest

from planner.configurations import (
    Configuration,
    Dispatch,
    batch_aware_latency,
    generate_config,
    leftover_rates,
    reassign_latency,
    round_robin_latency,
    two_tuple_config,
    with_dummy_requests,
)
from planner.latency_model import TableLatency
from planner.latency_split import harpagon_plan, latency_cost_efficiency, merged_groups, module_cost, split_latency
from planner.pipeline import Device, Path, Pipeline, Step
from planner.synthetic import random_pipeline

# Table I: (batch size, duration in seconds); all on one hardware of unit price 1.0.
TABLE_I = {
    "M1": ((2, 0.160), (4, 0.200), (8, 0.320)),
    "M2": ((2, 0.125), (4, 0.160), (8, 0.250)),
    "M3": ((2, 0.100), (8, 0.250), (32, 0.800)),
}


def profile(module: str) -> list[Configuration]:
    return [Configuration("gpu", 1.0, b, d) for b, d in TABLE_I[module]]


def shape(config_set):
    return [(a.configuration.batch, round(a.machines, 6), round(a.rate, 6)) for a in config_set.allocations]


def test_section_ii_m1_worst_case_latency_round_robin_against_batch_aware():
    m1 = profile("M1")
    assert [round(round_robin_latency(c, c.throughput), 6) for c in m1] == [0.32, 0.4, 0.64]
    assert [round(batch_aware_latency(c, 100), 6) for c in m1] == [0.18, 0.24, 0.4]
    # 100 req/s within 0.4 s: 5 machines of batch 4 under round-robin, 4 of batch 8 batch-aware.
    assert shape(two_tuple_config(100, 0.4, m1, Dispatch.ROUND_ROBIN)) == [(4, 5, 100)]
    assert shape(two_tuple_config(100, 0.4, m1, Dispatch.BATCH_AWARE)) == [(8, 4, 100)]


def test_table_ii_m3_at_198_requests_within_one_second():
    m3 = profile("M3")
    s1 = two_tuple_config(198, 1.0, m3, Dispatch.ROUND_ROBIN)
    s2 = two_tuple_config(198, 1.0, m3, Dispatch.BATCH_AWARE)
    s3 = generate_config(198, 1.0, m3)
    s4 = with_dummy_requests(198, 1.0, m3)
    assert [round(s.cost, 6) for s in (s1, s2, s3, s4)] == [6.3, 5.9, 5.3, 5.0]
    assert shape(s1) == [(8, 6, 192), (2, 0.3, 6)]
    assert shape(s2) == [(32, 4, 160), (2, 1, 20), (2, 0.9, 18)]  # Table II's 38 (1.9 x 2)
    assert shape(s3) == [(32, 4, 160), (8, 1, 32), (2, 0.3, 6)]
    assert shape(s4) == [(32, 5, 200)] and s4.dummy_rate == pytest.approx(2.0)
    for s in (s2, s3, s4):
        assert s.worst_case_latency_s <= 1.0


def test_section_iii_c_leftover_workload_of_batch_32_is_38():
    s3 = generate_config(198, 1.0, profile("M3"))
    leftover = {c.batch: round(u, 6) for c, u in leftover_rates(s3).items()}
    assert leftover == {32: 38, 8: 6, 2: 0}


def test_dummy_requests_that_do_not_help_are_not_added():
    # 200 req/s already fills five machines of batch 32: nothing to pad.
    s = with_dummy_requests(200, 1.0, profile("M3"))
    assert s.dummy_rate == 0 and round(s.cost, 6) == 5.0


def test_section_iii_b_m4_theorem_1_worst_case():
    a = Configuration("gpu", 1.0, 6, 2.0)
    c = Configuration("gpu", 1.0, 2, 1.0)
    assert (a.throughput_cost_ratio, c.throughput_cost_ratio) == (3.0, 2.0)
    assert batch_aware_latency(a, 8.0) == 2.75  # remaining workload 3 + 3 + 2
    assert batch_aware_latency(c, 2.0) == 2.0


def test_section_iii_d_latency_cost_efficiency_of_m1():
    m1 = profile("M1")
    assert module_cost(m1[0], 100) == pytest.approx(8.0)
    assert round(latency_cost_efficiency(m1[0], m1[1], 100), 1) == 50.0
    assert round(latency_cost_efficiency(m1[0], m1[2], 100), 1) == 18.2


def table_pipeline(modules: list[str], sla_s: float, rate: float) -> Pipeline:
    steps = tuple(Step(m, (Device("gpu", 1.0, TableLatency(TABLE_I[m]), tuple(b for b, _ in TABLE_I[m])),)) for m in modules)
    edges = tuple(zip(modules, modules[1:], strict=False))
    return Pipeline(steps, edges, (Path(tuple(modules), sla_s),), rate)


def test_algorithm_2_spends_the_slo_where_it_saves_most_and_stays_within_it():
    pipeline = table_pipeline(["M1", "M2"], 0.6, 100)
    split = split_latency(pipeline)
    used = sum(batch_aware_latency(c, 100) for c in split.values())
    assert used <= 0.6 + 1e-9
    start = sum(module_cost(profile(m)[0], 100) for m in ("M1", "M2"))
    assert sum(module_cost(c, 100) for c in split.values()) < start
    # No single further move fits: every costlier-latency configuration would break the SLO.
    for name, config in split.items():
        for other in profile(name):
            if module_cost(other, 100) < module_cost(config, 100):
                assert used - batch_aware_latency(config, 100) + batch_aware_latency(other, 100) > 0.6 + 1e-9


def test_harpagon_plan_meets_the_slo_with_its_own_worst_case():
    plan = harpagon_plan(table_pipeline(["M1", "M2", "M3"], 1.2, 198))
    assert plan is not None
    assert max(plan.path_latencies_s) <= 1.2 + 1e-9
    assert plan.whole_machine_cost >= plan.cost


def test_latency_reassigner_gives_unused_latency_to_the_residual_only_where_it_pays():
    m3 = profile("M3")
    # 198 req/s within 0.5 s: six machines of batch 8 and 6 req/s on batch 2 (0.3 machines).
    tight = generate_config(198, 0.5, m3)
    assert shape(tight) == [(8, 6, 192), (2, 0.3, 6)]
    # 0.9 s more is not enough for batch 8 to collect 8 requests at 6 req/s (0.25 + 8/6 = 1.58 s).
    assert reassign_latency(tight, 198, 0.9, 0.5, m3) is tight
    # 1.2 s more is: the residual moves to batch 8, 6/32 of a machine instead of 0.3.
    relaxed = reassign_latency(tight, 198, 1.2, 0.5, m3)
    assert shape(relaxed) == [(8, 6, 192), (8, 0.1875, 6)]
    assert relaxed.cost == pytest.approx(6 + 6 / 32)


def test_cost_direct_never_costs_more_than_latency_cost_efficiency_alone_and_sometimes_less():
    savings = []
    for seed in range(30):
        pipeline = random_pipeline(random.Random(seed), 3, join_probability=0.0)
        rates = {s.name: pipeline.step_rate(s.name) for s in pipeline.steps}

        def total(split, rates=rates):
            return sum(module_cost(c, rates[m]) for m, c in split.items())

        by_lc, with_direct = total(split_latency(pipeline, 0)), total(split_latency(pipeline, 3))
        assert with_direct <= by_lc + 1e-12
        savings.append(by_lc - with_direct)
    assert max(savings) > 0


def test_node_merging_groups_modules_of_the_same_parents_and_children():
    device = Device("gpu", 1.0, TableLatency(TABLE_I["M1"]), (2, 4, 8))
    steps = tuple(Step(n, (device,)) for n in ("mx", "my", "mz", "mw"))
    edges = (("mx", "my"), ("mx", "mz"), ("mx", "mw"), ("mw", "my"))
    paths = (Path(("mx", "my"), 2.0), Path(("mx", "mz"), 2.0), Path(("mx", "mw", "my"), 2.0))
    pipeline = Pipeline(steps, edges, paths, 100)
    # my has parents {mx, mw}; mz and mw both have parent mx, but mw has a child: no group.
    assert merged_groups(pipeline) == []
    fork = Pipeline(steps[:3], edges[:2], paths[:2], 100)
    assert merged_groups(fork) == [("my", "mz")]
    for merging in (True, False):
        split = split_latency(fork, node_merging=merging)
        assert all(batch_aware_latency(split["mx"], 100) + batch_aware_latency(split[m], 100) <= 2.0 + 1e-9 for m in ("my", "mz"))
