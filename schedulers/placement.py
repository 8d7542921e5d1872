"""Where the replicas of each model run: ROMA's two deployment strategies (Section 2.2).

"The placement of model executables can either balance their number on the different nodes or
deploy them onto the same worker until a predefined number of replicas is reached. ROMA does not
allow one to deploy multiple replicas of the same model on the same worker node for the same
device." A replica here is a model's CPU executor on a worker (the GPU executors of a worker
hold every model).

- ``balance``: each replica goes to the worker that holds the fewest replicas so far;
- ``pack``: to the worker that holds the most so far (filling one worker before the next).

Ties go to the worker named first, so that two dispatchers with the same config and the same
workers place alike. Placement is incremental: replicas already placed on a worker that is
still up stay where they are (moving one would throw its controller's state away); only the
missing ones are placed, and a lowered count removes replicas from the worker that ``balance``
would unload first (the fullest) or ``pack`` would (the emptiest). Under ``balance`` one
exception: where a worker holds two replicas more than another (one that joined after the
others were placed), replicas move to it until they do not. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PLACEMENTS = ("balance", "pack")


def place(
    wanted: Mapping[str, int | None],
    workers: Sequence[str],
    holds: Mapping[str, frozenset[str] | set[str]],
    current: Mapping[str, Sequence[str]] | None = None,
    policy: str = "balance",
) -> dict[str, list[str]]:
    """Which workers run each model's replica.

    ``wanted``: model -> replicas (None: every worker that holds the model); ``workers``: those
    up; ``holds``: worker -> the models it can run; ``current``: model -> workers it runs on now.
    A model wanting more replicas than workers hold it gets as many as there are.
    """
    if policy not in PLACEMENTS:
        raise ValueError(f"unknown placement {policy!r}: one of {', '.join(PLACEMENTS)}")
    order = {worker: i for i, worker in enumerate(workers)}
    current = current or {}
    placed: dict[str, list[str]] = {}
    count = dict.fromkeys(workers, 0)
    # Keep what is still valid first, so that the counts the new replicas are placed by are known.
    for model in wanted:
        kept = [w for w in current.get(model, ()) if w in order and model in holds.get(w, ())]
        placed[model] = list(dict.fromkeys(kept))
        for worker in placed[model]:
            count[worker] += 1
    for model, replicas in wanted.items():
        eligible = [w for w in workers if model in holds.get(w, ())]
        target = len(eligible) if replicas is None else min(replicas, len(eligible))
        mine = placed[model]
        while len(mine) > target:
            # Unload the worker this policy would fill last.
            worker = (
                max(mine, key=lambda w: (count[w], order[w]))
                if policy == "balance"
                else min(mine, key=lambda w: (count[w], -order[w]))
            )
            mine.remove(worker)
            count[worker] -= 1
        while len(mine) < target:
            free = [w for w in eligible if w not in mine]
            if policy == "balance":
                worker = min(free, key=lambda w: (count[w], order[w]))
            else:
                worker = min(free, key=lambda w: (-count[w], order[w]))
            mine.append(worker)
            count[worker] += 1
        placed[model] = mine
    if policy == "balance":
        _even_out(placed, workers, holds, count, order)
    return {model: sorted(mine, key=order.__getitem__) for model, mine in placed.items()}


def _even_out(
    placed: dict[str, list[str]],
    workers: Sequence[str],
    holds: Mapping[str, frozenset[str] | set[str]],
    count: dict[str, int],
    order: Mapping[str, int],
) -> None:
    """Under ``balance``, move replicas from the fullest worker to the emptiest while they
    differ by more than one: a worker that joined (or came back) after the replicas were placed
    got none, and the first worker to connect held them all for good (two workers found at once
    connect some milliseconds apart). A difference of one moves nothing: a move resets the
    replica's controller."""
    while workers:
        fullest = max(workers, key=lambda w: (count[w], -order[w]))
        emptiest = min(workers, key=lambda w: (count[w], order[w]))
        if count[fullest] - count[emptiest] <= 1:
            return
        movable = [m for m, mine in placed.items() if fullest in mine and emptiest not in mine and m in holds.get(emptiest, ())]
        if not movable:
            return
        model = movable[-1]  # the last placed: the first stay where the policy put them
        placed[model][placed[model].index(fullest)] = emptiest
        count[fullest] -= 1
        count[emptiest] += 1
