"""ROMA's CPU scheduler: random round-robin over the non-empty queues.

ROMA Section 3: "CPU Scheduler repeatedly removes a request from a randomly selected queue and
schedules it for CPU execution on a randomly selected model executable. This way the load sent
by CPU Scheduler to each model executable is homogeneous and the burden of managing CPU
allocation is handled locally by CT Controllers." A CPU executor holds one model (Section 2.2),
so a queue can only go to a free executor of its own model.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from schedulers.decisions import Assign


class RandomRoundRobin:
    def __init__(self, rng: random.Random):
        self._rng = rng

    def assign(self, waiting: Mapping[str, int], free: Mapping[str, Sequence[str]]) -> list[Assign]:
        """Pair free executors with queued work.

        ``waiting`` maps a model to its queue length and ``free`` a model to the ids of its idle
        executors. Queues are visited in random order and each gets random free executors of
        its model, at most one per queued request (a batch takes at least one request).
        """
        candidates = [model for model, length in waiting.items() if length > 0 and free.get(model)]
        self._rng.shuffle(candidates)
        decisions: list[Assign] = []
        for model in candidates:
            executors = list(free[model])
            self._rng.shuffle(executors)
            for executor_id in executors[: waiting[model]]:
                decisions.append(Assign(model, executor_id))
        return decisions
