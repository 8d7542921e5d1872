"""The interface every core controller implements, and the measurement it reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from schedulers.profiles import percentile


@dataclass
class Window:
    """What a model's CPU executor did over a stretch of time (one or more control periods).

    ``count``, ``total_ms`` and ``cpu_s`` add up over the stretch. ``waiting`` and
    ``oldest_wait_ms`` are the state at its end: the requests queued for, or running on, the
    executor, and the age of the oldest of them. They are what a starved executor shows: a
    queue that holds work but completes none in a period has no mean response time, and must
    not read as idle (see ``response_ms``).
    """

    count: int = 0
    total_ms: float = 0.0
    cpu_s: float = 0.0  # CPU time the executor used meanwhile (0 when unmeasured)
    waiting: int = 0  # requests queued for or running on the executor at the end
    oldest_wait_ms: float | None = None  # age of the oldest of them at the end (None: none waits)
    # Each completed request's response time, for the percentile and deadline SLA measures.
    times_ms: list[float] = field(default_factory=list)
    # The model's requests the GPUs answered meanwhile. ROMA's tau_R (equation 1) averages both
    # devices' requests; the feed-forward controller reads them (``FeedForwardController.cpu_sla_ms``).
    gpu_count: int = 0
    gpu_total_ms: float = 0.0

    def add(self, rt_ms: float) -> None:
        self.count += 1
        self.total_ms += rt_ms
        self.times_ms.append(rt_ms)

    def add_gpu(self, rt_ms: float) -> None:
        """A request of the model that a GPU answered (not this executor's)."""
        self.gpu_count += 1
        self.gpu_total_ms += rt_ms

    def merge(self, other: Window) -> None:
        """Extend this window by the later ``other``: sums add, the end state is ``other``'s."""
        self.count += other.count
        self.total_ms += other.total_ms
        self.cpu_s += other.cpu_s
        self.times_ms.extend(other.times_ms)
        self.gpu_count += other.gpu_count
        self.gpu_total_ms += other.gpu_total_ms
        self.waiting, self.oldest_wait_ms = other.waiting, other.oldest_wait_ms

    @property
    def cpu_s_per_request(self) -> float | None:
        return self.cpu_s / self.count if self.count and self.cpu_s > 0 else None

    @property
    def mean_ms(self) -> float | None:
        """Mean response time of the requests completed in the window (None: none completed)."""
        return self.total_ms / self.count if self.count else None

    def percentile_ms(self, q: float) -> float | None:
        """The q-th percentile of the completed requests' response times (None: none completed)."""
        return percentile(self.times_ms, q) if self.times_ms else None

    def late(self, sla_ms: float) -> int:
        """Completed requests whose response time was over ``sla_ms``."""
        return sum(1 for t in self.times_ms if t > sla_ms)

    @property
    def response_ms(self) -> float | None:
        """The response time a controller reads: the mean of the completed requests, raised to
        the age of the oldest request still waiting when that is larger.

        A waiting request's response time will be at least its age, so the age is a measured
        lower bound on the queue's response time (ROMA's tau_R = tau_Q + tau_P, Section 4,
        counts the time spent in the queue). Without it, a period in which the executor is
        starved (its queue full, its batch still running, nothing completed) reads exactly as
        an idle one. None only when nothing completed and nothing waits: the executor is idle.
        """
        mean = self.mean_ms
        if self.waiting > 0 and self.oldest_wait_ms is not None:
            return self.oldest_wait_ms if mean is None else max(mean, self.oldest_wait_ms)
        return mean


class CoreController(Protocol):
    #: Seconds between two calls of ``demand`` (the control period).
    period_s: float

    def demand(self, window: Window, sla_ms: float) -> float:
        """Cores the executor needs, given what it did since the controller was last asked
        (``window``: completed requests, CPU time, and the work still waiting at the end) and
        the model's current SLA."""

    def granted(self, cores: float) -> None:
        """The cores the supervisor actually granted: the state the next step starts from."""


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
