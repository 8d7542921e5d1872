"""How many rows a free CPU executor takes from its model's queue.

A CPU runs a batch's rows one after the other, so its cost is close to linear in the batch:
l(b) = per_item_ms b + fixed_ms (Symphony Section 4.3; the profile learns the line from every
batch, schedulers/profiles.py). A batch then saves only the fixed cost shared by its rows, and
every request of the batch waits for the whole batch's l(b) (Harpagon Section II, Fig. 1 and
Fig. 2(b): a request's worst-case latency is d + b/T, the batch's execution d plus the time to
collect its b requests at rate T). Here the rows are already queued (no collection time), so
the head request ends at now + l(b). Batching as far as max_batch_size allows, as the GPU does
to fill its cores, only delays the head on a CPU whose fixed cost is small.

Pure: no I/O, no clock; the dispatch core (schedulers/dispatch.py) passes the slack.
"""

from __future__ import annotations

import math

from schedulers.profiles import LatencyProfile

# A batch grows while the fixed cost each row carries, fixed_ms / b, is still at least this
# share of a row's own cost: past it, one more row saves fixed_ms/b - fixed_ms/(b+1) per row,
# under 5% of per_item_ms, and mostly makes the head request wait longer.
AMORTIZED_SHARE = 0.05

# A late queue goes one by one only while that keeps its executors at most this busy. At 1 they
# are never idle and the queue never drains; a closed loop (clients that send their next request
# when answered: perf_analyzer's concurrency mode) reads exactly 1 however long its requests
# wait, its arrivals being its completions, and stayed one by one after a stall (8 clients at 40
# ms a request where batches take 12 ms).
ONE_BY_ONE_MAX_UTILISATION = 0.9


def amortizing_rows(profile: LatencyProfile) -> float:
    """The largest b whose per-row share of the fixed cost, fixed_ms / b, is still at least
    AMORTIZED_SHARE of per_item_ms: b <= fixed_ms / (AMORTIZED_SHARE per_item_ms).
    No fixed cost: nothing to amortize (1). No per-row cost: every row is free (inf)."""
    fixed_ms, per_item_ms = profile.fixed_ms, profile.per_item_ms
    if fixed_ms <= 0:
        return 1
    if per_item_ms <= 0:
        return math.inf
    return fixed_ms / (AMORTIZED_SHARE * per_item_ms)


def cpu_batch_rows(
    profile: LatencyProfile | None,
    available_rows: int,
    max_batch: int,
    slack_ms: float,
    executors: int = 1,
    arrivals_per_s: float = math.inf,
    rows_per_request: float = 1.0,
    trip_ms: float = 0.0,
) -> int:
    """The rows of the next CPU batch: at least 1, at most ``available_rows`` and ``max_batch``.

    - Without a profile, as many as allowed (min of ``available_rows`` and ``max_batch``).
    - Otherwise only as many as amortize the fixed cost (``amortizing_rows``): a linear profile
      (fixed_ms ~ 0) gives 1.
    - And never more than the head request's deadline allows: l(b) <= ``slack_ms`` (the ms from
      now to the head's deadline), since it waits for the whole batch (Harpagon Section II,
      L_wc = d + b/T with the batch already collected). If not even l(1) fits, the head is late
      whatever the batch: it is served alone while the model's ``executors``, one request at a
      time, keep up with its ``arrivals_per_s``: arrivals_per_s times what a request holds an
      executor (the mean l(r), r the ``rows_per_request`` each brings, and the ``trip_ms`` of a
      batch beyond its compute) at most ONE_BY_ONE_MAX_UTILISATION of ``executors`` (the
      utilisation of one-by-one service, from the mean as queueing theory reads it, not the high
      percentile that deadlines are read against); where they
      would not, its queue is batched at the size that ends the ``available_rows`` queued soonest
      on average, shared among the ``executors`` (``backlog_rows``).
    """
    allowed = max(1, min(available_rows, max_batch))
    if profile is None:
        return allowed
    amortizing = amortizing_rows(profile)
    # A hair of slack for float division (0.3 / 0.05 is 5.999...), so that the bound itself is reached.
    rows = allowed if amortizing + 1e-9 >= allowed else max(1, math.floor(amortizing + 1e-9))
    if profile.latency_ms(1) > slack_ms:
        # Alone: in ROMA's CPU experiment, batching every late queue for its mean end had more
        # violating windows than serving it one by one (docs/BENCHMARKS.md, "A late head's CPU
        # batch: alone, the backlog's mean end, or alone unless one by one falls behind"). Yet
        # a model whose requests come faster than one by one serves them never drains its queue
        # once its heads are late (after a stall, say), where batches keep up: it is batched.
        # A request goes alone with all its rows (8-row requests read at l(1) seemed 3x lighter
        # one by one than they are), and holds its executor for the trip too: a closed loop
        # whose executor waits 0.6 ms between requests of 5 ms read 0.89 busy without it.
        alone_ms = _mean_ms_at(profile, rows_per_request) + trip_ms
        if arrivals_per_s * alone_ms / 1000 <= ONE_BY_ONE_MAX_UTILISATION * max(executors, 1):
            return 1
        return backlog_rows(profile, rows, available_rows / max(executors, 1))
    return _most_within(profile, rows, slack_ms)


