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
- ``--config config.toml --arrivals arrivals.json``: the models, GPUs (emulated profiles, memory
  and load times), CPU executors, queue limits, timeouts and GPU policy of a serving config, its
  dispatch core built as ``gateway serve`` builds it (gateway/dispatch_setup.py), and given
  arrival times ([[seconds, model], ...]); ``--cpu-profile model=per_item_ms,fixed_ms`` gives
  the CPU executors' l(b) at their configured cores (for example as a gateway measured it
  there: GET /admin/models/NAME, "profiles").

Per run it reports goodput (requests answered within their SLO, per second), the bad rate
(refused, timed out, late or left over, over all), per model the requests served on each device
and their outcomes, the batch sizes, the GPU idle fraction, and the core's own throughput
(requests decided per second of the one core it runs on).

``--zoo CSV --goodput`` measures Symphony's goodput instead of running one load: per policy,
Gamma shape and seed, the highest offered load at which every model's bad rate stays within 1%
(its p99 within its SLO), found by bisection; then the flat-top table above that peak, the GPU
idle fraction under it and the autoscaling signals (gateway/tools/goodput.py).

``--dispatch-delay-ms MEAN`` delays each GPU batch between the core's Start and the executor
receiving it (exponential, seeded): an executor that receives a batch after its latest start
refuses it (Clockwork's late action), and the core puts its requests back. With a delay the
default policy learns the trip and sends a busy GPU its next batch that long before its batch
in flight ends; the executor begins it once that one has ended, one batch at a time.
"""

from __future__ import annotations

import argparse
import collections
import csv
import functools
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway.tools.arguments import (
    MIN_GAMMA_SHAPE,
    existing_file,
    gamma_shape,
    non_negative_float,
    output_file,
    positive_float,
    positive_int,
    refuse_too_many_arrivals,
    seed,
)
from schedulers.dispatch import (
    CPU,
    EPSILON_S,
    GPU,
    SPILL_WITHIN,
    Action,
    Batch,
    DispatchCore,
    Fail,
    Finish,
    Start,
    WakeAt,
    cpu_executor_id,
)
from schedulers.gpu import BASELINES, DEFAULT_POLICY, POLICIES, GpuScheduler
from schedulers.profiles import LatencyProfile
from schedulers.request import Request
from schedulers.round_robin import RandomRoundRobin

# Zoo runs: batches are limited by the deadlines (pruning), not by a configured size.
MAX_BATCH = 512
# Zoo runs have no timeout of their own: a request ends served or refused.
ZOO_TIMEOUT_S = 3600.0
# Outcomes that are not bad: the arrival itself, and an answer within the SLO.
NOT_BAD = frozenset({"arrived", "in_slo"})
# Requests a run stopped early (``stop_when_bad``) never saw end.
UNFINISHED = "unfinished"


@dataclass(frozen=True)
class SimModel:
    """A model as the simulation runs it: its SLA, its batch limit and each device's true l(b)."""

    name: str
    sla_ms: float
    max_batch: int = MAX_BATCH
    gpu: tuple[float, float] | None = None  # (per-item ms, fixed ms) on a GPU
    cpu: tuple[float, float] | None = None  # (per-item ms, fixed ms) on its executor's cores; None: no CPU executor
    drop_late: bool = True
    max_queue_size: int = 1 << 30
    dispatch_batch: int = 1  # a planned CPU batch size (batch-aware dispatch)


@dataclass(frozen=True)
class ZooModel:
    name: str
    per_item_ms: float
    fixed_ms: float
    slo_ms: float

    def latency_ms(self, rows: int) -> float:
        return self.per_item_ms * rows + self.fixed_ms


ZOO_COLUMNS = ("alpha_ms", "beta_ms", "slo_ms")


def load_zoo(path: Path) -> list[ZooModel]:
    """A zoo CSV's models; a missing column, a value that is no finite number (alpha and the SLO
    over 0, beta at least 0: a batch's rows cost time), or a model named twice (its rows were
    merged, and half its load was dropped) is a SystemExit naming the row."""
    try:
        with path.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (UnicodeDecodeError, csv.Error) as error:
        raise SystemExit(f"gateway simulate: {path} is not a CSV file of text: {error}") from None
    zoo: list[ZooModel] = []
    for row in rows:
        try:
            alpha, beta, slo = (float(row[column]) for column in ZOO_COLUMNS)
            if not all(math.isfinite(v) for v in (alpha, beta, slo)) or alpha <= 0 or beta < 0 or slo <= 0:
                raise ValueError
            model = ZooModel(row["model"], alpha, beta, slo)
        except (KeyError, TypeError, ValueError):
            raise SystemExit(
                f"gateway simulate: {path}: row {row.get('model')!r} needs model and {', '.join(ZOO_COLUMNS)}: "
                "finite numbers, alpha and the SLO over 0, beta at least 0"
            ) from None
        if any(known.name == model.name for known in zoo):
            raise SystemExit(f"gateway simulate: {path}: model {model.name!r} is listed twice")
        zoo.append(model)
    if not zoo:
        raise SystemExit(f"gateway simulate: {path} has no models")
    return zoo


def gamma_arrivals(rate: float, shape: float | None, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times over [0, duration): Poisson when shape is None, else Gamma(shape, 1/(shape rate)) gaps."""
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate) if shape is None else rng.gammavariate(shape, 1.0 / (shape * rate))
        if t >= duration_s:
            return times
        times.append(t)


def zoo_arrivals(
    rates: Mapping[str, float], shape: float | None, duration_s: float, rng: random.Random
) -> list[tuple[float, str]]:
    """Open-loop arrivals [(seconds, model)] over [0, duration) at each model's rate (requests/s).

    Each model draws from a stream of its own, seeded from ``rng``: with a fresh
    ``random.Random(seed)`` the arrivals at another load are the same gaps scaled by the load
    (Python's Gamma and exponential draws are a unit draw times the scale), so a bisection
    over the load compares like with like instead of a fresh sample at every probe.
    """
    streams = {name: random.Random(rng.getrandbits(64)) for name in rates}
    arrivals = [
        (t, name) for name, rate in rates.items() if rate > 0 for t in gamma_arrivals(rate, shape, duration_s, streams[name])
    ]
    arrivals.sort()
    return arrivals


def even_split(zoo: Iterable[ZooModel], total_rps: float) -> dict[str, float]:
    """The offered load split evenly over the models (Symphony Section 5.3's workload)."""
    names = [model.name for model in zoo]
    return {name: total_rps / len(names) for name in names}


def linear_ms(profile: tuple[float, float], rows: int) -> float:
    per_item, fixed = profile
    return per_item * rows + fixed


class Simulation:
    """A discrete-event loop that carries out the dispatch core's actions on a virtual clock."""

    def __init__(
        self,
        models: list[SimModel],
        *,
        gpus: int,
        policy: str = "deferral",
        cpu_sharing: str = "spill",
        spill_within: float = SPILL_WITHIN,
        request_timeout_s: float = ZOO_TIMEOUT_S,
        seed: int = 0,
        stop_when_bad: Mapping[str, int] | None = None,
        gpu_dispatch_ms: float = 0.0,
        core: DispatchCore | None = None,
    ):
        """``stop_when_bad``: per model, the bad outcomes it may have; the run stops as soon as one
        model has more (its verdict is known: a bisection probe that fails need not run to the
        end), marks the result ``stopped_early`` and counts what had not ended as "unfinished".
        A run within every limit runs to the end and is unchanged.

        ``gpu_dispatch_ms``: mean of the exponential delay between the core's Start of a GPU batch
        and its executor receiving it (the network between Clockwork's controller and workers).
        An executor that receives a batch after its ``latest_start`` refuses it (Clockwork's
        late action, Section 4.4): the core gets ``on_batch_late`` and the GPU stays free.

        ``core``: a dispatch core built elsewhere (``gateway simulate --config`` builds the one
        that ``gateway serve`` builds, gateway/dispatch_setup.py), in place of one of ``policy``,
        ``cpu_sharing``, ``spill_within``, ``request_timeout_s`` and ``seed``.
        """
        self.models = {m.name: m for m in models}
        self.core = core or DispatchCore(
            cpu_scheduler=RandomRoundRobin(random.Random(seed)),
            gpu_scheduler=GpuScheduler(policy) if gpus else None,
            request_timeout_s=request_timeout_s,
            cpu_sharing=cpu_sharing,
            spill_within=spill_within,
        )
        for model in models:
            if model.cpu is not None:
                self.core.add_executor(cpu_executor_id(model.name), CPU, model.name)
        for i in range(gpus):
            self.core.add_executor(f"gpu{i}", GPU)
        for model in models:
            self.core.add_model(
                model.name,
                sla_ms=model.sla_ms,
                max_batch=model.max_batch,
                max_queue_size=model.max_queue_size,
                drop_late=model.drop_late,
                dispatch_batch=model.dispatch_batch,
                cpu_profile=LatencyProfile(*model.cpu) if model.cpu else None,
                gpu_profile=LatencyProfile(*model.gpu) if model.gpu and gpus else None,
            )
        self.gpus = gpus
        self._events: list[tuple[float, int, str, Any]] = []
        self._timer_at = float("inf")
        self._sequence = 0
        self.core_s = 0.0  # wall time spent inside the core
        self.outcomes = {name: {} for name in self.models}  # model -> outcome -> count
        self.served_on = {name: {"gpu": 0, "cpu": 0} for name in self.models}
        self.device_of: dict[int, str] = {}  # request id -> device that served it
        self.batch_rows: list[int] = []
        self.gpu_busy_s = 0.0
        self.stop_when_bad = dict(stop_when_bad) if stop_when_bad is not None else None
        self.bad = dict.fromkeys(self.models, 0)
        self._stop = False
        self.stopped_at: float | None = None
        self.gpu_dispatch_ms = gpu_dispatch_ms
        self._dispatch_rng = random.Random(f"gpu-dispatch-{seed}")
        self.late_actions = 0  # GPU batches refused by their executor for reaching it too late
        self._gpu_busy_until: dict[str, float] = {}  # GPU executor -> end of the batch it runs
        self._gpu_arrives: dict[str, float] = {}  # GPU executor -> when the last batch sent reaches it
        self.decided = 0  # arrivals the core has seen

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
        if outcome not in NOT_BAD:
            self.bad[model] += n
            if self.stop_when_bad is not None and self.bad[model] > self.stop_when_bad.get(model, self.bad[model]):
                self._stop = True

    def _carry_out(self, actions: Iterable[Action], now: float) -> None:
        for action in actions:
            if isinstance(action, Start):
                batch = action.batch
                if batch.device == GPU and self.gpu_dispatch_ms > 0:
                    delay_s = self._dispatch_rng.expovariate(1000 / self.gpu_dispatch_ms)
                    # One connection to each executor keeps its batches in the order sent: a
                    # pipelined batch never overtakes the one it was queued behind.
                    arrives = max(now + delay_s, self._gpu_arrives.get(batch.executor, now))
                    self._gpu_arrives[batch.executor] = arrives
                    self._push(arrives, "received", batch)
                elif batch.device == GPU and self._gpu_busy_until.get(batch.executor, now) > now:
                    self._push(self._gpu_busy_until[batch.executor], "received", batch)  # queued behind its batch
                else:
                    self._execute(batch, now)
            elif isinstance(action, Finish):
                device = action.batch.device
                for request in action.requests:
                    self._count(request.model, "in_slo" if now <= request.deadline + 1e-9 else "late")
                    self.served_on[request.model][device] += 1
                    self.device_of[request.id] = device
            elif isinstance(action, Fail):
                for request in action.requests:
                    self._count(request.model, action.outcome)
            elif isinstance(action, WakeAt) and action.time < self._timer_at:
                # One timer, moved earlier when asked, as gateway serve's engine keeps it.
                self._timer_at = action.time
                self._push(action.time, "wake", None)

    def _execute(self, batch: Batch, now: float) -> None:
        """The executor runs ``batch`` from ``now`` for its true l(b)."""
        model = self.models[batch.model]
        duration_ms = linear_ms(model.gpu if batch.device == GPU else model.cpu, batch.rows)
        # A GPU that does not hold the model loads it first (Clockwork's LOAD): busy, not computing.
        busy_s = (duration_ms + (batch.load.load_ms if batch.load is not None else 0.0)) / 1000
        if batch.device == GPU:
            self.gpu_busy_s += busy_s
            self._gpu_busy_until[batch.executor] = now + busy_s
            self.batch_rows.append(batch.rows)
        self._push(now + busy_s, "done", (batch, duration_ms))

    def _receive(self, batch: Batch, now: float) -> list[Action]:
        """A GPU executor receives ``batch`` after the dispatch delay: it runs it, or refuses it late.
        One sent while the executor's batch before it runs (pipelined) waits for that one to end,
        and is looked at then."""
        busy_until = self._gpu_busy_until.get(batch.executor, now)
        if busy_until > now:
            self._push(busy_until, "received", batch)
            return []
        if now > batch.latest_start + EPSILON_S:
            self.late_actions += 1
            return self._call(self.core.on_batch_late, batch, now)
        self._execute(batch, now)
        return []

    def run(self, arrivals: Iterable[tuple[float, str]], duration_s: float) -> dict[str, Any]:
        requests = 0
        for request_id, (t, model) in enumerate(sorted(arrivals), start=1):
            self._push(t, "arrival", Request(request_id, model, t))
            requests += 1
            self._count(model, "arrived")
        now = last = 0.0
        for executor in list(self.core.executors):
            self._carry_out(self._call(self.core.set_executor_ready, executor, True, now), now)
        while self._events and not self._stop:
            now, _, kind, payload = heapq.heappop(self._events)
            if kind == "arrival":
                actions = self._call(self.core.on_arrival, payload, now)
                self.decided += 1
                last = now
            elif kind == "done":
                batch, duration_ms = payload
                last = now
                actions = self._call(self.core.on_batch_done, batch, duration_ms, now)
            elif kind == "received":
                actions = self._receive(payload, now)
            else:
                if now != self._timer_at:
                    continue  # a timer since moved earlier: the engine would have cancelled it
                self._timer_at = float("inf")
                actions = self._call(self.core.on_timer, now)
            self._carry_out(actions, now)
        if self._stop:
            self.stopped_at = end = now
            for outcomes in self.outcomes.values():
                ended = sum(n for outcome, n in outcomes.items() if outcome != "arrived")
                if outcomes.get("arrived", 0) > ended:
                    outcomes[UNFINISHED] = outcomes["arrived"] - ended
        else:
            end = max(duration_s, last)  # timers set for far-off timeouts do not stretch the run
            for name, state in self.core.models.items():
                if state.queue:
                    self._count(name, "left", len(state.queue))
        # Arrivals all at one instant span no time: their rates are over the run, to its last event.
        return self._report(requests, duration_s or end, end)

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
            "goodput_rps": good / duration_s if duration_s else None,  # None: the whole run took no time
            "bad_rate": (requests - good) / requests if requests else 0.0,
            "late": sum(o.get("late", 0) for o in self.outcomes.values()),
            "refused": sum(o.get("refused_deadline", 0) for o in self.outcomes.values()),
            "batch_mean": float(sizes.mean()),
            "batch_p50": float(np.percentile(sizes, 50)),
            "batch_p90": float(np.percentile(sizes, 90)),
            "gpu_idle_fraction": 1 - self.gpu_busy_s / (self.gpus * end) if self.gpus and end else 0.0,
            # A run stopped early decided only the requests that had arrived by then.
            "scheduled_per_core_s": self.decided / self.core_s if self.core_s else float("inf"),
            "late_actions": self.late_actions,
            "stopped_early": self.stopped_at is not None,
            "stopped_at_s": self.stopped_at,
            "models": per_model,
            "goodput_by_model_rps": {
                name: o.get("in_slo", 0) / duration_s if duration_s else None for name, o in self.outcomes.items()
            },
        }


def bad_allowance(arrived: int, bad_limit: float) -> int:
    """How many of ``arrived`` requests may end badly within a bad rate of ``bad_limit``."""
    return math.floor(bad_limit * arrived + 1e-9)  # 0.01 x 300 must allow 3, whatever the float rounding


def simulate(
    zoo: list[ZooModel],
    gpus: int,
    rate: float | Mapping[str, float],
    shape: float | None,
    policy: str,
    duration_s: float,
    seed: int = 0,
    *,
    stop_above_bad_rate: float | None = None,
    dispatch_delay_ms: float = 0.0,
) -> dict[str, Any]:
    """A zoo on ``gpus`` GPUs at ``rate`` requests/s split evenly over its models, or at each
    model's rate where ``rate`` maps model names to rates.

    ``stop_above_bad_rate``: stop the run as soon as some model's bad rate over its arrivals
    exceeds it (``Simulation``'s ``stop_when_bad``).
    """
    rates = dict(rate) if isinstance(rate, Mapping) else even_split(zoo, rate)
    arrivals = zoo_arrivals(rates, shape, duration_s, random.Random(seed))
    stop_when_bad = None
    if stop_above_bad_rate is not None:
        arrived = collections.Counter(model for _, model in arrivals)
        stop_when_bad = {m.name: bad_allowance(arrived[m.name], stop_above_bad_rate) for m in zoo}
    models = [SimModel(m.name, m.slo_ms, gpu=(m.per_item_ms, m.fixed_ms)) for m in zoo]
    simulation = Simulation(
        models, gpus=gpus, policy=policy, seed=seed, stop_when_bad=stop_when_bad, gpu_dispatch_ms=dispatch_delay_ms
    )
    result = simulation.run(arrivals, duration_s)
    return {"policy": policy, "shape": shape, "offered_rps": sum(rates.values()), **result}


def arrivals_problem(arrivals: list[tuple[float, str]]) -> str | None:
    """Why arrival times cannot be simulated, in one line, or None: none at all, or a time that
    is no moment of the run (NaN never compares, so the virtual clock would never pass it)."""
    if not arrivals:
        return "none given: nothing to simulate"
    for t, model in arrivals:
        if not math.isfinite(t) or t < 0:
            return f"{t!r} (model {model!r}) is no time: each must be a finite number of seconds from 0"
    return None


@functools.cache
def _batchable(path: Path) -> bool:
    """Whether the model's requests are stacked into batches, as ``gateway serve`` finds it: a
    batch dimension in its signature, and results that stacking keeps (gateway/stacking_check.py)."""
    from gateway.stacking_check import check_rounds, session_runner, why_results_differ

    try:
        signature, run = session_runner(path)
    except Exception as error:  # ONNX Runtime raises its own kinds for a file it cannot read
        raise SystemExit(f"gateway simulate: {path}: ONNX Runtime cannot open it: {error}") from None
    if not signature.batchable:
        return False
    # As serve does (gateway/stacking_check.py's _checked): a model that fails on a round's
    # inputs keeps the word of the rounds before (none: its batching).
    for round_ in check_rounds(signature):
        try:
            runs = [run(inputs) for inputs in round_]
        except Exception:
            return True
        if why_results_differ(runs) is not None:
            return False
    return True


def simulate_config(
    config_path: Path, arrivals: list[tuple[float, str]], cpu_profiles: dict[str, tuple[float, float]], seed: int = 0
) -> dict[str, Any]:
    """The models, devices and limits of a serving config, under the given arrivals.

    A model without a CPU executor (``cpu_executor = false``) gets none here either: the GPUs
    alone serve it, whatever the CPU profiles."""
    from gateway.config import ConfigError, load_config
    from gateway.dispatch_setup import batch_limit, dispatch_core_of, gpu_scheduler_of

    problem = arrivals_problem(arrivals)
    if problem is not None:
        raise SystemExit(f"gateway simulate: the arrivals: {problem}")
    try:
        config = load_config(config_path)
    except ConfigError as error:
        raise SystemExit(f"gateway simulate: config error: {error}") from None
    unknown = sorted({model for _, model in arrivals} - set(config.models))
    if unknown:
        raise SystemExit(
            f"gateway simulate: the arrivals name {', '.join(map(repr, unknown))}, not a model of {config_path} "
            f"(its models: {', '.join(config.models)})"
        )
    strangers = sorted(set(cpu_profiles) - set(config.models))
    if strangers:
        raise SystemExit(
            f"gateway simulate: --cpu-profile {', '.join(strangers)}: not a model of {config_path} "
            f"(its models: {', '.join(config.models)})"
        )
    gpu_only = sorted(name for name in cpu_profiles if name in config.models and config.models[name].cpu is None)
    if gpu_only:
        raise SystemExit(f"gateway simulate: --cpu-profile {', '.join(gpu_only)}: no CPU executor (cpu_executor = false)")
    # Without its l(b) a CPU executor cannot be simulated: left out, a CPU-only config timed out
    # every request and said nothing.
    missing = sorted(name for name, model in config.models.items() if model.cpu is not None and name not in cpu_profiles)
    if missing:
        raise SystemExit(
            f"gateway simulate: no --cpu-profile for {', '.join(missing)}: a model with a CPU executor needs its "
            "l(b) (MODEL=PER_ITEM_MS,FIXED_MS, as GET /admin/models/NAME gives it), or cpu_executor = false"
        )
    if config.node.gpus and config.gpu.executor != "emulated":
        raise SystemExit('gateway simulate: the config\'s GPUs must be emulated ([gpu] executor = "emulated") to be simulated')
    models = []
    for name, model in config.models.items():
        gpu_row = config.gpu.profiles.get(model.gpu_profile or name) if config.node.gpus else None
        models.append(
            SimModel(
                name,
                model.sla_ms,
                max_batch=batch_limit(model, _batchable(model.path)),
                gpu=gpu_row,
                # The CPU profile is l(b) at the executor's cores, as the gateway measured it there.
                cpu=cpu_profiles.get(name) if model.cpu is not None else None,
                drop_late=model.drop_late,
                max_queue_size=model.max_queue_size,
                dispatch_batch=model.dispatch_batch,
            )
        )
    gpus = len(config.node.gpus)
    simulation = Simulation(models, gpus=gpus, core=dispatch_core_of(config, gpu_scheduler_of(config) if gpus else None, seed))
    duration_s = max((t for t, _ in arrivals), default=0.0)
    result = simulation.run(arrivals, duration_s)
    result["device_of"] = simulation.device_of
    return {"policy": config.gpu.policy, **result}


# Symphony's evaluation (Section 5.3) ran its zoos on 64 GPUs; the single-rate mode keeps 8.
GOODPUT_GPUS, RATE_GPUS = 64, 8
GOODPUT_SHAPES = "0.1,0.3,1.0"  # Symphony Section 5.3's Gamma shapes, burstiest first


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the dispatch core of gateway serve on a virtual clock against emulated GPUs. "
        "--zoo CSV --rate R: one offered load per policy. "
        "--zoo CSV --goodput: Symphony's goodput per policy, Gamma shape and seed, the highest offered load at which "
        "every model's bad rate (late, refused, left over) stays within 1%% (p99 within its SLO), by bisection; then "
        "the flat-top table at 1.25x/1.5x/2x that peak, the GPU idle fraction at 0.25x-1x beside Symphony's ideal "
        "(p - o) / p, and the autoscaling signals. --config F --arrivals A: a serving config's models and devices."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--zoo", type=existing_file, help="CSV with model, alpha_ms, beta_ms, slo_ms")
    source.add_argument("--config", type=existing_file, help="a serving config (its GPUs emulated)")
    parser.add_argument("--arrivals", type=existing_file, help="with --config: JSON [[seconds, model], ...]")
    parser.add_argument(
        "--cpu-profile",
        action="append",
        default=[],
        metavar="MODEL=PER_ITEM_MS,FIXED_MS",
        help="with --config, repeatable: the model's l(b) at its configured cpu.cores (GET /admin/models/NAME)",
    )
    parser.add_argument(
        "--gpus", type=positive_int, help=f"emulated GPUs (default {GOODPUT_GPUS} with --goodput, else {RATE_GPUS})"
    )
    parser.add_argument("--rate", type=positive_float, help="with --zoo: offered load, requests/s over all models")
    parser.add_argument("--shape", type=gamma_shape, default=None, help="Gamma shape of the arrival gaps (default: Poisson)")
    parser.add_argument(
        "--policies",
        help=f"comma-separated GPU policies of {', '.join(POLICIES)} (default: all; with --goodput the default "
        f"{DEFAULT_POLICY} and the baselines {', '.join(BASELINES)})",
    )
    parser.add_argument("--duration", type=positive_float, default=10.0, help="virtual seconds per run")
    parser.add_argument(
        "--seed", type=seed, default=0, help="arrivals' and CPU round robin's seed (with --config, [policy] seed wins)"
    )
    parser.add_argument(
        "--dispatch-delay-ms", type=non_negative_float, default=0.0, metavar="MEAN",
        help="mean of the exponential delay from the core's Start to the GPU executor; a batch received after its "
        "latest start is refused (Clockwork's late action) and its requests go back to the queue (default 0)",
    )  # fmt: skip
    parser.add_argument("--output", type=output_file, help="write the results as JSON here")
    goodput = parser.add_argument_group("goodput (with --zoo)")
    goodput.add_argument("--goodput", action="store_true", help="measure Symphony's goodput (see above) instead of one rate")
    goodput.add_argument("--shapes", default=GOODPUT_SHAPES, help="Gamma shapes, comma-separated; 'poisson' for none")
    goodput.add_argument("--seeds", type=positive_int, default=3, help="seeds per point: a bisection each (default 3)")
    goodput.add_argument(
        "--tolerance", type=tolerance, default=0.01, help="bisection width, a share of the upper bound (0.0001 to 0.5)"
    )
    goodput.add_argument("--jobs", type=positive_int, default=2, help="processes running the independent runs (default 2)")


def tolerance(text: str) -> float:
    """The bisection's width: from 0.0001 (a bracket narrower than the floats can tell apart was
    never reached, and the bisection never ended) to 0.5 of the upper bound."""
    value = positive_float(text)
    if not 1e-4 <= value <= 0.5:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0.0001 to 0.5")
    return value


def _cpu_profiles(specs: list[str]) -> dict[str, tuple[float, float]]:
    profiles = {}
    for spec in specs:
        name, _, numbers = spec.partition("=")
        try:
            per_item, fixed = (float(x) for x in numbers.split(","))
            if not (math.isfinite(per_item) and math.isfinite(fixed)) or per_item < 0 or fixed < 0 or per_item + fixed <= 0:
                raise ValueError
        except ValueError:
            raise SystemExit(
                f"gateway simulate: --cpu-profile {spec!r}: expected MODEL=PER_ITEM_MS,FIXED_MS, "
                "finite numbers of at least 0, not both 0"
            ) from None
        profiles[name] = (per_item, fixed)
    return profiles


# What each mode reads, besides --seed and --output; any other option given is refused, not
# ignored (--gpus with --config was: the config's node.gpus decide).
MODE_OPTIONS = {
    "--config": {"config", "arrivals", "cpu_profile"},
    "--zoo --rate": {"zoo", "rate", "gpus", "shape", "policies", "duration", "dispatch_delay_ms"},
    "--zoo --goodput": {
        "zoo",
        "goodput",
        "gpus",
        "policies",
        "duration",
        "dispatch_delay_ms",
        "shapes",
        "seeds",
        "tolerance",
        "jobs",
    },
}


def _refuse_options_of_other_modes(args: argparse.Namespace) -> None:
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    mode = "--config" if args.config is not None else "--zoo --goodput" if args.goodput else "--zoo --rate"
    options = set().union(*MODE_OPTIONS.values())
    stray = sorted(o for o in options - MODE_OPTIONS[mode] if getattr(args, o) != defaults.get_default(o))
    if stray:
        named = ", ".join("--" + option.replace("_", "-") for option in stray)
        raise SystemExit(f"gateway simulate: {named}: not read by {mode}")


def run(args: argparse.Namespace) -> int:
    _refuse_options_of_other_modes(args)
    results = []
    if args.config is not None:
        if args.arrivals is None:
            raise SystemExit("gateway simulate: --config needs --arrivals")
        try:
            arrivals = [(float(t), str(model)) for t, model in json.loads(args.arrivals.read_text())]
        except (ValueError, TypeError, RecursionError) as error:  # RecursionError: nested past the parser's depth
            raise SystemExit(f"gateway simulate: {args.arrivals} is not JSON [[seconds, model], ...]: {error}") from None
        result = simulate_config(args.config, arrivals, _cpu_profiles(args.cpu_profile), args.seed)
        results.append(result)
        for name, model in result["models"].items():
            print(f"{name:16s} {model}")
    elif args.goodput:
        return _run_goodput(args)
    else:
        if args.rate is None:
            raise SystemExit("gateway simulate: --zoo needs --rate (or --goodput)")
        refuse_too_many_arrivals("simulate", [(args.rate, args.duration)])
        zoo = load_zoo(args.zoo)
        gpus = RATE_GPUS if args.gpus is None else args.gpus
        for policy in _policies(args.policies, POLICIES):
            result = simulate(
                zoo, gpus, args.rate, args.shape, policy, args.duration, args.seed, dispatch_delay_ms=args.dispatch_delay_ms
            )
            results.append(result)
            print(
                f"{policy:16s} goodput {result['goodput_rps']:9.1f} req/s  bad rate {result['bad_rate']:.3f}  "
                f"batch mean {result['batch_mean']:.1f} p50 {result['batch_p50']:.0f} p90 {result['batch_p90']:.0f}  "
                f"GPU idle {result['gpu_idle_fraction']:.3f}  core {result['scheduled_per_core_s']:.0f} req/core-s"
                + (f"  late actions {result['late_actions']}" if args.dispatch_delay_ms else "")
            )
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))
    return 0


def _policies(spec: str | None, default: Iterable[str]) -> list[str]:
    chosen = spec.split(",") if spec else list(dict.fromkeys(default))
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown:
        raise SystemExit(f"gateway simulate: unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})")
    return chosen


def _shapes(spec: str) -> list[float | None]:
    try:
        return [None if word.strip().lower() == "poisson" else gamma_shape(word) for word in spec.split(",")]
    except argparse.ArgumentTypeError:
        raise SystemExit(
            f"gateway simulate: --shapes {spec!r}: expected finite numbers of at least {MIN_GAMMA_SHAPE:g} "
            "or 'poisson', comma-separated"
        ) from None


def _run_goodput(args: argparse.Namespace) -> int:
    # The measuring builds on this module, so it is imported only when asked for.
    from gateway.tools.goodput import GoodputUnmeasurable, markdown, measure

    zoo = load_zoo(args.zoo)
    policies = _policies(args.policies, (DEFAULT_POLICY, *BASELINES))
    try:
        report = measure(
            {args.zoo.stem: zoo},
            gpus=GOODPUT_GPUS if args.gpus is None else args.gpus,
            shapes=_shapes(args.shapes),
            policies=policies,
            seeds=list(range(args.seed, args.seed + args.seeds)),
            duration_s=args.duration,
            tolerance=args.tolerance,
            dispatch_delay_ms=args.dispatch_delay_ms,
            jobs=args.jobs,
            progress=lambda line: print(line, flush=True),
        )
    except GoodputUnmeasurable as error:
        raise SystemExit(f"gateway simulate: {error}") from None
    print()
    print(markdown(report, DEFAULT_POLICY, BASELINES))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
