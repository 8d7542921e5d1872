"""`gateway plan` on the OCR pipeline: each model step measured on a sample image's real step
inputs, planned under the pipeline's SLA, written into the config, and the planned config served."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from PIL import Image

from gateway.config import load_config
from tests.helpers import EXAMPLES, ROOT, run_gateway
from tests.test_ocr_pipeline import render


@pytest.fixture
def ocr_copy(tmp_path, example_models):
    shutil.copytree(example_models, tmp_path / "models")
    shutil.copy(EXAMPLES / "ocr.py", tmp_path / "ocr.py")
    shutil.copy(EXAMPLES / "ocr.toml", tmp_path / "ocr.toml")
    Image.fromarray(render(["Plans have", "budgets"])).save(tmp_path / "sample.png")
    return tmp_path


def plan(folder, *extra: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "plan",
            str(folder / "ocr.toml"),
            "--rate",
            "2",
            "--sample",
            str(folder / "sample.png"),
        ]
        + ["--json", *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("policy", ["ours", "fa2", "harpagon", "even"])
def test_every_policy_plans_the_models_within_the_sla(ocr_copy, policy):
    result = plan(ocr_copy, "--policy", policy)
    assert {row["model"] for row in result["steps"]} == {"ppocr_det", "ppocr_cls", "ppocr_rec"}
    # The models' own paths, entry to exit, each within the pipeline's SLA.
    assert sorted(tuple(p["steps"]) for p in result["paths"]) == [("detect", "classify", "recognize"), ("detect", "recognize")]
    assert all(p["worst_case_ms"] <= p["sla_ms"] for p in result["paths"])
    assert result["cost"] == pytest.approx(sum(row["cost"] for row in result["steps"]))


def test_the_plan_is_written_into_the_config_and_served(ocr_copy):
    before = (ocr_copy / "ocr.toml").read_text()
    result = plan(ocr_copy, "--apply")
    after = (ocr_copy / "ocr.toml").read_text()
    assert after != before and "# The PP-OCRv4 pipeline" in after  # comments kept
    models = tomllib.loads(after)["models"]
    config = load_config(ocr_copy / "ocr.toml")
    for row in result["steps"]:
        table, model = models[row["model"]], config.models[row["model"]]
        assert table["sla_ms"] == pytest.approx(row["worst_case_ms"], abs=0.1)
        assert model.dispatch_batch == row["batch"] <= model.max_batch_size
        cores = float(row["device"].split(":")[1]) * row["instances"]
        assert model.cpu is not None and model.cpu.cores == pytest.approx(cores)
    with run_gateway(ocr_copy / "ocr.toml") as gateway:
        image = render(["Served as", "planned"])
        tensor = triton.InferInput("image", list(image.shape), "UINT8")
        tensor.set_data_from_numpy(image)
        texts = triton.InferenceServerClient(gateway.url, network_timeout=120).infer("ocr", [tensor]).as_numpy("text")
        assert [t.decode().replace(" ", "") for t in texts] == ["Servedas", "planned"]
        assert gateway.admin("ppocr_rec")["sla_ms"] == pytest.approx(models["ppocr_rec"]["sla_ms"])
    assert np.isfinite(result["planner_ms"])


def test_the_plan_is_set_on_a_running_gateway_through_the_admin_api(ocr_copy):
    with run_gateway(ocr_copy / "ocr.toml") as gateway:
        result = plan(ocr_copy, "--apply-to", gateway.base)
        for row in result["steps"]:
            described = gateway.admin(row["model"])
            assert described["sla_ms"] == pytest.approx(row["worst_case_ms"], abs=0.1)
            assert described["pinned_cores"] == pytest.approx(float(row["device"].split(":")[1]) * row["instances"])
            assert described["dispatch_batch"] == row["batch"]
        # And it serves as set.
        image = render(["Set at", "run time"])
        tensor = triton.InferInput("image", list(image.shape), "UINT8")
        tensor.set_data_from_numpy(image)
        texts = triton.InferenceServerClient(gateway.url, network_timeout=120).infer("ocr", [tensor]).as_numpy("text")
        assert [t.decode().replace(" ", "") for t in texts] == ["Setat", "runtime"]
        # A planned batch over what the model was started with is refused before anything is set.
        put = requests.put(f"{gateway.base}/admin/models/ppocr_det/dispatch_batch", json={"dispatch_batch": 2}, timeout=10)
        assert put.status_code == 400 and "max_batch_size" in put.json()["error"]
        put = requests.put(f"{gateway.base}/admin/models/ppocr_rec/dispatch_batch", json={"dispatch_batch": "4"}, timeout=10)
        assert put.status_code == 400 and "dispatch_batch" in put.json()["error"]
