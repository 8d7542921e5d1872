"""Hand-made scenarios through the GPU scheduler on a fake clock, asserting the exact decisions."""

from __future__ import annotations

import itertools
import random

import pytest

from schedulers.admission import admissible
from schedulers.candidate import form_candidate
from schedulers.deficit import deficit
from schedulers.gpu import DUE_MARGIN_S, POLICIES, SHED_ABOVE_BAD_RATE, Dispatch, GpuScheduler, WaitUntil, gpu_can_finish
from schedulers.profiles import LatencyProfile
from schedulers.rate import ArrivalRate
from schedulers.request import Request, RequestQueue


def requests(model: str, arrivals: list[float], sla_s: float, first_id: int = 1) -> RequestQueue:
    return RequestQueue.of(Request(first_id + i, model, t, t + sla_s) for i, t in enumerate(arrivals))


def dispatched(decision) -> tuple[str, int]:
    assert isinstance(decision, Dispatch), decision
    return decision.model, decision.size


def linear(per_item_ms: float, fixed_ms: float) -> LatencyProfile:
    return LatencyProfile(per_item_ms, fixed_ms)


def test_the_model_with_the_largest_deficit_wins():
    scheduler = GpuScheduler("roma")
    scheduler.add_model("a", sla_ms=100, max_batch=8, profile=linear(1, 5))
    scheduler.add_model("b", sla_ms=100, max_batch=8, profile=linear(1, 5))
    now = 1.0
    # a's requests waited 10 ms, b's 85 ms: b is over its set point (80 ms), a is not.
    queues = {"a": requests("a", [0.99, 0.99], 0.1), "b": requests("b", [0.915], 0.1, first_id=10)}
    assert dispatched(scheduler.decide(now, "gpu:0", now, queues)) == ("b", 1)
    # Measured response times count too (ROMA's w = beta E + (1 - beta) R): a has been slow.
    for _ in range(5):
        scheduler.on_completed("a", 300.0)
    assert dispatched(scheduler.decide(now, "gpu:0", now, queues)) == ("a", 2)


def test_deficit_follows_algorithm_1():
    assert deficit(25, None, sla_ms=100) == 0.0  # under the 80 ms set point
    assert deficit(100, 140, sla_ms=100, queue_weight=0.5) == pytest.approx((120 - 80) / 80)


def test_a_candidate_below_beta_lambda_waits_until_sched_at():
    scheduler = GpuScheduler("deferral")
    profile = linear(1, 10)  # fixed cost beta = 10 ms
    scheduler.add_model("m", sla_ms=50, max_batch=16, profile=profile)
    # 1000 arrivals in the last second: beta x lambda = 10 ms x 1000/s = 10 requests.
    for i in range(1000):
        scheduler.on_arrival("m", 0.1 + i * 1e-6)
    now = 0.101
    queue = requests("m", [0.1, 0.1005], 0.05)
    decisions = scheduler.decide(now, "gpu:0", now, {"m": queue})
    sched_at = 0.15 - profile.latency_ms(3) / 1000  # deadline of the first - l(|reqs| + 1)
    assert decisions == WaitUntil(pytest.approx(sched_at))
    # At sched_at the same candidate goes.
    assert dispatched(scheduler.decide(sched_at, "gpu:0", sched_at, {"m": queue})) == ("m", 2)


@pytest.mark.parametrize("policy", ["deferral", "fair_deferral"])
def test_a_measured_profile_that_falls_with_the_batch_never_holds_a_candidate_past_its_last_start(policy):
    # l(2) measured under l(1) (each size's own p99; sizes padded to one batch shape cost alike):
    # sched_at = deadline - l(2) fell after invalid_after = deadline - l(1), and a lone request
    # on an idle GPU was held until it could no longer finish.
    scheduler = GpuScheduler(policy)
    profile = linear(1, 9)
    profile.observe(1, 10.0)
    profile.observe(2, 8.5)
    scheduler.add_model("m", sla_ms=50, max_batch=8, profile=profile)
    for i in range(1000):  # beta x lambda = 9 requests: Symphony's rule defers
        scheduler.on_arrival("m", 0.5 + i * 1e-4)
    queue = requests("m", [1.0], 0.05)
    decision = scheduler.decide(1.0, "gpu:0", 1.0, {"m": queue})
    assert isinstance(decision, WaitUntil) and decision.time <= 1.05 - 0.010 + 1e-9, decision
    latest = 1.05 - 0.010
    assert dispatched(scheduler.decide(latest, "gpu:0", latest, {"m": queue})) == ("m", 1)


