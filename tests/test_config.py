"""Config errors name the file, the key and the problem, and stop `gateway serve` before it starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib

import pytest

from gateway.config import ConfigError, json_schema, load_config
from tests.helpers import ROOT


def _write(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_example_config_loads(example_models):
    config = load_config(ROOT / "examples" / "config.toml")
    assert set(config.models) == {"mlp", "cnn_small", "cnn_large", "ppocr_det"}
    assert config.models["mlp"].sla_ms == 20 and config.models["mlp"].cpu.cores == 1.0
    assert config.server.host == "127.0.0.1"


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[models.m]\npath = 'mlp.onnx'\n", "models.m.sla_ms", "is required"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = -3\n", "models.m.sla_ms", "positive"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 'fast'\n", "models.m.sla_ms", "must be a number"),
        ("[models.m]\npath = 'missing.onnx'\nsla_ms = 10\n", "models.m.path", "no ONNX file"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\nmax_batch = 4\n", "models.m.max_batch", "unknown key"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu = { cores = 0 }\n", "models.m.cpu.cores", "positive"),
        # A period shorter than a control step: the loop never waited, and the gateway never served.
        ("[control]\nperiod_s = 1e-9\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "control.period_s", "at least 0.01"),
        ("[server]\nport = 70000\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "server.port", "0-65535"),
        ("[node]\ncpu_cores = 2\n", "models", "at least one model"),
        ("[policy]\ncpu_scheduler = 'fifo'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "policy.cpu_scheduler", "unknown"),
        ("[models.m\n", "(syntax)", ""),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = true\n", "models.m.sla_ms", "must be a number, got a boolean"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = inf\n", "models.m.sla_ms", "positive"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 1979-05-27\n", "models.m.sla_ms", "a date"),
        ("[models.'a b']\npath = 'mlp.onnx'\nsla_ms = 10\n", "models.a b", "letters, digits"),
        ("[control]\nsetpoint_ratio = 1.5\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "control.setpoint_ratio", "(0, 1]"),
        ("[control]\nactuator = 'x'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "control.actuator", "known: auto, cgroup"),
        ("[node]\ngpus = [0, 0]\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "node.gpus", "distinct"),
        ("[node]\ngpus = [true]\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "node.gpus[0]", "an integer"),
        ("[server]\nbogus = 1\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "server.bogus", "known: admin_token"),
        (
            "[node]\ncpu_cores = 2\n[control]\nreserved_cores = 2\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n",
            "control.reserved_cores",
            "under node.cpu_cores",
        ),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu = { cores = 3, max_cores = 2 }\n", "models.m.cpu.cores", "min_cores"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu_executor = false\n", "models.m.cpu_executor", "needs GPUs (node.gpus)"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu_executor = 0\n", "models.m.cpu_executor", "must be true or false"),
        (
            "[node]\ngpus = [0]\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu_executor = false\ncpu = { cores = 1 }\n",
            "models.m.cpu",
            "no CPU executor",
        ),
        (
            "[node]\ngpus = [0]\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu_executor = false\nplant = { gain = 2 }\n",
            "models.m.plant",
            "no CPU executor",
        ),
        ("[worker]\nlisten = '0.0.0.0'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "worker.listen", "HOST:PORT"),
        (
            "[cluster]\nworkers = 'workers:7070'\ntoken = '0123456789abcdef'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n",
            "cluster.workers",
            "dns:",
        ),
        (
            "[cluster]\nworkers = ['10.0.0.2:7070']\ntoken = 'short'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n",
            "cluster.token",
            "at least 16 characters",
        ),
        (
            "[cluster]\nworkers = ['10.0.0.2:7070']\nplacement = 'spread'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n",
            "cluster.placement",
            "balance",
        ),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\nreplicas = 0\n", "models.m.replicas", "0"),
        ("[worker]\ntls_cert = 'mlp.onnx'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n", "worker.tls_key", "both"),
        (
            "[worker]\ntls_cert = 'mlp.onnx'\ntls_key = 'mlp.onnx'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n",
            "worker.tls_cert",
            "cannot load",
        ),
        (
            "[cluster]\nworkers = ['10.0.0.2:7070']\ntoken = '0123456789abcdef'\ntls_ca = 'none.pem'\n"
            "[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n",
            "cluster.tls_ca",
            "cannot read CA certificates",
        ),
        # Each of these was accepted, then failed at start or at run time (a traceback, an
        # executor of 100,000 threads, a model no URL reaches, a pin the admin API refuses).
        ("[models.'.']\npath = 'mlp.onnx'\nsla_ms = 10\n", "models..", "dots only"),
        ("[models.'..']\npath = 'mlp.onnx'\nsla_ms = 10\n", "models...", "dots only"),
        (f"[models.{'m' * 65}]\npath = 'mlp.onnx'\nsla_ms = 10\n", f"models.{'m' * 65}", "at most 64 characters"),
        ('[models.m]\npath = "ml\\u0000p.onnx"\nsla_ms = 10\n', "models.m.path", "NUL"),
        # Paths no file can have were a traceback and exit 1, not a config error.
        ('[server]\nmodel_dir = "a\\u0000b"\n[models.m]\npath = "mlp.onnx"\nsla_ms = 10\n', "server.model_dir", "NUL"),
        (f"[models.m]\npath = '{'a' * 300}.onnx'\nsla_ms = 10\n", "models.m.path", "cannot be read"),
        ("[models.m]\npath = 'loop.onnx'\nsla_ms = 10\n", "models.m.path", "cannot be resolved"),
        (
            '[node]\ngpus = [0]\n[gpu]\nexecutor = "emulated"\nprofile = "a\\u0000b.csv"\n'
            '[models.m]\npath = "mlp.onnx"\nsla_ms = 10\n',
            "gpu.profile",
            "cannot read",
        ),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu = { threads = 100000 }\n", "models.m.cpu.threads", "256"),
        (
            "[node]\ncpu_cores = 1\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu = { cores = 1, max_cores = 8 }\n",
            "models.m.cpu.max_cores",
            "over the node's 1 cores",
        ),
        (
            "[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\nmax_batch_size = 4\ndispatch_batch = 8\n",
            "models.m.dispatch_batch",
            "over max_batch_size (4)",
        ),
        # A traceback at load (an overflow in equation (12)), and a name whose metadata URL is
        # Triton's statistics of every model.
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\nplant = { zero = -1e308 }\n", "models.m.plant", "no finite gain"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\nplant = { gain = 1e-310 }\n", "models.m.plant", "no finite gain"),
        ("[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\nplant = { pole = 1.0 }\n", "models.m.plant.pole", "in [0, 1)"),
        ("[models.stats]\npath = 'mlp.onnx'\nsla_ms = 10\n", "models.stats", "every model's statistics"),
        # pydantic's names of a choice's branches, and a too-short list beside its refused item.
        (
            "[cluster]\nworkers = ['nohost']\ntoken = '0123456789abcdef'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n",
            "cluster.workers[0]",
            "must be HOST:PORT",
        ),
    ],
)
def test_config_errors_name_file_and_key(tmp_models, text, key, words):
    if not (tmp_models / "loop.onnx").is_symlink():
        (tmp_models / "loop.onnx").symlink_to("loop.onnx")  # a link to itself
    _assert_refused(tmp_models, text, key, words)


def _assert_refused(tmp_models, text: str, key: str, words: str) -> None:
    path = _write(tmp_models, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}:")
    assert words in message


def test_every_problem_of_a_file_is_named_at_once(tmp_models):
    path = _write(tmp_models, "[server]\nport = 70000\nhost = 3\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 'x'\nmax_batch = 4\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).splitlines() == [
        f"{path}: server.host: must be a string, got int 3",
        f"{path}: server.port: must be 0-65535, got 70000",
        f"{path}: models.m.sla_ms: must be a number, got str 'x'",
        f"{path}: models.m.max_batch: unknown key (known: cpu, cpu_executor, default_priority, dispatch_batch, drop_late, "
        "gpu_profile, hang_timeout_ms, max_batch_size, max_queue_size, path, plant, priority_bound_ms, priority_levels, "
        "replicas, sla_measure, sla_ms, sla_percentile)",
    ]
    assert caught.value.key == "server.host"


def test_every_model_has_a_cpu_executor_unless_told_otherwise(tmp_models):
    path = _write(tmp_models, "[node]\ncpu_cores = 3\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n")
    assert load_config(path).models["m"].cpu is not None
    assert json_schema()["$defs"]["ModelTable"]["properties"]["cpu_executor"]["default"] is True


def test_a_gpu_only_model_has_no_cpu_executor_and_no_share_of_the_nodes_cores(tmp_models):
    """The node's cores are split over the models with a CPU executor only."""
    models = "".join(f"[models.{name}]\npath = 'mlp.onnx'\nsla_ms = 10\n" for name in ("a", "b"))
    path = _write(
        tmp_models,
        f"[node]\ncpu_cores = 3\ngpus = [0]\n{models}[models.g]\npath = 'mlp.onnx'\nsla_ms = 10\ncpu_executor = false\n",
    )
    config = load_config(path)
    assert config.models["g"].cpu is None
    assert config.models["a"].cpu is not None and config.models["a"].cpu.cores == 1.5
    assert config.models["b"].cpu is not None and config.models["b"].cpu.cores == 1.5


