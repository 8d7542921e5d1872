"""Triton's statistics extension: per-model totals in Triton's own schema, so that perf_analyzer
prints its server-side breakdown and a Triton dashboard reads the gateway unchanged.

Triton's protocol document (`extension_statistics.md`) defines, per model and version:

- ``success`` / ``fail``: requests that ended with a result / with an error, and the total time
  from their receipt to their end;
- ``queue``, ``compute_input``, ``compute_infer``, ``compute_output``: for every successful
  request, the time it waited and the time of its batch's three parts (a request of a batch of
  8 counts its batch's whole compute, as in Triton, so ``compute_infer.ns / count`` is the mean
  execution a request sat through);
- ``batch_stats``: per batch size, the executions and their three parts;
- ``inference_count`` (rows of successful requests: each inference of a batched request counts
  once), ``execution_count`` (batches run), ``last_inference`` (milliseconds since the epoch).

Here a batch's parts are: ``compute_input`` stacking the requests' tensors into one batch,
``compute_infer`` the executor's own measure of running the model (for an executor on another
node, the round trip from the dispatcher: the transfer is part of what the dispatcher plans
with), ``compute_output`` the rest of the round trip to the executor (the framing and the
transfer both ways) and splitting the outputs back into the requests'.

Pure accounting: the engine passes durations and a clock reading in; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The fields of Triton's $inference_stats and of each $batch_stat, in its document's order.
INFERENCE_STATS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
BATCH_STATS = ("compute_input", "compute_infer", "compute_output")


@dataclass
class Duration:
    """Triton's ``$duration_stat``: how many, and their total in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, ns)

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(frozen=True)
class BatchTiming:
    """One execution of a batch of ``rows`` rows and its three parts, in nanoseconds."""

    rows: int
    input_ns: int
    infer_ns: int
    output_ns: int

    @classmethod
    def measured(cls, rows: int, stacked_s: float, round_trip_s: float, compute_ms: float, split_s: float) -> BatchTiming:
        """From what the engine measures around a batch: the stacking, the executor's round trip,
        the executor's own compute time within it, and the split of its outputs."""
        infer_ns = round(compute_ms * 1e6)
        rest_ns = max(0, round(round_trip_s * 1e9) - infer_ns)
        return cls(rows, round(stacked_s * 1e9), infer_ns, rest_ns + round(split_s * 1e9))


@dataclass
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStatistics:
    """One model's totals since the gateway started."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStats] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0

    def executed(self, timing: BatchTiming, epoch_ms: int) -> None:
        """A batch ran to its end (whether or not its requests are still waited for)."""
        self.execution_count += 1
        self.last_inference_ms = epoch_ms
        stats = self.batches.setdefault(timing.rows, BatchStats())
        stats.compute_input.add(timing.input_ns)
        stats.compute_infer.add(timing.infer_ns)
        stats.compute_output.add(timing.output_ns)

    def succeeded(self, request_ns: int, queue_ns: int, rows: int, timing: BatchTiming) -> None:
        """A request answered with its result."""
        self.success.add(request_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(timing.input_ns)
        self.compute_infer.add(timing.infer_ns)
        self.compute_output.add(timing.output_ns)
        self.inference_count += rows

    def failed(self, request_ns: int) -> None:
        """A request that ended with an error (refused, invalid, timed out, its executor failed)."""
        self.fail.add(request_ns)

    def to_triton(self, name: str, version: str = "1") -> dict[str, Any]:
        """Triton's ``$model_stat``."""
        empty = Duration().to_json()
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_json(),
                "fail": self.fail.to_json(),
                "queue": self.queue.to_json(),
                "compute_input": self.compute_input.to_json(),
                "compute_infer": self.compute_infer.to_json(),
                "compute_output": self.compute_output.to_json(),
                # No response cache: Triton reports these as zeros when its cache is off.
                "cache_hit": empty,
                "cache_miss": empty,
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stats.compute_input.to_json(),
                    "compute_infer": stats.compute_infer.to_json(),
                    "compute_output": stats.compute_output.to_json(),
                }
                for size, stats in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