def test_work_conserving_dispatches_at_once():
    scheduler = GpuScheduler("work_conserving")
    scheduler.add_model("m", sla_ms=50, max_batch=16, profile=linear(1, 10))
    for i in range(1000):
        scheduler.on_arrival("m", 0.1 + i * 1e-6)
    queue = requests("m", [0.1, 0.1005], 0.05)
    assert dispatched(scheduler.decide(0.101, "gpu:0", 0.101, {"m": queue})) == ("m", 2)


def test_infeasible_requests_are_pruned():
    scheduler = GpuScheduler("deferral")
    scheduler.add_model("m", sla_ms=20, max_batch=16, profile=linear(2, 6))
    now = 0.100
    # The GPU is free at 0.107. Request 1 (deadline 0.105) cannot finish even alone (l(1) = 8 ms);
    # of requests 2-4 only two fit before request 2's deadline 0.118 (0.107 + l(2) = 0.117,
    # 0.107 + l(3) = 0.119).
    queue = RequestQueue.of(
        [
            Request(1, "m", 0.085, 0.105),
            Request(2, "m", 0.098, 0.118),
            Request(3, "m", 0.099, 0.119),
            Request(4, "m", 0.0995, 0.1195),
        ]
    )
    decision = scheduler.decide(now, "gpu:0", now + 0.007, {"m": queue})
    # Request 1 is left out (the dispatch core refuses it if no other device can finish it);
    # pruned to two, the batch cannot grow: it goes.
    assert decision == Dispatch("m", "gpu:0", (queue[1], queue[2]), skip=1)
    # From a GPU free now all three fit (0.100 + l(3) = 0.112), and the batch may still grow.
    rest = RequestQueue.of(list(queue)[1:])
    candidate = form_candidate("m", rest, linear(2, 6), max_batch=16, now=now, start=now, arrival_rate=0, defer=True)
    assert candidate.size == 3 and candidate.skip == 0


def test_a_hopeless_request_is_refused_at_admission():
    gpu, cpu = linear(1, 30), linear(5, 40)
    late = Request(1, "m", 0.0, 0.020)  # 20 ms SLA; the fastest device needs 31 ms
    ok = Request(2, "m", 0.0, 0.050)
    fastest_ms = min(gpu.latency_ms(1), cpu.latency_ms(1))
    assert not admissible(late, 0.0, fastest_ms)
    assert admissible(ok, 0.0, fastest_ms)


def test_edf_takes_the_earliest_latest_start_as_clockwork_does():
    scheduler = GpuScheduler("edf")
    # a: deadline 0.100, l(1) = 60 ms, so it must start by 0.040; b: deadline 0.080, l(1) = 6 ms,
    # by 0.074. Clockwork orders by that latest start (Section 5.3): a first, though b's
    # deadline is earlier.
    scheduler.add_model("a", sla_ms=100, max_batch=8, profile=linear(50, 10))
    scheduler.add_model("b", sla_ms=75, max_batch=8, profile=linear(1, 5))
    queues = {"a": requests("a", [0.0], 0.1), "b": requests("b", [0.005], 0.075, first_id=5)}
    assert dispatched(scheduler.decide(0.011, "gpu:0", 0.011, queues)) == ("a", 1)


def test_profile_learns_a_rolling_high_percentile_and_fits_unseen_sizes():
    profile = LatencyProfile(per_item_ms=1.0, fixed_ms=5.0, window=3)
    assert profile.latency_ms(4) == 9.0  # the seed
    for latency in (10.0, 12.0, 11.0, 30.0):
        profile.observe(4, latency)  # the window keeps the last three: 12, 11, 30
    assert profile.latency_ms(4) == pytest.approx(30.0, rel=0.02)  # read at p99
    profile.observe(8, 40.0)
    # Two sizes measured: the fit through (4, ~30) and (8, 40) answers for 16.
    assert profile.latency_ms(16) == pytest.approx(40 + 8 * (40 - profile.latency_ms(4)) / 4, rel=1e-6)


