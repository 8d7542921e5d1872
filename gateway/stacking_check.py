"""Whether stacking requests along a model's leading free dimension keeps each one's results.

A free leading dimension on every input and output (``ModelSignature.batchable``) is what a
batch dimension looks like, but not every such dimension is one: ``x[N, M] -> y[M, N]`` (a
transpose), ``x[N, M] -> sum[M]`` (a sum over the rows), ``table[K, 3], idx[N] -> table[idx]``
(two unrelated free dimensions) or a sort of the rows all have it, and stacked requests then
read each other's rows. ONNX Runtime reports a free dimension without saying which it is, and
names cannot decide it either (exporters name an output's batch dimension apart from its
input's, as PP-OCR's do).

So it is run, once per model at start (gateway/engine.py, before the profiling run): two
requests of two rows each, alone, then stacked in either order. Each stacked run must answer
four rows in every output, each request's two its own results. The requests differ in every
row: floats are drawn at random, and integers, booleans and strings carry the row's number
within its request in the first request (0, 1) and the other way round in the second (1, 0),
so that an integer used as an index stays within the request's own rows; where an input is
not floats, a second round gives the second request 0 and 0 (a maximum or mean over the rows of
0, 1 and 1, 0 is the same alone and stacked). A model that fails the check is served one request
at a time, as one without a batch dimension is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from executors.lifecycle import SupervisedExecutor
from executors.same_results import why_not_same
from gateway.profiling import sample_inputs
from gateway.signature import ModelSignature

log = logging.getLogger("gateway")

ROWS = 2  # each request's
UNCHECKED = "model %s: could not check that batching keeps each request's results (%s)"

Outputs = dict[str, np.ndarray]


def _request(signature: ModelSignature, seed: int, row_numbers: list[int]) -> dict[str, np.ndarray]:
    """Profiling's sample inputs at ``ROWS`` rows, filled row by row: floats drawn from ``seed``,
    anything else the row's number of ``row_numbers``."""
    rng = np.random.default_rng(seed)
    inputs = sample_inputs(signature, ROWS)
    for name, array in inputs.items():
        if array.dtype.kind == "f":
            inputs[name] = rng.random(array.shape).astype(array.dtype)
            continue
        for row, number in enumerate(row_numbers):
            array[row] = str(number).encode() if array.dtype == np.object_ else number
    return inputs


def check_requests(signature: ModelSignature, second_rows: tuple[int, int] = (1, 0)) -> list[dict[str, np.ndarray]]:
    """The check's runs: the two requests alone, then stacked in either order, then the first
    alone again (a model whose results differ from run to run cannot be checked). The second
    request's integers, booleans and strings are ``second_rows``."""
    first, second = _request(signature, 1, [0, 1]), _request(signature, 2, list(second_rows))
    stacked = ({n: np.concatenate([a[n], b[n]]) for n in first} for a, b in ((first, second), (second, first)))
    return [first, second, *stacked, first]


def check_rounds(signature: ModelSignature) -> list[list[dict[str, np.ndarray]]]:
    """The check's rounds of runs (``check_requests``). The first keeps every integer within its
    request's rows (0, 1 and 1, 0), so that an index stays valid; but a maximum, a minimum or a
    mean over the rows of such integers is the same for both requests alone and stacked, and
    clients of such a model read each other's rows. So where an input is not floats, a second
    round gives the second request 0, 0: within any table an index reaches (values past the
    first request's, 2 and 3, were refused by a table of two rows, and a maximum over two rows of
    it went unseen), and a model that refuses them leaves the first round's word standing."""
    rounds = [check_requests(signature)]
    if any(spec.datatype not in ("FP16", "FP32", "FP64") for spec in signature.inputs):
        rounds.append(check_requests(signature, (0, 0)))
    return rounds


