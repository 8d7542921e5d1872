"""The real GPU executor (ONNX Runtime's CUDA provider) against CPU outputs.

It needs an NVIDIA GPU and onnxruntime-gpu with its CUDA libraries (the project's `gpu` extra);
elsewhere it is skipped, and the reason is printed (pytest -rs).
"""

from __future__ import annotations

import contextlib

import numpy as np
import onnxruntime as ort
import pytest

from executors.process import ProcessExecutor


def cuda_unavailable_reason(model_path) -> str | None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"this onnxruntime ({ort.__version__}) has no CUDA provider"
    try:
        session = ort.InferenceSession(str(model_path), providers=["CUDAExecutionProvider"])
    except Exception as error:
        return f"the CUDA provider cannot open a session here: {error}"
    if session.get_providers()[0] != "CUDAExecutionProvider":
        return "no usable NVIDIA GPU: ONNX Runtime fell back from the CUDA provider to the CPU"
    return None


@pytest.fixture(scope="module")
def gpu_models(example_models):
    if hasattr(ort, "preload_dlls"):
        with contextlib.suppress(Exception):
            ort.preload_dlls()
    reason = cuda_unavailable_reason(example_models / "mlp.onnx")
    if reason:
        pytest.skip(reason)
    return example_models


async def test_gpu_executor_holds_every_model_and_matches_cpu(gpu_models, tmp_path):
    models = {name: gpu_models / f"{name}.onnx" for name in ("mlp", "cnn_small", "cnn_large", "ppocr_det")}
    executor = ProcessExecutor("gpu-0", models, device="gpu:0", threads=1, cores=1.0, socket_dir=tmp_path)
    await executor.start()
    try:
        assert executor.provider == "CUDAExecutionProvider"
        assert set(executor.signatures) == set(models)
        rng = np.random.default_rng(0)
        shapes = {"mlp": (8, 512), "cnn_small": (8, 3, 32, 32), "cnn_large": (4, 3, 64, 64), "ppocr_det": (2, 3, 96, 128)}
        for name, shape in shapes.items():
            x = rng.random(shape, dtype=np.float32)
            outputs, compute_ms = await executor.infer(name, {"x": x})
            cpu = ort.InferenceSession(str(models[name]), providers=["CPUExecutionProvider"])
            expected = dict(zip([o.name for o in cpu.get_outputs()], cpu.run(None, {"x": x}), strict=True))
            for output, want in expected.items():
                # cuDNN and cuBLAS may use TF32 tensor cores: equal to about three decimal places.
                assert np.allclose(outputs[output], want, rtol=1e-2, atol=1e-3), (name, np.abs(outputs[output] - want).max())
            assert compute_ms > 0
            gap = max(np.abs(outputs[o] - expected[o]).max() for o in expected)
            print(f"{name} {shape}: GPU {compute_ms:.2f} ms, max |GPU - CPU| {gap:.2e}")
    finally:
        await executor.stop()
