"""The PP-OCRv4 pipeline (examples/ocr.toml) served as one model: images with text rendered in
them through tritonclient, the text back; every step's outputs against running the same step by
hand on the same inputs; a bad image refused with the step named."""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as triton
from PIL import Image, ImageDraw, ImageFont

from tests.helpers import EXAMPLES, run_gateway

sys.path.insert(0, str(EXAMPLES))
import ocr  # noqa: E402  (examples/ocr.py: the pipeline's numpy steps)

STEPS = ("prepare", "detect", "boxes", "classify", "upright", "recognize", "decode")
MODELS = {"detect": "ppocr_det", "classify": "ppocr_cls", "recognize": "ppocr_rec"}
FUNCTIONS = {
    "prepare": ocr.detector_input,
    "boxes": ocr.text_boxes,
    "upright": ocr.recognizer_input,
    "decode": ocr.decode_text,
}


def render(lines: list[str], size: int = 40) -> np.ndarray:
    """Black text on white, in the font Pillow ships (Aileron, through FreeType)."""
    font = ImageFont.load_default(size=size)
    image = Image.new("RGB", (40 + 22 * max(map(len, lines)), 30 + 60 * len(lines)), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((20, 15 + 60 * i), line, fill="black", font=font)
    return np.asarray(image)


@pytest.fixture(scope="module")
def ocr_gateway(example_models):
    assert (example_models / "ppocr_rec.onnx").exists() and (example_models / "ppocr_keys.txt").exists()
    with run_gateway(EXAMPLES / "ocr.toml") as gateway:
        yield gateway


def _infer(gateway, image: np.ndarray, **parameters) -> triton.InferResult:
    client = triton.InferenceServerClient(gateway.url, network_timeout=120)
    tensor = triton.InferInput("image", list(image.shape), "UINT8")
    tensor.set_data_from_numpy(image)
    return client.infer("ocr", [tensor], parameters=parameters or None)


def _letters(text: bytes) -> str:
    """The text without spaces: the recognizer reads the narrow spaces of this font unevenly."""
    return text.decode().replace(" ", "")


@pytest.mark.parametrize(
    "lines",
    [["Hello World 2026"], ["SLA gateway", "PP-OCRv4 reads this"], ["ONNX Runtime", "KServe v2", "0123456789"]],
)
def test_the_text_in_an_image_comes_back(ocr_gateway, lines):
    result = _infer(ocr_gateway, render(lines))
    texts = [_letters(t) for t in result.as_numpy("text")]
    assert texts == [line.replace(" ", "") for line in lines], texts
    assert result.as_numpy("boxes").shape == (len(lines), 4)
    assert (result.as_numpy("score") > 0.8).all()
    assert result.get_response()["parameters"]["executed_on"] == "pipeline"


def test_every_step_gives_what_the_step_gives_by_hand(ocr_gateway):
    image = render(["Pipelines plan", "their budgets"])
    result = _infer(ocr_gateway, image, pipeline_steps=True)
    sessions = {step: ort.InferenceSession(str(EXAMPLES / "models" / f"{m}.onnx")) for step, m in MODELS.items()}
    config = {s["name"]: s for s in _steps()}
    got = {name: result.as_numpy(name) for name in (o["name"] for o in result.get_response()["outputs"])}
    for step in STEPS:
        # The step's inputs as the gateway fed them (the request's image, earlier steps' tensors).
        inputs = {name: image if source == "request/image" else got[source] for name, source in config[step]["inputs"].items()}
        outputs = {k: v for k, v in got.items() if k.startswith(f"{step}/")}
        assert outputs, f"no tensors of step {step}"
        if step in MODELS:
            session = sessions[step]
            by_hand = dict(zip((o.name for o in session.get_outputs()), session.run(None, inputs), strict=True))
        else:
            by_hand = FUNCTIONS[step](inputs)
        for key, array in outputs.items():
            expected = by_hand[key.split("/", 1)[1]]
            if array.dtype == np.object_:
                assert list(array) == list(expected), step
            else:
                np.testing.assert_allclose(array, expected, rtol=1e-4, atol=1e-5, err_msg=f"step {step}, {key}")
    assert [_letters(t) for t in got["decode/text"]] == ["Pipelinesplan", "theirbudgets"]


def _steps() -> list[dict]:
    import tomllib

    return tomllib.loads((EXAMPLES / "ocr.toml").read_text())["pipelines"]["ocr"]["steps"]


def test_the_pipeline_is_a_model_to_clients_and_a_bad_image_names_the_step(ocr_gateway):
    client = triton.InferenceServerClient(ocr_gateway.url)
    assert client.is_model_ready("ocr")
    metadata = client.get_model_metadata("ocr")
    assert metadata["platform"] == "ensemble"
    assert [i["name"] for i in metadata["inputs"]] == ["image"]
    assert [o["name"] for o in metadata["outputs"]] == ["text", "score", "boxes"]
    assert client.get_model_config("ocr")["max_batch_size"] == 0
    # Four channels: refused against the declared shape before any step runs.
    rgba = {"name": "image", "shape": [64, 64, 4], "datatype": "UINT8", "data": [0] * (64 * 64 * 4)}
    response = requests.post(f"{ocr_gateway.base}/v2/models/ocr/infer", json={"inputs": [rgba]}, timeout=60)
    assert response.status_code == 400 and "expects [any, any, 3]" in response.json()["error"]
    # Too small to read: the first step refuses it, and says so.
    tiny = {"name": "image", "shape": [4, 4, 3], "datatype": "UINT8", "data": [0] * 48}
    response = requests.post(f"{ocr_gateway.base}/v2/models/ocr/infer", json={"inputs": [tiny]}, timeout=60)
    assert response.status_code == 400
    assert "step 'prepare'" in response.json()["error"] and "8 to 4096 pixels" in response.json()["error"]
    # A blank image has no text: empty outputs, not an error.
    blank = _infer(ocr_gateway, np.full((64, 256, 3), 255, np.uint8))
    assert blank.as_numpy("text").shape == (0,) and blank.as_numpy("boxes").shape == (0, 4)
    # Counts add up: the pipeline's requests, and its steps' requests on their models.
    stats = requests.get(f"{ocr_gateway.base}/v2/models/ocr/stats", timeout=5).json()["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] >= 2
    det = requests.get(f"{ocr_gateway.base}/v2/models/ppocr_det/stats", timeout=5).json()["model_stats"][0]
    assert det["inference_stats"]["success"]["count"] >= stats["inference_stats"]["success"]["count"]
