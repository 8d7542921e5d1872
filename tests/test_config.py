"""Config errors name the file, the key and the problem, and stop `gateway serve` before it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.config import ConfigError, load_config
from tests.helpers import ROOT


def _write(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_example_config_loads(example_models):
    config = load_config(ROOT / "examples" / "config.toml")
    assert set(config.models) == {"mlp", "cnn_small", "cnn_large", "ppocr_det"}
    assert config.models["mlp"].sla_ms == 20 and config.models["mlp"].cpu.cores == 1.0
    assert config.server.host == "127.0.0.1"


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[models.m]\npath = 'mlp.onnx'\n", "models.m.sla_ms", "is required"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = -3\n", "models.m.sla_ms", "positive"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 'fast'\n", "models.m.sla_ms", "must be a number"),
        ("[models.m]\npath = 'missing.onnx'\nsla_ms = 10\n", "models.m.path", "no ONNX file"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\nmax_batch = 4\n", "models.m.max_batch", "unknown key"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu = { cores = 0 }\n", "models.m.cpu.cores", "positive"),
        ("[server]\nport = 70000\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "server.port", "0-65535"),
        ("[node]\ncpu_cores = 2\n", "models", "at least one model"),
        ("[policy]\ncpu_scheduler = 'fifo'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "policy.cpu_scheduler", "unknown"),
        ("[models.m\n", "(syntax)", ""),
    ],
)
def test_config_errors_name_file_and_key(tmp_models, text, key, words):
    path = _write(tmp_models, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}:")
    assert words in message


def test_serve_exits_nonzero_on_config_error(tmp_models):
    path = _write(tmp_models, "[models.m]\npath = 'mlp.onnx'\nsla_ms = 'soon'\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode != 0
    assert f"{path}: models.m.sla_ms: must be a number" in done.stderr


def test_serve_exits_nonzero_when_a_model_does_not_load(tmp_path):
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx file")
    path = _write(tmp_path, "[models.broken]\npath = 'broken.onnx'\nsla_ms = 10\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 1
    assert "executor cpu-broken failed to start" in done.stderr
