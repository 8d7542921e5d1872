"""KServe v2 / Open Inference Protocol: infer requests in, infer responses out.

Pure functions of bytes and numpy arrays: no sockets, no clock. JSON tensors may be nested or
flat; the binary tensor data extension (Triton's ``binary_data``,
``Inference-Header-Content-Length``) carries large tensors after the JSON header.
Every malformed request becomes an ``InvalidRequest`` that names what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from executors.tensors import (
    KSERVE_TO_NUMPY,
    TensorDecodeError,
    element_count,
    tensor_from_bytes,
    tensor_to_bytes,
)
from gateway.signature import ModelSignature, TensorSpec

# Which JSON scalar kinds (numpy dtype.kind of np.asarray(data)) each datatype accepts.
_ACCEPTED_KINDS = {"BOOL": "b", "BYTES": "U"}
_ACCEPTED_KINDS.update({name: "iu" for name in KSERVE_TO_NUMPY if name.startswith(("INT", "UINT"))})
_ACCEPTED_KINDS.update({name: "iuf" for name in ("FP16", "FP32", "FP64")})


@dataclass(frozen=True)
class Limits:
    """Caps on what one request may ask of the gateway (``[server]`` in the config)."""

    max_json_depth: int = 32
    max_elements: int = 16 * 1024 * 1024


class InvalidRequest(ValueError):
    """A client mistake: answered with this status and the message, never a 5xx."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput]
    rows: int  # length of the batch dimension (1 for a model without one)
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout_us: int | None = None  # the client's own timeout (the ``timeout`` parameter, as Triton)


def parse_infer_request(
    body: bytes, header_length: str | None, signature: ModelSignature, max_batch_size: int, limits: Limits = Limits()
) -> InferRequest:
    header, blobs = _split_body(body, header_length)
    if not isinstance(header, dict):
        raise InvalidRequest("the request body must be a JSON object")
    depth = json_depth(header, limits.max_json_depth)
    if depth > limits.max_json_depth:
        raise InvalidRequest(f"the request's JSON nests deeper than the limit of {limits.max_json_depth} levels")
    inputs_json = header.get("inputs")
    if not isinstance(inputs_json, list) or not inputs_json:
        raise InvalidRequest("'inputs' must be a non-empty list of tensors")
    parameters = header.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be an object")
    if "classification" in parameters:
        raise InvalidRequest("the classification extension is not supported")
    timeout_us = parameters.get("timeout")
    if timeout_us is not None and (isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us < 0):
        raise InvalidRequest(f"parameter 'timeout' must be a non-negative integer of microseconds, got {timeout_us!r}")

    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for item in inputs_json:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidRequest("each input must be an object with a 'name'")
        name = item["name"]
        spec = signature.input(name)
        if spec is None:
            known = ", ".join(t.name for t in signature.inputs)
            raise InvalidRequest(f"unknown input '{name}'; the model's inputs are: {known}")
        if name in inputs:
            raise InvalidRequest(f"input '{name}' is given twice")
        array, offset = _decode_input(item, spec, blobs, offset, limits)
        inputs[name] = array
    if blobs is not None and offset != len(blobs):
        raise InvalidRequest(f"{len(blobs) - offset} bytes of binary data follow the tensors that use them")
    missing = [t.name for t in signature.inputs if t.name not in inputs]
    if missing:
        raise InvalidRequest(f"missing input(s): {', '.join(missing)}")

    rows = _batch_rows(inputs, signature, max_batch_size)
    outputs = _requested_outputs(header.get("outputs"), signature, bool(parameters.get("binary_data_output", False)))
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest("'id' must be a string")
    return InferRequest(id=request_id, inputs=inputs, outputs=outputs, rows=rows, parameters=parameters, timeout_us=timeout_us)


