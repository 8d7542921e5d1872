"""What a real GPU executor's batches cost when their size changes batch to batch.

    python benchmarks/gpu_batch_shapes.py [--batches 400] [--gap-ms 3] [--out FILE.csv]

One GPU executor (ONNX Runtime's CUDA provider) holding mlp, cnn_small and cnn_large of the
example zoo, each warmed up; 400 batches, each of a random model and a random size 1-32, with
exponential gaps of 3 ms mean between them, as a dynamic batcher sends them. Three executors one
after the other: each batch at its own size ([gpu] batch_shapes = "exact") under cuDNN's
exhaustive search, and fixed sizes (executors/batch_shapes.py) under the exhaustive and the
heuristic search. Prints per model the median, 99th percentile and maximum of the compute time
the executor reported, over all batches and over the first batch of each size apart. Needs an
NVIDIA GPU and onnxruntime-gpu; it says so and exits 2 without them.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

from executors.process import ProcessExecutor

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"cnn_small": (3, 32, 32), "mlp": (512,), "cnn_large": (3, 64, 64)}
LARGEST = 32
CONFIGS = (("exact", "EXHAUSTIVE"), ("fixed", "EXHAUSTIVE"), ("fixed", "HEURISTIC"))


class NoGpu(Exception):
    """The GPU executor fell back from the CUDA provider: there is nothing to measure here."""


async def run(shapes: str, search: str, batches: int, gap_ms: float) -> list[dict[str, object]]:
    models = {name: ROOT / "examples" / "models" / f"{name}.onnx" for name in SHAPES}
    largest = dict.fromkeys(SHAPES, LARGEST)
    executor = ProcessExecutor(
        "gpu-0",
        models,
        device="gpu:0",
        threads=1,
        cores=1.0,
        socket_dir=Path(tempfile.mkdtemp(prefix="gpu-shapes-")),
        gpu_batches=largest,
        warmup=True,
        fixed_batch_shapes=shapes == "fixed",
        cudnn_conv_algo_search=search,
    )
    await executor.start()
    rng, seen, rows = random.Random(1), set(), []
    try:
        if executor.provider != "CUDAExecutionProvider":
            raise NoGpu(f"the GPU executor runs {executor.provider}, not the CUDA provider: nothing to measure")
        for i in range(batches):
            model, size = rng.choice(list(SHAPES)), rng.randint(1, LARGEST)
            x = np.random.default_rng(i).random((size, *SHAPES[model]), dtype=np.float32)
            _, compute_ms = await executor.infer(model, {"x": x})
            rows.append({"shapes": shapes, "search": search, "model": model, "size": size, "first": (model, size) not in seen})
            rows[-1]["compute_ms"] = round(compute_ms, 4)
            seen.add((model, size))
            await asyncio.sleep(rng.expovariate(1 / gap_ms) / 1000)
    finally:
        await executor.stop()
    return rows


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{np.median(values):.3f} / {values[int(0.99 * (len(values) - 1))]:.3f} / {values[-1]:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--gap-ms", type=float, default=3.0)
    parser.add_argument("--out", type=Path, help="every batch as a CSV row")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    print("| batch shapes | cuDNN search | model | ms median / p99 / max, all batches | first batch of each size |")
    print("|---|---|---|---|---|")
    for shapes, search in CONFIGS:
        try:
            these = asyncio.run(run(shapes, search, args.batches, args.gap_ms))
        except NoGpu as error:
            print(error, file=sys.stderr)
            return 2
        rows += these
        for model in SHAPES:
            every = [float(r["compute_ms"]) for r in these if r["model"] == model]  # type: ignore[arg-type]
            first = [float(r["compute_ms"]) for r in these if r["model"] == model and r["first"]]  # type: ignore[arg-type]
            print(f"| {shapes} | {search.lower()} | {model} | {summary(every)} | {summary(first)} |", flush=True)
    if args.out:
        with args.out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
