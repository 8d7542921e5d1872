"""A real GPU executor warms its models up before it says it is ready.

ONNX Runtime's CUDA provider searches cuDNN's convolution algorithms on the first run of each
input shape, and every batch size is a new shape: on an H100 that first run took 439 ms for a
batch that takes well under one once warm, and the GPU's latency profile learnt it as l(b)
(docs/BENCHMARKS.md). The worker runs each model once at every batch size up to its
max_batch_size before its hello, and says what it did. These tests run the worker on the CPU
(the provider does not change what it runs); the same warm-up on a GPU is
benchmarks/gpu_serve.py's.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from onnx import TensorProto, helper

from executors.process import ProcessExecutor
from executors.worker import open_session, warm_up
from gateway.config import ConfigError, load_config
from gateway.node import build_node_executors
from tests.helpers import flag_values, save_model, write_gpu_config


def test_warm_up_runs_every_batch_size_of_a_model_with_fixed_shapes(example_models):
    session = open_session(str(example_models / "cnn_small.onnx"), 1, "cpu", 0)
    sizes, _, skipped = warm_up(session, 5)
    assert sizes == [1, 2, 3, 4, 5] and skipped is None


def test_a_model_with_free_image_sides_is_not_warmed_and_says_why(example_models):
    session = open_session(str(example_models / "ppocr_det.onnx"), 1, "cpu", 0)
    sizes, _, skipped = warm_up(session, 8)
    assert sizes == [] and "free dimension besides the batch" in skipped and "[-1, 3, -1, -1]" in skipped


def test_an_input_without_a_batch_dimension_keeps_its_shape_at_every_size(tmp_path):
    # y = x + s with x[N, 4] and a scalar s[]: only x grows with the batch.
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "s"], ["y"])],
        "mixed",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    save_model(graph, tmp_path / "mixed.onnx")
    sizes, _, skipped = warm_up(open_session(str(tmp_path / "mixed.onnx"), 1, "cpu", 0), 3)
    assert sizes == [1, 2, 3] and skipped is None


class FailsOnZeros:
    """A session whose model cannot run on zeros (a division by an input, say)."""

    def get_inputs(self):
        return [SimpleNamespace(name="x", type="tensor(float)", shape=["N", 4])]

    get_outputs = get_inputs

    def run(self, names, feeds):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : zeros are not allowed here")


def test_a_model_that_fails_on_zeros_is_served_unwarmed_and_says_why():
    sizes, _, skipped = warm_up(FailsOnZeros(), 4)
    assert sizes == [] and "failed on zeros at batch 1" in skipped and "zeros are not allowed here" in skipped


async def test_the_executor_reports_the_warm_up_in_its_hello(example_models, tmp_path):
    # A GPU executor: on a machine without one ONNX Runtime falls back to the CPU and the worker
    # warms the CPU session; either way what it did comes back in its hello.
    models = {name: example_models / f"{name}.onnx" for name in ("mlp", "ppocr_det")}
    warmup = {"mlp": 3, "ppocr_det": 4}
    executor = ProcessExecutor(
        "gpu-0", models, device="gpu:0", threads=1, cores=1.0, socket_dir=tmp_path, gpu_batches=warmup, warmup=True
    )
    await executor.start()
    try:
        assert executor.warmed["mlp"]["batches"] == [1, 2, 3] and executor.warmed["mlp"]["skipped"] is None
        assert executor.warmed["ppocr_det"]["batches"] == [] and "free dimension" in executor.warmed["ppocr_det"]["skipped"]
    finally:
        await executor.stop()


def _config(tmp_models, gpu: str):
    return load_config(write_gpu_config(tmp_models, gpu, gpus=(0, 1)))


def test_real_gpu_executors_warm_each_model_up_to_its_largest_batch(tmp_models):
    config = _config(tmp_models, 'cudnn_conv_algo_search = "heuristic"')
    node = build_node_executors(config, tmp_models)
    for gpu in node.gpus:
        args = gpu.worker_arguments("unix:x")
        assert flag_values(args, "--warmup") == ["mlp=6"]
        assert flag_values(args, "--cudnn-conv-algo-search") == ["HEURISTIC"]
    cpu_args = node.cpu["mlp"].worker_arguments("unix:x")
    assert flag_values(cpu_args, "--warmup") == [] and flag_values(cpu_args, "--cudnn-conv-algo-search") == []


@pytest.mark.parametrize(
    "gpu",
    [
        "warmup = false",
        'executor = "emulated"\nprofile = "profile.csv"',  # an emulated GPU has no cuDNN to warm
        "memory_mb = 100",  # a model cache holds no session at start
    ],
)
def test_no_warm_up_where_there_is_nothing_to_warm_or_it_is_turned_off(tmp_models, gpu):
    (tmp_models / "profile.csv").write_text("model,alpha_ms,beta_ms\nmlp,0.1,1.0\n")
    node = build_node_executors(_config(tmp_models, gpu), tmp_models)
    assert all(flag_values(g.worker_arguments("unix:x"), "--warmup") == [] for g in node.gpus)


def test_an_unknown_cudnn_search_is_named(tmp_models):
    with pytest.raises(ConfigError, match="gpu.cudnn_conv_algo_search"):
        _config(tmp_models, 'cudnn_conv_algo_search = "fastest"')
