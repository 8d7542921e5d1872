"""A pipeline served as one model: its steps run in the order of their DAG, each wave of
independent steps at once. A model step goes through its model's queue, admission and
schedulers like any request of that model (its latency budget is that model's SLA, which
``gateway plan`` sets); a function step runs off the event loop. Every step's tensors are kept,
so a client may ask for them (``"parameters": {"pipeline_steps": true}``), to check each step
against running it by hand.

A request ends with the pipeline's outputs or with the first step's error, named: a step's
refusal keeps its status (429, 503, 504...), a function that rejects its input with ValueError
answers 400, and anything else a step does wrong 500.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from executors.tensors import KSERVE_TO_NUMPY, holds_datatype
from gateway.config.schema import PIPELINE_INPUT, PipelineStep, PipelineTable
from gateway.pipeline.functions import StepFunction, StepThreads, load_function
from gateway.pipeline.graph import PipelineGraph
from gateway.protocol import InferRequest, InvalidRequest, RequestedOutput
from gateway.signature import ModelSignature, TensorSpec
from gateway.stats import ResponseTimes
from gateway.triton_stats import BatchTiming, ModelStatistics
from supervisor.node import Window

if TYPE_CHECKING:
    from gateway.engine import Engine, ModelRuntime, Result

NUMPY_TO_KSERVE = {dtype: name for name, dtype in KSERVE_TO_NUMPY.items()}
# Threads of each pipeline's function steps: as many of its requests' functions run at once.
FUNCTION_THREADS = 8
# A step's chunks in its model's queue at once, at most (and at most a quarter of the queue).
MAX_CHUNKS_IN_FLIGHT = 64
T = TypeVar("T")
# The outcome of a step model's request taken back because another chunk or step of its pipeline
# request failed (it is also the message of that cancellation, which tells it from a client that left).
WITHDRAWN = "withdrawn"


@dataclass(frozen=True)
class PipelineSignature(ModelSignature):
    """A pipeline's inputs and outputs: one request at a time, so no dimension is a batch's."""

    @property
    def batchable(self) -> bool:
        return False


class StepFailed(RuntimeError):
    """A step could not give its outputs; ``status`` and ``outcome`` as the engine's RequestFailed."""

    def __init__(self, message: str, status: int, outcome: str):
        super().__init__(message)
        self.status, self.outcome = status, outcome


@dataclass(frozen=True)
class _NoBatching:
    """What the server reads of a model's config: a pipeline takes one request at a time."""

    max_batch_size: int = 0