def test_config_schema_command_describes_the_file(tmp_models):
    """`gateway config-schema` prints a JSON Schema that the example config meets and a wrong one does not."""
    import jsonschema_rs

    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "config-schema"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema["$schema"].endswith("2020-12/schema") and schema["required"] == ["models"]
    tables = {"server", "node", "gpu", "docker", "policy", "control", "worker", "cluster", "tracing", "models", "pipelines"}
    assert tables == set(schema["properties"])
    sla = schema["$defs"]["ModelTable"]["properties"]["sla_ms"]
    assert sla["exclusiveMinimum"] == 0 and "SLA" in sla["description"]
    validator = jsonschema_rs.validator_for(schema)
    assert validator.is_valid(tomllib.loads((ROOT / "examples" / "config.toml").read_text()))
    for wrong in ("[models.m]\npath = 'm.onnx'\nsla_ms = 'soon'\n", "[models.m]\npath = 'm.onnx'\nsla_ms = 1\nmax_batch = 4\n"):
        assert not validator.is_valid(tomllib.loads(wrong))


@pytest.mark.parametrize("name", ["a b", "..", ".", "x/y"])
def test_the_schema_refuses_a_model_or_pipeline_name_that_the_loader_refuses(name, tmp_models):
    """Such a name's table was checked against nothing (any body passed), and one of dots only
    matched the name's pattern: now the name itself is refused, as the loader refuses it."""
    import jsonschema_rs

    validator = jsonschema_rs.validator_for(json_schema())
    model = {"path": "mlp.onnx", "sla_ms": 20}
    pipeline = tomllib.loads((ROOT / "examples" / "ocr.toml").read_text())["pipelines"]["ocr"]
    assert validator.is_valid({"models": {"m": model}, "pipelines": {"ocr": pipeline}})
    assert not validator.is_valid({"models": {"m": model, name: model}})
    assert not validator.is_valid({"models": {"m": model, name: {"foo": "bar"}}})
    assert not validator.is_valid({"models": {"m": model}, "pipelines": {name: pipeline}})
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_models, f"[models.{json.dumps(name)}]\npath = 'mlp.onnx'\nsla_ms = 20\n"))
    assert caught.value.key == f"models.{name}"


