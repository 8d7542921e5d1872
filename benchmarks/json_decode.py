"""The parse of one infer request's JSON body (gateway/protocol.py, parse_infer_request): what
each request of the JSON path costs the gateway's event loop before it reaches the engine.

Bodies: the example MLP's row of 512 FP32 values, flat and nested as its shape; a 3x64x64 image
nested as its shape (cnn_large's input); and PP-OCR's 1x3x320x320 image, a body over LARGE_BYTES
that is read in pieces. Prints the best of ``--repeats`` rounds, microseconds a parse.

``--against CHECKOUT`` loads that checkout's gateway/protocol.py beside this one's, in the same
process, and times the two in alternate rounds on the same bodies, so that a noisy machine's
drift falls on both alike:

    .venv/bin/python benchmarks/json_decode.py
    .venv/bin/python benchmarks/json_decode.py --against /tmp/old   # a git worktree of another commit
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

import numpy as np

import gateway.protocol
from gateway.protocol import parse_infer_request
from gateway.signature import ModelSignature, TensorSpec


def _case(shape: list[int], nested: bool) -> tuple[bytes, ModelSignature]:
    values = np.random.default_rng(0).random(int(np.prod(shape))).round(6)
    data = values.reshape(shape).tolist() if nested else values.tolist()
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}).encode()
    free = (-1, *shape[1:])
    return body, ModelSignature((TensorSpec("x", "FP32", free),), (TensorSpec("y", "FP32", free),))


CASES = {
    "mlp 1x512 flat": ([1, 512], False),
    "mlp 1x512 nested": ([1, 512], True),
    "cnn 1x3x64x64 nested": ([1, 3, 64, 64], True),
    "ppocr 1x3x320x320 nested": ([1, 3, 320, 320], True),
}


def _module_of(checkout: Path) -> Callable[..., object]:
    """Another checkout's parse_infer_request, loaded under a name of its own."""
    spec = importlib.util.spec_from_file_location("other_protocol", checkout / "gateway" / "protocol.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["other_protocol"] = module
    spec.loader.exec_module(module)
    return module.parse_infer_request


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another checkout, timed in alternate rounds")
    args = parser.parse_args()
    parsers = {"this": parse_infer_request}
    if args.against is not None:
        parsers["against"] = _module_of(args.against)
    print(f"this: {gateway.protocol.__file__}" + (f"; against: {args.against}/gateway/protocol.py" if args.against else ""))
    for name, (shape, nested) in CASES.items():
        body, signature = _case(shape, nested)
        number = max(1, int(2e5 // len(body)))
        best = dict.fromkeys(parsers, float("inf"))
        for _ in range(args.repeats):
            for which, parse in parsers.items():
                took = timeit.timeit(functools.partial(parse, body, None, signature, 8), number=number)
                best[which] = min(best[which], took / number * 1e6)
        times = "  ".join(f"{which} {us:10.1f} us" for which, us in best.items())
        ratio = f"  this/against {best['this'] / best['against']:.2f}" if "against" in best else ""
        print(f"{name:26s} {len(body):>9,d} bytes  {times}{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
