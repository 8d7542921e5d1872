"""A real GPU runs each model at fixed batch sizes, a batch padded with zero rows to the next.

ONNX Runtime's CUDA convolution re-plans whenever its input shape changes (21-48 ms a batch on
an H200 against 0.1-0.4 ms for the batch: docs/BENCHMARKS.md), so the GPU executor keeps one
session per size (executors/batch_shapes.py). These tests run it on the CPU, where the padding,
the slicing and the choice of session are the same; benchmarks/gpu_serve.py measures it on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from executors.batch_shapes import FixedBatchSession, batch_sizes, why_not_fixed
from executors.process import ProcessExecutor
from executors.worker import fix_batch_sizes, open_session
from gateway.config import load_config
from gateway.node import build_node_executors
from tests.helpers import flag_values, save_model, two_lengths_model, write_gpu_config


def offset_lookup_model(path):
    """idx[N] -> table[idx - 11]: the indices 1-10 are valid, and a row of zeros is not."""
    graph = helper.make_graph(
        [helper.make_node("Sub", ["idx", "eleven"], ["j"]), helper.make_node("Gather", ["table", "j"], ["y"], axis=0)],
        "offset_lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor("table", TensorProto.FLOAT, [10, 3], [float(v) for v in range(30)]),
            helper.make_tensor("eleven", TensorProto.INT64, [], [11]),
        ],
    )
    return str(save_model(graph, path))


@pytest.mark.parametrize(
    ("largest", "sizes"), [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]), (32, [1, 2, 4, 8, 16, 32])]
)
def test_sizes_are_the_powers_of_two_below_the_largest_batch_and_it(largest, sizes):
    assert batch_sizes(largest) == sizes


class Spy:
    """A session that records the batch sizes it ran."""

    def __init__(self, session):
        self.session, self.rows = session, []

    def run(self, names, feeds):
        self.rows.append(next(iter(feeds.values())).shape[0])
        return self.session.run(names, feeds)


def test_a_batch_runs_padded_on_the_next_size_and_answers_its_own_rows(example_models):
    path = str(example_models / "cnn_small.onnx")
    fixed = FixedBatchSession(open_session(path, 1, "cpu", 0), lambda: open_session(path, 1, "cpu", 0), 8)
    assert list(fixed.sessions) == [1, 2, 4, 8] and len({id(s) for s in fixed.sessions.values()}) == 4
    spies = {size: Spy(session) for size, session in fixed.sessions.items()}
    fixed.sessions = spies
    x = np.random.default_rng(0).random((3, 3, 32, 32), dtype=np.float32)
    (padded,) = fixed.run(None, {"x": x})
    (alone,) = open_session(path, 1, "cpu", 0).run(None, {"x": x})
    assert spies[4].rows == [4] and not spies[1].rows and not spies[2].rows and not spies[8].rows
    assert padded.shape == alone.shape and np.allclose(padded, alone, atol=1e-5)
    fixed.run(None, {"x": x[:2]})
    assert spies[2].rows == [2]  # a batch of a size of its own runs unpadded


def test_a_batch_larger_than_the_largest_size_runs_as_it_is(example_models):
    path = str(example_models / "mlp.onnx")
    fixed = FixedBatchSession(open_session(path, 1, "cpu", 0), lambda: open_session(path, 1, "cpu", 0), 4)
    fixed.sessions = {size: Spy(session) for size, session in fixed.sessions.items()}
    (y,) = fixed.run(None, {"x": np.zeros((6, 512), np.float32)})
    assert y.shape[0] == 6 and fixed.sessions[4].rows == [6]


def test_a_model_whose_other_sessions_cannot_be_opened_keeps_its_one_session(example_models):
    path = str(example_models / "mlp.onnx")
    one = open_session(path, 1, "cpu", 0)
    sessions = {"mlp": one}

    def out_of_memory(name):
        raise RuntimeError("CUDA failure 2: out of memory")

    fix_batch_sizes(sessions, {"mlp": 8}, out_of_memory)
    assert sessions["mlp"] is one
    fix_batch_sizes(sessions, {"mlp": 8}, lambda name: open_session(path, 1, "cpu", 0))
    assert isinstance(sessions["mlp"], FixedBatchSession) and sessions["mlp"].sizes == [1, 2, 4, 8]


def test_models_with_other_free_dimensions_run_each_batch_at_its_own_size(example_models):
    assert why_not_fixed(open_session(str(example_models / "mlp.onnx"), 1, "cpu", 0)) is None
    reason = why_not_fixed(open_session(str(example_models / "ppocr_det.onnx"), 1, "cpu", 0))
    assert "input x has a free dimension besides the batch" in reason


def test_a_model_that_refuses_a_row_of_zeros_is_not_padded_with_them(tmp_path):
    # Padded with a zero row, a batch of three valid indices failed as a whole.
    path = offset_lookup_model(tmp_path / "offset.onnx")
    assert "fails on a row of zeros" in why_not_fixed(open_session(path, 1, "cpu", 0))
    sessions = {"offset": open_session(path, 1, "cpu", 0)}
    fix_batch_sizes(sessions, {"offset": 8}, lambda name: open_session(path, 1, "cpu", 0))
    assert not isinstance(sessions["offset"], FixedBatchSession)
    # Fixed all the same (a zero row that fails only past the first), a batch answers for itself.
    fixed = FixedBatchSession(open_session(path, 1, "cpu", 0), lambda: open_session(path, 1, "cpu", 0), 8)
    idx = np.array([1, 5, 10], np.int64)
    (y,) = fixed.run(None, {"idx": idx})
    assert np.array_equal(y, np.arange(30, dtype=np.float32).reshape(10, 3)[idx - 11])


def centred_rows_model(path):
    """x[N, 4] -> x minus the mean of its rows: a free leading dimension on the input and the
    output, and each row's result depends on every row (zero rows padded in move the mean)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1), helper.make_node("Sub", ["x", "mean"], ["y"])],
        "centred_rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return str(save_model(graph, path))


