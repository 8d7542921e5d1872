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


def assert_planned_sla(sla_ms: float, worst_case_ms: float) -> None:
    """The SLA is the step's latency rounded up to 0.1 ms; the reported worst case is the same
    latency rounded to 0.01 ms, so the two are at most 0.1 + 0.005 ms apart, the SLA never under."""
    assert worst_case_ms - 0.005 - 1e-9 <= sla_ms <= worst_case_ms + 0.105 + 1e-9
    assert sla_ms == pytest.approx(round(sla_ms, 1))


def run_plan(folder, *extra: str, sample: str = "sample.png") -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "plan",
            str(folder / "ocr.toml"),
            "--rate",
            "2",
            "--sample",
            str(folder / sample),
        ]
        + ["--json", *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def plan(folder, *extra: str, sample: str = "sample.png") -> dict:
    done = run_plan(folder, *extra, sample=sample)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def edit_config(folder, *replacements: tuple[str, str]) -> str:
    """The OCR config with each (old, new) replaced once; returns the text written."""
    text = (folder / "ocr.toml").read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    (folder / "ocr.toml").write_text(text)
    return text


def refused_in_one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stderr.strip().splitlines()[-1]


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
    # The controller's ceiling stays the node's: none is added where the file had none.
    assert not any("max_cores" in table.get("cpu", {}) for table in models.values())
    for row in result["steps"]:
        table, model = models[row["model"]], config.models[row["model"]]
        assert_planned_sla(table["sla_ms"], row["worst_case_ms"])
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
            assert_planned_sla(described["sla_ms"], row["worst_case_ms"])
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


def test_a_plan_that_gives_a_model_more_cores_than_the_node_is_not_written(ocr_copy):
    # Instances of 2 cores on a node of 1.5: every model is planned at least 2 cores.
    before = edit_config(ocr_copy, ("cpu_cores = 2", "cpu_cores = 1.5"))
    done = run_plan(ocr_copy, "--cores", "2", "--apply")
    said = refused_in_one_line(done)
    assert said == "gateway plan: model 'ppocr_det' is planned 2 cores, over the node's 1.5 (node.cpu_cores): nothing written"
    assert "cannot hold 2 requests/s" in done.stderr  # and together they are over the node too
    assert (ocr_copy / "ocr.toml").read_text() == before


def test_the_written_plan_loads_whatever_the_models_cores_bounds(ocr_copy):
    """Instances of 0.5 core at 2 requests/s: the classifier's plan is under its min_cores (written
    as its min_cores), the recognizer's over its max_cores (raised to the plan)."""
    edit_config(
        ocr_copy,
        ("cpu = { cores = 0.5, threads = 1 }", "cpu = { cores = 1.5, threads = 2, min_cores = 1.5 }"),
        ("cpu = { cores = 0.5, threads = 1 }", "cpu = { cores = 0.25, threads = 1, max_cores = 0.25 }"),
    )
    done = run_plan(ocr_copy, "--cores", "0.5", "--apply")
    assert done.returncode == 0, done.stderr[-2000:]
    planned = {row["model"]: 0.5 * row["instances"] for row in json.loads(done.stdout)["steps"]}
    assert planned["ppocr_cls"] < 1.5 and planned["ppocr_rec"] > 0.25
    assert f"model 'ppocr_cls': cores 1.5, its min_cores, rather than the planned {planned['ppocr_cls']:g}" in done.stderr
    config = load_config(ocr_copy / "ocr.toml")  # the loader takes what was written
    classifier, recognizer = config.models["ppocr_cls"].cpu, config.models["ppocr_rec"].cpu
    assert classifier is not None and (classifier.cores, classifier.min_cores) == (1.5, 1.5)
    assert recognizer is not None and recognizer.cores == recognizer.max_cores == pytest.approx(planned["ppocr_rec"])


def test_a_plan_over_the_running_gateways_cores_is_refused_before_anything_is_set(ocr_copy):
    edit_config(ocr_copy, ("cpu_cores = 2", "cpu_cores = 1.5"))
    models = ("ppocr_det", "ppocr_cls", "ppocr_rec")
    with run_gateway(ocr_copy / "ocr.toml") as gateway:
        before = [gateway.admin(m) for m in models]
        said = refused_in_one_line(run_plan(ocr_copy, "--cores", "2", "--apply-to", gateway.base))
        assert said == "gateway plan: model 'ppocr_det' is planned 2 cores, over the node's 1.5 (node.cpu_cores): nothing set"
        after = [gateway.admin(m) for m in models]
        for was, now in zip(before, after, strict=True):
            assert (now["sla_ms"], now["pinned_cores"], now["dispatch_batch"]) == (
                was["sla_ms"],
                was["pinned_cores"],
                was["dispatch_batch"],
            )


def test_a_sample_with_no_text_plans_the_steps_it_reaches(ocr_copy):
    """The served pipeline skips a model step of no rows (no text found): so does the measuring."""
    Image.fromarray(np.full((64, 64, 3), 255, np.uint8)).save(ocr_copy / "blank.png")
    result = plan(ocr_copy, sample="blank.png")
    assert [row["step"] for row in result["steps"]] == ["detect"]
    assert result["not_planned"] == ["classify", "recognize"]


def test_a_sample_the_pipeline_would_refuse_is_one_line_naming_it(ocr_copy):
    image = np.full((64, 64, 3), 255, np.uint8)
    np.savez(ocr_copy / "wrong_key.npz", picture=image)
    np.savez(ocr_copy / "floats.npz", image=image.astype(np.float32))
    (ocr_copy / "text.png").write_text("not an image")
    for sample, words in [
        ("wrong_key.npz", "it holds 'picture', the pipeline's inputs are 'image'"),
        ("floats.npz", "'image' is float32, the pipeline declares UINT8"),
        ("text.png", "not an image (nor a .npz of the inputs)"),
    ]:
        said = refused_in_one_line(run_plan(ocr_copy, sample=sample))
        assert said.startswith(f"gateway plan: --sample {ocr_copy / sample}: {words}"), said


def test_a_model_of_several_steps_is_planned_the_cores_of_each_and_the_tightest_sla():
    """Two steps on one model: the plan priced 2 x 0.5 cores, and --apply wrote the last step's
    0.5 cores, SLA and batch; a step planned at 0.03 ms was written sla_ms = 0.0, which no
    config loads."""
    from types import SimpleNamespace

    from gateway.tools.plan import planned_cores, planned_models

    choices = {
        "s1": SimpleNamespace(device="cpu:0.5", instances=1, batch=4, latency_s=0.0123),
        "s2": SimpleNamespace(device="cpu:0.5", instances=2, batch=2, latency_s=0.030),
        "tiny": SimpleNamespace(device="cpu:1", instances=1, batch=1, latency_s=0.00003),
    }
    steps = {"s1": "mlp", "s2": "mlp", "tiny": "ident"}
    assert planned_cores(steps, choices) == {"mlp": 1.5, "ident": 1.0}
    assert planned_models(steps, choices) == {"mlp": (12.3, 2), "ident": (0.1, 1)}
