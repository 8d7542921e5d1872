"""Measure l(b) of the example models on a real GPU (ONNX Runtime's CUDA provider).

    python benchmarks/gpu_profile.py [--out benchmarks/profiles/h100.csv] [--cudnn-conv-algo-search EXHAUSTIVE]

For batch sizes 1, 2, 4, 8, 16 and 32: 5 warm-up runs (the first CUDA run of a shape sets up
kernels and cuDNN algorithms), then the median of 30. Writes one row per model in the zoo CSV
format that the emulated GPU executor and ``gateway simulate`` read (model, alpha_ms, beta_ms,
beta_over_alpha, slo_ms; the fit l(b) = alpha b + beta), plus the raw medians per batch size
and the first run after each change of batch size (cold_b*_ms): the CUDA provider's convolution
re-plans for every new input shape (under the cuDNN algorithm search named), which a GPU
executor running each batch at its own size pays whenever the size changes
(executors/batch_shapes.py).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
SHAPES = {"mlp": (512,), "cnn_small": (3, 32, 32), "cnn_large": (3, 64, 64), "ppocr_det": (3, 64, 96), "upconv_l": (1, 8, 8)}
BATCHES = (1, 2, 4, 8, 16, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "profiles" / "gpu.csv")
    parser.add_argument("--cudnn-conv-algo-search", choices=["EXHAUSTIVE", "HEURISTIC", "DEFAULT"], default="EXHAUSTIVE")
    args = parser.parse_args()
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    rows = []
    for name, shape in SHAPES.items():
        cuda = {"cudnn_conv_algo_search": args.cudnn_conv_algo_search}
        session = ort.InferenceSession(str(MODELS / f"{name}.onnx"), providers=[("CUDAExecutionProvider", cuda)])
        assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
        medians, cold = {}, {}
        for b in BATCHES:
            x = np.random.default_rng(b).random((b, *shape), dtype=np.float32)
            for run in range(5):
                started = time.perf_counter()
                session.run(None, {"x": x})
                if run == 0:
                    cold[b] = (time.perf_counter() - started) * 1000
            samples = []
            for _ in range(30):
                started = time.perf_counter()
                session.run(None, {"x": x})
                samples.append((time.perf_counter() - started) * 1000)
            medians[b] = float(np.median(samples))
        alpha, beta = np.polyfit(list(medians), list(medians.values()), 1)
        alpha, beta = max(alpha, 0.0), max(beta, 0.0)
        rows.append(
            {
                "model": name,
                "alpha_ms": round(alpha, 4),
                "beta_ms": round(beta, 4),
                "beta_over_alpha": round(beta / alpha, 2) if alpha else "",
                "slo_ms": "",
                **{f"b{b}_ms": round(m, 4) for b, m in medians.items()},
                **{f"cold_b{b}_ms": round(m, 2) for b, m in cold.items()},
            }
        )
        print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