def test_the_schema_takes_a_name_at_the_edge_of_the_rule(tmp_models):
    import jsonschema_rs

    validator = jsonschema_rs.validator_for(json_schema())
    edge, model = "v1.2-" + "m" * 59, {"path": "mlp.onnx", "sla_ms": 20}  # 64 characters, dots among others
    assert validator.is_valid({"models": {edge: model}})
    assert not validator.is_valid({"models": {edge + "m": model}})
    assert edge in load_config(_write(tmp_models, f"[models.{json.dumps(edge)}]\npath = 'mlp.onnx'\nsla_ms = 20\n")).models


def test_a_pipeline_of_dots_only_is_refused_as_a_model_is(tmp_path, example_models):
    """A pipeline is served as a model of its name, which no URL carries when it is dots only."""
    shutil.copy(ROOT / "examples" / "ocr.py", tmp_path / "ocr.py")
    text = (ROOT / "examples" / "ocr.toml").read_text().replace('"models/', f'"{example_models}/')
    text = text.replace("[server]", f'[server]\nmodel_dir = "{example_models}"', 1)
    assert load_config(_write(tmp_path, text)).pipelines
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text.replace("[pipelines.ocr]", '[pipelines.".."]')))
    assert "'..' is no name a URL can carry" in str(caught.value)


