"""Every name the config allows is served: one that begins with "-", and names of letters outside
ASCII up to the 64 characters allowed, whose executor's socket, groups and container are named
after it (executors/names.py)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import numpy as np
import requests

from executors.names import safe_name
from tests.helpers import run_gateway

# "-x" was read by the executor's command line as an option; 30 CJK letters (90 bytes) overflowed
# the socket's path (107 bytes) with a traceback at start; 64 letters of 4 bytes each overflowed a
# file name (255 bytes), the executor's group.
NAMES = ["-x", "模" * 30, "\U0001d400" * 64]


def test_names_the_config_allows_are_served(tmp_models: Path):
    table = "path = 'mlp.onnx'\nsla_ms = 500\ncpu = { cores = 0.3 }\n"
    tables = "".join(f"[models.{json.dumps(name, ensure_ascii=False)}]\n{table}" for name in NAMES)
    config = tmp_models / "config.toml"
    config.write_text(f"[node]\ncpu_cores = 1\n[control]\npolicy = 'fixed'\n{tables}")
    x = np.random.default_rng(0).standard_normal((2, 512)).astype(np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 512], "data": x.ravel().tolist()}]}
    with run_gateway(config) as gateway:
        for name in NAMES:
            url = f"{gateway.base}/v2/models/{urllib.parse.quote(name, safe='')}/infer"
            answer = requests.post(url, json=body, timeout=30)
            assert answer.status_code == 200, (name, answer.text)
            assert answer.json()["model_name"] == name
            assert answer.json()["outputs"][0]["shape"][0] == 2


def test_an_executors_names_fit_and_stay_apart():
    ids = [f"cpu-{name}" for name in NAMES] + ["cpu-mlp", "gpu-0", "cpu-" + "a" * 64, "cpu-模", "cpu-模模"]
    names = [safe_name(i) for i in ids]
    assert len(set(names)) == len(names)
    assert safe_name("cpu-mlp") == "cpu-mlp" and safe_name("gpu-0") == "gpu-0"  # short ASCII ids stay as they are
    for name in names:
        assert len(name.encode()) <= 72 and name.isascii() and name[0].isalnum(), name
