"""The short profiling run at start-up that seeds each latency profile (DESIGN.md, principle 3).

For each model on each kind of device: batch 1 and a larger batch, three runs each (the first
is a warm-up: a GPU sets up its kernels on the first run of a shape), the median of the other
two, and the line l(b) = per_item b + fixed through them. Inputs are zeros of the model's
signature, with 32 for each free dimension other than the batch. The profiles then learn from
every real batch (schedulers/profiles.py).
"""

from __future__ import annotations

import asyncio
import logging
import statistics

import numpy as np

from executors.lifecycle import SupervisedExecutor
from executors.tensors import KSERVE_TO_NUMPY
from gateway.config import ModelConfig
from gateway.signature import ModelSignature
from schedulers.profiles import LatencyProfile

log = logging.getLogger("gateway")

RUNS = 3
# The larger batch of the profiling run (or the model's max batch size if smaller).
LARGE_BATCH = 8
# Free dimensions other than the batch get this size: a multiple of 32, which convolutional
# detectors such as PP-OCR need, and small enough to be quick.
FREE_DIMENSION = 32
# Used when a model cannot be run on zeros: the profile then learns from real batches.
FALLBACK_MS = 1.0


def sample_inputs(signature: ModelSignature, rows: int) -> dict[str, np.ndarray]:
    inputs = {}
    for spec in signature.inputs:
        shape = [
            rows if (i == 0 and signature.batchable) else (FREE_DIMENSION if d == -1 else d) for i, d in enumerate(spec.shape)
        ]
        if spec.datatype == "BYTES":
            inputs[spec.name] = np.full(shape, b"", dtype=np.object_)
        else:
            inputs[spec.name] = np.zeros(shape, dtype=KSERVE_TO_NUMPY[spec.datatype])
    return inputs


async def _median_ms(executor: SupervisedExecutor, model: str, inputs: dict[str, np.ndarray], hang_s: float) -> float:
    times = []
    for _ in range(RUNS):
        # A run that never ends is a hung executor, as a request's batch would be: killed and
        # replaced at hang_timeout_ms (else a load, or the start, waited for it for ever).
        try:
            _, compute_ms = await asyncio.wait_for(executor.infer(model, inputs), hang_s)
        except TimeoutError:
            rows = len(next(iter(inputs.values()))) if inputs else 1
            executor.kill_hung(f"no reply to a profiling batch of {rows} within {hang_s:g} s (hang_timeout_ms)")
            raise TimeoutError(f"no reply within {hang_s:g} s (hang_timeout_ms); the executor was killed") from None
        times.append(compute_ms)
    return statistics.median(times[1:])


async def profile_executor(
    executor: SupervisedExecutor, model: str, signature: ModelSignature, config: ModelConfig
) -> LatencyProfile:
    try:
        single = await _median_ms(executor, model, sample_inputs(signature, 1), config.hang_timeout_s)
        large = min(LARGE_BATCH, config.max_batch_size) if signature.batchable else 1
        if large == 1:
            return LatencyProfile(per_item_ms=0.0, fixed_ms=single)
        batch = await _median_ms(executor, model, sample_inputs(signature, large), config.hang_timeout_s)
    except Exception as error:
        log.warning(
            "model %s: profiling on %s failed (%s); the profile will learn from real batches", model, executor.device, error
        )
        return LatencyProfile(per_item_ms=FALLBACK_MS, fixed_ms=FALLBACK_MS)
    per_item = max(0.0, (batch - single) / (large - 1))
    profile = LatencyProfile(per_item_ms=per_item, fixed_ms=max(0.0, single - per_item))
    profile.observe(1, single)
    profile.observe(large, batch)
    return profile
