"""Pure parts, tested with plain calls: the executor protocol, batching, ROMA's CPU round-robin."""

from __future__ import annotations

import io
import random
from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest

from executors.tensors import KSERVE_TO_NUMPY, decode_bytes_elements, encode_bytes_elements, tensor_to_bytes
from executors.wire import ProtocolViolation, encode_frame, pack_tensors, read_frame_blocking, unpack_tensors
from gateway.batching import batch_key, split_outputs, stack_inputs, take_batch
from gateway.signature import ModelSignature
from gateway.stats import CoreMeter, ResponseTimes
from schedulers.decisions import Assign
from schedulers.round_robin import RandomRoundRobin
from tests.helpers import DATATYPES, random_input


def test_frames_carry_every_datatype_unchanged():
    rng = np.random.default_rng(0)
    tensors = {name: random_input(name, [2, 3], rng) for name in DATATYPES}
    descriptions, buffers = pack_tensors(tensors)
    stream = io.BytesIO(b"".join(bytes(piece) for piece in encode_frame({"kind": "infer", "tensors": descriptions}, buffers)))
    header, payload = read_frame_blocking(stream)
    back = unpack_tensors(header["tensors"], payload)
    for name, array in tensors.items():
        assert back[name].shape == array.shape
        assert back[name].tolist() == array.tolist(), name
    assert read_frame_blocking(stream) is None


def test_an_empty_tensor_is_zero_bytes_of_any_datatype():
    # A pipeline step that found nothing (no text in an image) answers tensors with no rows.
    for datatype in DATATYPES:
        empty = np.zeros((0, 4), dtype=KSERVE_TO_NUMPY[datatype])
        assert bytes(tensor_to_bytes(empty, datatype)) == b"", datatype


def test_truncated_frame_is_a_protocol_violation():
    pieces = encode_frame({"kind": "x"}, [b"12345678"])
    raw = b"".join(bytes(p) for p in pieces)
    with pytest.raises(ProtocolViolation):
        read_frame_blocking(io.BytesIO(raw[:-3]))


def test_bytes_elements_layout_is_tritons():
    array = np.array([b"ab", b"", "é"], dtype=np.object_)
    raw = encode_bytes_elements(array)
    assert raw == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\xc3\xa9"
    assert decode_bytes_elements(raw, 3).tolist() == [b"ab", b"", "é".encode()]


@dataclass
class FakeRequest:
    inputs: dict
    rows: int
    batch_key: tuple = ()


def _request(rows: int, width: int) -> FakeRequest:
    inputs = {"x": np.full((rows, width), float(rows), np.float32)}
    return FakeRequest(inputs, rows, batch_key(inputs))


def test_take_batch_keeps_fifo_and_stops_at_an_incompatible_request():
    queue = deque([_request(2, 4), _request(3, 4), _request(1, 5), _request(1, 4)])
    batch = take_batch(queue, max_rows=8, batchable=True)
    assert [r.rows for r in batch] == [2, 3]
    assert [r.rows for r in queue] == [1, 1]


def test_take_batch_respects_max_rows_and_unbatchable_models():
    queue = deque([_request(3, 4), _request(3, 4), _request(3, 4)])
    assert len(take_batch(queue, max_rows=6, batchable=True)) == 2
    queue = deque([_request(1, 4), _request(1, 4)])
    assert len(take_batch(queue, max_rows=8, batchable=False)) == 1


def test_stack_and_split_are_inverse():
    batch = [_request(2, 4), _request(1, 4), _request(3, 4)]
    stacked = stack_inputs(batch)
    assert stacked["x"].shape == (6, 4)
    parts = split_outputs({"y": stacked["x"] * 2}, batch)
    for request, part in zip(batch, parts, strict=True):
        assert np.array_equal(part["y"], request.inputs["x"] * 2)
    with pytest.raises(ValueError, match="does not split"):
        split_outputs({"y": np.zeros((5, 1))}, batch)


def test_batchable_needs_a_free_leading_dimension_everywhere():
    def signature(inputs, outputs):
        return ModelSignature.from_json({"inputs": inputs, "outputs": outputs})

    free = {"name": "x", "datatype": "FP32", "shape": [-1, 4]}
    fixed = {"name": "y", "datatype": "FP32", "shape": [2, 4]}
    assert signature([free], [dict(free, name="o")]).batchable
    assert not signature([free], [dict(fixed, name="o")]).batchable
    assert not signature([fixed], [dict(free, name="o")]).batchable
    assert not signature([dict(free, shape=[])], [dict(free, name="o")]).batchable


def test_round_robin_assigns_only_waiting_models_with_free_executors():
    scheduler = RandomRoundRobin(random.Random(1))
    decisions = scheduler.assign({"a": 3, "b": 0, "c": 1}, {"a": ["a0", "a1"], "b": ["b0"], "c": []})
    assert sorted(decisions, key=lambda d: d.executor_id) == [Assign("a", "a0"), Assign("a", "a1")]
    # Never more executors for a queue than it has requests.
    decisions = scheduler.assign({"a": 1}, {"a": ["a0", "a1", "a2"]})
    assert len(decisions) == 1


def test_round_robin_visits_queues_in_random_order():
    scheduler = RandomRoundRobin(random.Random(2))
    firsts = {scheduler.assign({"a": 1, "b": 1, "c": 1}, {"a": ["a0"], "b": ["b0"], "c": ["c0"]})[0].model for _ in range(60)}
    assert firsts == {"a", "b", "c"}
    # The same seed gives the same decisions (simulations and tests replay exactly).
    one, two = RandomRoundRobin(random.Random(9)), RandomRoundRobin(random.Random(9))
    waiting, free = {"a": 2, "b": 2}, {"a": ["a0"], "b": ["b0"]}
    assert [one.assign(waiting, free) for _ in range(10)] == [two.assign(waiting, free) for _ in range(10)]


def test_response_times_and_core_meter():
    times = ResponseTimes()
    for rt in (10.0, 20.0, 30.0):
        times.observe(rt, sla_ms=25.0)
    assert times.requests == 3 and times.violations == 1
    assert times.mean_ms == pytest.approx(20.0)
    assert times.std_ms == pytest.approx(np.std([10, 20, 30]))
    assert times.max_ms == 30.0
    meter = CoreMeter(cores=1.0, now=0.0)
    meter.set(0.5, now=10.0)
    assert meter.total(now=14.0) == pytest.approx(12.0)
