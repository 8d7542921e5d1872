"""Build the example model zoo into examples/models/ (run once at set-up; nothing is fetched while serving).

- mlp: x[N,512] -> MatMul 512x512 -> Relu -> MatMul 512x512 (the model of ../shared/PEERS.md)
- cnn_small: x[N,3,32,32] -> two convolutions -> global average pool -> 10 logits
- cnn_large: x[N,3,64,64] -> three wider convolutions -> global average pool -> 100 logits
- upconv_s/m/l/xl: x[N,1,8,8] upsampled to 64x64, then 3-5 convolutions: compute-bound models
  with tiny inputs (milliseconds of CPU per request), the stand-ins of ROMA's experiment
- ppocr_det, ppocr_cls, ppocr_rec: the PP-OCRv4 text detector, the angle classifier and the
  PP-OCRv4 recognizer shipped in the rapidocr-onnxruntime 1.4.4 wheel, read out of the wheel (a
  zip) fetched with ``pip download --no-deps``, and ppocr_keys.txt, the recognizer's character
  list, read out of its metadata; the package itself is never installed, since it would replace
  onnxruntime-gpu's ``onnxruntime`` module with the CPU one. examples/ocr.py has the steps
  between them ([pipelines.ocr] in examples/config.toml).

Weights are seeded random numbers: the zoo exists to be served and measured, not to be accurate.
ONNX files are saved with IR version 9, the newest that onnxruntime 1.31 accepts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
IR_VERSION = 9
OPSET = 17
OCR_WHEEL = "rapidocr-onnxruntime==1.4.4"
OCR_MEMBERS = {
    "ppocr_det.onnx": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "ppocr_cls.onnx": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "ppocr_rec.onnx": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
}
OCR_CHARACTERS = "ppocr_keys.txt"


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def mlp(rng: np.random.Generator, width: int = 512) -> onnx.GraphProto:
    w1 = numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("MatMul", ["a", "w2"], ["y"]),
    ]
    return helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        [w1, w2],
    )


def cnn(rng: np.random.Generator, name: str, size: int, channels: list[int], classes: int) -> onnx.GraphProto:
    nodes, weights = [], []
    previous, current = 3, "x"
    for i, width in enumerate(channels):
        w = numpy_helper.from_array(
            (rng.standard_normal((width, previous, 3, 3)) * np.sqrt(2 / (previous * 9))).astype(np.float32), f"conv{i}_w"
        )
        b = numpy_helper.from_array(np.zeros(width, np.float32), f"conv{i}_b")
        weights += [w, b]
        stride = 1 if i == 0 else 2
        nodes.append(
            helper.make_node(
                "Conv", [current, w.name, b.name], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]
            )
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        previous, current = width, f"r{i}"
    fc_w = numpy_helper.from_array((rng.standard_normal((previous, classes)) / np.sqrt(previous)).astype(np.float32), "fc_w")
    fc_b = numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b")
    weights += [fc_w, fc_b]
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]),
    ]
    return helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        weights,
    )


def upconv(rng: np.random.Generator, name: str, layers: int, width: int, size: int = 64) -> onnx.GraphProto:
    """x[N,1,8,8] -> nearest upsampling to size x size -> ``layers`` 3x3 convolutions of ``width``
    channels -> y[N,1]: milliseconds of CPU per request from a 64-float input, so that a load
    generator can keep an executor busy while staying cheap itself."""
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest")]
    inits = [numpy_helper.from_array(np.array([1.0, 1.0, size / 8, size / 8], np.float32), "scales")]
    previous, current = 1, "up"
    for i in range(layers):
        w = (rng.standard_normal((width, previous, 3, 3)) * np.sqrt(2 / (previous * 9))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [current, f"w{i}"], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        previous, current = width, f"r{i}"
    nodes.append(helper.make_node("ReduceMean", [current], ["s"], axes=[1, 2, 3], keepdims=0))
    nodes.append(helper.make_node("Unsqueeze", ["s", "one"], ["y"]))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    return helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        inits,
    )


# Stand-ins for the four applications of ROMA's evaluation (Section 5), from light to heavy.
UPCONV = {"upconv_s": (3, 48), "upconv_m": (3, 64), "upconv_l": (4, 64), "upconv_xl": (5, 64)}


def fetch_ocr_models(folder: Path, cache: Path) -> None:
    """Take the PP-OCRv4 models and the character list out of the rapidocr-onnxruntime wheel (not installing it)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(cache), OCR_WHEEL], check=True
        )
        wheels = sorted(cache.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        for name, member in OCR_MEMBERS.items():
            (folder / name).write_bytes(wheel.read(member))
    recognizer = onnx.load(str(folder / "ppocr_rec.onnx"), load_external_data=False)
    characters = {p.key: p.value for p in recognizer.metadata_props}["character"]
    (folder / OCR_CHARACTERS).write_text(characters, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "models")
    parser.add_argument("--no-ocr", action="store_true", help="skip the PP-OCRv4 models (no network needed)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20201)
    _save(mlp(rng), args.out / "mlp.onnx")
    _save(cnn(rng, "cnn_small", 32, [16, 32], 10), args.out / "cnn_small.onnx")
    _save(cnn(rng, "cnn_large", 64, [32, 64, 128], 100), args.out / "cnn_large.onnx")
    for name, (layers, width) in UPCONV.items():
        _save(upconv(rng, name, layers, width), args.out / f"{name}.onnx")
    if not args.no_ocr and not all((args.out / name).exists() for name in [*OCR_MEMBERS, OCR_CHARACTERS]):
        fetch_ocr_models(args.out, HERE / ".cache")
    print(f"models in {args.out}: {', '.join(sorted(p.name for p in args.out.glob('*.onnx')))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
