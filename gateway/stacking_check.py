"""Whether stacking requests along a model's leading free dimension keeps each one's results.

A free leading dimension on every input and output (``ModelSignature.batchable``) is what a
batch dimension looks like, but not every such dimension is one: ``x[N, M] -> y[M, N]`` (a
transpose), ``x[N, M] -> sum[M]`` (a sum over the rows), or ``table[K, 3], idx[N] -> table[idx]``
(two unrelated free dimensions) all have it, and stacked requests then read each other's rows.
ONNX Runtime reports a free dimension without saying which it is, and names cannot decide it
either (exporters name an output's batch dimension apart from its input's, as PP-OCR's do).

So it is run, once per model at start (gateway/engine.py, before the profiling run): two
requests of one row each, alone and then stacked. The stacked run must answer two rows in every
output, the first the first request's results and the second the second's. Float inputs differ
between the two requests (values in [0, 1)), so a batch that mixes rows shows; integer inputs are
zeros in both (an index into anything), booleans false and strings empty. A model that fails the
check is served one request at a time, as one without a batch dimension is.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from executors.lifecycle import SupervisedExecutor
from gateway.profiling import sample_inputs
from gateway.signature import ModelSignature

log = logging.getLogger("gateway")

# A row computed in a batch of two may differ from the same row alone in the last bits (kernels
# pick other blockings per batch size); mixed rows differ by far more.
RELATIVE_TOLERANCE = 1e-3
ABSOLUTE_TOLERANCE = 1e-5


def _request(signature: ModelSignature, seed: int) -> dict[str, np.ndarray]:
    """One row of the model's sample inputs (profiling's), its floats drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    inputs = sample_inputs(signature, 1)
    for name, array in inputs.items():
        if array.dtype.kind == "f":
            inputs[name] = rng.random(array.shape).astype(array.dtype)
    return inputs


def _differs(name: str, alone: np.ndarray, stacked: np.ndarray, which: str) -> str | None:
    if alone.shape != stacked.shape:
        return f"output '{name}' of the {which} request has shape {list(alone.shape)} alone, {list(stacked.shape)} stacked"
    if alone.dtype.kind in "fc":
        scale = float(np.nanmax(np.abs(alone))) if alone.size and not np.isnan(alone).all() else 0.0
        same = np.allclose(stacked, alone, rtol=RELATIVE_TOLERANCE, atol=ABSOLUTE_TOLERANCE * max(1.0, scale), equal_nan=True)
    else:
        same = np.array_equal(stacked, alone)
    return None if same else f"output '{name}' of the {which} request is not the same stacked as alone"


def check_requests(signature: ModelSignature) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The two one-row requests of the check, and the two stacked."""
    first, second = _request(signature, 1), _request(signature, 2)
    return first, second, {name: np.concatenate([first[name], second[name]]) for name in first}


def why_results_differ(alone: list[dict[str, np.ndarray]], stacked: dict[str, np.ndarray]) -> str | None:
    """Why the stacked run's outputs are not the two requests' own, row by row, or None."""
    for name, array in stacked.items():
        if array.ndim == 0 or array.shape[0] != 2:
            return f"output '{name}' has shape {list(array.shape)} for two stacked requests of one row each"
        for index, which in ((0, "first"), (1, "second")):
            reason = _differs(name, alone[index][name], array[index : index + 1], which)
            if reason is not None:
                return reason
    return None


async def why_stacking_changes_results(
    executor: SupervisedExecutor, model: str, signature: ModelSignature, hang_s: float
) -> str | None:
    """Why stacking two requests of ``model`` changes their results, or None when it does not.
    None too when the check cannot run (the model fails on the sample inputs): the profiling
    run says so, and batching stays as the signature has it."""
    first, second, stacked_inputs = check_requests(signature)
    try:
        alone = [(await asyncio.wait_for(executor.infer(model, r), hang_s))[0] for r in (first, second)]
        stacked, _ = await asyncio.wait_for(executor.infer(model, stacked_inputs), hang_s)
    except Exception as error:
        log.warning("model %s: could not check that batching keeps each request's results (%s)", model, error)
        return None
    return why_results_differ(alone, stacked)
