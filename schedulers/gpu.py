"""The GPU scheduler: what a free GPU runs next (ROMA Algorithm 1 with Symphony's deferral).

Driven by events and a clock, returning decisions (DESIGN.md, principle 1): the gateway calls
``decide`` when a GPU is free (at start, after each batch, on an arrival, at a ``WaitUntil``)
and carries out what comes back. Policies, chosen in the config so that they can be compared
side by side (``gateway simulate``):

- ``deferral`` (the default): Symphony's non-work-conserving rule decides which candidates are
  schedulable (Section 4.3); among them the model with the largest ROMA deficit wins
  (Algorithm 1), the deficit weighed by the candidate's requests per GPU-millisecond
  (``weighted_value``: among candidates of equal efficiency the largest deficit wins), ties
  going to the earliest sched_at. With none schedulable the GPU waits until the earliest
  sched_at or the next arrival.
- ``roma``: ROMA's pure deficit choice (Algorithm 1) with no deferral (every non-empty candidate
  is schedulable).
- ``work_conserving``: Symphony's work-conserving policy: no deferral, earliest sched_at first.
- ``edf``: Clockwork-like earliest deadline first, no deferral.
- ``round_robin``: the baselines of ROMA's evaluation (RR+CT, RR+rules, ...): the models take
  turns, in the order they were added, no deferral.

Every policy forms batches the same way (``schedulers.candidate``) and leaves out of a batch
the requests that this GPU cannot finish in time. The scheduler refuses nothing: the dispatch
core (schedulers/dispatch.py) refuses a request only when no device, GPU or CPU, can finish it.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schedulers.candidate import Candidate, form_candidate
from schedulers.deficit import QUEUE_WEIGHT, SETPOINT_RATIO, deficit, estimated_response_ms, sla_batch
from schedulers.profiles import LatencyProfile
from schedulers.rate import ArrivalRate
from schedulers.request import Request, RequestQueue

POLICIES = ("deferral", "roma", "work_conserving", "edf", "round_robin")
DEFAULT_POLICY = "deferral"
# The papers' GPU policies that the default is measured against (gateway simulate --goodput).
BASELINES = ("deferral", "work_conserving", "edf", "roma")
# ROMA's authors average the last 50 completed requests for the measured response time.
RECENT = 50


@dataclass(frozen=True)
class Dispatch:
    """Run ``requests`` (queued for ``model``, in queue order, after ``skip`` left at the head) on ``gpu``."""

    model: str
    gpu: str
    requests: tuple[Request, ...]
    skip: int = 0

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.requests)


@dataclass(frozen=True)
class WaitUntil:
    """Nothing is schedulable yet: ask again at ``time`` (or at the next arrival)."""

    time: float


Decision = Dispatch | WaitUntil


@dataclass
class GpuModel:
    sla_ms: float
    max_batch: int
    profile: LatencyProfile
    drop_late: bool = True
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    recent_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=RECENT))


class GpuScheduler:
    def __init__(self, policy: str = "deferral", setpoint_ratio: float = SETPOINT_RATIO, queue_weight: float = QUEUE_WEIGHT):
        if policy not in POLICIES:
            raise ValueError(f"unknown GPU policy {policy!r} (known: {', '.join(POLICIES)})")
        self.policy = policy
        self.setpoint_ratio, self.queue_weight = setpoint_ratio, queue_weight
        self.models: dict[str, GpuModel] = {}
        self._last_served: str | None = None  # round_robin's turn

    def add_model(self, name: str, sla_ms: float, max_batch: int, profile: LatencyProfile, drop_late: bool = True) -> None:
        self.models[name] = GpuModel(sla_ms, max_batch, profile, drop_late)

    # -- events -----------------------------------------------------------------------------
    def on_arrival(self, model: str, now: float) -> None:
        self.models[model].rate.observe(now)

    def on_queue_changed(self, model: str) -> None:
        """Requests left the model's queue or came back to it other than by arrival or dispatch."""

    def on_batch_done(self, model: str, rows: int, latency_ms: float) -> None:
        self.models[model].profile.observe(rows, latency_ms)

    def on_completed(self, model: str, response_ms: float) -> None:
        self.models[model].recent_ms.append(response_ms)

    def on_refused(self, model: str, requests: Iterable[Request], now: float) -> None:
        """A refused request counts in R as a response no sooner than its SLA: it was a violation."""
        state = self.models[model]
        for request in requests:
            best_ms = (now - request.arrival) * 1000 + state.profile.latency_ms(request.rows)
            state.recent_ms.append(max(best_ms, state.sla_ms))

    # -- decisions --------------------------------------------------------------------------
    def candidates(self, now: float, start: float, queues: Mapping[str, RequestQueue]) -> dict[str, Candidate]:
        out = {}
        for name, queue in queues.items():
            if not queue:
                continue
            state = self.models[name]
            candidate = form_candidate(
                name,
                queue,
                state.profile,
                max_batch=state.max_batch,
                now=now,
                start=start,
                arrival_rate=state.rate.per_second(now),
                defer=self.policy == "deferral",
                prune=state.drop_late,
            )
            if candidate is not None:
                out[name] = candidate
        return out

    def _next_turn(self, ready: Mapping[str, Candidate]) -> str:
        order = list(self.models)
        start = order.index(self._last_served) + 1 if self._last_served in self.models else 0
        chosen = next(order[(start + i) % len(order)] for i in range(len(order)) if order[(start + i) % len(order)] in ready)
        self._last_served = chosen
        return chosen

    def model_deficit(self, name: str, queue: RequestQueue, now: float) -> float:
        state = self.models[name]
        batch = sla_batch(state.profile, state.sla_ms, state.max_batch)
        estimated = estimated_response_ms(len(queue), queue.mean_wait_ms(now), state.profile, batch)
        measured = sum(state.recent_ms) / len(state.recent_ms) if state.recent_ms else None
        return deficit(estimated, measured, state.sla_ms, self.setpoint_ratio, self.queue_weight)

    def decide(self, now: float, gpu: str, gpu_free_at: float, queues: Mapping[str, RequestQueue]) -> Decision | None:
        """What ``gpu`` (free at ``gpu_free_at``) should do now: a batch, a wait, or nothing."""
        start = max(now, gpu_free_at)
        candidates = self.candidates(now, start, queues)
        ready = {name: c for name, c in candidates.items() if c.size > 0 and c.schedulable}
        if ready:
            if self.policy in ("deferral", "roma"):
                deficits = {name: self.model_deficit(name, queues[name], now) for name in ready}
                if self.policy == "roma":
                    chosen = min(ready, key=lambda n: (-deficits[n], ready[n].sched_at))
                else:
                    value = {
                        n: weighted_value(deficits[n], c.size, self.models[n].profile.latency_ms(c.rows))
                        for n, c in ready.items()
                    }
                    chosen = min(ready, key=lambda n: (-value[n], ready[n].sched_at))
            elif self.policy == "work_conserving":
                chosen = min(ready, key=lambda n: ready[n].sched_at)
            elif self.policy == "round_robin":
                chosen = self._next_turn(ready)
            else:
                chosen = min(ready, key=lambda n: ready[n].deadline)
            candidate = ready[chosen]
            batch = tuple(itertools.islice(queues[chosen], candidate.skip, candidate.skip + candidate.size))
            return Dispatch(chosen, gpu, batch, candidate.skip)
        waiting = [c.sched_at for c in candidates.values() if c.size > 0]
        if waiting:
            return WaitUntil(max(now, min(waiting)))
        return None


