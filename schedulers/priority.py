"""Where a request joins its model's queue: request priorities (Triton's ``priority`` parameter).

Level 1 is the highest; a model has ``levels`` of them (1: every request equal, the queue FIFO).
A request is queued ahead of the lower-level requests that have waited less than ``bound_s``,
and behind every other: FIFO within a level, as Triton's priority queue. A request that has
waited ``bound_s`` or longer is passed by no later arrival, so a lower level is delayed by higher
ones for at most ``bound_s`` plus the work already ahead of it then (Triton's priority queue has
no such bound; without one a steady stream of level-1 requests would starve level 2 forever).

A client's own deadline (its ``timeout``, where tighter than the SLA) does not move a request
ahead: a tight timeout would otherwise buy a place in the queue. The deadline is the request's
in admission and in the GPU's batch, which ends by its earliest deadline (candidate.py).

Pure: the dispatch core calls ``position`` with the queue and inserts there, and ``was_ahead``
where it puts back the requests of a batch that never ran.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedulers.request import Request


def goes_ahead(request: Request, waiting: Request, now: float, bound_s: float) -> bool:
    """Whether ``request``, arriving at ``now``, is queued ahead of ``waiting``."""
    return request.priority < waiting.priority and now - waiting.arrival < bound_s


def was_ahead(returned: Request, queued: Request, bound_s: float) -> bool:
    """Whether ``returned`` (taken out in a batch that never ran, and put back) was ahead of
    ``queued``: as ``goes_ahead`` placed the later of the two (ids are in the order requests
    reach the queue) when it reached the queue."""
    if returned.id < queued.id:
        return not goes_ahead(queued, returned, queued.entered_queue, bound_s)
    return goes_ahead(returned, queued, returned.entered_queue, bound_s)


def position(queue: Sequence[Request], request: Request, now: float, bound_s: float) -> int:
    """The index at which ``request`` joins ``queue`` (len(queue): at its tail). From the tail
    forward, it passes every request it goes ahead of, and stops at the first it does not: the
    order of those already waiting is never changed."""
    index = len(queue)
    while index > 0 and goes_ahead(request, queue[index - 1], now, bound_s):
        index -= 1
    return index