@dataclass
class PipelineRuntime:
    """A pipeline as the server and the engine's accounting see a model (the same fields)."""

    name: str
    graph: PipelineGraph
    functions: dict[str, StepFunction]
    signature: ModelSignature
    sla_ms: float
    config: _NoBatching = field(default_factory=_NoBatching)
    times: ResponseTimes = field(default_factory=ResponseTimes)
    outcomes: dict[str, int] = field(default_factory=dict)
    statistics: ModelStatistics = field(default_factory=ModelStatistics)
    window: Window = field(default_factory=Window)
    devices: dict[str, int] = field(default_factory=dict)
    received: int = 0
    gpu_profile: None = None  # no GPU batches of its own: its steps' models have theirs
    platform: str = "ensemble"  # what Triton calls a model made of models
    ready_check: Callable[[], bool] = lambda: True
    # The function steps run here, in threads of the pipeline's own: in the loop's default pool
    # (six threads on two cores), a pipeline's slow functions held up every other pipeline's.
    threads: StepThreads = field(default_factory=lambda: StepThreads(FUNCTION_THREADS, "pipeline-step"))

    @classmethod
    def build(cls, name: str, table: PipelineTable, models: dict[str, ModelRuntime], base: Path) -> PipelineRuntime:
        """Once the models have their signatures (the engine has started)."""
        outputs = {m: [t.name for t in r.signature.outputs] for m, r in models.items() if r.signature is not None}
        graph = PipelineGraph.build(name, table, outputs)
        functions = {s.name: load_function(s.function, base) for s in table.steps if s.function is not None}
        signature = PipelineSignature(
            tuple(TensorSpec(t.name, t.datatype, t.shape) for t in table.inputs),
            tuple(TensorSpec(t.name, t.datatype, t.shape) for t in table.outputs),
        )
        used = [models[s.model] for s in table.steps if s.model is not None]
        return cls(name, graph, functions, signature, table.sla_ms, ready_check=lambda: all(m.ready for m in used))

    @property
    def ready(self) -> bool:
        return self.ready_check()

    @property
    def served_name(self) -> str:
        return self.name

    @property
    def version(self) -> str:
        return "1"  # a pipeline is served as a model of one version

    @property
    def datatypes(self) -> dict[str, str]:
        return {t.name: t.datatype for t in self.signature.outputs}

    async def run(self, engine: Engine, request: InferRequest, arrival: float) -> Result:
        """Every step, in waves; the pipeline's outputs (and, when asked, every step's tensors)."""
        from gateway.engine import Result

        # Its compute is its steps' run, from here: from its arrival, it held the client's upload
        # (1.2 s of a body sent slowly, against a step of 0.1 ms).
        began = engine.now
        tensors: dict[str, np.ndarray] = {f"{PIPELINE_INPUT}/{k}": v for k, v in request.inputs.items()}
        steps = {s.name: s for s in self.graph.table.steps}
        # The whole pipeline ends by its request's deadline (the client's timeout, capped by the
        # server's), as a model's request does: each step gets what is left of it.
        limit_s = engine.config.server.request_timeout_ms / 1000
        if request.timeout_us:
            limit_s = min(limit_s, request.timeout_us / 1e6)
        deadline = _Deadline(arrival + limit_s, limit_s)
        for wave in self.graph.levels():
            steps_of_wave = [self._step(engine, steps[name], tensors, deadline, request.priority) for name in wave]
            results = await _all_or_none(steps_of_wave)
            for name, outputs in zip(wave, results, strict=True):
                tensors.update({f"{name}/{k}": v for k, v in outputs.items()})
        outputs = {t.name: tensors[t.source] for t in self.graph.table.outputs if t.source is not None}
        for t in self.signature.outputs:
            outputs[t.name] = _as_datatype(outputs[t.name], t.datatype, f"pipeline '{self.name}', output '{t.name}'")
        if request.parameters.get("pipeline_steps") is True:
            binary = request.parameters.get("binary_data_output") is True
            for key, array in tensors.items():
                if not key.startswith(f"{PIPELINE_INPUT}/"):
                    outputs[key] = _sendable(array, f"pipeline '{self.name}', step output '{key}'")
                    request.outputs.append(RequestedOutput(key, binary))
        took_ms = (engine.now - began) * 1000
        timing = BatchTiming(1, 0, round(took_ms * 1e6), 0)
        return Result(outputs, "pipeline", 1, 0.0, took_ms, self.name, timing, 1, began, engine.now)

    def datatypes_of(self, outputs: dict[str, np.ndarray]) -> dict[str, str]:
        """The datatype of each output to send, the declared ones and the steps' own."""
        return {**{k: NUMPY_TO_KSERVE.get(v.dtype, "BYTES") for k, v in outputs.items()}, **self.datatypes}

    async def _step(
        self, engine: Engine, step: PipelineStep, tensors: dict[str, np.ndarray], deadline: _Deadline, priority: int
    ) -> dict[str, np.ndarray]:
        arrays = {name: tensors[source] for name, source in step.inputs.items()}
        if step.model is not None:
            return await self._model_step(engine, step, arrays, deadline, priority)
        function = self.functions[step.name]
        where = f"pipeline '{self.name}', step '{step.name}'"
        left_s = deadline.left_s(where)  # past it, a 504: inside the try below it was taken for the function's failure (500)
        call = self.threads.submit(_call, function, arrays)
        try:
            async with asyncio.timeout(left_s):
                outputs = await asyncio.wrap_future(call)
        except TimeoutError:
            self.threads.given_up(call)
            raise deadline.passed(where) from None
        except asyncio.CancelledError:  # the client left, or the request was withdrawn
            self.threads.given_up(call)
            raise
        except ValueError as error:
            raise StepFailed(f"pipeline '{self.name}', step '{step.name}' refused the input: {error}", 400, "invalid") from None
        except Exception as error:
            raise StepFailed(
                f"pipeline '{self.name}', step '{step.name}' failed: {type(error).__name__}: {error}", 500, "internal_error"
            ) from None
        missing = [o for o in step.outputs if not isinstance(outputs, dict) or not isinstance(outputs.get(o), np.ndarray)]
        if missing:
            raise StepFailed(
                f"pipeline '{self.name}', step '{step.name}' gave no array for {', '.join(missing)}", 500, "internal_error"
            )
        return {o: outputs[o] for o in step.outputs}

    async def _model_step(
        self, engine: Engine, step: PipelineStep, arrays: dict[str, np.ndarray], deadline: _Deadline, priority: int
    ) -> dict[str, np.ndarray]:
        from gateway.engine import RequestFailed

        assert step.model is not None
        runtime = engine.models[step.model]
        signature = runtime.signature
        assert signature is not None
        where = f"pipeline '{self.name}', step '{step.name}' (model '{step.model}')"
        for spec in signature.inputs:
            if spec.name not in arrays:
                raise StepFailed(f"{where}: the model's input '{spec.name}' is fed nothing", 500, "internal_error")
            arrays[spec.name] = _as_datatype(arrays[spec.name], spec.datatype, f"{where}, input '{spec.name}'")
            if signature.batchable and arrays[spec.name].ndim == 0:
                raise StepFailed(f"{where}: the model's input '{spec.name}' is fed a scalar, with no rows", 500, "internal_error")
        rows = next(iter(arrays.values())).shape[0] if signature.batchable else 1
        if signature.batchable and rows == 0:
            # Nothing to run (no text found, say): empty outputs, as the model would give.
            return {
                t.name: np.zeros((0, *(max(d, 0) for d in t.shape[1:])), KSERVE_TO_NUMPY[t.datatype]) for t in signature.outputs
            }
        # A step's rows beyond the model's largest batch go as several requests, served side by side.
        limit = runtime.config.max_batch_size
        chunks = [arrays]
        if signature.batchable:
            chunks = [{k: v[i : i + limit] for k, v in arrays.items()} for i in range(0, rows, limit)]

        # The chunks enter the model's queue a window at a time: all at once, a request of
        # 200,000 rows (25,000 chunks) filled the queue, most were refused 429, and other
        # clients' requests were refused with them.
        window = asyncio.Semaphore(max(1, min(MAX_CHUNKS_IN_FLIGHT, runtime.config.max_queue_size // 4)))

        async def one(chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            async with window:
                request = InferRequest(
                    None,
                    chunk,
                    [RequestedOutput(t.name, True) for t in signature.outputs],
                    next(iter(chunk.values())).shape[0] if signature.batchable else 1,
                    timeout_us=max(1, round(deadline.left_s(where) * 1e6)),  # the model's queue times it out
                    priority=priority,  # the pipeline's request's level, in each step model's queue
                )
                engine.received(runtime)
                arrival, result, outcome = time.perf_counter(), None, "internal_error"
                try:
                    result = await engine.submit(runtime, request, arrival)
                    outcome = "success"
                    return result.outputs
                except RequestFailed as error:
                    outcome = error.outcome
                    if error.outcome == "timeout":
                        raise deadline.passed(where) from None
                    raise StepFailed(f"{where}: {error}", error.status, error.outcome) from None
                except InvalidRequest as error:  # what the step's model refuses before queueing it (BYTES not UTF-8)
                    outcome = "invalid"
                    raise StepFailed(f"{where}: {error}", error.status, outcome) from None
                except asyncio.CancelledError as cancelled:
                    # Withdrawn where another chunk or step of the request failed; else its client left.
                    outcome = WITHDRAWN if cancelled.args == (WITHDRAWN,) else "client_gone"
                    raise
                finally:
                    engine.record(runtime, outcome, arrival, result)

        parts = await _all_or_none([one(c) for c in chunks])
        return {t.name: np.concatenate([p[t.name] for p in parts]) for t in signature.outputs}


async def _all_or_none(steps: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every one's result, in order; at the first that fails, the others are cancelled (their
    requests leave their models' queues, counted ``withdrawn``) before its error is raised. With
    ``gather`` a request refused at once (429) left its other chunks and steps queued, and they
    were served. Where this is cancelled itself (the client left), the cancellation's own message
    reaches them first (``gather`` passes it on): they are gone with their client."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel(WITHDRAWN)
        await asyncio.gather(*pending, return_exceptions=True)


def _call(function: StepFunction, arrays: dict[str, np.ndarray]) -> Any:
    """A step's function, in a thread of the pipeline's. SystemExit or KeyboardInterrupt raised by
    it are its failure, not a request to stop the gateway (they went on through the event loop and
    ended the process): raised as a RuntimeError that names them."""
    try:
        return function(arrays)
    except Exception:
        raise
    except BaseException as error:
        raise RuntimeError(f"{type(error).__name__}({error})") from None


@dataclass(frozen=True)
class _Deadline:
    """When a pipeline's request must have ended (a ``perf_counter`` time), and its limit."""

    at: float
    limit_s: float

    def left_s(self, where: str) -> float:
        """What a step has left; a step that would begin past the deadline is refused."""
        left = self.at - time.perf_counter()
        if left <= 0:
            raise self.passed(where)
        return left

    def passed(self, where: str) -> StepFailed:
        return StepFailed(f"{where}: the pipeline's request timed out after {self.limit_s * 1000:g} ms", 504, "timeout")


def _sendable(array: np.ndarray, where: str) -> np.ndarray:
    """A step's own tensor, sent as the datatype its numpy type names (``datatypes_of``): an
    array that is no KServe datatype (complex numbers; objects that are not text) is the step's
    mistake, as a declared output of the wrong type is. It was sent as BYTES: a None as "None"
    over HTTP, and over gRPC a request that failed after it was served."""
    if array.dtype.kind in "OSU":
        return _as_datatype(array, "BYTES", where)
    if array.dtype in NUMPY_TO_KSERVE:
        return array
    raise StepFailed(f"{where}: {array.dtype} is no KServe datatype", 500, "internal_error")


def _as_datatype(array: Any, datatype: str, where: str) -> np.ndarray:
    """The array in the datatype declared for it; floats where other floats are declared, and
    integers where other integers are, are converted (a float64 where FP32 is declared is numpy's
    default) where each value fits; anything else that differs is the pipeline's mistake. (An
    int64 300 declared UINT8 was sent as 44, and 2**40 as INT32 0; a float64 1e300 as FP32 inf.)"""
    if not isinstance(array, np.ndarray):
        raise StepFailed(f"{where}: not an array ({type(array).__name__})", 500, "internal_error")
    if holds_datatype(array, datatype):
        return array
    wanted = KSERVE_TO_NUMPY[datatype]
    if array.dtype.kind == wanted.kind == "f":
        converted = array.astype(wanted)
        if array.size and np.isinf(converted[np.isfinite(array)]).any():
            raise StepFailed(f"{where}: a value beyond {datatype}'s range", 500, "internal_error")
        return converted
    if array.dtype.kind in "iu" and wanted.kind in "iu":
        bounds = np.iinfo(wanted)
        if array.size and not np.can_cast(array.dtype, wanted) and (array.min() < bounds.min or array.max() > bounds.max):
            raise StepFailed(f"{where}: a value beyond {datatype}'s range ({bounds.min} to {bounds.max})", 500, "internal_error")
        return array.astype(wanted)
    if datatype == "BYTES" and array.dtype.kind == "O":
        odd = next(item for item in array.flat if not isinstance(item, (str, bytes)))
        raise StepFailed(
            f"{where}: an element of type {type(odd).__name__} where BYTES (str or bytes) is declared", 500, "internal_error"
        )
    raise StepFailed(f"{where}: {array.dtype} where {datatype} is declared", 500, "internal_error")