def test_cpu_takes_only_what_the_gpu_cannot_finish():
    profile = linear(1, 9)  # a batch of 8 takes 17 ms
    soon = Request(1, "m", 0.0, 0.030)
    assert gpu_can_finish(soon, 0, now=0.0, gpu_free_at=0.020, profile=profile, max_batch=8)  # 20 + 10 ms
    assert not gpu_can_finish(soon, 0, now=0.0, gpu_free_at=0.021, profile=profile, max_batch=8)
    # Its own batch costs what it holds: the 8th request rides in a batch of 8 (17 ms), the
    # 9th waits for that batch, then rides in one of 1 (17 + 10 ms), the 17th in a third.
    assert gpu_can_finish(soon, 7, now=0.0, gpu_free_at=0.010, profile=profile, max_batch=8)
    assert gpu_can_finish(soon, 8, now=0.0, gpu_free_at=0.0, profile=profile, max_batch=8)
    assert not gpu_can_finish(soon, 8, now=0.0, gpu_free_at=0.005, profile=profile, max_batch=8)
    assert not gpu_can_finish(soon, 16, now=0.0, gpu_free_at=0.0, profile=profile, max_batch=8)
    # A GPU whose cost grows with the batch (no fixed cost): the head of a fresh queue is the
    # GPU's, though a full batch (8 x 16 ms) would not meet its 56 ms.
    per_item = linear(16, 0)
    fresh = Request(2, "m", 0.0, 0.056)
    assert gpu_can_finish(fresh, 0, now=0.0, gpu_free_at=0.0, profile=per_item, max_batch=8)
    assert gpu_can_finish(fresh, 2, now=0.0, gpu_free_at=0.0, profile=per_item, max_batch=8)
    assert not gpu_can_finish(fresh, 3, now=0.0, gpu_free_at=0.0, profile=per_item, max_batch=8)


def test_plain_percentile_and_fit_agree_with_numpy():
    import numpy as np

    from schedulers.profiles import fit_line, percentile

    samples = [12.0, 11.0, 30.0, 7.5, 9.25]
    for q in (0, 50, 90, 99, 100):
        assert percentile(samples, q) == pytest.approx(float(np.percentile(samples, q)))
    xs, ys = [1, 2, 4, 8], [3.1, 4.9, 9.2, 17.0]
    assert fit_line(xs, ys) == pytest.approx(tuple(np.polyfit(xs, ys, 1)))


def test_overload_drops_a_head_that_would_shrink_the_batch():
    profile = linear(1, 10)  # l(b) = b + 10 ms
    start = 0.0
    # The head can only go in a batch of one (11 ms of slack); the five behind it leave room for
    # a batch of five. Serving the head alone would waste a whole batch's fixed cost on it.
    queue = RequestQueue.of([Request(1, "m", -0.020, 0.011)] + [Request(i, "m", -0.01, 0.016) for i in range(2, 7)])
    candidate = form_candidate(
        "m", queue, profile, max_batch=16, now=start, start=start, arrival_rate=0, defer=True, drop_early=True
    )
    assert (candidate.hopeless, candidate.skip) == (0, 1)  # not hopeless: dropped early
    assert candidate.size == 5
    # With slack for the whole queue nothing is dropped.
    roomy = RequestQueue.of(Request(i, "m", 0.0, 0.050) for i in range(1, 7))
    candidate = form_candidate(
        "m", roomy, profile, max_batch=16, now=start, start=start, arrival_rate=0, defer=True, drop_early=True
    )
    assert candidate.skip == 0 and candidate.size == 6


def shedding_queue() -> RequestQueue:
    # l(b) = b + 10 ms from 0: the two oldest leave room for a batch of 2 (deadline 12 ms), the
    # three behind them for a batch of 3 (13 ms). Starting with the head serves 2; leaving out
    # the two oldest serves 3.
    return RequestQueue.of([Request(i, "m", -0.020, 0.012) for i in (1, 2)] + [Request(i, "m", -0.015, 0.013) for i in (3, 4, 5)])


def test_early_drop_leaves_out_the_head_for_a_larger_batch_only_where_what_it_leaves_out_is_lost_anyway():
    profile = linear(1, 10)
    for skip_cost, (skip, size) in ((1.0, (0, 2)), (0.0, (2, 3))):
        candidate = form_candidate(
            "m", shedding_queue(), profile, max_batch=16, now=0.0, start=0.0, arrival_rate=0, defer=True,
            drop_early=True, skip_cost=skip_cost,
        )  # fmt: skip
        # At cost 1 the batch of 3 serves one request net (3 - 2), less than the head's 2.
        assert (candidate.skip, candidate.size) == (skip, size), skip_cost


