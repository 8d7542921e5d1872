"""JSON tensor data read element by element, as Triton reads it: each value of the datatype's
JSON type, every value kept (trailing NULs of a string, UINT64 above 2**63), and a mistake named
the same way in a small body and in one over LARGE_BYTES, which is read in pieces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gateway.protocol import LARGE_BYTES, InvalidRequest, parse_infer_request
from gateway.signature import ModelSignature, TensorSpec


def _signature(datatype: str, width: int = -1) -> ModelSignature:
    return ModelSignature((TensorSpec("x", datatype, (-1, width)),), (TensorSpec("y", datatype, (-1, width)),))


def _parse(datatype: str, data: object, shape: list[int]) -> np.ndarray:
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}).encode()
    return parse_infer_request(body, None, _signature(datatype), max_batch_size=8).inputs["x"]


def _refusal(datatype: str, data: object, shape: list[int]) -> str:
    with pytest.raises(InvalidRequest) as refused:
        _parse(datatype, data, shape)
    assert refused.value.status == 400
    return str(refused.value)


def test_strings_keep_their_trailing_nuls():
    got = _parse("BYTES", ["a\u0000", "\u0000\u0000", "b\u0000c"], [1, 3])
    assert got.ravel().tolist() == [b"a\x00", b"\x00\x00", b"b\x00c"]


def test_uint64_above_the_int64_range_beside_small_values():
    got = _parse("UINT64", [2**64 - 1, 1, 0], [1, 3])
    assert got.dtype == np.uint64 and got.ravel().tolist() == [2**64 - 1, 1, 0]


@pytest.mark.parametrize(
    ("datatype", "data", "held"),
    [
        ("BYTES", ["a", 1, 2.5], "integers and numbers"),
        ("INT8", [1, True, False], "booleans"),
        ("FP32", [[1.5, True], [0.0, 2.0]], "booleans"),
        ("BOOL", [True, 0, False], "integers"),
        ("INT32", [1, None, 3], "nulls"),
        ("FP32", [1.0, {"a": 1}, 3.0], "objects"),
    ],
)
def test_a_value_of_another_json_type_is_refused(datatype, data, held):
    count = 4 if datatype == "FP32" and isinstance(data[0], list) else 3
    shape = [2, 2] if count == 4 else [1, 3]
    assert _refusal(datatype, data, shape) == f"input 'x': 'data' holds {held}, which is not {datatype}"


def test_values_out_of_range_and_ragged_lists_are_refused():
    assert _refusal("UINT64", [-1, 1, 0], [1, 3]) == "input 'x': a value is outside the range of UINT64"
    assert _refusal("INT8", [300, 1, 1], [1, 3]) == "input 'x': a value is outside the range of INT8"
    assert "ragged" in _refusal("FP32", [[1.0, 2.0], [3.0]], [1, 3])
    assert "ragged" in _refusal("FP32", [[1.0, 2.0], 3.0, 4.0], [1, 4])
    assert "ragged" in _refusal("FP32", [1.0, [2.0, 3.0]], [1, 3])


def test_nested_and_flat_data_read_the_same():
    flat = _parse("FP32", [1.0, 2, 3.5, 4.0], [2, 2])
    nested = _parse("FP32", [[1.0, 2], [3.5, 4.0]], [2, 2])
    assert flat.dtype == nested.dtype == np.float32
    assert np.array_equal(flat, nested) and flat.tolist() == [[1.0, 2.0], [3.5, 4.0]]


def _large_body(datatype: str, rows: list[str], width: int) -> bytes:
    text = b'{"inputs":[{"name":"x","datatype":"%s","shape":[%d,%d],"data":[%s]}]}' % (
        datatype.encode(),
        len(rows),
        width,
        ",".join(f"[{row}]" for row in rows).encode(),
    )
    assert len(text) > LARGE_BYTES
    json.loads(text)  # valid JSON, whatever the tensor's mistake
    return text


def test_a_string_among_the_numbers_of_a_large_body_is_named_as_in_a_small_one():
    width = 200_000
    row = ",".join(["0.125"] * width)
    body = _large_body("FP32", [row, '"a",' + ",".join(["0.125"] * (width - 1))], width)
    with pytest.raises(InvalidRequest) as refused:
        parse_infer_request(body, None, _signature("FP32"), max_batch_size=8)
    assert str(refused.value) == "input 'x': 'data' holds strings, which is not FP32"


def test_a_large_body_of_uint64_keeps_every_value():
    width = 150_000
    values = [2**64 - 1, 1, 0] * (width // 3)
    body = _large_body("UINT64", [",".join(map(str, values))], width)
    got = parse_infer_request(body, None, _signature("UINT64"), max_batch_size=8).inputs["x"]
    assert got.dtype == np.uint64 and got.shape == (1, width)
    assert got[0, :6].tolist() == [2**64 - 1, 1, 0, 2**64 - 1, 1, 0] and int(got.sum(dtype=object)) == (2**64) * (width // 3)
