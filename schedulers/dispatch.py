"""The dispatch core: every per-request decision of the data path, fed events, returning actions.

It owns the per-model queues (ROMA Section 2.1), admission (a bounded queue, Clockwork's
refusal of what cannot meet its deadline, Section 5.2), per-request timeouts, the choice between
CPU and GPU executors, batch formation, and the calls into the GPU scheduler (ROMA Algorithm 1
with Symphony's deferral, schedulers/gpu.py) and the CPU scheduler (ROMA's random round-robin,
schedulers/round_robin.py). Like h11 and Clockwork's controller (../shared/STYLE.md) it does no
I/O and reads no clock: each event carries ``now``, and the answer is a list of actions.

Events: a request arrives (``on_arrival``), an executor comes up or goes down
(``set_executor_ready``), a batch ends (``on_batch_done``, ``on_batch_failed``), a timer fires
(``on_timer``), a client goes away (``cancel``). Actions: ``Start`` a batch on an executor, ``Finish`` the requests of a batch
that are still waiting for its result, ``Fail`` requests with a status and a reason, ``WakeAt``
a time (a deferred batch falls due, or a request times out).

``gateway serve`` (gateway/engine.py) carries the actions out with asyncio, futures and
executor processes; ``gateway simulate`` (gateway/tools/simulate.py) with a virtual clock and
executors that take their profile's l(b). Both run this very code.

Which device serves what (the "spill" rule of ../shared/DESIGN.md): where GPUs serve a model,
a CPU executor takes from its queue only the requests that the GPUs' projected capacity cannot
finish in time, so that it never starves a batch the GPU defers on purpose. A request is refused
only when no device, GPU or CPU, can finish it by its deadline, and only for models that ask for
it (``drop_late``); the others are served late and counted as violations.

When a GPU gets work: once it is free, and, for the policies that pipeline (the default), also
a round trip before its batch in flight is expected to end, when no GPU is idle and the batch
chosen is full (``_pipeline``): the executor then holds one batch queued behind the running
one, as Clockwork's workers hold the actions their controller sends ahead (Section 4.5).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import statistics
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from schedulers.admission import admissible
from schedulers.candidate import hopeless_count
from schedulers.cpu_batch import cpu_batch_rows, dispatch_due, planned_batch_rows
from schedulers.gpu import Dispatch, GpuScheduler, WaitUntil, batches_ms, gpu_can_finish
from schedulers.gpu_memory import GpuMemory, Load
from schedulers.priority import position, was_ahead
from schedulers.profiles import LatencyProfile
from schedulers.rate import ArrivalRate
from schedulers.request import ENDED, QUEUED, RUNNING, Request, RequestQueue
from schedulers.round_robin import RandomRoundRobin

CPU, GPU = "cpu", "gpu"


def cpu_executor_id(model: str) -> str:
    """The id of a model's CPU executor: one per model (ROMA Section 2.2), in serving and in
    the simulator alike."""
    return f"cpu-{model}"


# The outcome of a batch whose executor failed (crashed, hung, hung up): ``on_batch_failed``
# then takes back the batch queued behind it, which the executor had not begun.
EXECUTOR_FAILED = "executor_failed"
# Float seconds: a timer set for t must find what is due at t.
EPSILON_S = 1e-9
# How long admission refuses, for the measurements alone, every request of one size before the
# model forgets the measurements that refuse them (``_measures_anew``).
RELEARN_AFTER_S = 5.0
REFUSAL_MARGIN_S = 1e-6
# The timeout heap drops its ended entries lazily, from the top; it is rebuilt with the live
# ones alone once it holds twice as many as after its last rebuild (and at least this many).
# Without it, every request ended in the last request_timeout_s (60 s by default; an hour in the
# simulator) stays reachable from the heap with its payload: its inputs' arrays, and objects
# that every full collection of Python's cyclic collector walks while the event loop waits.
TIMEOUTS_COMPACT_MIN = 64


# -- what the core hands out --------------------------------------------------------------------
@dataclass(eq=False)
class Batch:
    id: int
    model: str
    executor: str
    device: str  # "cpu" or "gpu"
    requests: tuple[Request, ...]
    rows: int
    started: float
    expected_end: float  # started + the profile's l(rows)
    # Clockwork's action window (Section 4.4): an executor that would start the batch later than
    # this refuses it (``on_batch_late``): its earliest deadline could no longer be met. Set on
    # GPU batches of models that refuse what they cannot finish in time; inf otherwise.
    latest_start: float = math.inf
    # A GPU batch of a model its GPU did not hold: LOADed first (and others UNLOADed), the load
    # time part of the batch's expected end (Clockwork Section 4; schedulers/gpu_memory.py).
    load: Load | None = None
    # A GPU batch sent while the GPU's batch before it still ran (``_pipeline``): when that one
    # was expected to end, and this one to begin. None: sent to an idle executor.
    begins: float | None = None


@dataclass(frozen=True)
class Start:
    """Run ``batch`` on its executor; report back with ``on_batch_done`` or ``on_batch_failed``."""

    batch: Batch


@dataclass(frozen=True)
class Finish:
    """The batch ended: answer ``requests`` (those of the batch not ended meanwhile) with its outputs."""

    batch: Batch
    requests: tuple[Request, ...]


@dataclass(frozen=True)
class Fail:
    """End ``requests`` with an error: HTTP ``status``, the accounting's ``outcome``, a message for the client."""

    requests: tuple[Request, ...]
    status: int
    outcome: str
    message: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class WakeAt:
    """Call ``on_timer`` at ``time`` (an earlier wake-up asked for before still stands)."""

    time: float


Action = Start | Finish | Fail | WakeAt


# -- what the core keeps ------------------------------------------------------------------------
@dataclass
class ModelState:
    name: str
    sla_ms: float
    max_batch: int  # 1 for a model without a batch dimension
    max_queue_size: int
    drop_late: bool
    cpu_profile: LatencyProfile | None = None
    gpu_profile: LatencyProfile | None = None
    queue: RequestQueue = field(default_factory=RequestQueue)
    cpu_executors: list[ExecutorState] = field(default_factory=list)
    on_gpus: bool = False  # the GPU scheduler serves it
    watched: Request | None = None  # the head whose refusal time is in the core's heap
    dispatch_batch: int = 1  # a planned CPU batch size: > 1, Harpagon's batch-aware dispatch (cpu_batch.py)
    priority_levels: int = 1  # 1: every request equal (priority.py)
    priority_bound_s: float = math.inf  # how long a lower level may be passed by higher ones
    # Rows -> since when admission has refused, for its measurements alone, every request of that
    # size (``_measures_anew``).
    refusing_since: dict[int, float] = field(default_factory=dict)
    # Its admitted requests and their rows over the last second: Symphony's lambda for the GPU
    # scheduler (which reads this one, in rows), and what a late CPU head goes alone or batched
    # against (in requests, each weighed at the rows they bring).
    arrivals: ArrivalRate = field(default_factory=ArrivalRate)
    # What a CPU batch held its executor beyond its compute (the trip to the executor and back,
    # the engine's part), over its last CPU_TRIPS batches; their median, ``cpu_trip_ms``, is what
    # one by one a request holds it for beside its l(r) (a stall now and then moves no median).
    cpu_trips: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=CPU_TRIPS))

    @property
    def cpu_trip_ms(self) -> float:
        return statistics.median(self.cpu_trips) if self.cpu_trips else 0.0

    @property
    def cpu_servers(self) -> int:
        """Its CPU executors that are ready, which drain its queue together (at least 1)."""
        return max(1, sum(e.ready for e in self.cpu_executors))