def test_a_model_whose_rows_read_each_other_is_not_padded(tmp_path):
    """Padded to 4, a request of three rows had a zero row in its mean: every answer off by a
    quarter of its rows' mean. The gateway's stacking check serves such a model one request at
    a time, which kept other requests out of the batch, not the padding."""
    path = centred_rows_model(tmp_path / "centred.onnx")
    assert "not the same padded with a row of zeros" in why_not_fixed(open_session(path, 1, "cpu", 0))
    sessions = {"centred": open_session(path, 1, "cpu", 0)}
    fix_batch_sizes(sessions, {"centred": 8}, lambda name: open_session(path, 1, "cpu", 0))
    assert not isinstance(sessions["centred"], FixedBatchSession)
    x = np.random.default_rng(1).random((3, 4), dtype=np.float32)
    (y,) = sessions["centred"].run(None, {"x": x})
    assert np.allclose(y, x - x.mean(axis=0), atol=1e-6)


def test_inputs_whose_leading_dimensions_differ_run_as_they_are(tmp_path):
    path = str(two_lengths_model(tmp_path / "two.onnx"))
    fixed = FixedBatchSession(open_session(path, 1, "cpu", 0), lambda: open_session(path, 1, "cpu", 0), 8)
    table = np.arange(9, dtype=np.float32).reshape(3, 3)
    (y,) = fixed.run(None, {"table": table, "idx": np.array([2, 0], np.int64)})
    assert np.array_equal(y, table[[2, 0]])  # padded to 4 and cut to the table's 3 rows, it had 3


async def test_the_gpu_executor_answers_a_padded_batch_with_its_own_rows(example_models, tmp_path):
    # On a machine without a GPU ONNX Runtime falls back to the CPU: the worker's sessions, padding
    # and slicing are the same.
    models = {"cnn_small": example_models / "cnn_small.onnx"}
    sizes = {"cnn_small": 8}
    executor = ProcessExecutor(
        "gpu-0",
        models,
        device="gpu:0",
        threads=1,
        cores=1.0,
        socket_dir=tmp_path,
        gpu_batches=sizes,
        warmup=True,
        fixed_batch_shapes=True,
    )
    await executor.start()
    try:
        assert executor.warmed["cnn_small"]["batches"] == [1, 2, 4, 8]  # each size's session warmed once
        x = np.random.default_rng(1).random((5, 3, 32, 32), dtype=np.float32)
        outputs, _ = await executor.infer("cnn_small", {"x": x})
        (alone,) = open_session(str(models["cnn_small"]), 1, "cpu", 0).run(None, {"x": x})
        (name,) = outputs
        # On a GPU cuDNN and cuBLAS may use TF32 tensor cores: equal to about three decimal places.
        assert outputs[name].shape == alone.shape and np.allclose(outputs[name], alone, rtol=1e-2, atol=1e-3)
    finally:
        await executor.stop()


def _node(tmp_models, gpu: str):
    return build_node_executors(load_config(write_gpu_config(tmp_models, gpu)), tmp_models)


def test_real_gpu_executors_run_fixed_batch_sizes_unless_told_exact(tmp_models):
    (gpu,) = _node(tmp_models, "").gpus
    assert flag_values(gpu.worker_arguments("unix:x"), "--fixed-batches") == ["mlp=6"]
    (gpu,) = _node(tmp_models, 'batch_shapes = "exact"').gpus
    assert flag_values(gpu.worker_arguments("unix:x"), "--fixed-batches") == []
