"""``gateway simulate``: the dispatch core that ``gateway serve`` runs, on a virtual clock.

The very ``DispatchCore`` (schedulers/dispatch.py) that serves requests decides here, fed by a
discrete-event loop instead of asyncio: GPUs take exactly l(b) = alpha b + beta for a batch of b
(Symphony's authors emulated GPUs the same way), CPU executors take their CPU profile's l(b)
divided by their cores. Everything the core does under ``gateway serve`` happens here too:
admission, the bounded queue, timeouts, the CPU/GPU spill, deferral, refusals, batch keys.

Two ways to say what runs:

- ``--zoo CSV`` (model, alpha_ms, beta_ms, slo_ms; such as ../shared/data/symphony_zoo_1080ti.csv):
  GPUs only, every model refuses what it cannot finish (Symphony's setting), open-loop arrivals
  per model: Poisson, or Gamma gaps with a shape s and scale 1 / (s x rate), so the mean gap is
  1 / rate and the coefficient of variation 1 / sqrt(s) (Symphony Section 4.3; smaller shapes
  are burstier); the offered load is split evenly.
- ``--config config.toml --arrivals arrivals.json``: the models, GPUs (emulated profiles), CPU
  executors and their cores, queue limits and timeouts of a serving config, and given arrival
  times ([[seconds, model], ...]); ``--cpu-profile model=per_item_ms,fixed_ms`` gives the CPU
  executors' l(b) (for example as a gateway measured it: GET /admin/models/NAME, "profiles").

Per run it reports goodput (requests answered within their SLO, per second), the bad rate
(refused, timed out, late or left over, over all), per model the requests served on each device
and their outcomes, the batch sizes, the GPU idle fraction, and the core's own throughput
(requests decided per second of the one core it runs on).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schedulers.dispatch import CPU, GPU, Action, DispatchCore, Fail, Finish, Start, WakeAt
from schedulers.gpu import POLICIES, GpuScheduler
from schedulers.profiles import LatencyProfile
from schedulers.request import Request
from schedulers.round_robin import RandomRoundRobin

# Zoo runs: batches are limited by the deadlines (pruning), not by a configured size.
MAX_BATCH = 512
# Zoo runs have no timeout of their own: a request ends served or refused.
ZOO_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class SimModel:
    """A model as the simulation runs it: its SLA, its batch limit and each device's true l(b)."""

    name: str
    sla_ms: float
    max_batch: int = MAX_BATCH
    gpu: tuple[float, float] | None = None  # (per-item ms, fixed ms) on a GPU
    cpu: tuple[float, float] | None = None  # (per-item ms, fixed ms) on one CPU core; None: no CPU executor
    cpu_cores: float = 1.0
    drop_late: bool = True
    max_queue_size: int = 1 << 30


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


def linear_ms(profile: tuple[float, float], rows: int, cores: float = 1.0) -> float:
    per_item, fixed = profile
    return (per_item * rows + fixed) / cores