@dataclass
class ExecutorState:
    id: str
    device: str
    model: str | None  # a CPU executor holds one model; a GPU executor holds them all
    ready: bool = False
    batch: Batch | None = None
    queued: Batch | None = None  # a GPU's next batch, sent before ``batch`` ends (``_pipeline``)

    @property
    def last(self) -> Batch | None:
        """The batch this executor will end last: the queued one, else the one running."""
        return self.queued or self.batch

    def free_at(self, now: float) -> float:
        last = self.last
        return now if last is None else max(now, last.expected_end)


def _ms(seconds: float) -> str:
    """Seconds as milliseconds for a message, to the microsecond (1 us was 0.000999993 ms)."""
    return f"{round(seconds * 1000, 3):g}"


def _bound(request: Request, state: ModelState) -> str:
    """What the request's deadline is: its model's SLA, or its own timeout where that is tighter."""
    # Set from its own timeout at admission: the SLA may have changed since (the admin API).
    if request.timeout_s and request.deadline == request.arrival + request.timeout_s:
        return f"the request's timeout of {_ms(request.timeout_s)} ms"
    return f"its SLA of {state.sla_ms:g} ms"


def _stacking(requests: Sequence[Request]) -> Iterator[Request]:
    """The leading requests whose inputs stack with the first's (its batch key): one batch."""
    first_key = requests[0].batch_key
    return itertools.takewhile(lambda r: r.batch_key == first_key, requests)


def _awaits_next(end: float, batch_id: int, gpu: ExecutorState) -> bool:
    """Whether an entry of the core's ``_pipeline_ends`` still stands: the GPU is ready, runs that
    batch, still expected to end then, and has nothing queued behind it."""
    running = gpu.batch
    return gpu.ready and gpu.queued is None and running is not None and (running.id, running.expected_end) == (batch_id, end)


# The GPUs keep a request only if they can answer it within this share of its SLA; the CPU
# takes the rest. At 1.0 (the deadline itself) the GPUs keep requests they would answer just
# in time: under an overload every GPU answer then comes near the SLA, and the mean of a
# one-second window goes over it (ROMA's evaluation, docs/BENCHMARKS.md: 3 to 7 violating
# windows in a test at 1.0 and 0.8, none at 0.7).
SPILL_WITHIN = 0.7
# A GPU executor answers a batch some time after its l(b): the batch's trip to the executor and
# the answer's trip back (in `gateway serve` on the developers' 2-core machine, 0.65 ms a batch
# in ROMA's evaluation, and 0.3 ms more before the next batch was sent: 9% of the GPU's time at
# 10 ms a request). The policies that pipeline (schedulers/gpu.py, PIPELINING) send a GPU its
# next batch this trip before its batch in flight is expected to end, so that the executor reads
# it as soon as it is free. The trip is learned from the batches sent to an idle GPU: an average
# with this weight, of the time from sending to the answer less l(b) as the executor measured it.
ROUND_TRIP_WEIGHT = 0.05
# The CPU batches whose trips a model's median trip is read from (ModelState.cpu_trips).
CPU_TRIPS = 15
# Below this there is no trip to hide (the simulator without a dispatch delay: none at all), and
# a GPU gets a batch only once it is free, as without pipelining.
PIPELINE_MIN_S = 1e-4
# A trip longer than this is a stall, not a round trip: a batch is never sent earlier.
PIPELINE_MAX_S = 0.010


class _OtherGpuQueue:
    """Another model's queue as GPU work ahead of a request of this one: its requests due before
    the request's deadline, less those no GPU can finish anyway (the hopeless head, the CPU's).
    Asked with ascending deadlines, it walks its queue once (an iterator: a deque's index is
    linear in the middle)."""

    def __init__(self, queue: RequestQueue, profile: LatencyProfile, max_batch: int, gpu_start: float):
        self.profile, self.max_batch = profile, max_batch
        self._rest = itertools.islice(queue, hopeless_count(queue, profile, gpu_start), None)
        self._next = next(self._rest, None)
        self.due = 0  # requests past the hopeless head due no later than the last deadline asked about

    def work_before(self, deadline: float) -> float:
        """ms of GPU work in this queue due no later than ``deadline``."""
        while self._next is not None and self._next.deadline <= deadline:
            self.due += 1
            self._next = next(self._rest, None)
        return batches_ms(self.profile, self.due, self.max_batch)


