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

from executors.same_results import why_not_same
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
    free leading batch dimension and no other, a row of zeros must run, and padding a batch with
    one must leave its own rows' results as they are (``why_padding_changes_rows``)."""
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
    return why_padding_changes_rows(session, signature["inputs"])


def why_padding_changes_rows(session: ort.InferenceSession, inputs: list[dict[str, Any]]) -> str | None:
    """Why a batch padded with a zero row does not answer its own rows as it does unpadded, or
    None. A leading free dimension on every input and output need not be a batch dimension: a
    model that subtracts the rows' mean, or sorts them, reads the zero rows too (the gateway's
    stacking check, gateway/stacking_check.py, keeps such a model's requests apart, but one
    request of several rows was still padded). Two rows of random floats (other inputs zero, as
    the padding is) run as they are and with a third row of zeros."""
    rng = np.random.default_rng(0)
    rows: dict[str, np.ndarray] = {}
    for spec in inputs:
        dtype = KSERVE_TO_NUMPY[spec["datatype"]]
        shape = [2, *spec["shape"][1:]]
        rows[spec["name"]] = rng.random(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    padded = {name: np.concatenate([array, np.zeros((1, *array.shape[1:]), array.dtype)]) for name, array in rows.items()}
    names = [output.name for output in session.get_outputs()]
    try:
        alone, again, with_zeros = (session.run(None, feeds) for feeds in (rows, rows, padded))
    except Exception as error:
        return f"it fails on two rows padded with a row of zeros: {type(error).__name__}: {error}"
    if any(why_not_same(name, a, b, "rows", "again") for name, a, b in zip(names, alone, again, strict=True)):
        return None  # its results differ from run to run (random operators): nothing to tell
    for name, own, padded_output in zip(names, alone, with_zeros, strict=True):
        padded_output = np.asarray(padded_output)
        if padded_output.ndim == 0 or padded_output.shape[0] != 3:
            return f"output '{name}' has shape {list(padded_output.shape)} for three rows"
        reason = why_not_same(name, np.asarray(own), padded_output[:2], "batch's rows", "padded with a row of zeros")
        if reason is not None:
            return reason
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
