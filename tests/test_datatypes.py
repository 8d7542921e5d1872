"""Every datatype ONNX models use, through tritonclient, as JSON and as binary tensors."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton

from tests.helpers import DATATYPES, identity_model, random_input, run_gateway, write_config


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("datatypes")
    identity_model(folder / "identity.onnx")
    config = write_config(folder / "config.toml", {"identity": {"path": "identity.onnx", "sla_ms": 100, "max_batch_size": 8}})
    with run_gateway(config) as gateway:
        yield gateway


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_datatype_round_trips(gateway, binary):
    client = triton.InferenceServerClient(gateway.url)
    metadata = client.get_model_metadata("identity")
    assert {t["datatype"] for t in metadata["inputs"]} == set(DATATYPES)
    rng = np.random.default_rng(11)
    sent, inputs = {}, []
    for name in DATATYPES:
        low = name.lower()
        data = random_input(name, [2, 3], rng)
        sent[low] = data
        tensor = triton.InferInput(f"in_{low}", list(data.shape), name)
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
    outputs = [triton.InferRequestedOutput(f"out_{n.lower()}", binary_data=binary) for n in DATATYPES]
    result = client.infer("identity", inputs, outputs=outputs)
    for low, data in sent.items():
        got = result.as_numpy(f"out_{low}")
        if low == "bytes":
            # JSON carries BYTES as text; tritonclient hands text back as str, binary as bytes.
            assert [g if isinstance(g, bytes) else g.encode() for g in got.ravel()] == list(data.ravel())
        else:
            assert got.dtype == data.dtype, low
            assert np.array_equal(got, data), low


def test_integer_out_of_range_is_refused(gateway):
    import requests

    inputs = []
    for name in DATATYPES:
        low = name.lower()
        value = [[1, 0, 1]] * 2
        if name == "BYTES":
            value = [["a", "b", "c"]] * 2
        if name == "BOOL":
            value = [[True, False, True]] * 2
        if name == "UINT8":
            value = [[300, 0, 1]] * 2
        inputs.append({"name": f"in_{low}", "shape": [2, 3], "datatype": name, "data": value})
    response = requests.post(f"{gateway.base}/v2/models/identity/infer", json={"inputs": inputs}, timeout=10)
    assert response.status_code == 400
    assert "outside the range of UINT8" in response.json()["error"]
