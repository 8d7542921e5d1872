"""A model on a real GPU at a few fixed batch sizes, one ONNX Runtime session for each.

ONNX Runtime's CUDA convolution (``Conv::UpdateState``, cuDNN 9's frontend) keeps the plan of
the last input shape only: a batch whose shape differs from the one before builds a new plan,
and under ``cudnn_conv_algo_search = EXHAUSTIVE`` times the candidate kernels to do it. On an
H200 that cost 21-48 ms a batch for the example zoo's CNNs (4-8 ms under HEURISTIC), against
0.1-0.4 ms for the batch itself once planned (docs/BENCHMARKS.md, "GPU batches whose size
changes"), and a dynamic batcher's sizes change nearly every batch.

So each size keeps a session of its own, whose plan is built once (at warm-up), and a batch
runs padded with zero rows to the next size: the powers of two below the model's largest batch,
and that batch. At most twice its rows, which costs little on a GPU, where l(b) is mostly its
fixed cost. The price is in GPU memory: each size's session holds its own copy of the weights
and its own CUDA provider with its memory arena and workspaces (not counted where memory_mb
makes GPU memory a cache, which runs every batch at its own size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort


def batch_sizes(max_batch: int) -> list[int]:
    """The sizes a batch is padded to: 1, 2, 4, ... below ``max_batch``, and ``max_batch``."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    if max_batch > 1:
        sizes.append(max_batch)
    return sizes


def why_not_fixed(session: ort.InferenceSession) -> str | None:
    """Why a model cannot run at fixed batch sizes (None: it can): every input and output must
    have a free leading batch dimension and no other, and inputs must be numbers (padded with 0)."""
    for kind, args in (("input", session.get_inputs()), ("output", session.get_outputs())):
        for arg in args:
            shape = list(arg.shape or [])
            if not shape or isinstance(shape[0], int):
                return f"{kind} {arg.name} has no free batch dimension: {shape}"
            if any(not isinstance(dim, int) for dim in shape[1:]):
                return f"{kind} {arg.name} has a free dimension besides the batch: {shape}"
    strings = [arg.name for arg in session.get_inputs() if arg.type == "tensor(string)"]
    return f"input {strings[0]} is strings" if strings else None


class FixedBatchSession:
    """Quacks like an InferenceSession (get_inputs, get_outputs, get_providers, run) whose batches
    run padded to one of ``sizes``, each size on a session of its own."""

    def __init__(self, first: ort.InferenceSession, open_another: Callable[[], ort.InferenceSession], max_batch: int):
        self.sizes = batch_sizes(max_batch)
        self.sessions = {size: first if size == self.sizes[0] else open_another() for size in self.sizes}

    def get_inputs(self) -> Any:
        return self.sessions[self.sizes[0]].get_inputs()

    def get_outputs(self) -> Any:
        return self.sessions[self.sizes[0]].get_outputs()

    def get_providers(self) -> list[str]:
        return self.sessions[self.sizes[0]].get_providers()

    def run(self, names: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> list[Any]:
        rows = next(iter(feeds.values())).shape[0]
        size = next((s for s in self.sizes if s >= rows), None)
        if size is None:  # larger than the largest size (the gateway never sends one): as it is
            return self.sessions[self.sizes[-1]].run(names, feeds)
        if size > rows:
            feeds = {name: np.concatenate([a, np.zeros((size - rows, *a.shape[1:]), a.dtype)]) for name, a in feeds.items()}
        return [np.asarray(output)[:rows] for output in self.sessions[size].run(names, feeds)]
