"""Batching never changes a result: no batch dimension, no batching; mixed trailing shapes, no
mixing; a free leading dimension that is no batch dimension (found by running the model at start,
gateway/stacking_check.py), no batching."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest
import requests
from onnx import TensorProto, helper

from gateway.tools.simulate import _batchable
from tests.helpers import (
    fixed_shape_model,
    metric_value,
    rowsum_model,
    run_gateway,
    save_model,
    table_model,
    two_lengths_model,
    write_config,
)


def transpose_model(path):
    """x[N,M] -> y[M,N]: both leading dimensions free, neither a batch dimension."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])],
        "transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", "N"])],
    )
    return save_model(graph, path)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batching")
    fixed_shape_model(folder / "fixed.onnx")
    rowsum_model(folder / "rowsum.onnx")
    transpose_model(folder / "transpose.onnx")
    two_lengths_model(folder / "lookup.onnx")
    table_model(folder / "table.onnx")
    config = write_config(
        folder / "config.toml",
        {
            "fixed": {"path": "fixed.onnx", "sla_ms": 100, "max_batch_size": 16},
            "rowsum": {"path": "rowsum.onnx", "sla_ms": 100, "max_batch_size": 16},
            "transpose": {"path": "transpose.onnx", "sla_ms": 100, "max_batch_size": 8, "dispatch_batch": 4},
            "lookup": {"path": "lookup.onnx", "sla_ms": 100, "max_batch_size": 8, "dispatch_batch": 4},
            "table": {"path": "table.onnx", "sla_ms": 1000, "max_batch_size": 8, "dispatch_batch": 4},
        },
    )
    with run_gateway(config) as gateway:
        yield gateway


async def _post_all(base: str, model: str, bodies: list[dict]) -> list[dict]:
    async with aiohttp.ClientSession() as session:

        async def one(body: dict) -> dict:
            async with session.post(f"{base}/v2/models/{model}/infer", json=body) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        return await asyncio.gather(*(one(b) for b in bodies))


