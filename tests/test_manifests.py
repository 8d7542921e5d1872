"""The Kubernetes deployment (deploy/kubernetes, deploy/Dockerfile).

Every manifest is checked against the OpenAPI schema of a pinned Kubernetes version, strictly (an
unknown or misspelt field fails), with kubernetes-validate's bundled schemas: no cluster is needed.
The rest checks what no schema can: the references between the manifests, the config file in the
ConfigMap and the image (labels and selectors, ports, probes, DNS names, paths, secrets).
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.helpers import EXAMPLES, ROOT

# The Kubernetes version the manifests are written for: its API schema is the one checked against.
KUBERNETES_VERSION = "1.30.0"

DEPLOY = ROOT / "deploy"
MANIFESTS = DEPLOY / "kubernetes"
KUSTOMIZATION = MANIFESTS / "kustomization.yaml"
NAMESPACE = "gateway"


def _load() -> list[tuple[Path, dict[str, Any]]]:
    documents = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path != KUSTOMIZATION:
            documents += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return documents


DOCUMENTS = _load()


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for _, doc in DOCUMENTS if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def _container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or a Service's target port as a number: a named one is looked up in the container."""
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert len(named) == 1, f"no container port named {port!r}"
    return named[0]


def _cores(quantity: str | int | float) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@pytest.fixture(scope="module")
def dispatcher() -> dict[str, Any]:
    return _one("Deployment", "gateway-dispatcher")


@pytest.fixture(scope="module")
def worker() -> dict[str, Any]:
    return _one("DaemonSet", "gateway-worker")


@pytest.fixture(scope="module")
def workers_service() -> dict[str, Any]:
    return _one("Service", "gateway-workers")


@pytest.fixture(scope="module")
def config_map() -> dict[str, Any]:
    return _one("ConfigMap", "gateway-config")


@pytest.fixture(scope="module")
def config(config_map: dict[str, Any]) -> dict[str, Any]:
    return tomllib.loads(config_map["data"]["config.toml"])


# -- the schema ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document", [doc for _, doc in DOCUMENTS], ids=[f"{p.name}:{d['kind']}/{d['metadata']['name']}" for p, d in DOCUMENTS]
)
def test_manifest_follows_the_kubernetes_schema(document: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"not a valid {document['kind']} for Kubernetes {KUBERNETES_VERSION}: {error.message} at {error.path}")