def test_the_default_sheds_at_the_head_only_under_a_sustained_overload():
    scheduler = GpuScheduler("fair_deferral")
    scheduler.add_model("m", sla_ms=100, max_batch=16, profile=linear(1, 10))
    scheduler.add_model("other", sla_ms=100, max_batch=16, profile=linear(1, 10))
    decision = scheduler.decide(0.0, "g", 0.0, {"m": shedding_queue()})
    assert (decision.skip, decision.size) == (0, 2)  # within 1% bad: a request left out is lost
    scheduler.on_completed("other", *[500.0] * 200)  # a burst of late answers is not yet a sustained overload
    assert scheduler.fairness.sustained < SHED_ABOVE_BAD_RATE < scheduler.fairness.overall
    decision = scheduler.decide(0.0, "g", 0.0, {"m": shedding_queue()})
    assert (decision.skip, decision.size) == (0, 2)
    scheduler.on_completed("other", *[500.0] * 1000)  # 1,200 late answers in a row: it is
    assert scheduler.fairness.sustained > SHED_ABOVE_BAD_RATE
    decision = scheduler.decide(0.0, "g", 0.0, {"m": shedding_queue()})
    assert (decision.skip, decision.size) == (2, 3)


def test_the_default_serves_the_candidate_that_expires_first():
    # Both candidates are due. "slow" (l(b) = 20 b + 5) has the earlier sched_at but can still
    # start 20 ms later; "quick" (l(b) = b + 5) expires 1 ms after its sched_at. Symphony's rule
    # (earliest sched_at) gives the GPU to slow, and quick misses; the default's least laxity
    # serves quick now, and slow still fits the next GPU.
    for policy, first in (("deferral", "slow"), ("fair_deferral", "quick")):
        scheduler = GpuScheduler(policy)
        scheduler.add_model("slow", sla_ms=100, max_batch=8, profile=linear(20, 5))
        scheduler.add_model("quick", sla_ms=100, max_batch=8, profile=linear(1, 5))
        queues = {
            "slow": requests("slow", [0.9745], 0.1),  # dl 1.0745: sched_at 1.0295, invalid_after 1.0495
            "quick": requests("quick", [0.9375], 0.1, first_id=10),  # dl 1.0375: sched_at 1.0305, invalid_after 1.0315
        }
        at = 1.031
        assert dispatched(scheduler.decide(at, "g", at, queues))[0] == first, policy


def test_the_default_serves_a_model_behind_on_its_bad_rate_first():
    scheduler = GpuScheduler("fair_deferral")
    scheduler.add_model("a", sla_ms=100, max_batch=8, profile=linear(1, 5))
    scheduler.add_model("b", sla_ms=100, max_batch=8, profile=linear(1, 5))
    now = 1.0
    # Both due (past sched_at); a expires first, so by laxity alone a goes.
    queues = {"a": requests("a", [0.91], 0.1), "b": requests("b", [0.915], 0.1, first_id=10)}
    assert dispatched(scheduler.decide(now, "g", now, queues)) == ("a", 1)
    # b has lost many requests lately while the others have not: it is behind, and goes first.
    for _ in range(200):
        scheduler.on_completed("a", 10.0)
    for _ in range(60):
        scheduler.on_refused("b", requests("b", [0.5], 0.1, first_id=99), now)
    assert scheduler.fairness.behind("b") and not scheduler.fairness.behind("a")
    assert dispatched(scheduler.decide(now, "g", now, queues)) == ("b", 1)


def test_the_default_makes_a_candidate_due_a_margin_before_its_sched_at():
    profile = linear(1, 10)
    for policy, margin in (("deferral", 0.0), ("fair_deferral", DUE_MARGIN_S)):
        scheduler = GpuScheduler(policy)
        scheduler.add_model("m", sla_ms=50, max_batch=16, profile=profile)
        now = 0.101
        queue = requests("m", [0.1, 0.1005], 0.05)
        sched_at = 0.15 - profile.latency_ms(3) / 1000
        # 1000 arrivals in the last second: beta x lambda = 10 requests holds the two back.
        for i in range(1000):
            scheduler.on_arrival("m", 0.1 + i * 1e-6)
        decision = scheduler.decide(now, "g", now, {"m": queue})
        assert decision == WaitUntil(pytest.approx(sched_at - margin)), policy
        assert dispatched(scheduler.decide(sched_at - margin, "g", sched_at - margin, {"m": queue})) == ("m", 2)


