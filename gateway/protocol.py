"""KServe v2 / Open Inference Protocol: infer requests in, infer responses out.

Pure functions of bytes and numpy arrays: no sockets, no clock. JSON tensors may be nested or
flat; the binary tensor data extension (Triton's ``binary_data``,
``Inference-Header-Content-Length``) carries large tensors after the JSON header.
Every malformed request becomes an ``InvalidRequest`` that names what was wrong.
"""

from __future__ import annotations

import itertools
import re
import reprlib
import secrets
from collections.abc import Iterator, Mapping
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

# Which Python types of JSON scalars each datatype accepts, element by element as Triton reads
# them: a boolean is no number, a number no string, so ["a", 1] is not BYTES nor [1, true] INT8.
_ACCEPTED_TYPES: dict[str, frozenset[type]] = {"BOOL": frozenset({bool}), "BYTES": frozenset({str})}
_ACCEPTED_TYPES.update({name: frozenset({int}) for name in KSERVE_TO_NUMPY if name.startswith(("INT", "UINT"))})
_ACCEPTED_TYPES.update({name: frozenset({int, float}) for name in ("FP16", "FP32", "FP64")})
_TYPE_TEXT = {bool: "booleans", int: "integers", float: "numbers", str: "strings", dict: "objects", type(None): "nulls"}
# The numpy kinds (dtype.kind of np.asarray of the whole list) that each datatype takes as it is.
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
        #: The refused request's own ``id``, where its JSON was read that far (it names the
        #: request in the answer's X-Request-ID and the logs, as an accepted one's does).
        self.request_id: str | None = None


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
    priority: int = 0  # Triton's ``priority`` parameter: 1 the highest level; 0 the model's default


def parse_infer_request(
    body: bytes | bytearray, header_length: str | None, signature: ModelSignature, max_batch_size: int, limits: Limits = Limits()
) -> InferRequest:
    """Check the request against the model, then decode its tensors.

    Every check that can refuse a request (names, datatypes, declared shapes against the model,
    element counts, the batch dimension against ``max_batch_size``, binary sizes, outputs, id)
    reads only the JSON header: no tensor is decoded before all of them pass. A JSON text over
    ``LARGE_BYTES`` is read in steps (``_load_large_json``), so this function can run in a worker
    thread without holding the GIL, and with it the event loop, for long.
    """
    header, blobs = _split_body(body, header_length)
    if not isinstance(header, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        return _checked_request(body, header, blobs, signature, max_batch_size, limits)
    except InvalidRequest as error:
        if isinstance(header.get("id"), str):
            error.request_id = header["id"]
        raise


def _checked_request(
    body: bytes | bytearray,
    header: dict[str, Any],
    blobs: memoryview | None,
    signature: ModelSignature,
    max_batch_size: int,
    limits: Limits,
) -> InferRequest:
    depth = json_depth(header, limits.max_json_depth)
    if depth > limits.max_json_depth:
        raise InvalidRequest(f"the request's JSON nests deeper than the limit of {limits.max_json_depth} levels")
    inputs_json = header.get("inputs")
    if not isinstance(inputs_json, list) or not inputs_json:
        raise InvalidRequest("'inputs' must be a non-empty list of tensors")
    parameters = _object(header.get("parameters"), "'parameters'")
    if "classification" in parameters:
        raise InvalidRequest("the classification extension is not supported")
    timeout_us = parameters.get("timeout")
    if timeout_us is not None and (isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us < 0):
        raise InvalidRequest(f"parameter 'timeout' must be a non-negative integer of microseconds, got {_brief(timeout_us)}")
    priority = parameters.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise InvalidRequest(f"parameter 'priority' must be a non-negative integer (1 the highest level), got {_brief(priority)}")
    binary_output = _flag(parameters, "binary_data_output", False, "parameter")

    planned: dict[str, _PlannedInput] = {}
    offset = 0
    for item in inputs_json:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidRequest("each input must be an object with a 'name'")
        name = item["name"]
        spec = signature.input(name)
        if spec is None:
            known = ", ".join(t.name for t in signature.inputs)
            raise InvalidRequest(f"unknown input '{name}'; the model's inputs are: {known}")
        if name in planned:
            raise InvalidRequest(f"input '{name}' is given twice")
        planned[name], offset = _plan_input(item, spec, blobs, offset, limits)
    if blobs is not None and offset != len(blobs):
        raise InvalidRequest(f"{len(blobs) - offset} bytes of binary data follow the tensors that use them")
    missing = [t.name for t in signature.inputs if t.name not in planned]
    if missing:
        raise InvalidRequest(f"missing input(s): {', '.join(missing)}")
    rows = _batch_rows({name: plan.shape for name, plan in planned.items()}, signature, max_batch_size)
    outputs = _requested_outputs(header.get("outputs"), signature, binary_output)
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest("'id' must be a string")

    # A JSON boolean is the literal true or false: where the text has neither, no tensor holds one.
    # A text over LARGE_BYTES is not searched (no step may be long): its long arrays, set aside as
    # numbers only, hold none anyway, and its short ones are read value by value.
    end = len(body) - (len(blobs) if blobs is not None else 0)
    booleans = end > LARGE_BYTES or body.find(b"true", 0, end) != -1 or body.find(b"false", 0, end) != -1
    inputs = {name: plan.decode(booleans) for name, plan in planned.items()}
    return InferRequest(
        id=request_id, inputs=inputs, outputs=outputs, rows=rows, parameters=parameters, timeout_us=timeout_us, priority=priority
    )


def json_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0), looking no further than ``limit`` + 1 levels.

    Lists of scalars (tensor data) are not walked element by element: a list whose first
    element is a scalar ends there, and a container hidden behind it makes the tensor ragged,
    which decoding refuses anyway. An array of numbers set aside as text counts as deep as its
    leading brackets.
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
        elif isinstance(item, _NumbersText):
            deepest = max(deepest, depth + item.depth - 1)
            continue
        else:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _split_body(body: bytes | bytearray, header_length: str | None) -> tuple[Any, memoryview | None]:
    if header_length is None:
        return _load_json(body), None
    # RFC 9110's Content-Length grammar, 1*DIGIT: int() alone would read "1_0", " 10" or "+10".
    if not (header_length.isascii() and header_length.isdigit()):
        raise InvalidRequest(f"Inference-Header-Content-Length must be a decimal number of bytes, got {_brief(header_length)}")
    length = int(header_length) if len(header_length) <= 20 else len(body) + 1
    if not 0 < length <= len(body):
        shown = header_length if len(header_length) <= 20 else header_length[:20] + "..."
        raise InvalidRequest(f"Inference-Header-Content-Length {shown} does not fit a body of {len(body)} bytes")
    return _load_json(body[:length]), memoryview(body)[length:]