async def test_model_without_batch_dimension_is_served_one_request_at_a_time(gateway):
    rng = np.random.default_rng(5)
    inputs = [rng.random((2, 4), dtype=np.float32) for _ in range(40)]
    bodies = [{"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.tolist()}]} for x in inputs]
    answers = await _post_all(gateway.base, "fixed", bodies)
    for x, answer in zip(inputs, answers, strict=True):
        assert answer["parameters"]["batch_size"] == 1
        assert np.allclose(np.asarray(answer["outputs"][0]["data"]).reshape(2, 4), x * 2 + 1)
    config = gateway.admin("fixed")
    assert config["max_batch_size"] == 0


async def test_requests_batch_only_with_equal_trailing_shapes(gateway):
    rng = np.random.default_rng(6)
    inputs = [rng.random((1 + i % 3, 4 if i % 2 else 7), dtype=np.float32) for i in range(60)]
    bodies = [{"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]} for x in inputs]
    answers = await _post_all(gateway.base, "rowsum", bodies)
    for x, answer in zip(inputs, answers, strict=True):
        (output,) = answer["outputs"]
        assert output["shape"] == [x.shape[0], 1]
        assert np.allclose(np.asarray(output["data"]), x.sum(axis=1), rtol=1e-5)


async def test_a_leading_dimension_that_is_no_batch_dimension_is_not_batched(gateway):
    # Stacked, four clients' [1,4] rows came back as columns of everyone's (client 0 got
    # [[1, 11, 21, 31]]), and two clients' tables were joined so that one read the other's rows.
    rows = [np.arange(4, dtype=np.float32) + 10 * i for i in range(16)]
    bodies = [{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.tolist()}]} for x in rows]
    answers = await _post_all(gateway.base, "transpose", bodies)
    for x, answer in zip(rows, answers, strict=True):
        assert answer["outputs"][0]["shape"] == [4, 1] and answer["outputs"][0]["data"] == x.tolist()
    tables = [np.full((3, 3), i, dtype=np.float32) + np.arange(3, dtype=np.float32)[:, None] / 10 for i in range(16)]
    bodies = [
        {
            "inputs": [
                {"name": "table", "shape": [3, 3], "datatype": "FP32", "data": t.ravel().tolist()},
                {"name": "idx", "shape": [2], "datatype": "INT64", "data": [2, 0]},
            ]
        }
        for t in tables
    ]
    answers = await _post_all(gateway.base, "lookup", bodies)  # K = 3, N = 2: refused as stacked rows that disagree
    for t, answer in zip(tables, answers, strict=True):
        assert np.allclose(np.asarray(answer["outputs"][0]["data"]).reshape(2, 3), t[[2, 0]])
    for model in ("transpose", "lookup"):
        described = gateway.admin(model)
        assert described["max_batch_size"] == 0
        assert described["dispatch_batch"] == 1  # its planned 4 would only have held requests back
    assert gateway.admin("rowsum")["max_batch_size"] == 16  # a true batch dimension keeps its batching


def mixing_model(path, node, element, kind: str):
    """One input x[N,3] of ``element`` through ``node``: row-wise mixing of a kind the check must see."""
    inputs = [helper.make_tensor_value_info("x", element, ["N", 3])]
    initializers = []
    if kind == "cumsum":  # each row the sum of the rows before it: integers mix
        initializers = [helper.make_tensor("axis", TensorProto.INT64, [], [0])]
    if kind == "gather":  # table and index in one request; an integer or boolean table mixes
        inputs.append(helper.make_tensor_value_info("idx", TensorProto.INT64, ["N"]))
    graph = helper.make_graph([node], kind, inputs, [helper.make_tensor_value_info("y", element, ["N", 3])], initializers)
    return save_model(graph, path)


def test_the_simulator_batches_what_serve_batches(tmp_path):
    assert _batchable(rowsum_model(tmp_path / "rowsum.onnx"))
    assert _batchable(table_model(tmp_path / "table.onnx"))
    # A table of two rows: the second round's indices (0 and 0) reach it too, and its rows are each request's own.
    assert _batchable(table_model(tmp_path / "small_table.onnx", rows=2))
    assert not _batchable(fixed_shape_model(tmp_path / "fixed.onnx"))
    assert not _batchable(transpose_model(tmp_path / "transpose.onnx"))
    assert not _batchable(two_lengths_model(tmp_path / "lookup.onnx"))


@pytest.mark.parametrize(
    ("kind", "element"),
    [("gather", TensorProto.INT64), ("gather", TensorProto.BOOL), ("cumsum", TensorProto.INT64), ("sort", TensorProto.FLOAT)],
)
def test_rows_that_mix_through_integers_booleans_or_an_order_are_seen(tmp_path, kind, element):
    """Integers, booleans and strings were zeros (false, empty) in both requests of the check, and
    a float model that sorted rows in descending order passed as the random rows happened to fall:
    an integer table, a running sum and that sort were kept batched, and clients got each other's rows."""
    nodes = {
        "gather": helper.make_node("Gather", ["x", "idx"], ["y"], axis=0),
        "cumsum": helper.make_node("CumSum", ["x", "axis"], ["y"]),
    }
    if kind == "sort":
        graph = helper.make_graph(
            [  # whole rows, largest first value first: y = x[argsort(-x[:, 0])]
                helper.make_node("Shape", ["x"], ["shape"]),
                helper.make_node("Slice", ["shape", "zero", "one"], ["k"]),
                helper.make_node("Slice", ["x", "zero", "one", "one"], ["first"]),
                helper.make_node("Reshape", ["first", "flat"], ["keys"]),
                helper.make_node("TopK", ["keys", "k"], ["largest", "order"], largest=1),
                helper.make_node("Gather", ["x", "order"], ["y"], axis=0),
            ],
            "sort",
            [helper.make_tensor_value_info("x", element, ["N", 3])],
            [helper.make_tensor_value_info("y", element, ["N", 3])],
            [
                helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
                helper.make_tensor("one", TensorProto.INT64, [1], [1]),
                helper.make_tensor("flat", TensorProto.INT64, [1], [-1]),
            ],
        )
        path = save_model(graph, tmp_path / "sort.onnx")
    else:
        path = mixing_model(tmp_path / f"{kind}.onnx", nodes[kind], element, kind)
    assert not _batchable(path)


async def test_one_requests_bad_input_fails_that_request_only(gateway):
    # Batched with a bad index, three good requests were refused 400 in words that carried the
    # bad request's index; each now runs alone once its batch is refused.
    before = gateway.admin("table")["stats"]["outcomes"]
    async with aiohttp.ClientSession() as session:

        async def one(index: int) -> tuple[int, int, dict]:
            body = {"inputs": [{"name": "idx", "shape": [1], "datatype": "INT64", "data": [index]}]}
            async with session.post(f"{gateway.base}/v2/models/table/infer", json=body) as response:
                return index, response.status, await response.json()

        answers = []
        for _ in range(5):
            answers += await asyncio.gather(*(one(i) for i in (1, 2, 100, 3)))
    for index, status, answer in answers:
        if index == 100:
            assert status == 400 and "failed on this input" in answer["error"], answer
        else:
            assert status == 200, answer
            assert answer["outputs"][0]["data"] == [3.0 * index, 3.0 * index + 1, 3.0 * index + 2]
    # The requests did share batches (of more than one row), and those that ran again alone say so.
    metrics = requests.get(f"{gateway.base}/metrics", timeout=10).text
    single = metric_value(metrics, "gateway_batch_size_bucket", model="table", le="1.0")
    assert metric_value(metrics, "gateway_batch_size_count", model="table") > single
    assert any(answer.get("parameters", {}).get("batch_size") == 1 for _, status, answer in answers if status == 200)
    after = gateway.admin("table")["stats"]["outcomes"]
    assert after.get("model_error", 0) - before.get("model_error", 0) == 5
    assert after.get("success", 0) - before.get("success", 0) == 15
    # Triton's statistics count each run alone as an execution of its own rows: counted as one
    # execution of the whole refused batch, they held more rows than the requests answered.
    (stats,) = requests.get(f"{gateway.base}/v2/models/table/stats", timeout=10).json()["model_stats"]
    executions = [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]]
    assert sum(size * count for size, count in executions) == stats["inference_count"], (executions, stats["inference_count"])
    assert sum(count for _, count in executions) == stats["execution_count"]


def test_a_quantized_or_random_model_keeps_its_batching(tmp_path):
    """A dynamically quantized model takes its scale from a run's whole input, so a request's
    outputs stacked are a little off its own (0.5% here): it was served one request at a time.
    A model with a random operator differs from run to run: nothing can be told, it keeps batching."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, shape, rng.standard_normal(shape).ravel().tolist())
               for i, shape in enumerate(([64, 256], [256, 10]))]  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w0"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w1"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        weights,
    )
    save_model(graph, tmp_path / "float.onnx")
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "quantized.onnx"), weight_type=QuantType.QInt8)
    assert _batchable(tmp_path / "quantized.onnx")
    noisy = helper.make_graph(
        [helper.make_node("RandomNormalLike", ["x"], ["noise"]), helper.make_node("Add", ["x", "noise"], ["y"])],
        "noisy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    assert _batchable(save_model(noisy, tmp_path / "noisy.onnx"))


async def test_a_check_that_times_out_says_so(caplog):
    """A run given up on (asyncio's TimeoutError, whose text is empty) was logged with an empty reason: "()"."""
    import logging

    from gateway.signature import ModelSignature
    from gateway.stacking_check import _checked

    x, y = ({"name": name, "datatype": "FP32", "shape": [-1, 4]} for name in ("x", "y"))
    signature = ModelSignature.from_json({"inputs": [x], "outputs": [y]})

    async def hangs(inputs):
        raise TimeoutError

    with caplog.at_level(logging.WARNING, logger="gateway"):
        assert await _checked("m", hangs, signature) is None
    assert "could not check that batching keeps each request's results (TimeoutError)" in caplog.text


def _row_reduction_model(path, op: str, datatype: int):
    """x[N, 4] of integers -> x minus the maximum (ReduceMax) or mean (ReduceMean) of its rows."""
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)]
    nodes += [helper.make_node(op, ["xf"], ["m"], axes=[0], keepdims=1), helper.make_node("Sub", ["xf", "m"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "rows",
        [helper.make_tensor_value_info("x", datatype, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return save_model(graph, path)


@pytest.mark.parametrize(("op", "datatype"), [("ReduceMax", TensorProto.INT64), ("ReduceMean", TensorProto.INT32)])
async def test_integers_reduced_over_the_rows_are_not_batched(tmp_path, op, datatype):
    """The check's integers were each request's row numbers, 0, 1 and 1, 0: a maximum or a mean
    over the rows came out the same alone and stacked, and clients of such a model got answers
    made of other clients' rows (a GPU-only model, 4 of 8 answers wrong). A lookup in a table
    still batches: each request's rows are its own whatever the indices."""
    from gateway.stacking_check import session_runner, why_stacking_changes_results_here

    path = _row_reduction_model(tmp_path / "rows.onnx", op, datatype)
    assert not _batchable(path)
    signature, _ = session_runner(path)
    assert "not the same stacked as alone" in await why_stacking_changes_results_here("rows", path, signature, 10.0)
    assert _batchable(table_model(tmp_path / "table.onnx"))
    # A table of two rows: the second round's indices (0 and 0) reach it too, and its rows are each request's own.
    assert _batchable(table_model(tmp_path / "small_table.onnx", rows=2))


def test_rows_mixed_under_an_offset_or_through_a_small_table_are_not_batched(tmp_path):
    """Two models the check passed, whose pipelines' clients then read each other's rows:
    x - mean(x, axis=0) + 100, where another request's rows moved each value by 0.05% of the
    output's norm (within the 5% a quantized model needs); and the rows of a two-row table,
    table[idx] - max(table[idx], axis=0), whose second round (indices 2 and 3) the table refused."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
            helper.make_node("Sub", ["x", "m"], ["d"]),
            helper.make_node("Add", ["d", "hundred"], ["y"]),
        ],
        "offset_mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor("hundred", TensorProto.FLOAT, [], [100.0])],
    )
    assert not _batchable(save_model(graph, tmp_path / "offset_mean.onnx"))
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "idx"], ["t"], axis=0),
            helper.make_node("ReduceMax", ["t"], ["m"], axes=[0], keepdims=1),
            helper.make_node("Sub", ["t", "m"], ["y"]),
        ],
        "table_max",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["N", 3])],
        [helper.make_tensor("table", TensorProto.INT64, [2, 3], [1, 2, 3, 10, 20, 30])],
    )
    assert not _batchable(save_model(graph, tmp_path / "table_max.onnx"))


def test_an_output_with_nans_is_still_checked():
    """NaN never equals itself: a model answering NaN anywhere seemed to differ from run to run,
    and whether batching kept its results was never checked."""
    from executors.same_results import why_not_same

    alone = np.array([[1.0, np.nan], [np.inf, 2.0]], np.float32)
    assert why_not_same("y", alone, alone.copy(), "first request", "again") is None
    mixed = alone.copy()
    mixed[0, 0] = 5.0
    assert "not the same stacked" in why_not_same("y", alone, mixed, "first request", "stacked")
