"""The one request type, from arrival to its end, and the per-model FIFO queue that holds it.

Every part of the data path sees the same object: admission, the queues, the GPU scheduler's
candidates, the CPU scheduler, the batch an executor runs, and the timers of the dispatch core.
What the request carries for the executor (its tensors) is an opaque ``payload``: the decisions
never look at it, so the simulator runs them with none.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

QUEUED, RUNNING, ENDED = "queued", "running", "ended"


@dataclass(eq=False, slots=True)
class Request:
    id: int
    model: str
    arrival: float  # seconds, on the core's clock (time.perf_counter under ``gateway serve``)
    deadline: float = float("inf")  # arrival + SLA (the dispatch core sets it on arrival)
    rows: int = 1
    # Requests with equal keys can share a batch (same inputs, trailing shapes and types).
    batch_key: tuple = ()
    # The client's own timeout in seconds (None: the server's cap alone applies).
    timeout_s: float | None = None
    priority: int = 1  # its level, 1 the highest (schedulers/priority.py)
    payload: Any = None
    state: str = QUEUED
    timeout_at: float = float("inf")
    dispatched: float | None = None
    # When it joined its queue, where that is after its arrival (``gateway serve``: its body read
    # and parsed): a queue time counted from its arrival was a slow upload's time too.
    queued_at: float | None = None

    @property
    def entered_queue(self) -> float:
        """When it joined its queue: ``queued_at``, else its arrival (the simulator's arrive there)."""
        return self.queued_at if self.queued_at is not None else self.arrival

    def __repr__(self) -> str:
        return f"Request({self.id}, {self.model!r}, arrival={self.arrival:.6f}, rows={self.rows}, {self.state})"


class RequestQueue(collections.deque):
    """A model's FIFO queue with running sums, so that the schedulers read its size, its rows and
    its mean arrival in O(1) instead of walking every queued request per decision.

    A deque itself, so that its length, truth, iteration and indexing, which the schedulers read
    several times per request, are the deque's own (C) operations; only the changes below keep
    the sums, and the queue is changed through them alone.
    """

    __slots__ = ("rows", "arrival_sum")

    def __init__(self, requests: Iterable[Request] = (), maxlen: None = None):
        # ``maxlen``: the deque's own copy and pickle protocols pass it; a queue has no bound of its own.
        super().__init__()
        self.rows = 0
        self.arrival_sum = 0.0
        for request in requests:
            self.append(request)

    @classmethod
    def of(cls, requests: Iterable[Request]) -> RequestQueue:
        return cls(requests)

    def append(self, request: Request) -> None:
        _append(self, request)
        self.rows += request.rows
        self.arrival_sum += request.arrival

    def insert(self, index: int, request: Request) -> None:
        _insert(self, index, request)
        self.rows += request.rows
        self.arrival_sum += request.arrival

    def appendleft(self, request: Request) -> None:
        _appendleft(self, request)
        self.rows += request.rows
        self.arrival_sum += request.arrival

    def popleft(self) -> Request:
        request = _popleft(self)
        self.rows -= request.rows
        # No drift of the float sum across an emptied queue.
        self.arrival_sum = self.arrival_sum - request.arrival if self else 0.0
        return request

    def put_back(self, requests: Iterable[Request], ahead: Callable[[Request, Request], bool] | None = None) -> None:
        """Return requests taken out (a batch that never ran) to their places: each ahead of the
        first queued request it was ahead of (``ahead(returned, queued)``; the order they reached
        the queue by default, a FIFO queue's). The order of those queued is kept: sorted by
        arrival, the whole queue lost the order its priorities had given it."""
        if ahead is None:
            ahead = _queued_first
        for request in requests:
            index = next((i for i, queued in enumerate(self) if ahead(request, queued)), len(self))
            self.insert(index, request)

    def remove(self, request: Request) -> None:
        _remove(self, request)
        self.rows -= request.rows
        self.arrival_sum = self.arrival_sum - request.arrival if self else 0.0

    def clear(self) -> None:
        _clear(self)
        self.rows, self.arrival_sum = 0, 0.0

    def mean_wait_ms(self, now: float) -> float:
        return (now - self.arrival_sum / len(self)) * 1000 if self else 0.0

    def __repr__(self) -> str:
        return f"RequestQueue({list(self)!r})"


def _queued_first(request: Request, other: Request) -> bool:
    return request.id < other.id  # ids are in the order requests reach the queue


_append, _appendleft, _insert = collections.deque.append, collections.deque.appendleft, collections.deque.insert
_popleft, _remove, _clear = collections.deque.popleft, collections.deque.remove, collections.deque.clear