@dataclass(frozen=True)
class _PlannedInput:
    """An input whose header passed every check; its data is decoded by ``decode``."""

    name: str
    datatype: str
    shape: list[int]
    binary: memoryview | None  # its bytes of the binary tensor extension, or
    data: Any  # its JSON data: a list, a scalar or a _NumbersText

    def decode(self, booleans: bool) -> np.ndarray:
        if self.binary is None:
            return _decode_json_data(self.name, self.data, self.datatype, self.shape, booleans)
        try:
            return tensor_from_bytes(self.binary, self.datatype, self.shape)
        except TensorDecodeError as error:
            raise InvalidRequest(f"input '{self.name}': {error}") from None


def _plan_input(
    item: dict[str, Any], spec: TensorSpec, blobs: memoryview | None, offset: int, limits: Limits
) -> tuple[_PlannedInput, int]:
    name = item["name"]
    datatype = item.get("datatype")
    if datatype != spec.datatype:
        raise InvalidRequest(f"input '{name}' has datatype {_brief(datatype)}; the model expects {spec.datatype}")
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
    parameters = _object(item.get("parameters"), f"input '{name}': 'parameters'")
    refuse_shared_memory(parameters, f"input '{name}'")
    size = parameters.get("binary_data_size")
    if size is not None:
        if blobs is None:
            raise InvalidRequest(f"input '{name}' has binary_data_size but the request has no Inference-Header-Content-Length")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(blobs):
            raise InvalidRequest(f"input '{name}': binary_data_size {_brief(size)} runs past the end of the body")
        return _PlannedInput(name, datatype, shape, blobs[offset : offset + size], None), offset + size
    if "data" not in item:
        raise InvalidRequest(f"input '{name}' has neither 'data' nor binary_data_size")
    return _PlannedInput(name, datatype, shape, None, item["data"]), offset


