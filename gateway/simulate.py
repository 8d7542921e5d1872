"""``gateway simulate``: the GPU scheduler on a virtual clock against emulated GPUs.

The very scheduler objects that ``gateway serve`` drives (schedulers/) run here against GPUs
that take exactly l(b) = alpha b + beta for a batch of b (Symphony's authors emulated GPUs the
same way), with open-loop arrivals per model: Poisson, or Gamma gaps with a shape s and scale
1 / (s x rate), so the mean gap is 1 / rate and the coefficient of variation 1 / sqrt(s)
(Symphony Section 4.3; smaller shapes are burstier). Models come from a zoo CSV such as
../shared/data/symphony_zoo_1080ti.csv (model, alpha_ms, beta_ms, slo_ms); the offered load is
split evenly over them.

Per policy it reports goodput (requests answered within their SLO, per second), the bad rate
(refused or late, over all), the batch-size distribution, the GPU idle fraction, and the
scheduler's own throughput (requests scheduled per second of the one core it runs on).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schedulers.candidate import QueuedRequest
from schedulers.gpu import POLICIES, Dispatch, GpuScheduler, Refuse, WaitUntil
from schedulers.profiles import LatencyProfile

# Batches are limited by the deadlines (pruning), not by a configured size.
MAX_BATCH = 512


@dataclass(frozen=True)
class ZooModel:
    name: str
    per_item_ms: float
    fixed_ms: float
    slo_ms: float

    def latency_ms(self, rows: int) -> float:
        return self.per_item_ms * rows + self.fixed_ms


def load_zoo(path: Path) -> list[ZooModel]:
    with path.open() as handle:
        return [
            ZooModel(row["model"], float(row["alpha_ms"]), float(row["beta_ms"]), float(row["slo_ms"]))
            for row in csv.DictReader(handle)
        ]


def gamma_arrivals(rate: float, shape: float | None, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times over [0, duration): Poisson when shape is None, else Gamma(shape, 1/(shape rate)) gaps."""
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate) if shape is None else rng.gammavariate(shape, 1.0 / (shape * rate))
        if t >= duration_s:
            return times
        times.append(t)


def simulate(
    zoo: list[ZooModel], gpus: int, rate: float, shape: float | None, policy: str, duration_s: float, seed: int = 0
) -> dict[str, Any]:
    rng = random.Random(seed)
    scheduler = GpuScheduler(policy)
    for model in zoo:
        scheduler.add_model(model.name, model.slo_ms, MAX_BATCH, LatencyProfile(model.per_item_ms, model.fixed_ms))
    per_model = {m.name: m for m in zoo}
    events: list[tuple[float, int, str, Any]] = []
    sequence = 0

    def push(at: float, kind: str, payload: Any) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (at, sequence, kind, payload))

    request_id = 0
    for model in zoo:
        for t in gamma_arrivals(rate / len(zoo), shape, duration_s, rng):
            request_id += 1
            push(t, "arrival", QueuedRequest(request_id, model.name, t, t + model.slo_ms / 1000))
    total = request_id
    queues: dict[str, deque[QueuedRequest]] = {m.name: deque() for m in zoo}
    idle = {f"gpu{i}": 0.0 for i in range(gpus)}  # gpu -> idle since
    idle_time = 0.0
    good = late = refused = 0
    good_by_model = {m.name: 0 for m in zoo}
    batch_sizes: list[int] = []
    scheduler_s = 0.0
    wake_at = float("inf")

    def dispatch(now: float) -> None:
        nonlocal idle_time, refused, wake_at, scheduler_s
        while idle:
            gpu = next(iter(idle))
            started = time.perf_counter()
            decisions = scheduler.decide(now, gpu, now, {name: list(q) for name, q in queues.items() if q})
            scheduler_s += time.perf_counter() - started
            progressed = False
            for decision in decisions:
                if isinstance(decision, Refuse):
                    drop = {r.id for r in decision.requests}
                    scheduler.on_refused(decision.model, decision.requests, now)
                    queue = queues[decision.model]
                    while queue and queue[0].id in drop:
                        queue.popleft()
                        refused += 1
                    progressed = True
                elif isinstance(decision, Dispatch):
                    queue = queues[decision.model]
                    batch = [queue.popleft() for _ in range(decision.size)]
                    rows = sum(r.rows for r in batch)
                    idle_time += now - idle.pop(gpu)
                    finish = now + per_model[decision.model].latency_ms(rows) / 1000
                    batch_sizes.append(rows)
                    push(finish, "done", (gpu, decision.model, batch, rows))
                    progressed = True
                elif isinstance(decision, WaitUntil) and decision.time < wake_at:
                    wake_at = decision.time
                    push(decision.time, "wake", None)
            if not any(isinstance(d, Dispatch) for d in decisions) and not progressed:
                return
            if not any(isinstance(d, Dispatch) for d in decisions):
                continue  # refusals only: look again with the same GPU

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrival":
            queues[payload.model].append(payload)
            started = time.perf_counter()
            scheduler.on_arrival(payload.model, now)
            scheduler_s += time.perf_counter() - started
        elif kind == "done":
            gpu, model, batch, rows = payload
            idle[gpu] = now
            scheduler.on_batch_done(model, rows, per_model[model].latency_ms(rows))
            for request in batch:
                scheduler.on_completed(model, (now - request.arrival) * 1000)
                if now <= request.deadline + 1e-9:
                    good += 1
                    good_by_model[model] += 1
                else:
                    late += 1
        elif kind == "wake":
            if now < wake_at:
                continue
            wake_at = float("inf")
        dispatch(now)
    end = max(duration_s, now if events is not None else duration_s)
    idle_time += sum(end - since for since in idle.values())
    left = sum(len(q) for q in queues.values())
    sizes = np.asarray(batch_sizes) if batch_sizes else np.zeros(1)
    return {
        "policy": policy,
        "shape": shape,
        "offered_rps": rate,
        "requests": total,
        "goodput_rps": good / duration_s,
        "bad_rate": (late + refused + left) / total if total else 0.0,
        "late": late,
        "refused": refused,
        "batch_mean": float(sizes.mean()),
        "batch_p50": float(np.percentile(sizes, 50)),
        "batch_p90": float(np.percentile(sizes, 90)),
        "gpu_idle_fraction": idle_time / (gpus * end),
        "scheduled_per_core_s": total / scheduler_s if scheduler_s else float("inf"),
        "goodput_by_model_rps": {name: count / duration_s for name, count in good_by_model.items()},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zoo", type=Path, required=True, help="CSV with model, alpha_ms, beta_ms, slo_ms")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rate", type=float, required=True, help="offered load, requests/s over all models")
    parser.add_argument("--shape", type=float, default=None, help="Gamma shape of the arrival gaps (default: Poisson)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--duration", type=float, default=10.0, help="virtual seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="write the results as JSON here")


def run(args: argparse.Namespace) -> int:
    zoo = load_zoo(args.zoo)
    results = []
    for policy in args.policies.split(","):
        result = simulate(zoo, args.gpus, args.rate, args.shape, policy, args.duration, args.seed)
        results.append(result)
        print(
            f"{policy:16s} goodput {result['goodput_rps']:9.1f} req/s  bad rate {result['bad_rate']:.3f}  "
            f"batch mean {result['batch_mean']:.1f} p50 {result['batch_p50']:.0f} p90 {result['batch_p90']:.0f}  "
            f"GPU idle {result['gpu_idle_fraction']:.3f}  scheduler {result['scheduled_per_core_s']:.0f} req/core-s"
        )
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
