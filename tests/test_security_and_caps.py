"""Bad actors: the admin token, the refusal to bind without it, the data-plane token, path
traversal, and each cap on a request (body size, JSON depth, tensor elements, timeout)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import requests

from tests.helpers import ROOT, free_port, run_gateway

GOOD = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}


@pytest.fixture
def folder(tmp_path, example_models):
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    return tmp_path


def write(folder, server: str = "", model: str = 'path = "mlp.onnx"') -> object:
    path = folder / "config.toml"
    path.write_text(f"[server]\n{server}\n\n[models.mlp]\n{model}\nsla_ms = 100\nmax_batch_size = 8\n")
    return path


def serve(config, *args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(config), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_admin_api_needs_the_bearer_token(folder):
    with run_gateway(write(folder, 'admin_token = "from-config"')) as gateway:
        url = f"{gateway.base}/admin/models/mlp"
        missing = requests.get(url, timeout=10)
        assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
        assert "no 'Authorization: Bearer' header" in missing.json()["error"]
        wrong = requests.put(f"{url}/sla", json={"sla_ms": 5}, headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401 and "wrong" in wrong.json()["error"]
        ok = requests.get(url, headers={"Authorization": "Bearer from-config"}, timeout=10)
        assert ok.status_code == 200 and ok.json()["sla_ms"] == 100  # the refused PUT changed nothing
        # The data plane, health, metrics and the API document stay open without a data token.
        assert requests.post(f"{gateway.base}/v2/models/mlp/infer", json=GOOD, timeout=10).status_code == 200
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/openapi.json"):
            assert requests.get(gateway.base + path, timeout=10).status_code == 200, path


def test_the_environment_token_wins_over_the_config(folder):
    with run_gateway(write(folder, 'admin_token = "from-config"'), {"GATEWAY_ADMIN_TOKEN": "from-env"}) as gateway:
        url = f"{gateway.base}/admin/node"
        assert requests.get(url, headers={"Authorization": "Bearer from-config"}, timeout=10).status_code == 401
        assert requests.get(url, headers={"Authorization": "Bearer from-env"}, timeout=10).status_code == 200


def test_the_data_plane_token_when_one_is_set(folder):
    with run_gateway(write(folder, 'data_token = "data"')) as gateway:
        infer = f"{gateway.base}/v2/models/mlp/infer"
        assert requests.post(infer, json=GOOD, timeout=10).status_code == 401
        assert requests.get(f"{gateway.base}/v2/models/mlp", timeout=10).status_code == 401
        assert requests.post(infer, json=GOOD, headers={"Authorization": "Bearer data"}, timeout=10).status_code == 200
        assert requests.get(f"{gateway.base}/v2/health/ready", timeout=10).status_code == 200  # probes stay open
        assert requests.get(f"{gateway.base}/admin/models", timeout=10).status_code == 200  # no admin token: loopback only


def test_refuses_a_non_loopback_address_without_an_admin_token(folder):
    import os

    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_ADMIN_TOKEN"}
    result = serve(write(folder), "--host", "0.0.0.0", "--port", str(free_port()), env=env)
    assert result.returncode == 2
    assert "not a loopback address, without a token" in result.stderr and "GATEWAY_ADMIN_TOKEN" in result.stderr


def test_with_a_token_a_non_loopback_address_is_served(folder):
    config = write(folder, 'host = "0.0.0.0"')
    with run_gateway(config, {"GATEWAY_ADMIN_TOKEN": "t"}) as gateway:
        assert requests.get(f"{gateway.base}/admin/node", headers={"Authorization": "Bearer t"}, timeout=10).status_code == 200


def test_model_files_only_from_the_model_directory(folder, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    shutil.copy(folder / "mlp.onnx", outside / "mlp.onnx")
    for path in (f"../{outside.name}/mlp.onnx", str(outside / "mlp.onnx")):
        result = serve(write(folder, model=f'path = "{path}"'), "--port", str(free_port()))
        assert result.returncode == 2, result.stderr
        assert "models.mlp.path" in result.stderr and "outside the model directory" in result.stderr
    # A model_dir of its own admits what lies under it.
    with run_gateway(write(folder, f'model_dir = "{outside}"', model='path = "' + str(outside / "mlp.onnx") + '"')) as g:
        assert requests.post(f"{g.base}/v2/models/mlp/infer", json=GOOD, timeout=10).status_code == 200


def test_no_path_traversal_through_the_api(folder):
    with run_gateway(write(folder)) as gateway:
        for path in (
            "/v2/models/..%2F..%2F..%2Fetc%2Fpasswd",
            "/v2/models/..%2Fconfig.toml/config",
            "/v2/models/%2Fetc%2Fpasswd/infer",
            "/admin/models/..%2F..%2Fmlp.onnx",
            "/v2/models/mlp/versions/..%2F..%2F1/ready",
        ):
            response = requests.request("POST" if path.endswith("infer") else "GET", gateway.base + path, json=GOOD, timeout=10)
            assert response.status_code == 404, (path, response.status_code)
            error = response.json()["error"]
            assert error.startswith(("unknown model", "model 'mlp' has no version")), error
            assert "root:x:0" not in response.text  # nothing of a file was read


def test_each_cap_is_a_clear_4xx_and_the_gateway_keeps_serving(folder):
    server = "max_body_bytes = 200000\nmax_json_depth = 8\nmax_elements = 4096"
    with run_gateway(write(folder, server)) as gateway:
        infer = f"{gateway.base}/v2/models/mlp/infer"

        def check(body: bytes | dict, status: int, words: str) -> None:
            kwargs = {"json": body} if isinstance(body, dict) else {"data": body}
            response = requests.post(infer, timeout=30, **kwargs)
            assert response.status_code == status, response.text
            assert words in response.json()["error"]
            assert requests.post(infer, json=GOOD, timeout=10).status_code == 200

        check(b"{" + b" " * 300_000 + b"}", 413, "")  # the body
        deep: dict = {"v": 1}
        for _ in range(12):
            deep = {"v": deep}
        check({**GOOD, "parameters": {"deep": deep}}, 400, "nests deeper than the limit of 8")
        nested = [[[[[[[[[[0.5]]]]]]]]]]
        check({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": nested}]}, 400, "nests deeper")
        big = {"inputs": [{"name": "x", "shape": [9, 512], "datatype": "FP32", "data": [0.5] * 9 * 512}]}
        check(big, 413, "over the limit of 4096 per tensor (server.max_elements)")
        huge_shape = {"inputs": [{"name": "x", "shape": [1 << 40, 512], "datatype": "FP32", "data": [0.5]}]}
        check(huge_shape, 413, "over the limit")
        for bad in (-1, "soon", 1.5, True):
            check({**GOOD, "parameters": {"timeout": bad}}, 400, "parameter 'timeout'")
        counts = requests.get(f"{gateway.base}/admin/models/mlp", timeout=10).json()["stats"]
        # Each 413 is too_large (the body, and the two tensors over max_elements), as over gRPC.
        assert counts["outcomes"]["too_large"] == 3 and counts["outcomes"]["invalid"] == 6
        assert counts["received"] == sum(counts["outcomes"].values())


def test_openapi_document_covers_every_route(folder):
    with run_gateway(write(folder)) as gateway:
        document = requests.get(f"{gateway.base}/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.")
    from gateway.config import ServerConfig
    from gateway.server import build_app  # the routes the server really has

    app = build_app(SimpleNamespace(config=SimpleNamespace(server=ServerConfig())))  # type: ignore[arg-type]
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    documented = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert routes == documented
    assert json.dumps(document)  # serialisable as served


def test_openapi_document_names_the_timeouts_and_expectations_the_server_sends():
    """408 (a body that stalls), 415 (a coding it cannot undo) and 417 (an unknown Expect) are
    answered: the document says so."""
    from gateway.openapi import openapi_document

    document = openapi_document("test")
    infer = document["paths"]["/v2/models/{model}/infer"]["post"]["responses"]
    assert {"408", "415", "417"} <= set(infer), sorted(infer)
    sla = document["paths"]["/admin/models/{model}/sla"]["put"]["responses"]
    assert {"408", "415", "417"} <= set(sla), sorted(sla)
    health = document["paths"]["/v2/health/live"]["get"]["responses"]
    assert "417" in health and "408" not in health and "415" not in health