def _decode_json_data(name: str, data: Any, datatype: str, shape: list[int], booleans: bool) -> np.ndarray:
    """``booleans``: the request's JSON text has a literal true or false (see _typed_array)."""
    count = element_count(shape)
    array = data.numbers(name, shape, datatype) if isinstance(data, _NumbersText) else None
    if array is None:
        if isinstance(data, _NumbersText):
            data = data.parse(name, count)
        array = _typed_array(name, data if isinstance(data, list) else [data], datatype, exact=booleans)
    if array.size != count:
        raise InvalidRequest(f"input '{name}': shape {shape} needs {count} elements, 'data' has {array.size}")
    array = array.reshape(shape)
    # JSON has no NaN or infinity, so a value that is not finite once converted was too large
    # for the datatype (1e39 for FP32, 70000 for FP16).
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidRequest(f"input '{name}': a value is outside the range of {datatype}")
    return array


def _flat(name: str, data: list[Any]) -> list[Any]:
    """The scalars of ``data``, a list nested any number of levels deep, in order; a ragged list
    (sub-lists of different lengths, or lists beside scalars) is refused."""
    while data and type(data[0]) is list:
        if not all(type(item) is list for item in data) or len(set(map(len, data))) != 1:
            raise InvalidRequest(f"input '{name}': 'data' is a ragged nested list")
        data = list(itertools.chain.from_iterable(data))
    return data


def _typed_array(name: str, values: list[Any], datatype: str, exact: bool = True) -> np.ndarray:
    """``values`` (JSON scalars, in lists nested any number of levels deep) as an array of
    ``datatype`` (of numpy's shape for the nesting; the caller reshapes it), each value of the
    datatype's JSON type, as Triton reads them.

    numpy's reading of the whole list is checked by its kind, which is exact but for booleans:
    it reads [1, true] as integers and [1.5, true] as numbers. So where the JSON may hold a
    boolean (``exact``: its text has a literal true or false), and wherever numpy's kind is not
    the datatype's (a string among numbers; a UINT64 over 2**63 beside small values, which numpy
    reads as floats), each value's type is checked instead."""
    if datatype == "BYTES":
        values = _flat(name, values)
        try:
            encoded = [text.encode("utf-8") for text in values]
        except AttributeError:
            raise _wrong_types(name, set(map(type, values)) - _ACCEPTED_TYPES[datatype], datatype) from None
        array = np.empty(len(values), dtype=np.object_)
        array[:] = encoded  # a numpy string array would drop trailing NULs
        return array
    dtype = KSERVE_TO_NUMPY[datatype]
    if not exact:
        try:
            raw = np.asarray(values)
        except ValueError:  # a ragged list: named below
            raw = None
        if raw is not None and raw.dtype.kind in _ACCEPTED_KINDS[datatype]:
            if dtype.kind in "iu" and raw.size:
                info = np.iinfo(dtype)
                if raw.min() < info.min or raw.max() > info.max:
                    raise InvalidRequest(f"input '{name}': a value is outside the range of {datatype}")
            with np.errstate(over="ignore"):  # a float too large for the datatype is refused by the caller
                return raw.astype(dtype, copy=False)
    values = _flat(name, values)
    wrong = set(map(type, values)) - _ACCEPTED_TYPES[datatype]
    if wrong:
        raise _wrong_types(name, wrong, datatype)
    try:
        with np.errstate(over="ignore"):
            return np.asarray(values, dtype=dtype)
    except OverflowError:
        raise InvalidRequest(f"input '{name}': a value is outside the range of {datatype}") from None


def _wrong_types(name: str, wrong: set[type], datatype: str) -> InvalidRequest:
    """The refusal of data holding values of the ``wrong`` types for ``datatype``."""
    if list in wrong:
        return InvalidRequest(f"input '{name}': 'data' is a ragged nested list")
    held = " and ".join(sorted(_TYPE_TEXT.get(kind, "values") for kind in wrong))
    return InvalidRequest(f"input '{name}': 'data' holds {held}, which is not {datatype}")


def _batch_rows(shapes: dict[str, list[int]], signature: ModelSignature, max_batch_size: int) -> int:
    if not signature.batchable:
        return 1
    rows = {shape[0] for shape in shapes.values()}
    if len(rows) != 1:
        raise InvalidRequest(f"the inputs disagree on the batch dimension: {sorted(rows)}")
    (count,) = rows
    if not 1 <= count <= max_batch_size:
        raise InvalidRequest(f"batch dimension {count} is outside 1..{max_batch_size} (the model's max_batch_size)")
    return count