def test_serve_exits_nonzero_on_config_error(tmp_models):
    path = _write(tmp_models, "[models.m]\npath = 'mlp.onnx'\nsla_ms = 'soon'\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode != 0
    assert f"{path}: models.m.sla_ms: must be a number" in done.stderr


def test_serve_exits_nonzero_when_a_model_does_not_load(tmp_path):
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx file")
    path = _write(tmp_path, "[models.broken]\npath = 'broken.onnx'\nsla_ms = 10\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 1
    assert "executor cpu-broken failed to start" in done.stderr


GPU_CONFIG = "[node]\ngpus = [0]\n[gpu]\nexecutor = 'emulated'\nprofile = 'zoo.csv'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n"


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ("model,alpha_ms,beta_ms\nm,1\n", "row 'm': beta_ms is missing"),
        ("model,alpha_ms,beta_ms\nm,nan,nan\n", "row 'm': alpha_ms is 'nan', not a finite number of at least 0"),
        ("model,alpha_ms,beta_ms\nm,-1,-50\n", "row 'm': alpha_ms is '-1'"),
        ("model,alpha_ms,beta_ms,memory_mb,load_ms\nm,1,2,-5,3\n", "row 'm': memory_mb is '-5'"),
        ("alpha_ms,beta_ms\n1,2\n", "needs the columns model, alpha_ms, beta_ms"),
        (None, "cannot read"),  # the profile is a folder
    ],
)
def test_an_emulated_gpus_profile_is_checked_row_by_row(tmp_models, rows, words):
    if rows is None:
        (tmp_models / "zoo.csv").mkdir()
    else:
        (tmp_models / "zoo.csv").write_text(rows)
    _assert_refused(tmp_models, GPU_CONFIG, "gpu.profile", words)


def test_a_pipeline_step_whose_model_is_not_onnx_is_named(tmp_models):
    (tmp_models / "junk.onnx").write_bytes(b"this is not a protobuf at all \xff\xfe")
    text = (
        "[models.m]\npath = 'junk.onnx'\nsla_ms = 10\n"
        "[pipelines.p]\nsla_ms = 100\ninputs = [{ name = 'x', datatype = 'FP32', shape = [-1, 512] }]\n"
        "outputs = [{ name = 'y', datatype = 'FP32', shape = [-1, 512], source = 's/y' }]\n"
        "steps = [{ name = 's', model = 'm', inputs = { x = 'request/x' } }]\n"
    )
    _assert_refused(tmp_models, text, "models.m.path", "is not an ONNX model")


