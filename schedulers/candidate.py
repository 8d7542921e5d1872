"""Symphony's candidate batch of a model (Section 4.3 and the pseudo-code of Appendix C).

For the queue of a model (FIFO, so deadlines ascend) and the time ``start`` at which a GPU could
start it, the candidate is the longest prefix of at most ``max_batch`` requests that can finish
by the earliest deadline among them: start + l(|reqs|) <= dl(reqs). Requests that cannot finish
even alone are *hopeless*: they are left out of the candidate (Symphony's pruning, as Clipper's;
they stay queued for a CPU executor, and the dispatch core refuses what no device can finish).

    sched_at      = dl(reqs) - l(|reqs| + 1)    the last moment to grow the batch by one
    invalid_after = dl(reqs) - l(|reqs|)        past this the candidate itself misses

Symphony's l grows with the batch; a measured one need not, and sched_at is then held to at
most invalid_after (the paper's rule wherever l grows, as in every zoo).

A candidate is schedulable (the non-work-conserving rule) when it holds at least beta x lambda
rows (beta: the profile's fixed cost, lambda: the arrival rate in rows a second, the unit of b:
Symphony's requests are one item each, schedulers/rate.py), when it cannot grow (full, or the
next queued request does not fit), or when now >= sched_at; a work-conserving scheduler treats
every candidate as schedulable.

Candidates are kept, not rebuilt per decision (Symphony's ModelThread, Section 4.5): an arrival
grows the candidate in O(1) (``grow``) when the new request fits, and a candidate is formed
anew (``form_candidate``) only when requests leave the queue or the candidate expires.

``early_drop`` is our own rule, not the paper's (the default policy uses it, the baselines do
not): under overload the head of the queue has little slack left, and cutting every batch to
the head's deadline makes batches of one or two that waste the GPU on fixed costs. The
candidate then also leaves out the first few requests when skipping them lets one batch serve
more requests in time than they are: a request is dropped only to save more than itself, and
never while the head's own deadline leaves room for the whole queue.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from schedulers.profiles import LatencyProfile
from schedulers.request import Request

# Times are float seconds: a wake-up set for sched_at must find the candidate due.
EPSILON_S = 1e-9


@dataclass(slots=True)
class Candidate:
    model: str
    size: int  # requests in the batch, taken from the queue after the first ``skip``
    rows: int
    deadline: float
    sched_at: float
    invalid_after: float
    schedulable: bool
    # Requests at the head left out of the batch: the hopeless ones (they cannot finish on this
    # device even alone), then the early-dropped ones. They stay queued; the dispatch core
    # refuses only what no device can finish in time.
    skip: int = 0
    hopeless: int = 0
    full: bool = False  # it cannot grow: at the batch limit, or the next request did not fit


def hopeless_count(queue: Sequence[Request], profile: LatencyProfile, start: float) -> int:
    """How many requests at the head cannot finish by their deadline even as a batch of one."""
    count = 0
    for request in queue:
        if start + profile.latency_ms(request.rows) / 1000 <= request.deadline:
            break
        count += 1
    return count


# How far into the queue an early drop looks for a better batch start.
EARLY_DROP_SCAN = 64


def batch_capacity(request: Request, profile: LatencyProfile, start: float, max_batch: int) -> int:
    """How many rows a batch that starts at ``start`` may hold and still meet ``request``'s deadline."""
    slack_ms = (request.deadline - start) * 1000 - profile.fixed_ms
    if slack_ms < 0:
        return 0
    if profile.per_item_ms <= 0:
        return max_batch
    return min(max_batch, int(slack_ms / profile.per_item_ms))


def early_drop(
    queue: Sequence[Request], first: int, profile: LatencyProfile, start: float, max_batch: int, skip_cost: float = 1.0
) -> int:
    """How many requests from ``first`` on to leave out so that the next batch serves the most
    requests net: served less ``skip_cost`` for each request left out (1: a request left out is
    lost; 0: it is lost anyway, as under an overload that sheds requests whatever the choice)."""
    left = len(queue) - first
    if left <= 0:
        return 0
    best_skip, best_net = 0, min(left, batch_capacity(queue[first], profile, start, max_batch))
    if best_net >= left:
        return 0  # the head's deadline leaves room for the whole queue
    # Deadlines ascend along a FIFO queue, and so does the room they leave: no skip can do better
    # than the last request in reach would, less the one skipped. Most formations stop here.
    reach = min(left, EARLY_DROP_SCAN)
    if min(left - 1, batch_capacity(queue[first + reach - 1], profile, start, max_batch)) - skip_cost <= best_net:
        return 0
    for skip, request in enumerate(itertools.islice(queue, first + 1, first + reach), start=1):
        if left - skip - skip_cost * skip <= best_net:
            break  # a later start serves at most the rest of the queue, less what it skips
        capacity = batch_capacity(request, profile, start, max_batch)
        if capacity < request.rows:
            continue  # it cannot start a batch in time itself
        net = min(left - skip, capacity) - skip_cost * skip
        if net > best_net:
            best_skip, best_net = skip, net
    return best_skip