def _requested_outputs(items: Any, signature: ModelSignature, binary_default: bool) -> list[RequestedOutput]:
    # None asked for is every output, as Triton reads an empty list too: it answered no tensor.
    if items is None or items == []:
        return [RequestedOutput(t.name, binary_default) for t in signature.outputs]
    if not isinstance(items, list):
        raise InvalidRequest("'outputs' must be a list")
    requested: list[RequestedOutput] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidRequest("each requested output must be an object with a 'name'")
        name = item["name"]
        if any(output.name == name for output in requested):  # as Triton: answered twice, it had two of one name
            raise InvalidRequest(f"output '{name}' is requested more than once")
        if signature.output(name) is None:
            known = ", ".join(t.name for t in signature.outputs)
            raise InvalidRequest(f"unknown output '{name}'; the model's outputs are: {known}")
        parameters = _object(item.get("parameters"), f"output '{name}': 'parameters'")
        refuse_shared_memory(parameters, f"output '{name}'")
        if "classification" in parameters:
            raise InvalidRequest("the classification extension is not supported")
        requested.append(RequestedOutput(name, _flag(parameters, "binary_data", binary_default, f"output '{name}': parameter")))
    return requested


def _object(value: Any, what: str) -> dict[str, Any]:
    """A ``parameters`` object: absent or null is empty, anything but an object is refused."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be an object, got {_brief(value)}")
    return value


def refuse_shared_memory(parameters: Mapping[str, Any], where: str) -> None:
    """A tensor in a shared-memory region (Triton's shared-memory extensions, not served here):
    an output's was answered inline as if asked for no region, and an input's was refused as
    having no data at all."""
    region = parameters.get("shared_memory_region")
    if region is not None:
        raise InvalidRequest(
            f"{where} names shared-memory region {_brief(region)}: shared memory is not served here; "
            "send the tensor in the request"
        )


def _flag(parameters: dict[str, Any], key: str, default: bool, where: str) -> bool:
    """A boolean parameter (absent or null: ``default``): "no", 0 or [] are refused, not read
    as Python's truth."""
    value = parameters.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where} '{key}' must be true or false, got {_brief(value)}")
    return value


def _brief(value: Any) -> str:
    """A client's value for an error message, cut short: it can be megabytes long."""
    return _BRIEF.repr(value)


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxstring, _BRIEF.maxother = 2, 4, 4, 60, 60


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("any" if d == -1 else str(d) for d in shape) + "]"


# -- large JSON texts ---------------------------------------------------------------------------
# A request over LARGE_BYTES is decoded off the event loop (gateway.server hands it to a worker
# thread), but a thread frees the loop only when each step it takes is short: orjson and numpy
# hold the GIL for the whole of one call, and one orjson.loads of a 60 MB tensor holds it 0.6 s.
# So the long arrays of numbers under "data" keys are set aside as text before the rest of the
# JSON is parsed, checked against the model, and only then read in pieces of _PIECE_BYTES.
LARGE_BYTES = 1 << 20
_PIECE_BYTES = 256 << 10  # about 2 ms of orjson and numpy per piece
_MIN_SET_ASIDE_BYTES = 64 << 10  # shorter arrays stay in the JSON parsed in one call
# Bytes in a window searched by one regular expression call: about 1 ms of sre, whose class
# search runs at about 9 ms per MB (a 1 MB window held the GIL, and so the loop, that long).
_WINDOW_BYTES = 128 << 10
_DATA_ARRAY = re.compile(rb'"data"[ \t\r\n]*:[ \t\r\n]*\[')
_NOT_IN_NUMBERS = re.compile(rb"[^-+0-9.eE,\[\] \t\r\n]")
_LEADING_BRACKETS = re.compile(rb"(?:\[[ \t\r\n]*)+")
_NUMBERS_TO_N = bytes.maketrans(b"0123456789+-.eE", b"n" * 15)
_BRACKETS_TO_SPACES = bytes.maketrans(b"[]", b"  ")
# A JSON number with its separators takes at most this many bytes in any sane client's text; a
# longer text that is not laid out as its shape is refused rather than parsed in one call.
_MAX_BYTES_PER_ELEMENT = 64


def _load_json(text: bytes | bytearray) -> Any:
    if len(text) > LARGE_BYTES:
        return _load_large_json(text)
    return _loads(text)