def test_an_arrival_grows_the_kept_candidate_as_forming_it_anew_would():
    profile = linear(1.5, 6)
    rng = random.Random(4)
    for policy in POLICIES:
        queue = RequestQueue()
        scheduler = GpuScheduler(policy)
        scheduler.add_model("m", sla_ms=30, max_batch=6, profile=profile, queue=queue)
        t = 0.0
        for i in range(300):
            t += rng.expovariate(400)
            request = Request(i, "m", t, t + 0.030)
            queue.append(request)
            scheduler.on_arrival("m", t, request)
            kept = scheduler.models["m"].candidate
            rate = scheduler.models["m"].rate.rows_per_second(t)
            defer, drop = policy in ("deferral", "fair_deferral"), policy == "fair_deferral"
            fresh = form_candidate(
                "m", queue, profile, max_batch=6, now=t, start=t, arrival_rate=rate, defer=defer, drop_early=drop
            )
            if kept is not None and kept.size and t <= kept.invalid_after:
                batch = list(itertools.islice(queue, kept.skip, kept.skip + kept.size))
                assert t + profile.latency_ms(sum(r.rows for r in batch)) / 1000 <= min(r.deadline for r in batch)
                if not drop:  # our early drop looks again only when the candidate is formed anew
                    assert (kept.skip, kept.size, kept.sched_at) == (fresh.skip, fresh.size, fresh.sched_at)
            if rng.random() < 0.3:  # a GPU takes the candidate now and then
                decision = scheduler.decide(t, "g", t)
                if isinstance(decision, Dispatch):
                    for r in decision.requests:  # those skipped at the head stay queued
                        queue.remove(r)
                    scheduler.on_queue_changed("m", t)


def test_a_refusal_counts_as_a_violation_in_the_deficit():
    scheduler = GpuScheduler("roma")
    scheduler.add_model("a", sla_ms=100, max_batch=8, profile=linear(1, 5))
    queue = requests("a", [0.99], 0.1)
    assert scheduler.model_deficit("a", queue, 1.0) == 0.0
    refused = requests("a", [0.5] * 3, 0.1, first_id=100)
    scheduler.on_refused("a", refused, 1.0)
    # R = mean(waited 500 ms + 6 ms), E = 10 + l(1): w = 0.5 x 16 + 0.5 x 506 = 261 ms against 80 ms.
    assert scheduler.model_deficit("a", queue, 1.0) == pytest.approx((261 - 80) / 80)


def test_round_robin_gives_the_models_turns_whatever_their_deficit():
    scheduler = GpuScheduler("round_robin")
    for name in ("a", "b", "c"):
        scheduler.add_model(name, sla_ms=100, max_batch=8, profile=linear(1, 5))
    now = 1.0
    # c is far behind its set point, a and b are not: turns still go a, b, c, a, ...
    queues = {
        "a": requests("a", [0.99], 0.1),
        "b": requests("b", [0.99], 0.1, first_id=10),
        "c": requests("c", [0.91], 0.1, first_id=20),
    }
    chosen = [scheduler.decide(now, "g", now, queues).model for _ in range(4)]
    assert chosen == ["a", "b", "c", "a"]
    # A model with nothing queued loses its turn to the next.
    assert scheduler.decide(now, "g", now, {"a": queues["a"], "c": queues["c"]}).model == "c"