def form_candidate(
    model: str,
    queue: Sequence[Request],
    profile: LatencyProfile,
    *,
    max_batch: int,
    now: float,
    start: float,
    arrival_rate: float,
    defer: bool,
    prune: bool = True,
    drop_early: bool = False,
    skip_cost: float = 1.0,
) -> Candidate | None:
    """The candidate of ``queue`` for a GPU free at ``start`` (>= now), or None if it is empty.

    With ``prune`` the hopeless head is left out and the batch is cut to what meets the
    earliest deadline; without it (a model configured to serve late rather than refuse) the
    batch is simply the first ``max_batch`` rows. ``drop_early`` adds our early drop, at
    ``skip_cost`` for a request it leaves out.
    """
    hopeless = hopeless_count(queue, profile, start) if prune else 0
    dropped = early_drop(queue, hopeless, profile, start, max_batch, skip_cost) if prune and drop_early else 0
    skip = hopeless + dropped
    while prune and skip < len(queue) and start + profile.latency_ms(queue[skip].rows) / 1000 > queue[skip].deadline:
        skip += 1  # the batch must start with a request that fits alone (rows vary from request to request)
    if skip >= len(queue):
        if not skip:
            return None
        inf = float("inf")
        return Candidate(model, 0, 0, inf, inf, inf, False, skip, hopeless, full=True)
    deadline = queue[skip].deadline
    size, rows, latency_ms = 0, 0, None
    for request in itertools.islice(queue, skip, None):
        more = rows + request.rows
        if more > max_batch:
            break
        # The batch's deadline is its earliest: the head's in a FIFO queue, whose deadlines
        # ascend; a request queued by priority or by its own deadline may have an earlier one.
        earliest = request.deadline if request.deadline < deadline else deadline
        if prune:
            more_ms = profile.latency_ms(more)
            if size > 0 and start + more_ms / 1000 > earliest:
                break
            latency_ms = more_ms
        deadline = earliest
        size += 1
        rows = more
    full = rows >= max_batch or skip + size < len(queue)
    candidate = Candidate(model, size, rows, deadline, 0.0, 0.0, False, skip, hopeless, full)
    _time(candidate, profile, now, arrival_rate, defer, latency_ms)
    return candidate


def grow(
    candidate: Candidate,
    request: Request,
    profile: LatencyProfile,
    *,
    max_batch: int,
    now: float,
    arrival_rate: float,
    defer: bool,
    prune: bool,
) -> None:
    """``request`` joined the queue right behind ``candidate`` (not full): take it in if it fits, else the candidate is full."""
    rows = candidate.rows + request.rows
    deadline = candidate.deadline
    if request.deadline < deadline:
        deadline = request.deadline
    latency_ms = profile.latency_ms(rows)
    if rows > max_batch or (prune and now + latency_ms / 1000 > deadline):
        candidate.full = True
        candidate.schedulable = True
        return
    candidate.deadline = deadline
    candidate.size += 1
    candidate.rows = rows
    candidate.full = rows >= max_batch
    _time(candidate, profile, now, arrival_rate, defer, latency_ms)


def _time(
    candidate: Candidate, profile: LatencyProfile, now: float, arrival_rate: float, defer: bool, latency_ms: float | None = None
) -> None:
    """sched_at, invalid_after and whether the candidate is schedulable now (Section 4.3).
    ``arrival_rate``: rows a second; ``latency_ms``: l(rows), where the caller has it already."""
    rows, deadline = candidate.rows, candidate.deadline
    if latency_ms is None:
        latency_ms = profile.latency_ms(rows)
    # Symphony's l(b) grows with b; a measured one need not (each size's own p99, sizes padded
    # to one batch shape): where l(rows + 1) < l(rows), waiting for a request more would hold the
    # candidate past its own last start. It is held no later than that.
    candidate.sched_at = sched_at = deadline - max(profile.latency_ms(rows + 1), latency_ms) / 1000
    candidate.invalid_after = deadline - latency_ms / 1000
    candidate.schedulable = (
        (not defer) or candidate.full or rows >= profile.fixed_ms / 1000 * arrival_rate or now >= sched_at - EPSILON_S
    )