def weighted_value(deficit: float, requests: int, batch_ms: float) -> float:
    """What dispatching a candidate is worth under ``deferral``: (1 + deficit) x requests per GPU-ms.

    ROMA's Algorithm 1 hands a free GPU to the model furthest behind its set point. With
    deadline-cut batches that is, under overload, the costliest model: its batches are grown to
    its deadline, so its response times sit near the SLA and its deficit never clears, and a GPU
    spent on it serves a few requests where a cheap model's batch would serve dozens (measured on
    Symphony's 1080Ti zoo: goodput fell to 45% of EDF's; docs/BENCHMARKS.md). Weighing the deficit
    by the candidate's requests per GPU-millisecond keeps ROMA's rule among candidates of equal
    efficiency (the largest deficit wins) and spends a contended GPU where it serves the most
    requests in time; a model's deficit, which counts its refused requests, still raises its turn.
    """
    return (1 + deficit) * requests / batch_ms


def gpu_can_finish(
    request: Request, position: int, now: float, gpu_free_at: float, profile: LatencyProfile, max_batch: int
) -> bool:
    """Whether the GPUs' projected capacity serves the request at ``position`` of its queue in time.

    The projection: the earliest GPU starts the queue at max(now, gpu_free_at) and works through
    it in full batches. The CPU scheduler takes from a queue only requests for which this is
    false, so CPU executors never starve a batch the GPU is deferring on purpose
    (../shared/DESIGN.md, open questions).
    """
    rounds = position // max_batch + 1
    finish = max(now, gpu_free_at) + rounds * profile.latency_ms(max_batch) / 1000
    return finish <= request.deadline