def _loads(text: bytes | bytearray | memoryview) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise InvalidRequest(f"the request is not valid JSON: {error}") from None


def _load_large_json(text: bytes | bytearray) -> Any:
    """``orjson.loads(text)``, with each long array of numbers under an input's "data" left as
    a ``_NumbersText``.

    Each such array is replaced by a string that names it before the rest is parsed, which is
    the same JSON with another value in the same place. A "data" key anywhere but in an input
    (in "parameters", say) gets its value back by parsing the whole text as it came.
    """
    marker = "\0" + secrets.token_hex(8) + ":"
    parts: list[bytes] = []
    aside: list[_NumbersText] = []
    start = 0
    for begin, end in _long_data_arrays(text):
        parts += [text[start:begin], orjson.dumps(f"{marker}{len(aside)}")]
        aside.append(_NumbersText(text, begin, end))
        start = end
    if not aside:
        return _loads(text)
    parts.append(text[start:])
    header = _loads(b"".join(parts))
    inputs = header.get("inputs") if isinstance(header, dict) else None
    restored = 0
    for item in inputs if isinstance(inputs, list) else ():
        data = item.get("data") if isinstance(item, dict) else None
        if isinstance(data, str) and data.startswith(marker):
            item["data"] = aside[int(data[len(marker) :])]
            restored += 1
    return header if restored == len(aside) else _loads(text)


def _long_data_arrays(text: bytes | bytearray) -> Iterator[tuple[int, int]]:
    """Where the values of "data" keys are long arrays of only numbers: (start, end) of each,
    from its "[" to its "]"."""
    position = 0
    while (found := _search(_DATA_ARRAY, text, position, overlap=64)) is not None:
        begin = found.end() - 1
        stop = _search(_NOT_IN_NUMBERS, text, begin)
        run_end = stop.start() if stop is not None else len(text)
        # Where the run of number characters holds the whole array, then at most a comma and
        # whitespace, the array ends at its last "]". Where the run stops inside the array (a
        # string among its numbers), the brackets up to that "]" do not pair up: setting that
        # text aside would break the JSON, which is then parsed as it came.
        end = text.rfind(b"]", begin, run_end) + 1
        if end - begin >= _MIN_SET_ASIDE_BYTES and _brackets_pair(text, begin, end):
            yield begin, end
        position = run_end


