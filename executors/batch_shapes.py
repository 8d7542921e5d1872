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

from executors.tensors import KSERVE_TO_NUMPY, describe


def batch_sizes(max_batch: int) -> list[int]:
    """The sizes a batch is padded to: 1, 2, 4, ... below ``max_batch``, and ``max_batch``."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    if max_batch > 1:
        sizes.append(max_batch)
    return sizes


def why_not_on_zeros(session: ort.InferenceSession) -> str | None:
    """Why a model cannot be run on zeros of shapes known ahead (None: it can): an input with a
    free dimension besides a leading batch one (its shapes come from requests), or of strings or
    another type without a numpy dtype."""
    for spec in describe(session)["inputs"]:
        if -1 in spec["shape"][1:]:
            return f"input {spec['name']} has a free dimension besides the batch: {spec['shape']}"
        if spec["datatype"] not in KSERVE_TO_NUMPY or spec["datatype"] == "BYTES":
            return f"input {spec['name']} is {spec['datatype']}"
    return None


def why_not_fixed(session: ort.InferenceSession) -> str | None:
    """Why a model cannot run at fixed batch sizes (None: it can): its inputs must run on zeros
    (``why_not_on_zeros``: a batch is padded with them), every input and output must have a
    free leading batch dimension and no other, and a row of zeros must run."""
    reason = why_not_on_zeros(session)
    if reason:
        return reason
    signature = describe(session)
    for kind in ("input", "output"):
        for spec in signature[f"{kind}s"]:
            if spec["shape"][:1] != [-1]:
                return f"{kind} {spec['name']} has no free batch dimension: {spec['shape']}"
            if -1 in spec["shape"][1:]:
                return f"{kind} {spec['name']} has a free dimension besides the batch: {spec['shape']}"
    zeros = {spec["name"]: np.zeros([1, *spec["shape"][1:]], KSERVE_TO_NUMPY[spec["datatype"]]) for spec in signature["inputs"]}
    try:
        session.run(None, zeros)
    except Exception as error:
        return f"it fails on a row of zeros, which would pad its batches: {type(error).__name__}: {error}"
    return None


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
        leading = {a.shape[0] if a.ndim else None for a in feeds.values()}
        rows = next(iter(leading))
        size = next((s for s in self.sizes if rows is not None and s >= rows), None) if len(leading) == 1 else None
        if size is None:
            # Larger than the largest size (the gateway never sends one), or inputs whose leading
            # dimensions differ (no batch dimension to pad): as it is.
            return self.sessions[self.sizes[-1]].run(names, feeds)
        if size == rows:
            return self.sessions[size].run(names, feeds)
        padded = {name: np.concatenate([a, np.zeros((size - rows, *a.shape[1:]), a.dtype)]) for name, a in feeds.items()}
        try:
            outputs = self.sessions[size].run(names, padded)
        except Exception:
            # A zero row the model refuses (an index it offsets out of range, say), where the
            # batch's own rows are valid: unpadded, the batch answers for itself (or fails on its own).
            return self.sessions[size].run(names, feeds)
        return [np.asarray(output)[:rows] for output in outputs]