class DispatchCore:
    def __init__(
        self,
        *,
        cpu_scheduler: RandomRoundRobin,
        gpu_scheduler: GpuScheduler | None = None,
        request_timeout_s: float = 60.0,
        cpu_sharing: str = "spill",
        gpu_memory: GpuMemory | None = None,
        spill_within: float = SPILL_WITHIN,
    ):
        """``gpu_memory``: each GPU holds only the models that fit it, loaded on demand (None:
        every GPU holds every model). ``spill_within``: the share of its SLA within which the
        GPUs must answer a request to keep it from the CPU (``_cpu_share``)."""
        self.cpu_scheduler, self.gpu_scheduler = cpu_scheduler, gpu_scheduler
        self.gpu_memory = gpu_memory
        self.request_timeout_s = request_timeout_s
        self.cpu_sharing, self.spill_within = cpu_sharing, spill_within
        self.models: dict[str, ModelState] = {}
        self.executors: dict[str, ExecutorState] = {}
        self._gpus: list[ExecutorState] = []
        self._idle_gpus: dict[str, ExecutorState] = {}  # ready and without a batch, in the order they became so
        self._gpu_ends: list[tuple[float, int, ExecutorState]] = []  # (expected end, batch id, GPU) of batches started
        self._cpu_models: list[ModelState] = []  # models with CPU executors
        self._timeouts: list[tuple[float, int, Request]] = []
        self._timeouts_compact_at = TIMEOUTS_COMPACT_MIN
        # The time past which each model's head request can be finished by no device, so that
        # a head that time has made hopeless is refused even when nothing else happens to it.
        self._refusals: list[tuple[float, int, Request]] = []
        self._touched: dict[str, ModelState] = {}  # models whose queues changed since the last pump
        self._deferral_at = math.inf  # the GPU scheduler's WaitUntil
        self._pipeline_at = math.inf  # the earliest a busy GPU is due its next batch (_pipeline)
        # (expected end, batch id, GPU) of running batches with nothing queued behind them, and
        # the GPUs whose next batch is due (a round trip before that end) and not yet decided.
        self._pipeline_ends: list[tuple[float, int, ExecutorState]] = []
        self._pipeline_due: dict[str, ExecutorState] = {}
        self.gpu_round_trip_s = 0.0  # learned from batches sent to an idle GPU (ROUND_TRIP_WEIGHT)
        self._trips_seen = 0
        self._cpu_hold_at = math.inf  # the earliest a CPU batch held for its planned size is due
        self._wake_asked = math.inf  # the earliest WakeAt handed out and not yet fired
        self._batch_ids = itertools.count(1)
        # Batches taken back from a failed executor before it began them: their requests went
        # back to their queues, so the executor's own report of them changes nothing.
        self._withdrawn: set[int] = set()

    # -- set-up -------------------------------------------------------------------------------
    def add_model(
        self,
        name: str,
        *,
        sla_ms: float,
        max_batch: int,
        max_queue_size: int,
        drop_late: bool = False,
        cpu_profile: LatencyProfile | None = None,
        gpu_profile: LatencyProfile | None = None,
        dispatch_batch: int = 1,
        priority_levels: int = 1,
        priority_bound_ms: float = math.inf,
    ) -> None:
        state = ModelState(name, sla_ms, max_batch, max_queue_size, drop_late, cpu_profile, gpu_profile)
        state.dispatch_batch = dispatch_batch
        state.priority_levels, state.priority_bound_s = priority_levels, priority_bound_ms / 1000
        state.cpu_executors = [e for e in self.executors.values() if e.model == name]
        self.models[name] = state
        if state.cpu_executors:
            self._cpu_models.append(state)
        if self.gpu_scheduler is not None and gpu_profile is not None:
            self.gpu_scheduler.add_model(name, sla_ms, max_batch, gpu_profile, drop_late, state.queue, state.arrivals)
            state.on_gpus = True

    def add_gpu_profile(self, model: str, profile: LatencyProfile, now: float) -> list[Action]:
        """A model served before any GPU was there to profile it on (a dispatcher whose workers
        with GPUs connected later): the GPU scheduler takes it from now on, its queue as it is."""
        state = self.models[model]
        if state.gpu_profile is not None or self.gpu_scheduler is None:
            return []
        state.gpu_profile = profile
        self.gpu_scheduler.add_model(model, state.sla_ms, state.max_batch, profile, state.drop_late, state.queue, state.arrivals)
        state.on_gpus = True
        self.gpu_scheduler.on_queue_changed(model, now)
        state.watched = None
        self._touched[model] = state
        return self._pump(now)

    def remove_model(self, model: str) -> None:
        """A model unloaded at run time, its queue empty and no batch of it running: the core
        forgets it and its CPU executors (the GPU executors stay, for the other models)."""
        state = self.models[model]
        if state.queue or any(e.batch is not None for e in state.cpu_executors):
            raise ValueError(f"model '{model}' still has requests queued or running")
        for executor in state.cpu_executors:
            self.executors.pop(executor.id, None)
        if state in self._cpu_models:
            self._cpu_models.remove(state)
        self._touched.pop(model, None)
        del self.models[model]
        if self.gpu_scheduler is not None:
            self.gpu_scheduler.models.pop(model, None)

    def drop_queue(self, model: str, message: str) -> list[Action]:
        """Answer every queued request of ``model`` 503 with ``message`` (it is being unloaded)."""
        state = self.models[model]
        dropped = list(state.queue)
        state.queue.clear()
        if not dropped:
            return []
        self._end(dropped)
        return [Fail(tuple(dropped), 503, "unloaded", message)]

    def end_running(self, model: str, message: str) -> list[Action]:
        """Answer the live requests of ``model``'s batches on its executors 503 with ``message``
        (it is being unloaded, and they ran past the wait): each batch stays its executor's until
        the executor reports it (stopped, it fails), and its answer, should one come, is dropped."""
        running = [b for e in self.executors.values() for b in (e.batch, e.queued) if b is not None and b.model == model]
        ended = self._end(r for batch in running for r in batch.requests)
        return [Fail(ended, 503, "unloaded", message)] if ended else []

    def busy(self, model: str) -> bool:
        """Requests of the model are queued, or a batch of it runs."""
        state = self.models[model]
        return bool(state.queue) or any(
            b is not None and b.model == model for e in self.executors.values() for b in (e.batch, e.queued)
        )

    def add_executor(self, executor_id: str, device: str, model: str | None = None) -> None:
        """A CPU executor of ``model``, or (``device`` "gpu", no model) a GPU executor of every model."""
        executor = ExecutorState(executor_id, device, model)
        self.executors[executor_id] = executor
        if device == GPU:
            self._gpus.append(executor)
            if self.gpu_memory is not None:
                self.gpu_memory.add_gpu(executor_id)
        elif model in self.models:
            state = self.models[model]
            state.cpu_executors.append(executor)
            if state not in self._cpu_models:
                self._cpu_models.append(state)

    def remove_executor(self, executor_id: str) -> bool:
        """Forget an executor gone for good (a worker let go); False, and nothing forgotten, while
        it is up or has a batch: it is forgotten once that has ended."""
        executor = self.executors.get(executor_id)
        if executor is None:
            return True
        if executor.ready or executor.last is not None:
            return False
        del self.executors[executor_id]
        if executor.device == GPU:
            self._gpus.remove(executor)
            self._idle_gpus.pop(executor_id, None)
            if self.gpu_memory is not None:
                self.gpu_memory.held.pop(executor_id, None)
        elif executor.model in self.models:
            self.models[executor.model].cpu_executors.remove(executor)
        return True

    def set_sla(self, model: str, sla_ms: float) -> None:
        """Requests that arrive from now on get the new SLA; those queued keep their deadline."""
        self.models[model].sla_ms = sla_ms
        if self.gpu_scheduler is not None and model in self.gpu_scheduler.models:
            self.gpu_scheduler.models[model].sla_ms = sla_ms

    def set_dispatch_batch(self, model: str, rows: int, now: float) -> list[Action]:
        """A planned CPU batch size from now on (1: none, the first free executor takes what is
        queued); the queue is looked at again, since a batch it waited for may now be due."""
        state = self.models[model]
        state.dispatch_batch = rows
        state.watched = None
        self._touched[model] = state
        return self._pump(now)

    # -- events -------------------------------------------------------------------------------
    def on_arrival(self, request: Request, now: float) -> list[Action]:
        """Admit ``request`` (its arrival, rows, batch key, own timeout and payload set) or refuse it."""
        state = self.models[request.model]
        queue = state.queue
        request.deadline = request.arrival + state.sla_ms / 1000
        # The client's own deadline, where its timeout is tighter than the SLA (Triton reads 0 as none).
        own_timeout = request.timeout_s
        own_deadline = bool(own_timeout) and request.arrival + own_timeout < request.deadline
        if own_deadline:
            request.deadline = request.arrival + own_timeout
        timeout_s = self.request_timeout_s
        if own_timeout and own_timeout < timeout_s:  # Triton reads 0 as no timeout of the client's own
            timeout_s = own_timeout
        request.timeout_at = timeout_at = request.arrival + timeout_s
        if timeout_at <= now + EPSILON_S:
            # Its timeout passed before it reached the queue (its body was still arriving, or a
            # timeout of 1 us): queued, an idle executor ran it and the result was discarded.
            request.state = ENDED
            message = f"timed out after {_ms(timeout_s)} ms, before it reached the queue; it was not run"
            return [Fail((request,), 504, "timeout", message)]
        if len(queue) >= state.max_queue_size:
            request.state = ENDED
            retry_after = self.retry_after_s(request.model)
            message = (
                f"model '{state.name}' has {len(state.queue)} requests waiting, its limit (max_queue_size); "
                f"refused before any work was done, retry in {retry_after} s"
            )
            return [Fail((request,), 429, "queue_full", message, (("Retry-After", str(retry_after)),))]
        if state.drop_late:
            fastest = self._fastest_ms(state, request.rows)
            if fastest is not None and not admissible(request, now, fastest):
                if self._measures_anew(state, request.rows, now):
                    fastest = self._fastest_ms(state, request.rows)
            elif state.refusing_since:  # admitted: its size is measured again
                state.refusing_since.pop(request.rows, None)
            if fastest is not None and not admissible(request, now, fastest):
                request.state = ENDED
                load_ms = self._load_ms(state.name) if state.gpu_profile is not None else 0.0
                loading = f", a GPU loading the model first ({load_ms:g} ms) included" if load_ms else ""
                # The time already gone names itself: a body that took the SLA to arrive was said
                # to be refused for a device that needed 0.2 ms.
                message = (
                    f"model '{state.name}' cannot answer within {_bound(request, state)}: {_ms(now - request.arrival)} ms "
                    f"of it had passed when it reached the queue, and the fastest device needs {fastest:.1f} ms for "
                    f"this request{loading}; refused before any work was done"
                )
                return [Fail((request,), 503, "refused_deadline", message)]
        request.state = QUEUED
        state.arrivals.observe(now, request.rows)  # admitted: refused requests add no load
        heapq.heappush(self._timeouts, (timeout_at, request.id, request))
        if len(self._timeouts) >= self._timeouts_compact_at:
            self._compact_timeouts()
        # FIFO with one level; with several, ahead of the lower levels (priority.py).
        if state.priority_levels > 1 and queue and (index := position(queue, request, now, state.priority_bound_s)) < len(queue):
            queue.insert(index, request)
            if state.on_gpus:
                self.gpu_scheduler.on_queue_changed(state.name, now)  # its candidate is formed anew
            if index == 0:
                self._touched[state.name] = state  # a new head, to look at and to watch
            return self._pump(now)
        queue.append(request)
        if state.on_gpus:
            self.gpu_scheduler.on_arrival(state.name, now, request)
        if len(queue) == 1:
            # A new head, to look at and to watch. Behind an older head an arrival changes
            # nothing about what can be finished in time: time does, and the refusal heap has it.
            self._touched[state.name] = state
        return self._pump(now)

    def set_executor_ready(self, executor_id: str, ready: bool, now: float) -> list[Action]:
        executor = self.executors[executor_id]
        executor.ready = ready
        if executor.device == GPU:
            if not ready and self.gpu_memory is not None:
                self.gpu_memory.forget(executor_id)  # restarted, it holds nothing
            self._gpu_changed(executor)
        # Which device can finish what has changed for every model: look again, watch anew.
        for name, state in self.models.items():
            if state.queue:
                state.watched = None
                self._touched[name] = state
        return self._pump(now)

    def on_batch_done(self, batch: Batch, compute_ms: float, now: float, learn: bool = True) -> list[Action]:
        """``batch`` ran in ``compute_ms`` on its executor: its live requests are answered, the
        profile learns. ``learn`` False: the time is not the batch's own (the model refused the
        batch, and its requests ran again one at a time), and no profile learns from it."""
        if self._reported_withdrawn(batch):
            return [Finish(batch, ())]
        self._release(batch, now)
        state = self.models[batch.model]
        gpu_model = state.on_gpus
        if learn and batch.device == GPU and gpu_model:
            self.gpu_scheduler.on_batch_done(batch.model, batch.rows, compute_ms)
            if batch.begins is None:  # sent to an idle GPU: all but l(b) (and a load) was the trip
                load_s = batch.load.load_ms / 1000 if batch.load is not None else 0.0
                trip_s = min(PIPELINE_MAX_S, max(0.0, now - batch.started - compute_ms / 1000 - load_s))
                weight = ROUND_TRIP_WEIGHT if self._trips_seen else 1.0  # the first answer sets it
                self.gpu_round_trip_s += weight * (trip_s - self.gpu_round_trip_s)
                self._trips_seen += 1
        elif learn and batch.device == CPU and state.cpu_profile is not None:
            state.cpu_profile.observe(batch.rows, compute_ms)
            state.cpu_trips.append(max(0.0, (now - batch.started) * 1000 - compute_ms))
        live = self._end(batch.requests)
        if gpu_model and live:
            self.gpu_scheduler.on_completed(batch.model, *((now - r.arrival) * 1000 for r in live))
        return [Finish(batch, live), *self._pump(now)]

    def on_batch_late(self, batch: Batch, now: float) -> list[Action]:
        """The executor refused ``batch``: it reached it after its ``latest_start`` (Clockwork's
        late action, Section 4.4). Nothing ran; the live requests go back to their queue in
        arrival order, to be rescheduled, or refused at once if no device can finish them now."""
        if self._reported_withdrawn(batch):
            return []
        self._release(batch, now)
        state = self.models[batch.model]
        if state.on_gpus:
            # A batch queued behind another was on its way only from when that one was to end.
            self.gpu_scheduler.on_late(batch.started if batch.begins is None else batch.begins, now)
        self._requeue(batch.model, batch.requests, now)
        reason = "its batch reached the GPU executor after its latest start time and was not run"
        return self._pump(now, refusal_reason=(state.name, reason))

    def on_batch_failed(
        self,
        batch: Batch,
        now: float,
        status: int,
        outcome: str,
        message: str,
        answered: Collection[Request] = (),
        unrun: Collection[Request] = (),
    ) -> list[Action]:
        """``batch`` did not run: its live requests end with ``status``. Of a batch the model
        refused, run a request at a time, whose executor failed partway: ``answered``, those that
        ran before, their results in hand, which a ``Finish`` answers; ``unrun``, those never sent
        to it, which go back to their queue as a late action's do (only the one it failed on
        ends with ``status``: its own input may be what killed it).

        Where its executor failed (``EXECUTOR_FAILED``: crashed, hung and killed, hung up), a
        batch queued on it (``_pipeline``) had not begun: the executor reads it only once it has
        answered the one before. That one is taken back, whichever of the two is reported first:
        its requests go back to their queue to be served elsewhere, or refused at once if no
        device can finish them now, as after a late action. The failed executor gets no work in
        this decision: it may still be reported up when its batches' failures arrive (an executor
        on a worker, whose worker restarts it and reports so later; or a connection's failure that
        reaches the batch before the supervisor's own notice)."""
        if self._reported_withdrawn(batch):
            return []
        executor = self.executors[batch.executor]
        if outcome != EXECUTOR_FAILED:
            self._release(batch, now)
            live = self._end(batch.requests)
            return ([Fail(live, status, outcome, message)] if live else []) + self._pump(now)
        actions: list[Action] = []
        if executor.queued is batch:
            unbegun: Batch | None = batch  # reported before the batch it waited behind
        else:
            unbegun = executor.queued if executor.batch is batch else None
            self._release(batch, now)
            live = self._end(r for r in batch.requests if r not in unrun)
            done = tuple(r for r in live if r in answered)
            if done:
                actions.append(Finish(batch, done))
                if self.models[batch.model].on_gpus:  # answered, as on_batch_done reports them
                    self.gpu_scheduler.on_completed(batch.model, *((now - r.arrival) * 1000 for r in done))
            if failed_requests := tuple(r for r in live if r not in answered):
                actions.append(Fail(failed_requests, status, outcome, message))
            if unrun:
                self._requeue(batch.model, unrun, now)
            if unbegun is not None:
                self._withdrawn.add(unbegun.id)  # its own report is still to come
        reason = None
        if unbegun is not None:
            self._release(unbegun, now)
            self._requeue(unbegun.model, unbegun.requests, now)
            reason = (unbegun.model, "its GPU executor failed before it began the batch")
        failed = self._idle_gpus.pop(executor.id, None)
        actions += self._pump(now, refusal_reason=reason)
        if failed is not None and failed.ready and failed.batch is None:
            self._idle_gpus.setdefault(executor.id, failed)
        return actions

    def on_timer(self, now: float) -> list[Action]:
        """Time passed: end the requests past their timeout, and decide again (deferred batches)."""
        self._wake_asked = math.inf
        actions: list[Action] = []
        while self._timeouts and self._timeouts[0][0] <= now + EPSILON_S:
            _, _, request = heapq.heappop(self._timeouts)
            if request.state == ENDED:
                continue
            if request.state == QUEUED:
                state = self.models[request.model]
                state.queue.remove(request)
                self._queue_changed(state, now)
                where = "waiting in the queue; it was not run"
            else:
                where = "while its batch ran; the result is discarded"
            request.state = ENDED
            waited = _ms(request.timeout_at - request.arrival)
            actions.append(Fail((request,), 504, "timeout", f"timed out after {waited} ms {where}"))
        return actions + self._pump(now)

    def cancel(self, request: Request, now: float) -> list[Action]:
        """Its client has gone: a queued request leaves the queue at once (never run, its slot
        free); a running one ends now and its result is discarded when the batch ends."""
        if request.state == QUEUED:
            state = self.models[request.model]
            state.queue.remove(request)
            self._queue_changed(state, now)
        elif request.state != RUNNING:
            return []
        request.state = ENDED
        return self._pump(now)

    def shutdown(self) -> list[Action]:
        """End every queued request (the gateway is going away); running batches end with their executors."""
        queued = []
        for state in self.models.values():
            while state.queue:
                queued.append(state.queue.popleft())
            if state.on_gpus:
                self.gpu_scheduler.on_queue_changed(state.name, 0.0)
        self._end(queued)
        return [Fail(tuple(queued), 503, "shutdown", "the gateway is shutting down")] if queued else []

    # -- what the shell and the control loop read ------------------------------------------------
    def queue_length(self, model: str) -> int:
        return len(self.models[model].queue)

    def cpu_backlog(self, model: str, now: float) -> tuple[int, float | None]:
        """The work a CPU controller cannot see completing: the requests running on the model's
        CPU executors and those queued for them (with GPUs, only the head the GPUs cannot finish
        in time: the spill), and the age in ms of the oldest."""
        state = self.models[model]
        if not state.cpu_executors:
            return 0, None
        running = [r for e in state.cpu_executors if e.batch is not None for r in e.batch.requests if r.state == RUNNING]
        arrivals = [r.arrival for r in running]
        share = self._cpu_share(state, now) if state.queue else 0
        if share:
            arrivals.append(state.queue[0].arrival)
        return share + len(running), ((now - min(arrivals)) * 1000 if arrivals else None)

    def retry_after_s(self, model: str) -> int:
        """Whole seconds until the queue has drained at the model's measured speed (at least 1)."""
        state = self.models[model]
        profile = state.cpu_profile or state.gpu_profile
        drain_ms = profile.latency_ms(1) * state.queue.rows / state.cpu_servers if profile is not None else 1000.0
        return max(1, math.ceil(drain_ms / 1000))

    # -- deciding -------------------------------------------------------------------------------
    def _pump(self, now: float, refusal_reason: tuple[str, str] | None = None) -> list[Action]:
        actions: list[Action] = []
        if self._touched or (self._refusals and self._refusals[0][0] <= now + EPSILON_S):
            self._refuse_unreachable(now, actions, refusal_reason)
        if self.gpu_scheduler is not None and self._idle_gpus:
            self._pump_gpus(now, actions)
        else:
            self._deferral_at = math.inf  # a batch end will ask again
        self._pipeline_at = math.inf
        if not self._idle_gpus and self._pipelining():  # an idle GPU takes the next batch itself
            self._pipeline(now, actions)
        if self._cpu_models:
            self._pump_cpus(now, actions)
        if self._touched:
            self._watch_heads()
        wake = min(self._deferral_at, self._cpu_hold_at, self._pipeline_at)
        asked = self._wake_asked
        # A heap's top as it stands is never later than its first live entry: only where it is
        # earlier than both the wake-up so far and the one asked already are its ended entries
        # dropped to read the live one (it cannot lower the wake-up otherwise).
        timeouts, refusals = self._timeouts, self._refusals
        if timeouts and timeouts[0][0] < wake and timeouts[0][0] < asked:
            wake = min(wake, self._next_timeout())
        if refusals and refusals[0][0] < wake and refusals[0][0] < asked:
            wake = min(wake, self._next_refusal())
        if wake < asked:
            self._wake_asked = wake
            actions.append(WakeAt(wake))
        return actions

    def _queue_changed(self, state: ModelState, now: float) -> None:
        """Requests left ``state``'s queue (or came back to it) other than by arrival."""
        self._touched[state.name] = state
        if state.on_gpus:
            self.gpu_scheduler.on_queue_changed(state.name, now)

    def _compact_timeouts(self) -> None:
        """Rebuild the timeout heap with its live entries alone: linear in its size, once per
        as many arrivals as it kept, so constant per request."""
        timeouts = self._timeouts
        timeouts[:] = [entry for entry in timeouts if entry[2].state != ENDED]
        heapq.heapify(timeouts)
        self._timeouts_compact_at = max(TIMEOUTS_COMPACT_MIN, 2 * len(timeouts))

    def _next_timeout(self) -> float:
        while self._timeouts and self._timeouts[0][2].state == ENDED:
            heapq.heappop(self._timeouts)
        return self._timeouts[0][0] if self._timeouts else math.inf

    def _watch_heads(self) -> None:
        """Put the new head request of every model touched in this pump into the refusal heap."""
        for state in self._touched.values():
            if not state.drop_late or not state.queue or state.queue[0] is state.watched:
                continue
            head = state.queue[0]
            fastest_ms = self._fastest_ms(state, head.rows)
            if fastest_ms is not None:
                state.watched = head
                last_start = head.deadline - fastest_ms / 1000
                # Just past it, so that the head is certain to be out of reach when it is looked at.
                heapq.heappush(self._refusals, (last_start + REFUSAL_MARGIN_S, head.id, head))
        self._touched.clear()

    def _next_refusal(self) -> float:
        refusals = self._refusals
        while refusals and not self._is_head(refusals[0][2]):
            heapq.heappop(refusals)
        return refusals[0][0] if refusals else math.inf

    def _is_head(self, request: Request) -> bool:
        queue = self.models[request.model].queue
        return request.state == QUEUED and bool(queue) and queue[0] is request

    def _measures_anew(self, state: ModelState, rows: int, now: float) -> bool:
        """Whether the model's measurements that refuse requests of ``rows`` rows are forgotten
        before this one is refused: where, for RELEARN_AFTER_S, the model's l(rows) alone (with no
        GPU load, whatever the request's own timeout or the time gone before it reached the
        queue) has been past its whole SLA at every request of that size. A refusal stops the
        measuring: one slow run (an input of dynamic shape 1,000 times the usual, a stall of the
        machine) read at the window's 99th percentile refused every later request of that size,
        for good, though the device served them in milliseconds. Forgotten (that size's
        measurements, or where it has none, those past the SLA that set the fit), its latency
        comes from the fit of the others or the seed; a model that is that slow measures so
        again within a request. Ours, not Clockwork's: its profiles are of models whose time
        does not depend on the input."""
        own_ms = self._fastest_ms(state, rows, loading=False)
        if own_ms is None or own_ms <= state.sla_ms:  # not the measurements' refusal
            state.refusing_since.pop(rows, None)
            return False
        since = state.refusing_since.setdefault(rows, now)
        if now - since < RELEARN_AFTER_S:
            return False
        state.refusing_since[rows] = now
        for profile in (state.cpu_profile, state.gpu_profile):
            if profile is not None:
                measured = profile.measured()
                for size in [rows] if rows in measured else [b for b, ms in measured.items() if ms > state.sla_ms]:
                    profile.forget(size)
        return True

    def _fastest_ms(self, state: ModelState, rows: int, loading: bool = True) -> float | None:
        """l(rows) on the fastest device that serves the model (None: none does); on a GPU, plus
        the model's load time where no GPU holds it (``loading``)."""
        on_gpu = None
        if state.gpu_profile is not None and self._gpus:
            on_gpu = state.gpu_profile.latency_ms(rows)
            if loading and self.gpu_memory is not None:
                on_gpu += self._load_ms(state.name)
        if state.cpu_profile is None or not state.cpu_executors:
            return on_gpu
        on_cpu = state.cpu_profile.latency_ms(rows)
        return on_cpu if on_gpu is None else min(on_cpu, on_gpu)

    def _load_ms(self, model: str) -> float:
        """What a GPU batch of ``model`` waits for a LOAD first: 0 where a GPU holds it."""
        memory = self.gpu_memory
        if memory is None or memory.held_anywhere(model):
            return 0.0
        return memory.load_ms(model)

    def _gpu_changed(self, gpu: ExecutorState) -> None:
        """A GPU executor started or ended a batch, or came up or went down."""
        last = gpu.last
        if last is not None:
            heapq.heappush(self._gpu_ends, (last.expected_end, last.id, gpu))
        if gpu.ready and gpu.batch is not None and gpu.queued is None:
            if self._pipelining():
                heapq.heappush(self._pipeline_ends, (gpu.batch.expected_end, gpu.batch.id, gpu))
        else:
            self._pipeline_due.pop(gpu.id, None)
        if gpu.ready and gpu.batch is None:
            self._idle_gpus[gpu.id] = gpu
        else:
            self._idle_gpus.pop(gpu.id, None)
        self._drop_ended()

    def _drop_ended(self) -> None:
        """Drop the heaps' top entries of batches that ended (or GPUs gone down): their readers,
        ``_gpu_start`` and ``_pipeline``, run only while no GPU is idle, and would otherwise leave
        an entry behind for every batch served while one is. Each entry is dropped once."""
        ends = self._gpu_ends
        while ends:
            _, batch_id, gpu = ends[0]
            last = gpu.last
            if gpu.ready and last is not None and last.id == batch_id:
                break
            heapq.heappop(ends)
        ends = self._pipeline_ends
        while ends and not _awaits_next(*ends[0]):
            heapq.heappop(ends)

    def _gpu_start(self, now: float) -> float | None:
        """When the earliest ready GPU executor can start a batch (None: no GPU is ready)."""
        if self._idle_gpus:
            return now
        ends = self._gpu_ends
        # Entries of batches that ended, or of GPUs gone down, are dropped as they come to the top.
        while ends:
            end, batch_id, gpu = ends[0]
            batch = gpu.last
            if gpu.ready and batch is not None and batch.id == batch_id:
                if batch.expected_end == end:
                    return max(now, end)
                heapq.heapreplace(ends, (batch.expected_end, batch_id, gpu))  # its end was moved
            else:
                heapq.heappop(ends)
        return None

    def _refuse_unreachable(self, now: float, actions: list[Action], reason: tuple[str, str] | None = None) -> None:
        """Refuse the head requests of ``drop_late`` models that no ready device can finish in time.

        A device can finish a request when it could start it at the earliest (now, or when its
        batch in flight ends) and end it by the deadline, on its profile. Requests the GPU
        cannot finish but a CPU executor can are left queued: the CPU takes them (spill). With
        no device ready at all, requests wait for one until even the fastest device, up at once,
        could no longer finish them in time. Only the models
        whose queues changed since the last look, and those whose head's last start time has
        come (the refusal heap), are looked at.
        """
        due = self._touched
        refusals = self._refusals
        while refusals and refusals[0][0] <= now + EPSILON_S:
            _, _, head = heapq.heappop(refusals)
            if self._is_head(head):
                state = self.models[head.model]
                state.watched = None  # watched anew if it stays (a profile that learned a lower l(b))
                due[head.model] = state
        gpu_start: float | None = None
        gpu_known = self.gpu_scheduler is None
        for state in list(due.values()):
            if not state.drop_late or not state.queue:
                continue
            if not gpu_known:
                gpu_start, gpu_known = self._gpu_start(now), True
            cpu_start = (
                min((e.free_at(now) for e in state.cpu_executors if e.ready), default=None) if state.cpu_executors else None
            )
            gpu_on = None
            if state.gpu_profile is not None and gpu_start is not None:
                gpu_on = gpu_start + (self._load_ms(state.name) / 1000 if self.gpu_memory is not None else 0.0)
            refused = []
            down = cpu_start is None and gpu_on is None
            while state.queue:
                request = state.queue[0]
                if down:
                    # No device is up: a request is refused once even the fastest of them, up
                    # this instant, could not finish it in time (it waited for its timeout, or
                    # for ever for a device in a crash loop); the others wait for one.
                    fastest_ms = self._fastest_ms(state, request.rows)
                    if fastest_ms is None or now + fastest_ms / 1000 <= request.deadline:
                        break
                    refused.append(state.queue.popleft())
                    continue
                on_gpu = gpu_on is not None and gpu_on + state.gpu_profile.latency_ms(request.rows) / 1000 <= request.deadline
                on_cpu = (
                    cpu_start is not None
                    and state.cpu_profile is not None
                    and cpu_start + state.cpu_profile.latency_ms(request.rows) / 1000 <= request.deadline
                )
                if on_gpu or on_cpu:
                    break
                refused.append(state.queue.popleft())
            if refused:
                self._end(refused)
                if state.on_gpus:
                    self.gpu_scheduler.on_refused(state.name, refused, now)
                    self.gpu_scheduler.on_queue_changed(state.name, now)
                why = "no device was up to finish it in time" if down else "no device could finish it in time"
                # One answer for each bound: a request held to its own timeout was said to miss the SLA.
                by_bound: dict[str, list[Request]] = {}
                for request in refused:
                    by_bound.setdefault(_bound(request, state), []).append(request)
                for bound, requests in by_bound.items():
                    message = (
                        f"model '{state.name}' could not serve this request within {bound} "
                        f"({why}{'; ' + reason[1] if reason and reason[0] == state.name else ''}); "
                        "refused before it ran"
                    )
                    actions.append(Fail(tuple(requests), 503, "refused_deadline", message))

    def _pump_gpus(self, now: float, actions: list[Action]) -> None:
        assert self.gpu_scheduler is not None
        self._deferral_at = math.inf
        declined: set[str] = set()  # idle GPUs left for a busy one that holds the model
        while self._idle_gpus:
            # The first idle GPU not declined (no list of them: this runs at every decision).
            gpu = next((g for g in self._idle_gpus.values() if g.id not in declined), None)
            if gpu is None:
                return
            decision = self.gpu_scheduler.decide(now, gpu.id, now)
            if decision is None:
                return
            if isinstance(decision, WaitUntil):
                self._deferral_at = decision.time  # no other idle GPU would get another answer
                return
            state = self.models[decision.model]
            if self.gpu_memory is None:
                self._start(gpu, state, self._take(state, decision), now, actions)
            elif not self._start_cached(gpu, state, self._take(state, decision), now, actions):
                declined.add(gpu.id)
            self._queue_changed(state, now)

    def _pipelining(self) -> bool:
        """Whether GPUs get their next batch before they are free: the policy pipelines, and
        there is a round trip to hide."""
        return (
            self.gpu_round_trip_s >= PIPELINE_MIN_S
            and self.gpu_scheduler is not None
            and self.gpu_scheduler.pipelines
            and self.gpu_memory is None
        )

    def _pipeline(self, now: float, actions: list[Action]) -> None:
        """Send each busy GPU its next batch a round trip before its batch in flight is expected to
        end (the policies in PIPELINING): the executor reads it the moment it is free, where a batch
        sent only once the answer is back would leave the GPU idle for the trip (ROUND_TRIP_WEIGHT).
        The GPU scheduler decides as for a GPU free at that end, so a deferred batch still waits
        for its time; one batch is queued at most, and an executor that begins it after its latest
        start refuses it (Clockwork's late action). Only a batch at its model's max_batch is sent
        ahead: a smaller one could still grow during the trip (in the simulator with a 2 ms mean
        dispatch delay, sending every batch ahead shrank them from 2.16 to 1.87 requests and
        raised the worst model's bad rate from 0.005 to 0.035; docs/BENCHMARKS.md). Not where
        GPUs hold only some models."""
        assert self.gpu_scheduler is not None
        lead_s = self.gpu_round_trip_s
        ends, due = self._pipeline_ends, self._pipeline_due
        while ends and ends[0][0] - lead_s <= now + EPSILON_S:
            entry = heapq.heappop(ends)
            if _awaits_next(*entry):
                due[entry[2].id] = entry[2]
        if ends:
            self._pipeline_at = ends[0][0] - lead_s  # an entry of an ended batch only wakes the core early
        for gpu in list(due.values()):
            running = gpu.batch
            assert running is not None and gpu.queued is None  # _gpu_changed keeps it so
            decision = self.gpu_scheduler.decide(now, gpu.id, running.expected_end)
            if decision is None:
                return
            if isinstance(decision, WaitUntil):
                self._deferral_at = min(self._deferral_at, decision.time)
                return
            state = self.models[decision.model]
            if self._stacked_rows(decision.requests) < state.max_batch:
                # It could still grow by the end: this GPU takes its next batch once free, as
                # without pipelining (the candidate is formed anew). Only a full batch loses
                # nothing by being chosen a trip early.
                self.gpu_scheduler.on_queue_changed(decision.model, now)
                del due[gpu.id]
                continue
            self._start(gpu, state, self._take(state, decision), now, actions, begins=running.expected_end)
            self._queue_changed(state, now)

    def _start_cached(
        self, gpu: ExecutorState, state: ModelState, requests: list[Request], now: float, actions: list[Action]
    ) -> bool:
        """Start a GPU batch where GPUs hold only some models (gpu_memory): on an idle GPU that
        holds the model if there is one, else LOADing it first. A model that refuses what it
        cannot finish in time keeps only the requests that the load leaves in time; the others go
        back to the queue's head, or, where none is left, wait for a busy GPU that holds the model
        and frees in time for the first of them (False: nothing started, ``gpu`` left idle), and
        else are refused with the reason."""
        memory = self.gpu_memory
        assert memory is not None
        holder = next((g for g in self._idle_gpus.values() if memory.holds(g.id, state.name)), None)
        gpu = holder or gpu
        load = memory.plan(gpu.id, state.name)
        if load is not None and state.drop_late and state.gpu_profile is not None:
            ready_at = now + load.load_ms / 1000
            keep, rows, earliest = 0, 0, math.inf
            for request in requests:
                earliest = min(earliest, request.deadline)
                if ready_at + state.gpu_profile.latency_ms(rows + request.rows) / 1000 > earliest:
                    break
                keep, rows = keep + 1, rows + request.rows
            for request in reversed(requests[keep:]):
                state.queue.appendleft(request)
            requests = requests[:keep]
            if not requests:
                head = state.queue[0]
                finish_s = state.gpu_profile.latency_ms(head.rows) / 1000
                if any(
                    g.ready and memory.holds(g.id, state.name) and g.free_at(now) + finish_s <= head.deadline for g in self._gpus
                ):
                    # A GPU that holds the model is busy and frees in time: the requests wait for
                    # it (refused here, "no GPU holds the model" was said of a model that one held).
                    return False
                refused = [state.queue.popleft()]
                self._end(refused)
                self.gpu_scheduler.on_refused(state.name, refused, now)
                message = (
                    f"model '{state.name}' could not serve this request within {_bound(refused[0], state)}: no GPU "
                    f"holds the model, and loading it takes {load.load_ms:g} ms; refused before it ran"
                )
                actions.append(Fail(tuple(refused), 503, "refused_deadline", message))
                return True
        self._start(gpu, state, requests, now, actions, load)
        return True

    @staticmethod
    def _stacked_rows(requests: list[Request]) -> int:
        """The rows of the batch ``_take`` makes of ``requests``: those that stack with the first."""
        return sum(r.rows for r in _stacking(requests))

    def _take(self, state: ModelState, decision: Dispatch) -> list[Request]:
        """Take the dispatched requests out of the queue (those skipped at its head stay in front).

        The batch ends early at a request whose inputs cannot be stacked with the first's (batch
        key): FIFO order is kept, and the rest waits for the next batch.
        """
        queue = state.queue
        skipped = [queue.popleft() for _ in range(decision.skip)]
        batch = []
        for request in _stacking(decision.requests):
            if not queue or queue[0] is not request:
                break
            batch.append(queue.popleft())
        for request in reversed(skipped):
            queue.appendleft(request)
        return batch

    def _pump_cpus(self, now: float, actions: list[Action]) -> None:
        waiting: dict[str, int] = {}
        free: dict[str, list[str]] = {}
        self._cpu_hold_at = math.inf
        for state in self._cpu_models:
            if not state.queue:
                continue
            due = dispatch_due(state.cpu_profile, state.queue.rows, state.dispatch_batch, state.queue[0].deadline)
            if due > now:
                self._cpu_hold_at = min(self._cpu_hold_at, due)  # held for its planned batch
                continue
            idle = [e.id for e in state.cpu_executors if e.ready and e.batch is None]
            if idle and (share := self._cpu_share(state, now)):
                waiting[state.name], free[state.name] = share, idle
        if not waiting:
            return
        for assign in self.cpu_scheduler.assign(waiting, free):
            state = self.models[assign.model]
            share = self._cpu_share(state, now)  # another executor of the model may have taken some
            if not share:
                continue
            # Rows only where they amortize the CPU's fixed cost, within the head's deadline; a
            # head late whatever the batch goes alone, unless one by one would keep the model's
            # ready executors more than 0.9 busy with its arrivals (each held for the l(r) of its
            # rows and the trip): then the size that ends the queue soonest on average
            # (schedulers/cpu_batch.py).
            available = sum(r.rows for r in itertools.islice(state.queue, share))
            slack_ms = (state.queue[0].deadline - now) * 1000
            if state.dispatch_batch > 1:
                limit = planned_batch_rows(state.cpu_profile, available, state.dispatch_batch, state.max_batch, slack_ms)
            else:
                arrivals = state.arrivals
                limit = cpu_batch_rows(
                    state.cpu_profile,
                    available,
                    state.max_batch,
                    slack_ms,
                    state.cpu_servers,
                    arrivals.per_second(now),
                    arrivals.rows_per_request(now),
                    state.cpu_trip_ms,
                )
            self._start(self.executors[assign.executor_id], state, self._take_head(state.queue, limit), now, actions)
            self._queue_changed(state, now)

    @staticmethod
    def _take_head(queue: RequestQueue, max_rows: int) -> list[Request]:
        """The head of the queue and the requests right behind it that stack with it, up to ``max_rows``."""
        first = queue.popleft()
        batch, rows = [first], first.rows
        while queue and queue[0].batch_key == first.batch_key and rows + queue[0].rows <= max_rows:
            request = queue.popleft()
            rows += request.rows
            batch.append(request)
        return batch

    def _cpu_share(self, state: ModelState, now: float) -> int:
        """How many requests at the head of the queue the CPU may take.

        Without GPUs for the model, all of them. With GPUs, as many as the GPUs' projected
        capacity cannot finish in time (``gpu_can_finish`` over the whole queue), taken from
        the head: the oldest go to the CPU, and the requests behind them move up to positions
        the GPUs can finish. A batch the GPU is deferring on purpose is never taken.

        "In time" is within ``spill_within`` of the request's SLA, not at the deadline itself:
        the margin keeps the GPUs' answers under the SLA on average when they are overloaded.

        The GPUs serve every model: ahead of a request they also have the other models' queued
        requests with earlier deadlines (those a GPU can still finish), shared among the ready
        GPUs. Without them a model's queue looks as if it had the GPUs to itself, its requests
        wait for a GPU busy with the others until they are nearly late, and the CPU takes them
        with little of their SLA left (its response times then sit near the SLA, and its
        controller asks for cores that cannot win back the time spent waiting).
        """
        gpu_start = self._gpu_start(now) if self.gpu_scheduler is not None else None
        if state.gpu_profile is None or self.cpu_sharing == "greedy" or gpu_start is None:
            return len(state.queue)
        max_batch, profile = state.max_batch, state.gpu_profile
        others = [
            _OtherGpuQueue(other.queue, other.gpu_profile, other.max_batch, gpu_start)
            for other in self.models.values()
            if other is not state and other.on_gpus and other.queue and other.gpu_profile is not None
        ]
        gpus = max(1, sum(gpu.ready for gpu in self._gpus))
        share = 0
        for place, request in enumerate(state.queue):
            ahead_s = sum(other.work_before(request.deadline) for other in others) / 1000 / gpus if others else 0.0
            share += not gpu_can_finish(request, place, now, gpu_start + ahead_s, profile, max_batch, self.spill_within)
        return share

    def _start(
        self,
        executor: ExecutorState,
        state: ModelState,
        requests: list[Request],
        now: float,
        actions: list[Action],
        load: Load | None = None,
        begins: float | None = None,
    ) -> None:
        """Start ``requests`` as a batch on ``executor``; ``begins``: queued behind the GPU's batch
        in flight, expected to end then (``_pipeline``)."""
        rows = sum([r.rows for r in requests])
        on_gpu = executor.device == GPU
        profile = state.gpu_profile if on_gpu else state.cpu_profile
        duration_s = profile.latency_ms(rows) / 1000 if profile is not None else 0.0
        load_s = load.load_ms / 1000 if load is not None else 0.0
        latest = math.inf
        if on_gpu and state.drop_late and profile is not None:
            latest = min([r.deadline for r in requests]) - duration_s - load_s
        batch = Batch(
            next(self._batch_ids),
            state.name,
            executor.id,
            executor.device,
            tuple(requests),
            rows,
            now,
            (now if begins is None else begins) + load_s + duration_s,
            latest,
            load,
            begins,
        )
        if self.gpu_memory is not None and on_gpu:
            if load is not None:
                self.gpu_memory.commit(load)
            self.gpu_memory.used(executor.id, state.name)
        for request in requests:
            request.state, request.dispatched = RUNNING, now
        if begins is None:
            executor.batch = batch
        else:
            executor.queued = batch
        if on_gpu:
            self._gpu_changed(executor)
        actions.append(Start(batch))

    def _reported_withdrawn(self, batch: Batch) -> bool:
        """Whether ``batch`` is one taken back from a failed executor (its report is the last)."""
        if batch.id not in self._withdrawn:
            return False
        self._withdrawn.discard(batch.id)
        return True

    def _requeue(self, model: str, requests: Iterable[Request], now: float) -> None:
        """The live ones of ``requests``, taken from ``model``'s queue and not run, go back to
        their places in it."""
        state = self.models[model]
        returned = [r for r in requests if r.state != ENDED]
        for request in returned:
            request.state, request.dispatched = QUEUED, None
        if returned:
            if state.priority_levels > 1:
                bound_s = state.priority_bound_s
                state.queue.put_back(returned, lambda request, queued: was_ahead(request, queued, bound_s))
            else:
                state.queue.put_back(returned)
            # The head may be a request watched before it was sent, whose refusal entry left the
            # heap while it ran: watch it anew, or nothing would refuse it before its timeout.
            state.watched = None
            self._queue_changed(state, now)

    def _release(self, batch: Batch, now: float) -> None:
        executor = self.executors[batch.executor]
        if executor.batch is batch:
            # The executor goes on to its queued batch as soon as it has answered this one.
            executor.batch, executor.queued = executor.queued, None
            following = executor.batch
            if following is not None and following.begins is not None:
                following.expected_end += now - following.begins
                following.begins = now
        elif executor.queued is batch:
            executor.queued = None
        else:
            return
        if executor.device == GPU:
            self._gpu_changed(executor)

    @staticmethod
    def _end(requests: Iterable[Request]) -> tuple[Request, ...]:
        """Mark the requests not ended yet as ended; those are returned."""
        live = tuple(r for r in requests if r.state != ENDED)
        for request in live:
            request.state = ENDED
        return live