class Simulation:
    """A discrete-event loop that carries out the dispatch core's actions on a virtual clock."""

    def __init__(
        self,
        models: list[SimModel],
        *,
        gpus: int,
        policy: str = "deferral",
        cpu_sharing: str = "spill",
        request_timeout_s: float = ZOO_TIMEOUT_S,
        seed: int = 0,
    ):
        self.models = {m.name: m for m in models}
        self.core = DispatchCore(
            cpu_scheduler=RandomRoundRobin(random.Random(seed)),
            gpu_scheduler=GpuScheduler(policy) if gpus else None,
            request_timeout_s=request_timeout_s,
            cpu_sharing=cpu_sharing,
        )
        for model in models:
            if model.cpu is not None:
                self.core.add_executor(f"cpu-{model.name}", CPU, model.name)
        for i in range(gpus):
            self.core.add_executor(f"gpu{i}", GPU)
        for model in models:
            self.core.add_model(
                model.name,
                sla_ms=model.sla_ms,
                max_batch=model.max_batch,
                max_queue_size=model.max_queue_size,
                drop_late=model.drop_late,
                cpu_profile=LatencyProfile(*linear_ms_pair(model.cpu, model.cpu_cores)) if model.cpu else None,
                gpu_profile=LatencyProfile(*model.gpu) if model.gpu and gpus else None,
            )
        self.gpus = gpus
        self._events: list[tuple[float, int, str, Any]] = []
        self._sequence = 0
        self.core_s = 0.0  # wall time spent inside the core
        self.outcomes = {name: {} for name in self.models}  # model -> outcome -> count
        self.served_on = {name: {"gpu": 0, "cpu": 0} for name in self.models}
        self.device_of: dict[int, str] = {}  # request id -> device that served it
        self.batch_rows: list[int] = []
        self.gpu_busy_s = 0.0

    def _push(self, at: float, kind: str, payload: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (at, self._sequence, kind, payload))

    def _call(self, event: Callable[..., list[Action]], *args: Any) -> list[Action]:
        started = time.perf_counter()
        actions = event(*args)
        self.core_s += time.perf_counter() - started
        return actions

    def _count(self, model: str, outcome: str, n: int = 1) -> None:
        self.outcomes[model][outcome] = self.outcomes[model].get(outcome, 0) + n

    def _carry_out(self, actions: Iterable[Action], now: float) -> None:
        for action in actions:
            if isinstance(action, Start):
                batch = action.batch
                model = self.models[batch.model]
                if batch.device == GPU:
                    duration_ms = linear_ms(model.gpu, batch.rows)
                    self.gpu_busy_s += duration_ms / 1000
                    self.batch_rows.append(batch.rows)
                else:
                    duration_ms = linear_ms(model.cpu, batch.rows, model.cpu_cores)
                self._push(now + duration_ms / 1000, "done", (batch, duration_ms))
            elif isinstance(action, Finish):
                device = action.batch.device
                for request in action.requests:
                    self._count(request.model, "in_slo" if now <= request.deadline + 1e-9 else "late")
                    self.served_on[request.model][device] += 1
                    self.device_of[request.id] = device
            elif isinstance(action, Fail):
                for request in action.requests:
                    self._count(request.model, action.outcome)
            elif isinstance(action, WakeAt) and action.time < float("inf"):
                self._push(action.time, "wake", None)

    def run(self, arrivals: Iterable[tuple[float, str]], duration_s: float) -> dict[str, Any]:
        requests = 0
        for request_id, (t, model) in enumerate(sorted(arrivals), start=1):
            self._push(t, "arrival", Request(request_id, model, t))
            requests += 1
            self._count(model, "arrived")
        now = last = 0.0
        for executor in list(self.core.executors):
            self._carry_out(self._call(self.core.set_executor_ready, executor, True, now), now)
        while self._events:
            now, _, kind, payload = heapq.heappop(self._events)
            if kind == "arrival":
                actions = self._call(self.core.on_arrival, payload, now)
                last = now
            elif kind == "done":
                batch, duration_ms = payload
                last = now
                actions = self._call(self.core.on_batch_done, batch, duration_ms, now)
            else:
                actions = self._call(self.core.on_timer, now)
            self._carry_out(actions, now)
        end = max(duration_s, last)  # timers set for far-off timeouts do not stretch the run
        for name, state in self.core.models.items():
            if state.queue:
                self._count(name, "left", len(state.queue))
        return self._report(requests, duration_s, end)

    def _report(self, requests: int, duration_s: float, end: float) -> dict[str, Any]:
        good = sum(o.get("in_slo", 0) for o in self.outcomes.values())
        sizes = np.asarray(self.batch_rows) if self.batch_rows else np.zeros(1)
        per_model = {
            name: {
                **outcomes,
                "served_on": dict(self.served_on[name]),
                "bad_rate": 1 - outcomes.get("in_slo", 0) / outcomes["arrived"] if outcomes.get("arrived") else 0.0,
            }
            for name, outcomes in self.outcomes.items()
        }
        return {
            "requests": requests,
            "goodput_rps": good / duration_s,
            "bad_rate": (requests - good) / requests if requests else 0.0,
            "late": sum(o.get("late", 0) for o in self.outcomes.values()),
            "refused": sum(o.get("refused_deadline", 0) for o in self.outcomes.values()),
            "batch_mean": float(sizes.mean()),
            "batch_p50": float(np.percentile(sizes, 50)),
            "batch_p90": float(np.percentile(sizes, 90)),
            "gpu_idle_fraction": 1 - self.gpu_busy_s / (self.gpus * end) if self.gpus else 0.0,
            "scheduled_per_core_s": requests / self.core_s if self.core_s else float("inf"),
            "models": per_model,
            "goodput_by_model_rps": {name: o.get("in_slo", 0) / duration_s for name, o in self.outcomes.items()},
        }


def linear_ms_pair(profile: tuple[float, float], cores: float) -> tuple[float, float]:
    """A CPU profile at ``cores`` cores: both costs divided by the cores (what the core learns there)."""
    return profile[0] / cores, profile[1] / cores


