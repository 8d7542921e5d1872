"""The GPU scheduler: what a free GPU runs next (Symphony Section 4.3, ROMA Algorithm 1, Clockwork).

Driven by events and a clock, returning decisions (DESIGN.md, principle 1): the dispatch core
tells it of arrivals and of requests that leave a queue, and calls ``decide`` when a GPU is
free; it keeps every model's candidate batch up to date in between (schedulers/candidate.py).
Policies, chosen in the config so that they can be compared side by side (``gateway simulate``):

- ``fair_deferral`` (the default, ours): Symphony's non-work-conserving rule decides when a
  candidate is schedulable (beta x lambda rows, or sched_at), with a look-ahead: a candidate
  is due a millisecond before its sched_at (``DUE_MARGIN_S``). Among the schedulable, models
  whose recent bad rate runs more than a gap over the overall one go first (the fairness bound,
  schedulers/fairness.py), then the candidate with the earliest latest start (invalid_after:
  Clockwork's order, Section 5.3). Where the GPU executors answer after a round trip, a busy
  GPU gets its next batch, if full, that trip before its batch in flight ends (``PIPELINING``).
  Under overload the candidate drops a head that would shrink the batch (``early_drop``): only
  where the batch gains more requests than it leaves out; and once the bad rate over all models
  has stayed high for a while (a sustained overload, which sheds requests whatever the choice:
  ``SHED_ABOVE_BAD_RATE``), wherever the batch serves more, since the requests left out at the
  head are lost anyway (the flat-top of Section 4.4).
- ``deferral``: Symphony's policy exactly (Section 4.3): schedulable at beta x lambda items
  (rows here; a request is one item in Symphony) or at sched_at, the earliest sched_at first,
  Clipper's pruning of what cannot finish.
- ``work_conserving``: Symphony's work-conserving policy: no deferral, earliest sched_at first.
- ``edf``: Clockwork's controller (Section 5.3): no deferral, the candidate with the earliest
  *latest* start (its head's deadline less l(batch): invalid_after) first.
- ``roma``: ROMA's deficit choice (Algorithm 1) with no deferral: the model furthest over its
  set point first.
- ``round_robin``: the baselines of ROMA's evaluation (RR+CT, RR+rules, ...): the models take
  turns, in the order they were added, no deferral.

Every policy leaves out of a batch the requests that this GPU cannot finish in time. The
scheduler refuses nothing: the dispatch core (schedulers/dispatch.py) refuses a request only
when no device, GPU or CPU, can finish it.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schedulers.candidate import EPSILON_S, Candidate, form_candidate, grow
from schedulers.deficit import QUEUE_WEIGHT, SETPOINT_RATIO, deficit, estimated_response_ms, sla_batch
from schedulers.fairness import BadRateTracker
from schedulers.profiles import LatencyProfile
from schedulers.rate import ArrivalRate
from schedulers.request import Request, RequestQueue

POLICIES = ("fair_deferral", "deferral", "roma", "work_conserving", "edf", "round_robin")
DEFAULT_POLICY = "fair_deferral"
# Policies that hold a candidate back until it is schedulable (Symphony's non-work-conserving rule).
DEFERRING = ("fair_deferral", "deferral")
# Policies that use our early drop (schedulers/candidate.py); the papers' baselines do not.
DROPPING_EARLY = ("fair_deferral",)
# Policies whose GPUs get their next batch a round trip before the batch in flight ends
# (schedulers/dispatch.py, ``_pipeline``), as Clockwork's controller sends a worker actions
# ahead of the time it predicts the worker free (Section 4.5, "Modeling worker performance").
# The baselines hand a batch only to a free GPU, as the engine they are measured in always did
# (ROMA's freeGPU, Algorithm 1, "is executed as soon as a GPU becomes free", Section 3).
PIPELINING = ("fair_deferral",)
# The order in which a free GPU takes the schedulable candidates, where it is one of their times.
# edf is Clockwork's (Section 5.3): strategies ordered by latest = the head's deadline less the
# batch's execution time, which is the candidate's invalid_after.
ORDER_KEYS = {"fair_deferral": "invalid_after", "deferral": "sched_at", "work_conserving": "sched_at", "edf": "invalid_after"}
# The default's look-ahead: a candidate is due this long before its sched_at. A batch sent at
# sched_at itself has only l(n + 1) - l(n) = alpha (0.05 to 2 ms on Symphony's zoos) before it
# expires at invalid_after; a timer that fires a millisecond late (asyncio's timers follow the
# loop clock, of 1 ms grain under uvloop), an executor round trip, or a GPU that frees a moment
# after sched_at then costs the batch requests. One millisecond early, it still reaches a GPU in
# time; the batch it gives up is at most what arrives in that millisecond.
DUE_MARGIN_S = 0.001
# The look-ahead learns the round trip from late actions (``on_late``): it grows to 1.5x the
# longest one seen lately, at most 20 ms, and falls back to the floor as batches arrive in time.
LATE_GROWTH = 1.5
MAX_DUE_MARGIN_S = 0.020
MARGIN_DECAY = 0.999
# Past this bad rate over all models, averaged over about the last 10,000 requests, the load is
# shed whatever the choice, and the early drop counts a request it leaves out as no loss.
# Measured on the 1080Ti zoo at 2x the peak (Poisson, 3 seeds): in-SLO throughput 0.94 of the
# peak when a request left out counts as lost, 1.09 when it counts as nothing. The threshold is
# five times the 1% that Symphony's goodput allows, and the average a slow one: with the faster
# average (1,000 requests) at 1%, bursts at the peak (A100 zoo, Gamma shape 0.1) set it off and
# cost 2% of the goodput.
SHED_ABOVE_BAD_RATE = 0.05
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
    queue: RequestQueue = field(default_factory=RequestQueue)
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    counts_arrivals: bool = True  # False: ``rate`` is its owner's, who counts each admitted arrival
    recent_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=RECENT))
    candidate: Candidate | None = None
    version: int = 0  # bumped on every change of the candidate: older heap entries are stale


class GpuScheduler:
    """Keeps every model's candidate up to date as requests come and go, and hands a free GPU
    the best schedulable one (Symphony's ModelThreads and RankThread, Section 4.5, in one
    thread): an arrival costs O(1), a decision O(schedulable candidates)."""

    def __init__(self, policy: str = DEFAULT_POLICY, setpoint_ratio: float = SETPOINT_RATIO, queue_weight: float = QUEUE_WEIGHT):
        if policy not in POLICIES:
            raise ValueError(f"unknown GPU policy {policy!r} (known: {', '.join(POLICIES)})")
        self.policy = policy
        self.setpoint_ratio, self.queue_weight = setpoint_ratio, queue_weight
        self.models: dict[str, GpuModel] = {}
        self._defer = policy in DEFERRING
        self._drop_early = policy in DROPPING_EARLY
        self.pipelines = policy in PIPELINING
        self._due_margin = DUE_MARGIN_S if policy == "fair_deferral" else 0.0
        self.fairness = BadRateTracker()
        self._ready: dict[str, Candidate] = {}  # schedulable candidates
        # The schedulable candidates by the policy's order, for the policies whose order is a
        # property of the candidate alone: (key, version, model), stale entries dropped lazily.
        self._ready_order: list[tuple[float, int, str]] = []
        self._order_key = ORDER_KEYS.get(policy)
        self._waiting: list[tuple[float, int, str]] = []  # (sched_at, version, model): not yet schedulable
        self._last_served: str | None = None  # round_robin's turn

    def add_model(
        self,
        name: str,
        sla_ms: float,
        max_batch: int,
        profile: LatencyProfile,
        drop_late: bool = True,
        queue: RequestQueue | None = None,
        rate: ArrivalRate | None = None,
    ) -> None:
        """``queue``: the model's queue, read in place (the dispatch core's); requests leave it
        only through ``Dispatch`` decisions or with a call to ``on_queue_changed``. ``rate``: the
        model's arrival rate, read in place and counted by its owner (the dispatch core's, which
        counts the requests it admits, whichever device serves them); without one, every
        ``on_arrival`` is counted here."""
        state = GpuModel(sla_ms, max_batch, profile, drop_late, queue if queue is not None else RequestQueue())
        if rate is not None:
            state.rate, state.counts_arrivals = rate, False
        self.models[name] = state

    # -- events -----------------------------------------------------------------------------
    def on_arrival(self, model: str, now: float, request: Request | None = None) -> None:
        """``request`` was appended to the model's queue (None: only count the arrival)."""
        state = self.models[model]
        if state.counts_arrivals:
            state.rate.observe(now, request.rows if request is not None else 1)
        if request is None:
            return
        candidate = state.candidate
        if candidate is None or candidate.size == 0 or now > candidate.invalid_after:
            self._form(model, state, now)
        elif not candidate.full:
            was_schedulable = candidate.schedulable
            grow(
                candidate,
                request,
                state.profile,
                max_batch=state.max_batch,
                now=now,
                arrival_rate=state.rate.rows_per_second(now),
                defer=self._defer,
                prune=state.drop_late,
            )
            if not was_schedulable or self._order_key is not None:
                self._place(model, state, candidate)

    def on_queue_changed(self, model: str, now: float) -> None:
        """Requests left the model's queue, or came back to it, other than by arrival: form its candidate anew."""
        self._form(model, self.models[model], now)

    def on_late(self, sent: float, now: float) -> None:
        """A batch sent at ``sent`` reached its GPU executor after its latest start (Clockwork's
        late action), seen at ``now``: the look-ahead grows to what the round trip took."""
        if self._due_margin:
            self._due_margin = min(MAX_DUE_MARGIN_S, max(self._due_margin, (now - sent) * LATE_GROWTH))

    def on_batch_done(self, model: str, rows: int, latency_ms: float) -> None:
        if self._due_margin > DUE_MARGIN_S:
            # Back towards the floor, by half in about 700 batches without a late one.
            self._due_margin = max(DUE_MARGIN_S, self._due_margin * MARGIN_DECAY)
        self.models[model].profile.observe(rows, latency_ms)

    def on_completed(self, model: str, *responses_ms: float) -> None:
        """Requests of ``model`` (a batch's) were answered after ``responses_ms``."""
        state = self.models[model]
        state.recent_ms.extend(responses_ms)
        sla_ms = state.sla_ms
        self.fairness.record(model, sum(ms > sla_ms for ms in responses_ms), len(responses_ms))

    def on_refused(self, model: str, requests: Iterable[Request], now: float) -> None:
        """A refused request counts in R as a response no sooner than its SLA: it was a violation."""
        state = self.models[model]
        for request in requests:
            best_ms = (now - request.arrival) * 1000 + state.profile.latency_ms(request.rows)
            state.recent_ms.append(max(best_ms, state.sla_ms))
            self.fairness.record(model, 1)

    # -- candidates -------------------------------------------------------------------------
    def _form(self, model: str, state: GpuModel, start: float) -> Candidate | None:
        candidate = form_candidate(
            model,
            state.queue,
            state.profile,
            max_batch=state.max_batch,
            now=start,
            start=start,
            arrival_rate=state.rate.rows_per_second(start),
            defer=self._defer,
            prune=state.drop_late,
            drop_early=self._drop_early,
            skip_cost=0.0 if self.fairness.sustained > SHED_ABOVE_BAD_RATE else 1.0,
        )
        state.candidate = candidate
        self._place(model, state, candidate)
        return candidate

    def _place(self, model: str, state: GpuModel, candidate: Candidate | None) -> None:
        state.version += 1
        self._ready.pop(model, None)
        if candidate is None or candidate.size == 0:
            return
        if candidate.schedulable:
            self._make_ready(model, state, candidate)
        else:
            heapq.heappush(self._waiting, (candidate.sched_at - self._due_margin, state.version, model))

    def _due(self, now: float) -> None:
        """Candidates whose sched_at has come are schedulable now."""
        waiting = self._waiting
        while waiting and waiting[0][0] <= now + EPSILON_S:
            _, version, model = heapq.heappop(waiting)
            state = self.models[model]
            if version == state.version and state.candidate is not None:
                state.candidate.schedulable = True
                self._make_ready(model, state, state.candidate)

    def _make_ready(self, model: str, state: GpuModel, candidate: Candidate) -> None:
        self._ready[model] = candidate
        if self._order_key is not None:
            heapq.heappush(self._ready_order, (getattr(candidate, self._order_key), state.version, model))

    def _first_in_order(self) -> str:
        """The schedulable candidate first in the policy's order (the ready heap's valid top)."""
        order, ready, models = self._ready_order, self._ready, self.models
        while True:
            _, version, model = order[0]
            if model in ready and models[model].version == version:
                return model
            heapq.heappop(order)

    def _next_sched_at(self) -> float | None:
        waiting = self._waiting
        while waiting and waiting[0][1] != self.models[waiting[0][2]].version:
            heapq.heappop(waiting)
        return waiting[0][0] if waiting else None

    # -- decisions --------------------------------------------------------------------------
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

    def _choose(self, now: float) -> str:
        ready = self._ready
        if self.policy == "fair_deferral":
            # Models behind on their bad rate first (the fairness bound), then Clockwork's order
            # (the earliest latest start, invalid_after): the candidate that expires first, where
            # Symphony's earliest sched_at would hand the GPU to one that can still wait
            # (docs/BENCHMARKS.md: 1.07-1.83x Symphony's goodput, and the same as edf's).
            behind = [n for n in self.fairness.behind_models if n in ready]
            if behind:
                return min(behind, key=lambda n: ready[n].invalid_after)
        if self._order_key is not None:
            return self._first_in_order()
        if self.policy == "round_robin":
            return self._next_turn(ready)
        deficits = {name: self.model_deficit(name, self.models[name].queue, now) for name in ready}
        return min(ready, key=lambda n: (-deficits[n], ready[n].sched_at))  # roma

    def decide(
        self, now: float, gpu: str, gpu_free_at: float, queues: Mapping[str, RequestQueue] | None = None
    ) -> Decision | None:
        """What ``gpu`` (free at ``gpu_free_at``) should do now: a batch, a wait, or nothing.

        ``queues``: for a caller that keeps queues of its own rather than handing them to
        ``add_model``: the models' queues as they are now (a model left out has none queued);
        every candidate is formed anew from them.
        """
        start = max(now, gpu_free_at)
        if queues is not None:
            for name, state in self.models.items():
                state.queue = queues.get(name) or RequestQueue()
                self._form(name, state, start)
        self._due(now)
        while self._ready:
            chosen = self._choose(now)
            state = self.models[chosen]
            candidate = self._ready[chosen]
            if state.drop_late and start > candidate.invalid_after + EPSILON_S:
                # It expired while it waited for a GPU: prune it for this start and choose again.
                # (A model that serves late rather than refuse is never pruned: its batch goes.)
                # Formed anew it fits: its first request fits alone (form_candidate), so decide ends.
                self._form(chosen, state, start)
                self._due(now)
                continue
            batch = tuple(itertools.islice(state.queue, candidate.skip, candidate.skip + candidate.size))
            # The caller takes these requests out of the queue; the candidate is formed anew then.
            state.candidate = None
            self._place(chosen, state, None)
            return Dispatch(chosen, gpu, batch, candidate.skip)
        sched_at = self._next_sched_at()
        if sched_at is not None:
            return WaitUntil(max(now, sched_at))
        return None


