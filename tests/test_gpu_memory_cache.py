"""GPU memory as a cache of models (Clockwork Section 4; schedulers/gpu_memory.py): the pure LRU
decision, the dispatch core's LOADs counted into a batch's end and into admission, and a
gateway whose emulated GPU holds two of three models, LOADing and UNLOADing as LRU says."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time

import numpy as np
import onnxruntime as ort
import pytest
import requests

from schedulers.dispatch import GPU, DispatchCore, Fail, Start
from schedulers.gpu import GpuScheduler
from schedulers.gpu_memory import GpuMemory, ModelFootprint, ModelTooLarge
from schedulers.profiles import LatencyProfile
from schedulers.request import Request
from schedulers.round_robin import RandomRoundRobin
from tests.helpers import metric_value, run_gateway


def memory(capacity_mb: float = 100.0) -> GpuMemory:
    sizes = {"a": ModelFootprint(40, 10), "b": ModelFootprint(40, 20), "c": ModelFootprint(40, 30), "big": ModelFootprint(150, 5)}
    cache = GpuMemory(capacity_mb, sizes)
    cache.add_gpu("gpu-0")
    return cache


def test_a_model_that_fits_is_loaded_and_the_least_recently_used_evicted():
    cache = memory()
    for model in ("a", "b"):
        load = cache.plan("gpu-0", model)
        assert load is not None and load.evict == ()
        cache.commit(load)
    assert cache.plan("gpu-0", "a") is None  # held: no LOAD
    cache.used("gpu-0", "a")  # a used after b: b is now the least recently used
    load = cache.plan("gpu-0", "c")
    assert load is not None and load.evict == ("b",) and load.load_ms == 30
    cache.commit(load)
    assert list(cache.held["gpu-0"]) == ["a", "c"] and cache.used_mb("gpu-0") == 80
    with pytest.raises(ModelTooLarge, match="150 MB of GPU memory, over the 100 MB"):
        cache.plan("gpu-0", "big")
    cache.forget("gpu-0")
    assert not cache.held_anywhere("a")


def cached_core() -> DispatchCore:
    cache = memory()
    core = DispatchCore(
        cpu_scheduler=RandomRoundRobin(random.Random(1)), gpu_scheduler=GpuScheduler("work_conserving"), gpu_memory=cache
    )
    core.add_executor("gpu-0", GPU)
    for model in "abc":
        core.add_model(model, sla_ms=1000.0, max_batch=4, max_queue_size=10, drop_late=True, gpu_profile=LatencyProfile(1.0, 5.0))
    core.set_executor_ready("gpu-0", True, 0.0)
    return core


def test_the_core_loads_on_demand_and_counts_the_load_into_the_batch():
    core, now, loads = cached_core(), 0.0, []
    for i, model in enumerate("abcab"):
        (start,) = [a for a in core.on_arrival(Request(i, model, now), now) if isinstance(a, Start)]
        batch = start.batch
        loads.append((batch.model, batch.load.evict if batch.load else None))
        load_s = batch.load.load_ms / 1000 if batch.load else 0.0
        assert batch.expected_end == pytest.approx(now + load_s + 0.006)  # LOAD, then l(1) = 6 ms
        now = batch.expected_end
        core.on_batch_done(batch, 6.0, now)
    # a, b loaded; c evicts a (least recently used); a evicts b; b evicts c.
    assert loads == [("a", ()), ("b", ()), ("c", ("a",)), ("a", ("b",)), ("b", ("c",))]


def test_a_deadline_that_cannot_absorb_the_load_is_refused_at_admission():
    core = cached_core()
    # c is held by no GPU: its LOAD takes 30 ms, l(1) 6 ms; a client timeout of 20 ms cannot wait for it.
    (fail,) = [a for a in core.on_arrival(Request(1, "c", 0.0, timeout_s=0.020), 0.0) if isinstance(a, Fail)]
    assert fail.status == 503 and "36.0 ms" in fail.message and "loading the model first (30 ms)" in fail.message
    # 50 ms can: admitted, and started with its LOAD.
    (start,) = [a for a in core.on_arrival(Request(2, "c", 0.0, timeout_s=0.050), 0.0) if isinstance(a, Start)]
    assert start.batch.load is not None and start.batch.latest_start == pytest.approx(0.050 - 0.006 - 0.030)


# -- served ----------------------------------------------------------------------------------------
MODELS = {"mlp": [1, 512], "cnn_small": [1, 3, 32, 32], "cnn_large": [1, 3, 64, 64]}
# Each model 40 MB on a GPU of 100 MB: two fit. Loads of 40-60 ms; l(b) a few ms.
PROFILE = "model,alpha_ms,beta_ms,memory_mb,load_ms\nmlp,0.2,2.0,40,40\ncnn_small,0.2,2.0,40,50\ncnn_large,0.2,3.0,40,60\n"


@pytest.fixture(scope="module")
def cached_gateway(tmp_path_factory, example_models):
    folder = tmp_path_factory.mktemp("gpu-cache")
    tables = []
    for model in MODELS:
        shutil.copy(example_models / f"{model}.onnx", folder / f"{model}.onnx")
        tables.append(
            f'[models.{model}]\npath = "{model}.onnx"\nsla_ms = 500\nmax_batch_size = 4\ndrop_late = true\ncpu_executor = false\n'
        )
    (folder / "gpu.csv").write_text(PROFILE)
    (folder / "config.toml").write_text(
        '[node]\ncpu_cores = 1.0\ngpus = [0]\n\n[gpu]\nexecutor = "emulated"\nprofile = "gpu.csv"\nmemory_mb = 100\n\n'
        + "\n".join(tables)
    )
    with run_gateway(folder / "config.toml") as gateway:
        yield gateway


def infer(gateway, model: str, array: np.ndarray, timeout_us: int | None = None) -> requests.Response:
    body = {"inputs": [{"name": "x", "shape": list(array.shape), "datatype": "FP32", "data": array.ravel().tolist()}]}
    if timeout_us is not None:
        body["parameters"] = {"timeout": timeout_us}
    return requests.post(f"{gateway.base}/v2/models/{model}/infer", json=body, timeout=30)


def test_the_gpu_loads_and_unloads_as_lru_says_and_every_answer_is_right(cached_gateway, example_models):
    rng = np.random.default_rng(3)
    sessions = {m: ort.InferenceSession(str(example_models / f"{m}.onnx")) for m in MODELS}
    order = ["mlp", "cnn_small", "cnn_large"] * 2
    for model in order:  # one at a time: each a batch of its own
        array = rng.random(MODELS[model], dtype=np.float32)
        response = infer(cached_gateway, model, array)
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        expected = sessions[model].run(None, {"x": array})[0]
        np.testing.assert_allclose(np.array(output["data"]).reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)
    metrics = requests.get(f"{cached_gateway.base}/metrics", timeout=10).text
    # Two fit: every request after the second evicts the least recently used (the one two back).
    loads = {m: metric_value(metrics, "gateway_gpu_model_loads_total", gpu="gpu-0", model=m) for m in MODELS}
    unloads = {m: metric_value(metrics, "gateway_gpu_model_unloads_total", gpu="gpu-0", model=m) for m in MODELS}
    assert loads == {"mlp": 2, "cnn_small": 2, "cnn_large": 2}
    assert unloads == {"mlp": 2, "cnn_small": 1, "cnn_large": 1}
    # Each of those batches loaded its model first (60 ms for cnn_large): no part of the batch in
    # Triton's statistics, where it was counted as compute_output.
    (stats,) = requests.get(f"{cached_gateway.base}/v2/models/cnn_large/stats", timeout=10).json()["model_stats"]
    output = stats["inference_stats"]["compute_output"]
    assert output["count"] == 2 and output["ns"] / output["count"] < 30e6, output
    # Now cnn_small and cnn_large are held. mlp's LOAD takes 40 ms: a client timeout of 20 ms
    # cannot absorb it, and is refused at admission with the reason.
    refused = infer(cached_gateway, "mlp", rng.random(MODELS["mlp"], dtype=np.float32), timeout_us=20_000)
    assert refused.status_code == 503 and "loading the model first (40 ms)" in refused.json()["error"]
    held = infer(cached_gateway, "cnn_large", rng.random(MODELS["cnn_large"], dtype=np.float32), timeout_us=20_000)
    assert held.status_code == 200  # a held model needs no LOAD: the same timeout is met


def test_a_load_longer_than_the_hang_timeout_is_no_hang_and_a_gpu_lost_is_counted(tmp_path, example_models):
    """A batch that loads its model first waited the hang timeout alone: a 2.5 s load on a 2 s
    timeout had the GPU killed as hung at every try. A GPU executor that went down lost what it
    held (counted unloaded) and its restart is counted, as a CPU executor's is."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    (tmp_path / "gpu.csv").write_text("model,alpha_ms,beta_ms,memory_mb,load_ms\nmlp,0.2,2.0,40,2500\n")
    (tmp_path / "config.toml").write_text(
        '[node]\ncpu_cores = 1.0\ngpus = [0]\n\n[gpu]\nexecutor = "emulated"\nprofile = "gpu.csv"\nmemory_mb = 100\n\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 100\nhang_timeout_ms = 2000\ncpu_executor = false\n'
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        response = infer(gateway, "mlp", np.zeros((1, 512), np.float32))
        assert response.status_code == 200, response.text
        (executor,) = gateway.admin("mlp")["executors"]
        assert executor["id"] == "gpu-0" and executor["restarts"] == 0
        metrics = gateway.metrics()
        assert metric_value(metrics, "gateway_gpu_model_loads_total", gpu="gpu-0", model="mlp") == 1
        assert metric_value(metrics, "gateway_executor_restarts_total", executor="gpu-0", model="") == 0
        os.kill(executor["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while gateway.admin("mlp")["executors"][0]["restarts"] == 0 or gateway.admin("mlp")["executors"][0]["state"] != "ready":
            assert time.monotonic() < deadline, "the GPU executor was not back"
            time.sleep(0.1)
        metrics = gateway.metrics()
        assert metric_value(metrics, "gateway_executor_restarts_total", executor="gpu-0", model="") == 1
        assert metric_value(metrics, "gateway_gpu_model_unloads_total", gpu="gpu-0", model="mlp") == 1


def test_the_start_leaves_a_gpu_holding_nothing_the_core_does_not_count(tmp_path, example_models):
    """The check that stacking keeps results ran a GPU-only model on its GPU at start, which
    opened the model there behind the dispatch core's back: the first request's counted LOAD
    (1 s here) was never waited for, and a GPU of memory_mb held every model. It runs in the
    gateway's process instead, and the first request waits for its LOAD."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    (tmp_path / "gpu.csv").write_text("model,alpha_ms,beta_ms,memory_mb,load_ms\nmlp,0.2,2.0,40,1000\n")
    (tmp_path / "config.toml").write_text(
        '[node]\ncpu_cores = 1.0\ngpus = [0]\n\n[gpu]\nexecutor = "emulated"\nprofile = "gpu.csv"\nmemory_mb = 100\n\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 5000\nmax_batch_size = 4\ncpu_executor = false\n'
    )
    array = np.zeros(MODELS["mlp"], np.float32)
    with run_gateway(tmp_path / "config.toml") as gateway:
        began = time.monotonic()
        assert infer(gateway, "mlp", array).status_code == 200
        assert time.monotonic() - began >= 1.0  # the LOAD, waited for: the GPU did not hold the model
        assert gateway.admin("mlp")["max_batch_size"] == 4  # checked all the same, and batched


def test_a_request_the_busy_gpu_holding_its_model_can_finish_in_time_waits_for_it():
    """Refused 503 "no GPU holds the model" by the idle GPU that would have had to LOAD it, while
    the GPU that held it was busy and would have finished it in time."""
    cache = memory()
    cache.add_gpu("gpu-1")
    core = DispatchCore(
        cpu_scheduler=RandomRoundRobin(random.Random(1)), gpu_scheduler=GpuScheduler("work_conserving"), gpu_memory=cache
    )
    for gpu in ("gpu-0", "gpu-1"):
        core.add_executor(gpu, GPU)
    core.add_model("a", sla_ms=1000.0, max_batch=1, max_queue_size=10, drop_late=True, gpu_profile=LatencyProfile(1.0, 5.0))
    for gpu in ("gpu-0", "gpu-1"):
        core.set_executor_ready(gpu, True, 0.0)
    (first,) = [a for a in core.on_arrival(Request(1, "a", 0.0), 0.0) if isinstance(a, Start)]
    core.on_batch_done(first.batch, 6.0, first.batch.expected_end)  # its GPU holds a now (LOAD 10 ms, l(1) 6 ms)
    holder = first.batch.executor
    (second,) = [a for a in core.on_arrival(Request(2, "a", 0.020), 0.020) if isinstance(a, Start)]
    assert second.batch.executor == holder and second.batch.load is None  # busy until 26 ms
    # Due by 33 ms: a LOAD on the idle GPU ends at 37 ms, the holder at 32 ms.
    actions = core.on_arrival(Request(3, "a", 0.021, timeout_s=0.012), 0.021)
    assert not [a for a in actions if isinstance(a, Fail)], actions
    (third,) = [a for a in core.on_batch_done(second.batch, 6.0, 0.026) if isinstance(a, Start)]
    assert third.batch.executor == holder and third.batch.load is None and [r.id for r in third.batch.requests] == [3]