def _mean_ms_at(profile: LatencyProfile, rows: float) -> float:
    """The mean l at a mean of ``rows`` rows a request (at least 1), between the whole sizes
    around it: the mean over requests of mixed sizes on a line."""
    rows = max(rows, 1.0)
    low = math.floor(rows)
    below = profile.mean_ms(low)
    return below if rows == low else below + (rows - low) * (profile.mean_ms(low + 1) - below)


def backlog_rows(profile: LatencyProfile, rows: int, queued_rows: float) -> int:
    """The batch size, at most ``rows``, whose batches end the ``queued_rows`` soonest on average,
    for a queue whose head is late whatever the batch (an executor's part of it where the
    model's executors drain it together).

    Batches of b rows, one after another, end at l(b), 2 l(b), ...: the queued rows' mean end is
    about l(b) (n/b + 1) / 2 (b dividing n; a short last batch moves it by a few per cent),
    which is least near b = sqrt(n fixed_ms / per_item_ms) on a line.
    Served alone (b = 1), every head after a stall was late too and the queue paid its fixed
    cost n times (48 requests queued behind a 20 ms stall ran one by one, none within its SLA of
    20 ms); at the most rows that amortize (b = fixed_ms / (0.05 per_item_ms)), every request of
    a short backlog waited for the whole batch: 8 queued rows of l(b) = b + 0.4 ms end at
    8.4 ms each as one batch, at 6.0 ms on average in pairs.

    l(b) is read as the dispatch core reads it (the measured high percentile where there is
    one): it need not be a line, so every b up to ``rows`` is weighed (a CPU's batch is small)."""
    n = max(queued_rows, 1)
    return min(range(1, max(rows, 1) + 1), key=lambda b: profile.latency_ms(b) * (n / b + 1))


def within_slack(profile: LatencyProfile, rows: int, slack_ms: float) -> int:
    """At most ``rows``, the most whose l(b) fits the head's ``slack_ms``; ``rows`` where not even
    l(1) does (a planned batch keeps its size; ``cpu_batch_rows`` weighs the backlog instead).

    l(b) is read as the dispatch core reads it for the batch's expected end (the measured high
    percentile where there is one): it need not be monotonic in b, so step down, not solve."""
    return rows if profile.latency_ms(1) > slack_ms else _most_within(profile, rows, slack_ms)


def _most_within(profile: LatencyProfile, rows: int, slack_ms: float) -> int:
    """At most ``rows``, the most whose l(b) fits ``slack_ms`` (1 where none does)."""
    while rows > 1 and profile.latency_ms(rows) > slack_ms:
        rows -= 1
    return rows


def planned_batch_rows(profile: LatencyProfile | None, available_rows: int, planned: int, max_batch: int, slack_ms: float) -> int:
    """The rows of a CPU batch where a plan fixed the batch size (Harpagon Section III-A,
    batch-aware dispatch): the planned size, or what is queued when the head cannot wait for
    more, never past what the head's deadline allows (l(b) <= ``slack_ms``, ``within_slack``), at least 1."""
    rows = max(1, min(available_rows, planned, max_batch))
    return rows if profile is None else within_slack(profile, rows, slack_ms)


def dispatch_due(profile: LatencyProfile | None, queued_rows: int, planned: int, head_deadline: float) -> float:
    """When a free CPU executor takes a batch under batch-aware dispatch (Harpagon Section
    III-A: a batch leaves when it holds the planned b requests, not at the first free executor,
    so that every request's worst case is d(b) + b/T rather than 2 d(b)).

    At once (-inf) when ``planned`` rows are queued or no plan holds it (``planned`` <= 1);
    otherwise at the head request's latest start for a full batch, deadline - l(planned)
    (Symphony's sched_at rule, Section 4.3, on a CPU): waiting longer would make it late. Without
    a profile there is no l(b) to wait by, so at once. A measured l(b) need not grow with b: the
    wait ends no later than the last start of the batch queued now, deadline - l(queued rows)."""
    if planned <= 1 or queued_rows >= planned or profile is None:
        return -math.inf
    return head_deadline - max(profile.latency_ms(planned), profile.latency_ms(max(1, queued_rows))) / 1000