def simulate(
    zoo: list[ZooModel], gpus: int, rate: float, shape: float | None, policy: str, duration_s: float, seed: int = 0
) -> dict[str, Any]:
    """A zoo on ``gpus`` GPUs at ``rate`` requests/s split evenly over its models."""
    rng = random.Random(seed)
    arrivals = [
        (t, model.name) for model in zoo for t in gamma_arrivals(rate / len(zoo), shape, duration_s, rng)
    ]
    models = [SimModel(m.name, m.slo_ms, gpu=(m.per_item_ms, m.fixed_ms)) for m in zoo]
    result = Simulation(models, gpus=gpus, policy=policy, seed=seed).run(arrivals, duration_s)
    return {"policy": policy, "shape": shape, "offered_rps": rate, **result}


def simulate_config(
    config_path: Path, arrivals: list[tuple[float, str]], cpu_profiles: dict[str, tuple[float, float]], seed: int = 0
) -> dict[str, Any]:
    """The models, devices and limits of a serving config, under the given arrivals."""
    from gateway.config import load_config

    config = load_config(config_path)
    models = []
    for name, model in config.models.items():
        gpu_row = config.gpu.profiles.get(model.gpu_profile or name) if config.node.gpus else None
        models.append(
            SimModel(
                name,
                model.sla_ms,
                max_batch=model.max_batch_size,
                gpu=gpu_row,
                cpu=cpu_profiles.get(name),
                cpu_cores=model.cpu.cores,
                drop_late=model.drop_late,
                max_queue_size=model.max_queue_size,
            )
        )
    if config.node.gpus and config.gpu.executor != "emulated":
        raise SystemExit("gateway simulate: the config's GPUs must be emulated ([gpu] executor = \"emulated\") to be simulated")
    simulation = Simulation(
        models,
        gpus=len(config.node.gpus),
        policy=config.gpu.policy,
        cpu_sharing=config.gpu.cpu_sharing,
        request_timeout_s=config.server.request_timeout_ms / 1000,
        seed=config.policy.seed if config.policy.seed is not None else seed,
    )
    duration_s = max((t for t, _ in arrivals), default=0.0)
    result = simulation.run(arrivals, duration_s)
    result["device_of"] = simulation.device_of
    return {"policy": config.gpu.policy, **result}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--zoo", type=Path, help="CSV with model, alpha_ms, beta_ms, slo_ms")
    source.add_argument("--config", type=Path, help="a serving config (its GPUs emulated)")
    parser.add_argument("--arrivals", type=Path, help="with --config: JSON [[seconds, model], ...]")
    parser.add_argument(
        "--cpu-profile", action="append", default=[], metavar="MODEL=PER_ITEM_MS,FIXED_MS", help="with --config, repeatable"
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rate", type=float, help="with --zoo: offered load, requests/s over all models")
    parser.add_argument("--shape", type=float, default=None, help="Gamma shape of the arrival gaps (default: Poisson)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--duration", type=float, default=10.0, help="virtual seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="write the results as JSON here")


def _cpu_profiles(specs: list[str]) -> dict[str, tuple[float, float]]:
    profiles = {}
    for spec in specs:
        name, _, numbers = spec.partition("=")
        try:
            per_item, fixed = (float(x) for x in numbers.split(","))
        except ValueError:
            raise SystemExit(f"gateway simulate: --cpu-profile {spec!r}: expected MODEL=PER_ITEM_MS,FIXED_MS") from None
        profiles[name] = (per_item, fixed)
    return profiles


def run(args: argparse.Namespace) -> int:
    results = []
    if args.config is not None:
        if args.arrivals is None:
            raise SystemExit("gateway simulate: --config needs --arrivals")
        arrivals = [(float(t), str(model)) for t, model in json.loads(args.arrivals.read_text())]
        result = simulate_config(args.config, arrivals, _cpu_profiles(args.cpu_profile), args.seed)
        results.append(result)
        for name, model in result["models"].items():
            print(f"{name:16s} {model}")
    else:
        if args.rate is None:
            raise SystemExit("gateway simulate: --zoo needs --rate")
        zoo = load_zoo(args.zoo)
        for policy in args.policies.split(","):
            result = simulate(zoo, args.gpus, args.rate, args.shape, policy, args.duration, args.seed)
            results.append(result)
            print(
                f"{policy:16s} goodput {result['goodput_rps']:9.1f} req/s  bad rate {result['bad_rate']:.3f}  "
                f"batch mean {result['batch_mean']:.1f} p50 {result['batch_p50']:.0f} p90 {result['batch_p90']:.0f}  "
                f"GPU idle {result['gpu_idle_fraction']:.3f}  core {result['scheduled_per_core_s']:.0f} req/core-s"
            )
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