def json_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0), looking no further than ``limit`` + 1 levels.

    Lists of scalars (tensor data) are not walked element by element: a list whose first
    element is a scalar ends there, and a container hidden behind it makes the tensor ragged,
    which decoding refuses anyway.
    """
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list) and item and isinstance(item[0], (list, dict)):
            children = item
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            continue
        else:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _split_body(body: bytes, header_length: str | None) -> tuple[Any, memoryview | None]:
    if header_length is None:
        json_bytes, blobs = body, None
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise InvalidRequest(f"Inference-Header-Content-Length must be an integer, got {header_length!r}") from None
        if not 0 < length <= len(body):
            raise InvalidRequest(f"Inference-Header-Content-Length {length} does not fit a body of {len(body)} bytes")
        json_bytes, blobs = body[:length], memoryview(body)[length:]
    try:
        return orjson.loads(json_bytes), blobs
    except orjson.JSONDecodeError as error:
        raise InvalidRequest(f"the request is not valid JSON: {error}") from None


def _decode_input(
    item: dict[str, Any], spec: TensorSpec, blobs: memoryview | None, offset: int, limits: Limits
) -> tuple[np.ndarray, int]:
    name = item["name"]
    datatype = item.get("datatype")
    if datatype != spec.datatype:
        raise InvalidRequest(f"input '{name}' has datatype {datatype!r}; the model expects {spec.datatype}")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidRequest(f"input '{name}': 'shape' must be a list of non-negative integers")
    if len(shape) != len(spec.shape) or any(s != -1 and s != d for s, d in zip(spec.shape, shape, strict=True)):
        raise InvalidRequest(f"input '{name}' has shape {shape}; the model expects {_shape_text(spec.shape)}")
    if element_count(shape) > limits.max_elements:
        raise InvalidRequest(
            f"input '{name}' has {element_count(shape)} elements, over the limit of {limits.max_elements} per tensor "
            "(server.max_elements)",
            status=413,
        )
    parameters = item.get("parameters") or {}
    size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if size is not None:
        if blobs is None:
            raise InvalidRequest(f"input '{name}' has binary_data_size but the request has no Inference-Header-Content-Length")
        if not isinstance(size, int) or size < 0 or offset + size > len(blobs):
            raise InvalidRequest(f"input '{name}': binary_data_size {size!r} runs past the end of the body")
        try:
            return tensor_from_bytes(blobs[offset : offset + size], datatype, shape), offset + size
        except TensorDecodeError as error:
            raise InvalidRequest(f"input '{name}': {error}") from None
    if "data" not in item:
        raise InvalidRequest(f"input '{name}' has neither 'data' nor binary_data_size")
    return _decode_json_data(name, item["data"], datatype, shape), offset


def _decode_json_data(name: str, data: Any, datatype: str, shape: list[int]) -> np.ndarray:
    if not isinstance(data, list):
        data = [data]
    try:
        raw = np.asarray(data)
    except ValueError:
        raise InvalidRequest(f"input '{name}': 'data' is a ragged nested list") from None
    count = element_count(shape)
    if raw.size != count:
        raise InvalidRequest(f"input '{name}': shape {shape} needs {count} elements, 'data' has {raw.size}")
    if count and raw.dtype.kind not in _ACCEPTED_KINDS[datatype]:
        raise InvalidRequest(f"input '{name}': 'data' holds {_kind_text(raw.dtype.kind)}, which is not {datatype}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = [s.encode("utf-8") for s in raw.ravel().tolist()]
        return array.reshape(shape)
    dtype = KSERVE_TO_NUMPY[datatype]
    if dtype.kind in "iu" and count:
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise InvalidRequest(f"input '{name}': a value is outside the range of {datatype}")
    return raw.astype(dtype, copy=False).reshape(shape)


def _batch_rows(inputs: dict[str, np.ndarray], signature: ModelSignature, max_batch_size: int) -> int:
    if not signature.batchable:
        return 1
    rows = {array.shape[0] for array in inputs.values()}
    if len(rows) != 1:
        raise InvalidRequest(f"the inputs disagree on the batch dimension: {sorted(rows)}")
    (count,) = rows
    if not 1 <= count <= max_batch_size:
        raise InvalidRequest(f"batch dimension {count} is outside 1..{max_batch_size} (the model's max_batch_size)")
    return count


def _requested_outputs(items: Any, signature: ModelSignature, binary_default: bool) -> list[RequestedOutput]:
    if items is None:
        return [RequestedOutput(t.name, binary_default) for t in signature.outputs]
    if not isinstance(items, list):
        raise InvalidRequest("'outputs' must be a list")
    requested = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidRequest("each requested output must be an object with a 'name'")
        if signature.output(item["name"]) is None:
            known = ", ".join(t.name for t in signature.outputs)
            raise InvalidRequest(f"unknown output '{item['name']}'; the model's outputs are: {known}")
        parameters = item.get("parameters") or {}
        if "classification" in parameters:
            raise InvalidRequest("the classification extension is not supported")
        requested.append(RequestedOutput(item["name"], bool(parameters.get("binary_data", binary_default))))
    return requested


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("any" if d == -1 else str(d) for d in shape) + "]"


def _kind_text(kind: str) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers", "U": "strings"}.get(kind, "values")


def encode_infer_response(
    model: str,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    datatypes: dict[str, str],
    parameters: dict[str, Any],
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length."""
    outputs_json = []
    blobs: list[bytes | memoryview] = []
    for wanted in request.outputs:
        array = outputs[wanted.name]
        datatype = datatypes[wanted.name]
        entry: dict[str, Any] = {"name": wanted.name, "datatype": datatype, "shape": list(array.shape)}
        if wanted.binary:
            raw = tensor_to_bytes(array, datatype)
            blobs.append(raw)
            entry["parameters"] = {"binary_data_size": len(raw) if isinstance(raw, bytes) else raw.nbytes}
        elif datatype == "BYTES":
            entry["data"] = [_bytes_to_text(b) for b in array.ravel().tolist()]
        else:
            # orjson writes numpy arrays itself, twenty times faster than json on tolist().
            entry["data"] = np.ascontiguousarray(array).ravel()
        outputs_json.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": outputs_json, "parameters": parameters}
    if request.id is not None:
        response["id"] = request.id
    head = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


def _bytes_to_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
