"""Symphony's candidate batch of a model (Section 4.3 and the pseudo-code of Appendix C).

For the queue of a model (FIFO, so deadlines ascend) and the time ``start`` at which a GPU could
start it, the candidate is the longest prefix of at most ``max_batch`` requests that can finish
by the earliest deadline among them: start + l(|reqs|) <= dl(reqs). Requests that cannot finish
even alone are *hopeless*: they are pruned from the candidate (the gateway refuses them or
serves them late, per the model's config).

    sched_at      = dl(reqs) - l(|reqs| + 1)    the last moment to grow the batch by one
    invalid_after = dl(reqs) - l(|reqs|)        past this the candidate itself misses

Under overload the head of the queue has little slack left, and cutting every batch to the
head's deadline makes batches of one or two that waste the GPU on fixed costs, so the queue
falls further behind and goodput collapses (measured: docs/BENCHMARKS.md). The candidate
therefore also sets aside the first few requests when skipping them lets one batch serve more
requests in time than they are (``early_drop``): a request is dropped only to save more than
itself, and never while the head's own deadline leaves room for the whole queue.

A candidate is schedulable (the non-work-conserving rule) when it holds at least beta x lambda
requests (beta: the profile's fixed cost, lambda: the arrival rate), or when now >= sched_at;
a work-conserving scheduler treats every candidate as schedulable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedulers.profiles import LatencyProfile

# Times are float seconds: a wake-up set for sched_at must find the candidate due.
EPSILON_S = 1e-9


@dataclass(frozen=True)
class QueuedRequest:
    id: int
    model: str
    arrival: float  # seconds
    deadline: float  # seconds: arrival + SLA
    rows: int = 1


@dataclass(frozen=True)
class Candidate:
    model: str
    size: int  # requests from the head of the queue
    rows: int
    deadline: float
    sched_at: float
    invalid_after: float
    schedulable: bool
    hopeless: tuple[QueuedRequest, ...] = ()


def hopeless_requests(queue: Sequence[QueuedRequest], profile: LatencyProfile, start: float) -> list[QueuedRequest]:
    """The requests at the head that cannot finish by their deadline even as a batch of one."""
    out = []
    for request in queue:
        if start + profile.latency_ms(request.rows) / 1000 <= request.deadline:
            break
        out.append(request)
    return out


# How far into the queue an early drop looks for a better batch start.
EARLY_DROP_SCAN = 64


def batch_capacity(request: QueuedRequest, profile: LatencyProfile, start: float, max_batch: int) -> int:
    """How many rows a batch that starts at ``start`` may hold and still meet ``request``'s deadline."""
    slack_ms = (request.deadline - start) * 1000 - profile.fixed_ms
    if slack_ms < 0:
        return 0
    if profile.per_item_ms <= 0:
        return max_batch
    return min(max_batch, int(slack_ms / profile.per_item_ms))


def early_drop(queue: Sequence[QueuedRequest], profile: LatencyProfile, start: float, max_batch: int) -> int:
    """How many requests at the head to drop so that the next batch serves the most requests net."""
    if not queue:
        return 0
    best_skip, best_net = 0, min(len(queue), batch_capacity(queue[0], profile, start, max_batch))
    for skip in range(1, min(len(queue), EARLY_DROP_SCAN)):
        net = min(len(queue) - skip, batch_capacity(queue[skip], profile, start, max_batch)) - skip
        if net > best_net:
            best_skip, best_net = skip, net
    return best_skip


def form_candidate(
    model: str,
    queue: Sequence[QueuedRequest],
    profile: LatencyProfile,
    *,
    max_batch: int,
    now: float,
    start: float,
    arrival_rate: float,
    defer: bool,
    prune: bool = True,
) -> Candidate | None:
    """The candidate of ``queue`` for a GPU free at ``start`` (>= now), or None if it is empty.

    With ``prune`` the hopeless head is set aside and the batch is cut to what meets the
    earliest deadline; without it (a model configured to serve late rather than refuse) the
    batch is simply the first ``max_batch`` rows.
    """
    hopeless = list(hopeless_requests(queue, profile, start)) if prune else []
    rest = queue[len(hopeless) :]
    if prune:
        skip = early_drop(rest, profile, start, max_batch)
        hopeless += rest[:skip]
        rest = rest[skip:]
    if not rest:
        return Candidate(model, 0, 0, float("inf"), float("inf"), float("inf"), False, tuple(hopeless)) if hopeless else None
    deadline = rest[0].deadline
    size, rows = 0, 0
    for request in rest:
        if rows + request.rows > max_batch:
            break
        if prune and size > 0 and start + profile.latency_ms(rows + request.rows) / 1000 > deadline:
            break
        size += 1
        rows += request.rows
    sched_at = deadline - profile.latency_ms(rows + 1) / 1000
    invalid_after = deadline - profile.latency_ms(rows) / 1000
    full = rows >= max_batch or size < len(rest)  # it cannot grow any more
    enough = rows >= profile.fixed_ms / 1000 * arrival_rate
    schedulable = (not defer) or full or enough or now >= sched_at - EPSILON_S
    return Candidate(model, size, rows, deadline, sched_at, invalid_after, schedulable, tuple(hopeless))