def why_results_differ(runs: list[Outputs]) -> str | None:
    """Why the stacked runs' outputs (``check_requests``'s order) are not the two requests' own,
    row by row, or None. None too where the first request's two runs alone disagree (random
    operators): nothing can be told from such a model's runs, and it keeps its batching."""
    first, second, *stacked, again = runs
    if any(why_not_same(name, first[name], again[name], "first request", "again") for name in first):
        log.warning("results differ from run to run: whether batching keeps each request's results was not checked")
        return None
    for order, outputs in zip(((first, second), (second, first)), stacked, strict=True):
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != 2 * ROWS:
                return f"output '{name}' has shape {list(array.shape)} for two stacked requests of {ROWS} rows each"
            for index, (alone, which) in enumerate(zip(order, ("first", "second"), strict=True)):
                reason = why_not_same(name, alone[name], array[index * ROWS : (index + 1) * ROWS], f"{which} request", "stacked")
                if reason is not None:
                    return reason
    return None


async def _checked(
    model: str, run: Callable[[dict[str, np.ndarray]], Awaitable[Outputs]], signature: ModelSignature
) -> str | None:
    first, *more = check_rounds(signature)
    try:
        runs = [await run(inputs) for inputs in first]
    except Exception as error:
        log.warning(UNCHECKED, model, str(error) or type(error).__name__)  # a timeout's text is empty
        return None
    reason = why_results_differ(runs)
    for round_ in more:
        if reason is not None:
            break
        try:
            runs = [await run(inputs) for inputs in round_]
        except Exception:  # values the model refuses: the first round's word stands
            break
        reason = why_results_differ(runs)
    return reason


async def why_stacking_changes_results(
    executor: SupervisedExecutor, model: str, signature: ModelSignature, hang_s: float
) -> str | None:
    """Why stacking requests of ``model`` changes their results, run on its CPU ``executor``, or
    None when it does not. None too when the check cannot run (the model fails on the sample
    inputs): the warning says so, and batching stays as the signature has it."""

    async def run(inputs: dict[str, np.ndarray]) -> Outputs:
        return (await asyncio.wait_for(executor.infer(model, inputs), hang_s))[0]

    return await _checked(model, run, signature)


def _session_here(path: Path) -> Any:
    """The model at ``path`` in this process, on ONNX Runtime's CPU provider."""
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def file_signature(path: Path) -> dict[str, Any]:
    """The inputs and outputs of the model at ``path`` as its executor's hello says them, read by
    ONNX Runtime in this process."""
    from executors.tensors import describe

    return describe(_session_here(path))


def session_runner(path: Path) -> tuple[ModelSignature, Callable[[dict[str, np.ndarray]], Outputs]]:
    """The model's signature, and the model run in this process by ONNX Runtime on the CPU: for a
    model that only GPUs serve, whose executors hold models as the dispatch core counts them (a
    run there would load it behind the core's back, past a GPU's memory_mb), and for the simulator."""
    from executors.tensors import describe
    from executors.worker import as_onnx_feed

    session = _session_here(path)
    names = [output.name for output in session.get_outputs()]

    def run(inputs: dict[str, np.ndarray]) -> Outputs:
        feeds = {name: as_onnx_feed(array) for name, array in inputs.items()}
        return dict(zip(names, session.run(names, feeds), strict=True))

    return ModelSignature.from_json(describe(session)), run


async def why_stacking_changes_results_here(model: str, path: Path, signature: ModelSignature, hang_s: float) -> str | None:
    """``why_stacking_changes_results`` with the model run in this process (``session_runner``),
    off the event loop, each run waited for at most ``hang_s`` (then the check is given up)."""

    async def run(inputs: dict[str, np.ndarray]) -> Outputs:
        return await asyncio.wait_for(asyncio.to_thread(runner, inputs), hang_s)

    try:
        _, runner = await asyncio.to_thread(session_runner, path)
    except Exception as error:
        log.warning(UNCHECKED, model, str(error) or type(error).__name__)  # a timeout's text is empty
        return None
    return await _checked(model, run, signature)