def test_a_choice_or_a_refused_item_is_named_once_in_the_files_words(tmp_models):
    """``workers = ["nohost"]`` named pydantic's branches (``cluster.workers.str``, ``tuple[function-
    after[...]]``), and a step's bad name added a false "steps: at least 1 item"."""
    path = _write(
        tmp_models,
        "[cluster]\nworkers = ['nohost']\ntoken = '0123456789abcdef'\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n"
        "[pipelines.p]\nsla_ms = 1\ninputs = [{name = 'a', datatype = 'FP32', shape = [1]}]\n"
        "outputs = [{name = 'b', datatype = 'FP32', shape = [1], source = 's/y'}]\n"
        "steps = [{name = '1s', model = 'm', inputs = {x = 'request/a'}}]\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    keys = [line.split(": ")[1] for line in str(caught.value).splitlines()]
    assert keys == ["cluster.workers[0]", "pipelines.p.steps[0].name"], str(caught.value)


@pytest.mark.parametrize("variable", ["GATEWAY_DATA_TOKEN", "GATEWAY_ADMIN_TOKEN", "GATEWAY_WORKER_TOKEN"])
def test_a_token_is_read_without_the_whitespace_around_it(tmp_models, monkeypatch, variable):
    """A secret file ends in a newline: the token held it, a header's value never does (RFC 9110
    5.5), and every HTTP client got 401 whatever it sent."""
    monkeypatch.setenv(variable, "s3cret-token-0123456789\n")
    config = load_config(
        _write(tmp_models, "[server]\nadmin_token = ' a\t'\ndata_token = 'd '\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n")
    )
    tokens = {
        "GATEWAY_DATA_TOKEN": config.server.data_token,
        "GATEWAY_ADMIN_TOKEN": config.server.admin_token,
        "GATEWAY_WORKER_TOKEN": config.worker.token,
    }
    assert tokens.pop(variable) == "s3cret-token-0123456789"
    assert set(tokens.values()) <= {"a", "d", None}


def test_the_default_threads_are_held_to_the_cap(tmp_models):
    """node.cpu_cores = 300 gave each executor 300 intra-op threads; 1e300 a traceback in the executor."""
    for cores in ("300", "1e300"):
        config = load_config(_write(tmp_models, f"[node]\ncpu_cores = {cores}\n[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n"))
        assert config.models["m"].cpu.threads == 256


@pytest.mark.parametrize("kind", ["directory", "not UTF-8"])
def test_a_config_that_is_no_text_file_is_refused_without_a_traceback(tmp_path, kind):
    path = tmp_path / "config.toml"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"[models.m]\npath = '\xff.onnx'\n")
    for command in ("serve", "worker"):
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", command, str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"{path}: (file): " in done.stderr


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (["serve", "--port", "86936"], "--port: must be a port number from 0 to 65535, got 86936"),
        (["serve", "--grpc-port", "-1"], "--grpc-port: must be a port number from 0 to 65535, got -1"),
        (["worker", "--http-port", "70000"], "--http-port: must be a port number from 0 to 65535, got 70000"),
        (["worker", "--listen", "nope"], "--listen: must be HOST:PORT"),
    ],
)
def test_a_port_given_on_the_command_line_is_checked_as_the_configs_are(tmp_models, arguments, words):
    """--port 86936 was served on 21400 (the kernel keeps 16 bits); --listen nope and --http-port
    70000 ended a worker in a traceback."""
    path = _write(tmp_models, "[models.m]\npath = 'mlp.onnx'\nsla_ms = 10\n")
    command, *options = arguments
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", command, str(path), *options], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert words in done.stderr


def test_the_schema_refuses_what_the_loader_refuses_of_one_key():
    """These passed the schema (an editor's check) and were refused by the loader."""
    import jsonschema_rs

    validator = jsonschema_rs.validator_for(json_schema())
    model = {"m": {"path": "mlp.onnx", "sla_ms": 20}}
    assert validator.is_valid({"models": model, "worker": {"listen": "0.0.0.0:7070"}, "node": {"gpus": [0, 1]}})
    for wrong in (
        {"node": {"gpus": [0, 0]}},
        {"worker": {"listen": "nope"}},
        {"cluster": {"workers": ["a:1"], "dns_server": "x"}},
        {"tracing": {"otlp_endpoint": "ftp://x"}},
        {"models": {"m": {"path": "mlp.onnx", "sla_ms": 20, "plant": {"pole": 1.0}}}},
        {"models": {"stats": {"path": "mlp.onnx", "sla_ms": 20}}},
    ):
        assert not validator.is_valid({"models": model, **wrong}), wrong
