"""Tensor datatypes of the KServe v2 protocol and their byte encodings.

The gateway and every executor share these codecs: the HTTP front end decodes JSON and binary
tensors with them, and the executor protocol (``executors.wire``) carries raw tensor bytes in the
same layout, so a tensor is never turned into JSON inside the system.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import numpy as np

# KServe v2 / Open Inference Protocol datatype names and the numpy dtype that holds each.
KSERVE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

# ONNX Runtime's type strings (NodeArg.type) for the same datatypes.
ONNX_TO_KSERVE: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

# Triton's model-configuration names (model_config.proto DataType) for /v2/models/{m}/config.
KSERVE_TO_TRITON_CONFIG: dict[str, str] = {name: f"TYPE_{name}" for name in KSERVE_TO_NUMPY}
KSERVE_TO_TRITON_CONFIG["BYTES"] = "TYPE_STRING"

_LENGTH = struct.Struct("<I")
_ELEMENTS_PER_STEP = 1 << 16


class TensorDecodeError(ValueError):
    """Bytes that cannot be read as a tensor of the stated datatype and shape."""


def element_count(shape: list[int] | tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def datatype_of(array: np.ndarray) -> str:
    """The KServe datatype name of a numpy array (strings and bytes are BYTES)."""
    if array.dtype.kind in "OUS":
        return "BYTES"
    for name, dtype in KSERVE_TO_NUMPY.items():
        if dtype == array.dtype:
            return name
    raise TypeError(f"numpy dtype {array.dtype} has no KServe datatype")


def encode_bytes_elements(array: np.ndarray) -> bytes:
    """BYTES layout of the binary tensor extension: each element as a 4-byte little-endian
    length followed by its bytes, in row-major order."""
    parts: list[bytes] = []
    for item in array.ravel():
        raw = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def decode_bytes_elements(buffer: bytes | memoryview, count: int) -> np.ndarray:
    view = memoryview(buffer)
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + 4 > len(view):
            raise TensorDecodeError(f"BYTES tensor ends after {len(items)} of {count} elements")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise TensorDecodeError(f"BYTES element {len(items)} runs past the end of its data")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != len(view):
        raise TensorDecodeError(f"BYTES tensor has {len(view) - offset} bytes after its {count} elements")
    array = np.empty(count, dtype=np.object_)
    # A slice at a time: one assignment of millions of objects holds the GIL for a quarter of a
    # second, and the gateway decodes large bodies in a thread beside its event loop.
    for start in range(0, count, _ELEMENTS_PER_STEP):
        array[start : start + _ELEMENTS_PER_STEP] = items[start : start + _ELEMENTS_PER_STEP]
    return array


def holds_datatype(array: np.ndarray, datatype: str) -> bool:
    """Whether ``array`` holds ``datatype``'s numpy type as it is (BYTES: strings of any kind; an
    array of objects only where each one is a str or bytes: a None was written as "None")."""
    if array.dtype == KSERVE_TO_NUMPY[datatype]:
        return datatype != "BYTES" or all(isinstance(item, (str, bytes)) for item in array.flat)
    return datatype == "BYTES" and array.dtype.kind in "SU"


def first_non_text(array: np.ndarray) -> int | None:
    """The flat index of the first element of a BYTES tensor that is bytes but not UTF-8 text, or None.

    Joined with NULs, the elements are UTF-8 exactly when each one is (a NUL neither continues a
    character nor begins one): one decode in C for the common case, a search only for a refusal."""
    items = array.ravel().tolist()
    with contextlib.suppress(UnicodeDecodeError, TypeError):
        b"\0".join(items).decode("utf-8")
        return None
    for index, item in enumerate(items):
        if isinstance(item, bytes):
            try:
                item.decode("utf-8")
            except UnicodeDecodeError:
                return index
    return None


def tensor_to_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """Raw bytes of a tensor in row-major order (fixed-size types are not copied when contiguous)."""
    if datatype == "BYTES":
        return encode_bytes_elements(array)
    contiguous = np.ascontiguousarray(array, dtype=KSERVE_TO_NUMPY[datatype])
    if contiguous.size == 0:
        return b""  # a memoryview with a zero in its shape cannot be cast to bytes
    return memoryview(contiguous).cast("B")


def tensor_from_bytes(buffer: bytes | memoryview, datatype: str, shape: list[int]) -> np.ndarray:
    count = element_count(shape)
    if datatype == "BYTES":
        return decode_bytes_elements(buffer, count).reshape(shape)
    dtype = KSERVE_TO_NUMPY[datatype]
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise TensorDecodeError(f"{datatype} tensor of shape {list(shape)} needs {expected} bytes, got {len(buffer)}")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def describe(session: Any) -> dict[str, Any]:
    """Inputs and outputs of an ONNX Runtime session: name, KServe datatype, shape with -1 for free dims."""

    def spec(arg: Any) -> dict[str, Any]:
        shape = [dim if isinstance(dim, int) and dim >= 0 else -1 for dim in (arg.shape or [])]
        return {"name": arg.name, "datatype": ONNX_TO_KSERVE.get(arg.type, arg.type), "shape": shape}

    return {
        "inputs": [spec(arg) for arg in session.get_inputs()],
        "outputs": [spec(arg) for arg in session.get_outputs()],
    }
