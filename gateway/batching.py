"""Stacking queued requests into one batch and splitting the results back.

Requests are stacked only along the leading batch dimension that every input and output of the
model has (``ModelSignature.batchable``), and only when their other dimensions and datatypes
agree, so batching never changes a result.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Batchable(Protocol):
    inputs: dict[str, np.ndarray]
    rows: int
    batch_key: tuple


def batch_key(inputs: dict[str, np.ndarray]) -> tuple:
    """Requests with equal keys can share a batch: same inputs, same trailing shapes and types."""
    return tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(inputs.items()))


def take_batch(queue: deque, max_rows: int, batchable: bool) -> list:
    """Pop the head of the queue and the compatible requests right behind it, up to max_rows.

    FIFO order is kept: the batch stops at the first request that does not fit, so no request
    overtakes an older one of the same model.
    """
    first = queue.popleft()
    batch = [first]
    if not batchable:
        return batch
    rows = first.rows
    while queue and queue[0].batch_key == first.batch_key and rows + queue[0].rows <= max_rows:
        request = queue.popleft()
        rows += request.rows
        batch.append(request)
    return batch


def stack_inputs(batch: Sequence[Batchable]) -> dict[str, np.ndarray]:
    if len(batch) == 1:
        return batch[0].inputs
    return {name: np.concatenate([r.inputs[name] for r in batch]) for name in batch[0].inputs}


def split_outputs(outputs: dict[str, np.ndarray], batch: Sequence[Batchable]) -> list[dict[str, np.ndarray]]:
    if len(batch) == 1:
        return [outputs]
    total = sum(r.rows for r in batch)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(f"output '{name}' has shape {list(array.shape)}, which does not split into {total} rows")
    cuts = np.cumsum([r.rows for r in batch])[:-1]
    per_output = {name: np.split(array, cuts) for name, array in outputs.items()}
    return [{name: parts[i] for name, parts in per_output.items()} for i in range(len(batch))]
