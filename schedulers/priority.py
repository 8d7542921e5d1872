"""Where a request joins its model's queue: request priorities (Triton's ``priority`` parameter)
and the client's own deadline (its ``timeout`` where that is tighter than the model's SLA).

A model's queue is FIFO, so its deadlines ascend, which the GPU candidates (candidate.py) and the
refusal heap read it by. Two things may place a request ahead of requests already waiting:

- Its level. Level 1 is the highest; a model has ``levels`` of them (1: every request equal,
  the queue stays FIFO). A request is queued ahead of the lower-level requests that have waited
  less than ``bound_s``; a request that has waited ``bound_s`` or longer is passed by no later
  arrival, so a lower level is delayed by higher ones for at most ``bound_s`` plus the work
  already ahead of it then (Triton's priority queue has no such bound; without one a steady
  stream of level-1 requests would starve level 2 forever).
- Its deadline. Within a level, a request whose own deadline is earlier than those of requests
  waiting (a client ``timeout`` tighter than the SLA) goes ahead of them: earliest deadline
  first, which is FIFO when every request has the model's SLA.

Pure: the dispatch core calls ``position`` with the queue and inserts there.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedulers.request import Request


def goes_ahead(request: Request, waiting: Request, now: float, bound_s: float) -> bool:
    """Whether ``request``, arriving at ``now``, is queued ahead of ``waiting``."""
    if request.priority != waiting.priority:
        return request.priority < waiting.priority and now - waiting.arrival < bound_s
    return request.deadline < waiting.deadline


def position(queue: Sequence[Request], request: Request, now: float, bound_s: float) -> int:
    """The index at which ``request`` joins ``queue`` (len(queue): at its tail). From the tail
    forward, it passes every request it goes ahead of, and stops at the first it does not: the
    order of those already waiting is never changed."""
    index = len(queue)
    while index > 0 and goes_ahead(request, queue[index - 1], now, bound_s):
        index -= 1
    return index
