"""Models at the edges of what ONNX allows: a scalar (rank-0) input is served on the emulated GPU
as on the CPU; a model no KServe client could use (no inputs, a bfloat16 tensor) stops the
gateway's start with its reason, where it used to start ready and fail every request."""

from __future__ import annotations

import subprocess
import sys

import requests
from onnx import TensorProto, helper

from tests.helpers import ROOT, run_gateway, save_model


def _identity(path, element_type: int, shape: list) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", element_type, shape)],
        [helper.make_tensor_value_info("y", element_type, shape)],
    )
    save_model(graph, path)


def test_a_scalar_input_is_served_on_the_emulated_gpu_and_the_cpu(tmp_path):
    _identity(tmp_path / "scalar.onnx", TensorProto.FLOAT, [])
    (tmp_path / "gpu.csv").write_text("model,alpha_ms,beta_ms\nscalar,0.1,1\n")
    (tmp_path / "config.toml").write_text(
        '[node]\ncpu_cores = 1.0\ngpus = [0]\n[gpu]\nexecutor = "emulated"\nprofile = "gpu.csv"\n'
        '[models.on_gpu]\npath = "scalar.onnx"\nsla_ms = 100\ngpu_profile = "scalar"\ncpu_executor = false\n'
        '[models.on_cpu]\npath = "scalar.onnx"\nsla_ms = 100\ngpu_profile = "scalar"\ncpu = { cores = 0.3, threads = 1 }\n'
    )
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [], "data": [2.5]}]}
    with run_gateway(tmp_path / "config.toml") as gateway:
        for model in ("on_gpu", "on_cpu"):
            response = requests.post(f"{gateway.base}/v2/models/{model}/infer", json=body, timeout=10)
            assert response.status_code == 200, response.text
            (output,) = response.json()["outputs"]
            assert output["shape"] == [] and output["data"] == [2.5]


def _start(tmp_path, model_file: str) -> subprocess.CompletedProcess:
    (tmp_path / "config.toml").write_text(f'[models.odd]\npath = "{model_file}"\nsla_ms = 100\ncpu = {{ cores = 0.3 }}\n')
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(tmp_path / "config.toml"), "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_model_with_a_type_kserve_cannot_carry_stops_the_start(tmp_path):
    _identity(tmp_path / "bf16.onnx", TensorProto.BFLOAT16, ["N", 2])
    done = _start(tmp_path, "bf16.onnx")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gateway: model 'odd' cannot be served: input 'x' is tensor(bfloat16), a type the KServe v2 protocol" in done.stderr


def test_a_model_without_inputs_stops_the_start(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0]))],
        "constant",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    save_model(graph, tmp_path / "constant.onnx")
    done = _start(tmp_path, "constant.onnx")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gateway: model 'odd' cannot be served: it has no inputs" in done.stderr
