"""The one request type, from arrival to its end, and the per-model FIFO queue that holds it.

Every part of the data path sees the same object: admission, the queues, the GPU scheduler's
candidates, the CPU scheduler, the batch an executor runs, and the timers of the dispatch core.
What the request carries for the executor (its tensors) is an opaque ``payload``: the decisions
never look at it, so the simulator runs them with none.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
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

    def __repr__(self) -> str:
        return f"Request({self.id}, {self.model!r}, arrival={self.arrival:.6f}, rows={self.rows}, {self.state})"


@dataclass
class RequestQueue:
    """A model's FIFO queue with running sums, so that the schedulers read its size, its rows and
    its mean arrival in O(1) instead of walking every queued request per decision."""

    items: collections.deque[Request] = field(default_factory=collections.deque)
    rows: int = 0
    arrival_sum: float = 0.0

    @classmethod
    def of(cls, requests: Iterable[Request]) -> RequestQueue:
        queue = cls()
        for request in requests:
            queue.append(request)
        return queue

    def append(self, request: Request) -> None:
        self.items.append(request)
        self._count(request, 1)

    def insert(self, index: int, request: Request) -> None:
        self.items.insert(index, request)
        self._count(request, 1)

    def appendleft(self, request: Request) -> None:
        self.items.appendleft(request)
        self._count(request, 1)

    def popleft(self) -> Request:
        request = self.items.popleft()
        self._count(request, -1)
        return request

    def put_back(self, requests: Iterable[Request]) -> None:
        """Return requests taken out (a batch that never ran) to their places in arrival order."""
        merged = sorted([*self.items, *requests], key=lambda r: (r.arrival, r.id))
        self.items.clear()
        self.rows, self.arrival_sum = 0, 0.0
        for request in merged:
            self.append(request)

    def remove(self, request: Request) -> None:
        self.items.remove(request)
        self._count(request, -1)

    def _count(self, request: Request, sign: int) -> None:
        self.rows += sign * request.rows
        self.arrival_sum += sign * request.arrival
        if not self.items:
            self.arrival_sum = 0.0  # no drift of the float sum across an emptied queue

    def mean_wait_ms(self, now: float) -> float:
        return (now - self.arrival_sum / len(self.items)) * 1000 if self.items else 0.0

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.items)

    def __getitem__(self, index: int) -> Request:
        return self.items[index]