def test_validation_is_strict(dispatcher: dict[str, Any]) -> None:
    """The check above would catch a misspelt field: a probe's 'periodSecond' is refused."""
    broken = copy.deepcopy(dispatcher)
    _container(broken)["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# What the schema leaves to the API server: the form of resource quantities, hostPath types.
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([mkMGTPE]|[KMGTPE]i|[eE][+-]?\d+)?$")
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"}


@pytest.mark.parametrize("name", ["gateway-dispatcher", "gateway-worker"])
def test_what_the_api_server_checks_beyond_the_schema(name: str) -> None:
    (workload,) = [doc for _, doc in DOCUMENTS if doc["metadata"]["name"] == name]
    resources = _container(workload)["resources"]
    for amounts in (resources.get("requests", {}), resources.get("limits", {})):
        for resource, amount in amounts.items():
            assert QUANTITY.match(str(amount)), f"{name}: {resource} {amount!r} is not a quantity"
    for volume in workload["spec"]["template"]["spec"]["volumes"]:
        if "hostPath" in volume:
            assert volume["hostPath"].get("type", "") in HOST_PATH_TYPES


def test_the_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load(KUSTOMIZATION.read_text())["resources"]
    assert sorted(listed) == sorted({path.name for path, _ in DOCUMENTS})


def test_everything_is_in_the_gateway_namespace() -> None:
    assert _one("Namespace", NAMESPACE)
    for path, doc in DOCUMENTS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{path.name}: {doc['kind']} outside {NAMESPACE}"


# -- the config file in the ConfigMap --------------------------------------------------------------


def test_the_config_serves_the_example_models(config: dict[str, Any]) -> None:
    examples = tomllib.loads((EXAMPLES / "config.toml").read_text())
    assert set(config["models"]) == set(examples["models"])
    assert config["server"]["host"] == "0.0.0.0"
    assert config["control"]["policy"] == "feedforward"
    assert config["node"]["cpu_cores"] > 0
    # Secrets stay in the Secret: the file holds no token.
    for table in ("server", "cluster", "worker"):
        assert not {"token", "admin_token", "data_token"} & set(config.get(table, {})), f"a token in [{table}]"


def test_the_gateway_loads_the_config_with_the_secrets_tokens(
    config_map: dict[str, Any], example_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config the pods read, loaded as `gateway serve` and `gateway worker` load it, with the
    Secret's tokens in the environment as the pods have them; the model directory of the image is
    swapped for this checkout's examples/models."""
    from gateway.config import load_config, worker_token_error

    text = config_map["data"]["config.toml"]
    image_models = tomllib.loads(text)["server"]["model_dir"]
    (tmp_path / "config.toml").write_text(text.replace(image_models, str(example_models)))
    tokens = _one("Secret", "gateway-tokens")["stringData"]
    monkeypatch.setenv("GATEWAY_WORKER_TOKEN", tokens["worker-token"])
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", tokens["admin-token"])
    loaded = load_config(tmp_path / "config.toml")
    assert loaded.cluster is not None and loaded.cluster.token == tokens["worker-token"]
    assert worker_token_error(loaded.worker.token) is None
    assert loaded.server.admin_token == tokens["admin-token"]


def test_the_config_is_where_the_pods_read_it(
    dispatcher: dict[str, Any], worker: dict[str, Any], config_map: dict[str, Any]
) -> None:
    for workload, role in ((dispatcher, "serve"), (worker, "worker")):
        command = _container(workload)["command"]
        assert command[:2] == ["gateway", role] and len(command) == 3
        config_path = Path(command[2])
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        mounts = [m for m in _container(workload)["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
        assert len(mounts) == 1, f"{role}: nothing mounted at {config_path.parent}"
        assert volumes[mounts[0]["name"]]["configMap"]["name"] == config_map["metadata"]["name"]
        assert config_path.name in config_map["data"]


# -- the workers and their headless Service --------------------------------------------------------


def test_the_headless_service_selects_the_workers_only(
    workers_service: dict[str, Any], worker: dict[str, Any], dispatcher: dict[str, Any]
) -> None:
    spec = workers_service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is False
    assert _selects(spec["selector"], _pod_labels(worker))
    assert not _selects(spec["selector"], _pod_labels(dispatcher))


def test_the_worker_port_is_the_configured_listen_port(
    workers_service: dict[str, Any], worker: dict[str, Any], config: dict[str, Any]
) -> None:
    listen_port = int(config["worker"]["listen"].rsplit(":", 1)[1])
    (port,) = workers_service["spec"]["ports"]
    assert port["port"] == listen_port
    assert _container_port(_container(worker), port.get("targetPort", port["port"])) == listen_port


def test_the_dispatchers_look_for_workers_at_the_headless_service(
    workers_service: dict[str, Any], config: dict[str, Any]
) -> None:
    name, namespace = workers_service["metadata"]["name"], workers_service["metadata"]["namespace"]
    (port,) = workers_service["spec"]["ports"]
    assert config["cluster"]["workers"] == f"dns:{name}.{namespace}.svc.cluster.local:{port['port']}"


def test_worker_probes_ask_the_workers_http_port(worker: dict[str, Any], config: dict[str, Any]) -> None:
    container = _container(worker)
    http_port = config["worker"]["http_port"]
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert _container_port(container, get["port"]) == http_port
    assert _container_port(container, container["startupProbe"]["httpGet"]["port"]) == http_port


def test_the_worker_may_write_cgroups(worker: dict[str, Any]) -> None:
    container = _container(worker)
    assert container["securityContext"]["privileged"] is True
    assert container["securityContext"]["runAsUser"] == 0
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/sys/fs/cgroup"]
    assert not mount.get("readOnly", False)
    assert volumes[mount["name"]]["hostPath"]["path"] == "/sys/fs/cgroup"


def test_the_worker_reserves_its_executors_cores(worker: dict[str, Any], config: dict[str, Any]) -> None:
    resources = _container(worker)["resources"]
    assert _cores(resources["requests"]["cpu"]) >= config["node"]["cpu_cores"]
    # The executors' quotas are the worker's to set: no CPU limit on top of them.
    assert "cpu" not in resources.get("limits", {})


# -- the dispatchers and their Service -------------------------------------------------------------


def test_the_dispatcher_service_reaches_the_server_port(
    dispatcher: dict[str, Any], worker: dict[str, Any], config: dict[str, Any]
) -> None:
    service = _one("Service", "gateway")
    spec = service["spec"]
    assert spec.get("type", "ClusterIP") == "ClusterIP"
    assert _selects(spec["selector"], _pod_labels(dispatcher))
    assert not _selects(spec["selector"], _pod_labels(worker))
    server_port = config["server"]["port"]
    (port,) = spec["ports"]
    assert port["port"] == server_port
    assert _container_port(_container(dispatcher), port["targetPort"]) == server_port


def test_dispatcher_probes_ask_the_server_port(dispatcher: dict[str, Any], config: dict[str, Any]) -> None:
    container = _container(dispatcher)
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert _container_port(container, get["port"]) == config["server"]["port"]
    assert _container_port(container, container["startupProbe"]["httpGet"]["port"]) == config["server"]["port"]


def test_the_dispatchers_outlast_their_drain(dispatcher: dict[str, Any], config: dict[str, Any]) -> None:
    grace = dispatcher["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > config["server"]["drain_timeout_s"]


def test_the_dispatchers_wait_for_workers_within_the_startup_probe(dispatcher: dict[str, Any], config: dict[str, Any]) -> None:
    """A dispatcher that finds no worker in time exits with a message naming the models; the
    kubelet must not kill it first, or that message is lost in a restart without reason."""
    probe = _container(dispatcher)["startupProbe"]
    assert config["cluster"]["start_timeout_s"] < probe["periodSeconds"] * probe["failureThreshold"]


def test_workload_selectors_match_their_pods(dispatcher: dict[str, Any], worker: dict[str, Any]) -> None:
    assert dispatcher["spec"]["replicas"] == 2
    for workload in (dispatcher, worker):
        assert _selects(workload["spec"]["selector"]["matchLabels"], _pod_labels(workload))
        assert _pod_labels(workload)["app.kubernetes.io/name"] == "sla-gateway"
    assert _pod_labels(dispatcher)["app.kubernetes.io/component"] == "dispatcher"
    assert _pod_labels(worker)["app.kubernetes.io/component"] == "worker"


def test_tokens_come_from_the_secret(dispatcher: dict[str, Any], worker: dict[str, Any]) -> None:
    secret = _one("Secret", "gateway-tokens")
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for workload, needed in (
        (dispatcher, {"GATEWAY_ADMIN_TOKEN", "GATEWAY_WORKER_TOKEN"}),
        (worker, {"GATEWAY_WORKER_TOKEN"}),
    ):
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in _container(workload)["env"] if "valueFrom" in e}
        assert needed <= set(env)
        for ref in env.values():
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys
    # Both roles must hold the same worker token.
    assert {
        e["valueFrom"]["secretKeyRef"]["key"]
        for w in (dispatcher, worker)
        for e in _container(w)["env"]
        if e["name"] == "GATEWAY_WORKER_TOKEN"
    } == {"worker-token"}


# -- the image -------------------------------------------------------------------------------------


def test_the_image_holds_the_configured_models(
    dispatcher: dict[str, Any], worker: dict[str, Any], config: dict[str, Any]
) -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    script = (EXAMPLES / "make_models.py").read_text()
    built = re.search(r"make_models\.py[^\n]*--out\s+(\S+)", dockerfile)
    assert built, "the Dockerfile does not build the models"
    model_dir = Path(config["server"]["model_dir"])
    assert Path(built.group(1)) == model_dir
    for name, table in config["models"].items():
        path = Path(table["path"])
        assert path.parent == model_dir, f"models.{name}.path is not in {model_dir}"
        assert re.search(rf'"{re.escape(path.stem)}(\.onnx)?"', script), f"make_models.py does not make {path.name}"
    if "ppocr_det" in config["models"]:
        assert "--no-ocr" not in dockerfile
    assert re.search(r'^ENTRYPOINT \["gateway"\]$', dockerfile, re.MULTILINE)
    # The dispatcher runs as the image's own user, the worker as root (cgroup files are root's).
    uid = re.search(r"useradd --uid (\d+)", dockerfile)
    assert uid and dispatcher["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid.group(1))
    assert _container(dispatcher)["image"] == _container(worker)["image"]