def batches_ms(profile: LatencyProfile, count: int, max_batch: int) -> float:
    """A GPU's time to serve ``count`` requests in full batches of ``max_batch`` and one partial batch."""
    full, rest = divmod(count, max_batch)
    return full * profile.latency_ms(max_batch) + (profile.latency_ms(rest) if rest else 0.0)


def gpu_can_finish(
    request: Request,
    position: int,
    now: float,
    gpu_free_at: float,
    profile: LatencyProfile,
    max_batch: int,
    within: float = 1.0,
) -> bool:
    """Whether the GPUs' projected capacity serves the request at ``position`` of its queue in time.

    The projection: the earliest GPU starts the queue at max(now, gpu_free_at) and works through
    it in full batches, the request's own batch holding it and the requests before it in that
    round: l(max_batch) per full round ahead, then l(position mod max_batch + 1). (Charging a
    whole l(max_batch) for its own round too would hand the CPU every request of a model whose
    GPU cost grows with the batch: with 8 rows at 16 ms each, even the head of a fresh queue
    would look late for a 56 ms SLA.) ``gpu_free_at`` may include the other models' work the
    GPUs will do first (the dispatch core's ``_cpu_share``). The CPU scheduler takes from a queue
    only requests for which this is false, so CPU executors never starve a batch the GPU is
    deferring on purpose (../shared/DESIGN.md, open questions).
    """
    due = request.deadline if within >= 1.0 else request.arrival + within * (request.deadline - request.arrival)
    return max(now, gpu_free_at) + batches_ms(profile, position + 1, max_batch) / 1000 <= due