def _brackets_pair(text: bytes | bytearray, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` opens as many brackets as it closes, counted a window at a
    time so that no call is long."""
    balance = 0
    for position in range(start, end, _WINDOW_BYTES):
        stop = min(position + _WINDOW_BYTES, end)
        balance += text.count(b"[", position, stop) - text.count(b"]", position, stop)
    return balance == 0


def _search(pattern: re.Pattern[bytes], text: bytes | bytearray, position: int, overlap: int = 0) -> re.Match[bytes] | None:
    """``pattern.search(text, position)``, one window at a time so that no call is long. A match
    longer than ``overlap`` across two windows is missed: only for patterns where that is safe."""
    while position < len(text):
        found = pattern.search(text, position, position + _WINDOW_BYTES + overlap)
        if found is not None:
            return found
        position += _WINDOW_BYTES
    return None


@dataclass(frozen=True, repr=False)
class _NumbersText:
    """An array of numbers from a request's JSON, still text: ``text[start:end]``."""

    text: bytes | bytearray
    start: int
    end: int

    def __repr__(self) -> str:
        return f"<array of numbers, {self.end - self.start} bytes of JSON>"

    @property
    def depth(self) -> int:
        """How deep its first element nests: the leading brackets."""
        leading = _LEADING_BRACKETS.match(self.text, self.start, min(self.end, self.start + 4096))
        return leading.group().count(b"[") if leading is not None else 1

    def numbers(self, name: str, shape: list[int], datatype: str) -> np.ndarray | None:
        """Its numbers as ``datatype``, flat, read a piece at a time, when it is laid out flat or
        nested as ``shape`` (what clients send); None otherwise (``parse`` reads it then)."""
        depth, inner_start, inner_end = self.depth, self.start + 1, self.end - 1
        if not element_count(shape):
            return None
        if depth == 1:
            if self.text.find(b"[", inner_start, inner_end) != -1 or self.text.find(b"]", inner_start, inner_end) != -1:
                return None
        elif depth != len(shape) or not self._nested_as(shape):
            return None
        parts = []
        position = inner_start
        while True:
            cut = inner_end
            if inner_end - position > _PIECE_BYTES:
                cut = self.text.rfind(b",", position, position + _PIECE_BYTES)
                if cut == -1:  # whitespace longer than a piece: then the piece ends at the next comma
                    cut = self.text.find(b",", position + _PIECE_BYTES, inner_end)
                    cut = inner_end if cut == -1 else cut
            piece = self.text[position:cut].translate(_BRACKETS_TO_SPACES)
            try:
                values = orjson.loads(b"[" + piece + b"]")
                if not values:  # between two commas, or after the last one
                    raise orjson.JSONDecodeError("a comma without a number", "", 0)
            except orjson.JSONDecodeError:
                raise InvalidRequest(f"the request is not valid JSON: input '{name}' has a malformed number in 'data'") from None
            parts.append(_typed_array(name, values, datatype, exact=False))  # numbers only: no boolean
            if cut == inner_end:
                return np.concatenate(parts) if len(parts) > 1 else parts[0]
            position = cut + 1

    def _nested_as(self, shape: list[int]) -> bool:
        """Whether its brackets and commas are exactly those of an array of ``shape`` with a
        number between each, checked a piece at a time."""
        layout = b"[" + b"," * (shape[-1] - 1) + b"]"
        for dim in reversed(shape[:-1]):
            layout = b"".join((b"[", layout, (b"," + layout) * (dim - 1), b"]"))  # a repeat: memcpy-fast
        seen, before = 0, b""
        for position in range(self.start, self.end, _PIECE_BYTES):
            # Whitespace gone and each number character an "n": "[[n,nnn],[n,n]]".
            piece = self.text[position : min(position + _PIECE_BYTES, self.end)].translate(_NUMBERS_TO_N, b" \t\r\n")
            joined = before + piece
            before = joined[-1:]
            if b"]n" in joined or b"n[" in joined:  # a number outside a bracket: "[1]2", "1[2]"
                return False
            marks = piece.replace(b"n", b"")
            if layout[seen : seen + len(marks)] != marks:
                return False
            seen += len(marks)
        return seen == len(layout)

    def parse(self, name: str, count: int) -> Any:
        """Its JSON value, parsed in one call (an array nested otherwise than its shape)."""
        if self.end - self.start > _MAX_BYTES_PER_ELEMENT * count + _MIN_SET_ASIDE_BYTES:
            raise InvalidRequest(
                f"input '{name}': 'data' is {self.end - self.start} bytes of JSON, too long for {count} elements "
                "laid out otherwise than flat or as the input's shape"
            )
        return _loads(memoryview(self.text)[self.start : self.end])


def encode_infer_response(
    model: str,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    datatypes: dict[str, str],
    parameters: dict[str, Any],
    version: str = "1",
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length.

    NaN and infinities, which JSON has no numbers for, are written as null (orjson's choice);
    binary outputs carry them as they are. A JSON output of many numbers is written a piece at a
    time (``_json_numbers``), so that this can run in a worker thread without holding the GIL long.
    """
    outputs_json = []
    blobs: list[bytes | memoryview] = []
    long_data: list[np.ndarray] = []
    marker = "\0" + secrets.token_hex(8) + ":"
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
            data = np.ascontiguousarray(array).ravel()
            if data.size > _PIECE_ELEMENTS:
                entry["data"] = f"{marker}{len(long_data)}"  # written in below
                long_data.append(data)
            else:
                entry["data"] = data
        outputs_json.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outputs_json, "parameters": parameters}
    if request.id is not None:
        response["id"] = request.id
    head = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if long_data:
        parts, rest = [], head
        for index, data in enumerate(long_data):
            before, rest = rest.split(orjson.dumps(f"{marker}{index}"), 1)
            parts += [before, _json_numbers(data)]
        head = b"".join([*parts, rest])
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


_PIECE_ELEMENTS = 64 * 1024  # numbers orjson writes in one call: a few ms


def _json_numbers(data: np.ndarray) -> bytes:
    """``orjson.dumps(data)`` of a flat array, written a piece at a time."""
    pieces = (
        orjson.dumps(data[start : start + _PIECE_ELEMENTS], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        for start in range(0, data.size, _PIECE_ELEMENTS)
    )
    return b"[" + b",".join(pieces) + b"]"


def _bytes_to_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
