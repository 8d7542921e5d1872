"""What the node's GPU cluster did over the last period: the inputs of Symphony's autoscaling signals.

Symphony (Section 4.4) reads two signals off a period of serving, which schedulers/autoscale.py
turns into GPUs to add or to release:

- the bad rate r: of the requests of the GPU-served models that ended in the period, the share
  that ended out of their SLO (answered late, refused, timed out, failed);
- the idle fraction f: 1 - busy GPU-time / (N GPUs x the period), a GPU busy from the moment a
  batch is sent to it until its answer is back (Symphony's Figure 10 counts GPU busy time so).

``GpuClusterWindow`` keeps what they need over a sliding period, fed events with their time; it
reads no clock (DESIGN.md, principle 1), so the gateway feeds it time.perf_counter readings and
tests a fake clock.
"""

from __future__ import annotations

from collections import deque

# Long enough to hold many batches of every model (tens to hundreds of ms each), short enough
# that the signals follow a load step within a benchmark run. Symphony acts on them per epoch
# (minutes); an autoscaler reading /metrics averages as it likes.
PERIOD_S = 10.0

# Outcomes of a request that did not meet its SLO (Symphony's "bad"): refused at admission or
# for a full queue, timed out, or failed by the gateway or an executor. A success counts as bad
# when it came after the SLA. The rest say nothing about capacity and are left out: the
# client's input was wrong (invalid, too_large, model_error), the client left (client_gone), or
# the gateway was shutting down.
OUT_OF_SLO = frozenset({"refused_deadline", "queue_full", "timeout", "executor_failed", "internal_error"})


def ended_out_of_slo(outcome: str, response_ms: float | None, sla_ms: float) -> bool | None:
    """Whether a request that ended with ``outcome`` (``response_ms`` after its arrival when it
    was answered) missed its SLO; None when the outcome does not count in the bad rate."""
    if outcome == "success":
        return response_ms is None or response_ms > sla_ms
    if outcome in OUT_OF_SLO:
        return True
    return None


class GpuClusterWindow:
    """Requests that ended and GPU busy time over the last ``period_s`` seconds.

    Events must come in time order (one monotonic clock). Each event and each reading forgets
    what has left the window, so memory holds one period of requests and batches.
    """

    def __init__(self, opened_at: float, period_s: float = PERIOD_S):
        self.period_s = period_s
        # Before a whole period has passed, the window is as long as the time since it opened:
        # a busy first second must not read as 90% idle.
        self._opened_at = opened_at
        self._good: deque[float] = deque()  # end times of requests that met their SLO
        self._bad: deque[float] = deque()  # end times of requests that did not
        self._busy: deque[tuple[float, float]] = deque()  # (start, end) of batches that ended, in end order
        # GPU executor -> (start of its busy time not yet counted, batches sent and not answered):
        # a GPU whose next batch is sent before its batch in flight ends (the default policy's
        # pipelining) stays busy from the first to the last answer.
        self._running: dict[str, tuple[float, int]] = {}

    # -- events -----------------------------------------------------------------------------
    def request_ended(self, now: float, out_of_slo: bool) -> None:
        (self._bad if out_of_slo else self._good).append(now)
        self._forget(now)

    def batch_started(self, gpu: str, now: float) -> None:
        started, sent = self._running.get(gpu, (now, 0))
        self._running[gpu] = (started, sent + 1)

    def batch_ended(self, gpu: str, now: float) -> None:
        running = self._running.pop(gpu, None)
        if running is not None:
            started, sent = running
            self._busy.append((started, now))
            if sent > 1:  # the next batch runs on: busy from now, counted at its answer
                self._running[gpu] = (now, sent - 1)
        self._forget(now)

    # -- readings ---------------------------------------------------------------------------
    def bad_rate(self, now: float) -> float:
        """Bad requests over the requests that ended in the window (0 when none ended)."""
        self._forget(now)
        ended = len(self._good) + len(self._bad)
        return len(self._bad) / ended if ended else 0.0

    def busy_s(self, now: float) -> float:
        """GPU-seconds spent on batches within the window, those still running included."""
        self._forget(now)
        since = now - self.period_s
        busy = sum(end - max(start, since) for start, end in self._busy)
        return busy + sum(now - max(start, since) for start, _ in self._running.values())

    def idle_fraction(self, now: float, gpus: int) -> float:
        """1 - busy GPU-time / (``gpus`` x the window's length); 1 with nothing to measure yet."""
        length = min(self.period_s, now - self._opened_at)
        if gpus <= 0 or length <= 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self.busy_s(now) / (gpus * length)))

    def _forget(self, now: float) -> None:
        since = now - self.period_s
        for ends in (self._good, self._bad):
            while ends and ends[0] < since:
                ends.popleft()
        while self._busy and self._busy[0][1] <= since:
            self._busy.popleft()