def test_the_default_look_ahead_grows_with_a_late_round_trip_and_decays_back():
    profile = linear(1, 10)
    scheduler = GpuScheduler("fair_deferral")
    scheduler.add_model("m", sla_ms=50, max_batch=16, profile=profile)
    for i in range(1000):  # beta x lambda = 10 requests: a candidate of two waits for its sched_at
        scheduler.on_arrival("m", 0.1 + i * 1e-6)
    queue = requests("m", [0.1, 0.1005], 0.05)
    sched_at = 0.15 - profile.latency_ms(3) / 1000
    assert scheduler.decide(0.101, "g", 0.101, {"m": queue}) == WaitUntil(pytest.approx(sched_at - DUE_MARGIN_S))
    # A batch sent at 0.090 was refused late by its executor, seen at 0.094: 4 ms of round trip.
    scheduler.on_late(0.090, 0.094)
    assert scheduler.decide(0.101, "g", 0.101, {"m": queue}) == WaitUntil(pytest.approx(sched_at - 0.006))
    # Batches done in time bring it back to the floor.
    for _ in range(5000):
        scheduler.on_batch_done("m", 2, 12.0)
    assert scheduler.decide(0.101, "g", 0.101, {"m": queue}) == WaitUntil(pytest.approx(sched_at - DUE_MARGIN_S))
    # Symphony's deferral has no look-ahead to grow.
    symphony = GpuScheduler("deferral")
    symphony.add_model("m", sla_ms=50, max_batch=16, profile=profile)
    symphony.on_late(0.090, 0.094)
    for i in range(1000):
        symphony.on_arrival("m", 0.1 + i * 1e-6)
    assert symphony.decide(0.101, "g", 0.101, {"m": queue}) == WaitUntil(pytest.approx(sched_at))


@pytest.mark.timeout(10)
def test_a_batch_never_starts_with_a_request_of_many_rows_that_cannot_fit_alone():
    # l(b) = b + 5 ms. Behind a head of one row (deadline 7 ms) waits a request of 16 rows that
    # cannot finish in time even alone (21 ms against 20), then 18 single rows. The early drop
    # must not pick the 16 rows to start a batch: a candidate that expired before it formed
    # would be formed again and again.
    profile = linear(1, 5)
    queue = RequestQueue.of(
        [Request(1, "m", 0.0, 0.007), Request(2, "m", 0.0, 0.020, rows=16)] + [Request(i, "m", 0.0, 0.020) for i in range(3, 21)]
    )
    scheduler = GpuScheduler("fair_deferral")
    scheduler.add_model("m", sla_ms=20, max_batch=32, profile=profile, queue=queue)
    scheduler.on_queue_changed("m", 0.0)
    decision = scheduler.decide(0.0, "g", 0.0)
    assert isinstance(decision, Dispatch)
    rows = sum(r.rows for r in decision.requests)
    assert profile.latency_ms(rows) / 1000 <= min(r.deadline for r in decision.requests)
    assert all(r.rows == 1 for r in decision.requests)


@pytest.mark.parametrize("policy", ["deferral", "fair_deferral"])
def test_beta_lambda_counts_rows_as_the_batch_does(policy):
    # Symphony's lambda and its batch size share a unit (a request is one item there); here a
    # batch is sized in rows. 50 requests of 4 rows in the last second are 200 rows a second:
    # beta x lambda = 30 ms x 200/s = 6 rows, so one request of 4 rows waits to grow. Counted
    # in requests (1.5), it was schedulable at once, a batch of one on the GPU's fixed cost.
    queue, rate = RequestQueue(), ArrivalRate()
    scheduler = GpuScheduler(policy)
    scheduler.add_model("m", sla_ms=200, max_batch=32, profile=linear(1, 30), queue=queue, rate=rate)
    for i in range(49):
        rate.observe(0.02 * i, rows=4)  # served already
    now = 0.98
    request = Request(100, "m", now, now + 0.2, rows=4)
    queue.append(request)
    rate.observe(now, rows=4)
    scheduler.on_arrival("m", now, request)
    assert isinstance(scheduler.decide(now, "g", now), WaitUntil)
    # One request more, 8 rows of the 6: schedulable.
    later = Request(101, "m", now + 0.001, now + 0.201, rows=4)
    queue.append(later)
    rate.observe(now + 0.001, rows=4)
    scheduler.on_arrival("m", now + 0.001, later)
    assert dispatched(scheduler.decide(now + 0.001, "g", now + 0.001)) == ("m", 2)


def test_an_arrival_rate_counts_requests_and_their_rows_over_its_window():
    rate = ArrivalRate(window_s=1.0)
    for i, rows in enumerate([1, 4, 8, 3]):
        rate.observe(0.25 * i, rows)
    assert (rate.per_second(0.75), rate.rows_per_second(0.75), rate.rows_per_request(0.75)) == (4, 16, 4)
    # At 1.1 the arrival at 0 (1 row) has left the window; at 3 every one has.
    assert (rate.per_second(1.1), rate.rows_per_second(1.1), rate.rows_per_request(1.1)) == (3, 15, 5)
    assert (rate.per_second(3.0), rate.rows_per_second(3.0), rate.rows_per_request(3.0)) == (0, 0, 1)
