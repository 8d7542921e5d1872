"""Batching never changes a result: no batch dimension, no batching; mixed trailing shapes, no mixing."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from tests.helpers import fixed_shape_model, rowsum_model, run_gateway, write_config


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batching")
    fixed_shape_model(folder / "fixed.onnx")
    rowsum_model(folder / "rowsum.onnx")
    config = write_config(
        folder / "config.toml",
        {
            "fixed": {"path": "fixed.onnx", "sla_ms": 100, "max_batch_size": 16},
            "rowsum": {"path": "rowsum.onnx", "sla_ms": 100, "max_batch_size": 16},
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
