"""Triton's model repository extension: the models under ``server.model_dir`` that may be loaded
at run time, beside those of the config (explicit model control: nothing under the folder is
loaded until asked).

A repository model is a folder ``model_dir/NAME`` holding either ``config.toml`` (the keys of a
``[models.NAME]`` table, ``path`` relative to that folder) or versions ``VERSION/model.onnx``
(whole numbers; the highest is served, with the defaults for the rest). A load may override the
config with a JSON object of the same keys (Triton's ``parameters.config``); an unknown key or
a bad value is refused naming it, as a config file's would be.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError

from gateway.config import ConfigError, GatewayConfig, ModelConfig
from gateway.config.loading import _check_url_name, _file_adapter, _model, _problem, _reject_dates
from gateway.engine import PIPELINE_FIXED
from gateway.protocol import InvalidRequest

if TYPE_CHECKING:
    from gateway.engine import Engine

log = logging.getLogger("gateway")

CONFIG_FILE = "config.toml"
MODEL_FILE = "model.onnx"
# Triton's model states in the repository index.
READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass(frozen=True)
class RepositoryModel:
    """A model found under model_dir: its folder, its config file if any, its latest version."""

    name: str
    folder: Path
    versions: tuple[str, ...]  # its version folders, lowest first (none: a config.toml names the file)

    @property
    def version(self) -> str:
        return self.versions[-1] if self.versions else "1"

    def table(self, version: str | None = None) -> dict[str, Any]:
        """The model's [models.NAME] keys: its config.toml, or a version's file (the latest by default)."""
        config_file = self.folder / CONFIG_FILE
        if config_file.is_file():
            try:
                table = tomllib.loads(config_file.read_text())
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as error:  # not UTF-8: a 500 before
                raise InvalidRequest(f"model '{self.name}': {config_file}: {error}") from None
            if isinstance(table.get("path"), str) and not Path(table["path"]).is_absolute():
                table["path"] = str(self.folder / table["path"])
            return table
        return {"path": str(self.folder / (version or self.version) / MODEL_FILE), "sla_ms": 100.0}


def scan(model_dir: Path | None) -> dict[str, RepositoryModel]:
    """The repository models under ``model_dir``, by name."""
    found: dict[str, RepositoryModel] = {}
    if model_dir is None or not model_dir.is_dir():
        return found
    for folder in sorted(p for p in model_dir.iterdir() if p.is_dir()):
        # A version is a folder named by a whole number as written in ASCII: "²" passes isdigit()
        # and not int() (every index and load was a 500), "١" read as 1 and was never found, and
        # "01" shadowed "1".
        versions = sorted(int(v.name) for v in folder.iterdir() if _version_name(v.name) and (v / MODEL_FILE).is_file())
        if (folder / CONFIG_FILE).is_file():
            found[folder.name] = RepositoryModel(folder.name, folder, ())
        elif versions:
            found[folder.name] = RepositoryModel(folder.name, folder, tuple(str(v) for v in versions))
    return found


def _version_name(name: str) -> bool:
    return name.isascii() and name.isdigit() and str(int(name)) == name


def parse_override(text: object) -> dict[str, Any]:
    """Triton's ``parameters.config``: a JSON object (as a string) of the model's config keys."""
    if text is None:
        return {}
    if not isinstance(text, str):
        raise InvalidRequest("parameter 'config' must be a string holding a JSON object of the model's config keys")
    try:
        # orjson, as for a body (gateway/server.py): json.loads raises RecursionError, a 500, on
        # nesting deeper than the interpreter's stack.
        value = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise InvalidRequest(f"parameter 'config' is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("parameter 'config' must hold a JSON object of the model's config keys")
    # Triton's own name for the name is not a setting here: the path names the model.
    value.pop("name", None)
    if "path" in value:  # the API names models, never files: a model's file is its folder's
        raise InvalidRequest(
            "parameter 'config': 'path' cannot be overridden; a repository model's file is in its folder under server.model_dir"
        )
    return value


def model_config(config: GatewayConfig, name: str, table: dict[str, Any]) -> ModelConfig:
    """``table`` checked as a [models.NAME] table of ``config``'s file would be: a 400 naming the
    key where it is wrong."""
    try:
        # A TOML date (a model's config.toml) is no JSON value: json.dumps raised, a 500.
        _reject_dates(config.source, table, f"models.{name}")
    except ConfigError as error:
        raise _as_request_error(error) from None
    try:
        # As a file of that one table: the problems are worded as a config file's.
        checked = _file_adapter().validate_json(json.dumps({"models": {name: table}}), strict=True).models[name]
    except ValidationError as error:
        key, problem = _problem(error.errors(include_url=False)[0])
        raise InvalidRequest(f"model config: {key}: {problem}") from None
    cpu_models = sum(m.cpu is not None for m in config.models.values()) + 1
    try:
        default_cores = config.node.cpu_cores / cpu_models
        # Served by its CPU executor alone (Engine._load_model): an emulated GPU's profile has no say.
        return _model(config.source, name, checked, config.server, config.node, config.gpu, default_cores, on_gpus=False)
    except ConfigError as error:
        raise _as_request_error(error) from None


def _as_request_error(error: ConfigError) -> InvalidRequest:
    """A config file's error as the API's 400: the key and the problem, without the file's name."""
    return InvalidRequest(f"model config: {str(error).partition(': ')[2]}")


def repository_index(engine: Engine, ready_only: bool = False) -> list[dict[str, str]]:
    """Triton's index: every model of the config and of the repository, with its state (READY,
    UNLOADING, UNAVAILABLE with the reason), by name; ``ready_only``: the READY ones."""
    entries: dict[tuple[str, str], dict[str, str]] = {}
    served = {runtime.served_name for runtime in engine.models.values()}
    unloaded = {name: found.version for name, found in scan(engine.config.server.model_dir).items()}
    unloaded.update({name: "1" for name in engine.file_models if name not in unloaded})  # the config's, unloaded at run time
    for name, version in unloaded.items():
        if name not in served:
            # Triton's reason for a model whose load failed is the failure.
            reason = engine.load_failures.get(name, "unloaded")
            entries[name, version] = {"name": name, "version": version, "state": UNAVAILABLE, "reason": reason}
    for key, runtime in engine.models.items():
        state = UNLOADING if key in engine.unloading else READY if runtime.ready else UNAVAILABLE
        name, version = runtime.served_name, runtime.version
        entries[name, version] = {"name": name, "version": version, "state": state, "reason": ""}
    for name in engine.pipelines:  # served as models of the one version "1", as Triton lists its ensembles
        entries[name, "1"] = {"name": name, "version": "1", "state": READY, "reason": ""}
    listed = [entries[key] for key in sorted(entries, key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0))]
    return [e for e in listed if e["state"] == READY] if ready_only else listed


async def load_from_repository(engine: Engine, name: str, override_text: object, parameters: Iterable[str] = ()) -> None:
    """Load ``name`` (from the repository, or the config's own model again) with the config
    override of Triton's ``parameters.config``; a 404 for a model found nowhere. ``parameters``:
    the request's parameter names, where Triton's ``file:`` ones (a model's files sent in the
    request) are refused: they were ignored, and the model on disk was loaded as if they matched."""
    sent = sorted(p for p in parameters if p.startswith("file:"))
    if sent:
        raise InvalidRequest(
            f"parameter '{sent[0]}': model files sent in a load request are not accepted; "
            f"put the model under the repository (server.model_dir) as {name}/[VERSION/]model.onnx"
        )
    override = parse_override(override_text)
    found = scan(engine.config.server.model_dir).get(name)
    current = engine.models.get(name)
    if found is not None:
        table = found.table()
    elif current is not None or name in engine.file_models:
        model = current.config if current is not None else engine.file_models[name]
        # The SLA served: one the admin API set since (PUT /admin/models/NAME/sla) is kept.
        sla_ms = current.sla_ms if current is not None else model.sla_ms
        table = {"path": str(model.path), "sla_ms": sla_ms, "max_batch_size": model.max_batch_size}
    elif name in engine.pipelines:
        raise InvalidRequest(PIPELINE_FIXED.format(name=name))
    else:
        known = ", ".join(sorted({*scan(engine.config.server.model_dir), *engine.served_names(), *engine.file_models}))
        raise InvalidRequest(f"no model '{name}' in the repository ({engine.config.server.model_dir}); known: {known}", 404)
    try:
        await _load(engine, name, found, table, override)
    except InvalidRequest as error:
        # The model's own failure, the index's reason for it until it loads; not for one that a
        # failed reload left served (unloaded later, its reason is the unload).
        if error.status == 400 and name not in engine.served_names():
            engine.load_failures[name] = str(error)
        raise
    engine.load_failures.pop(name, None)


async def _load(
    engine: Engine, name: str, found: RepositoryModel | None, table: dict[str, Any], override: dict[str, Any]
) -> None:
    from executors.lifecycle import ExecutorStartError

    try:
        if found is not None and found.versions:
            # Every version side by side, each its own runtime (NAME.vN), served under NAME: the
            # name clients use is checked too ("stats" and "..." were loaded, checked as
            # "stats.v1" alone, and GET /v2/models/stats never reached the model).
            try:
                _check_url_name(engine.config.source, f"models.{name}", name)
            except ConfigError as error:
                raise _as_request_error(error) from None
            # Checked under the name the client knows, then keyed NAME.vN: checked as NAME.vN, a
            # name of 62 to 64 characters (valid) was refused as too long, under a key never written.
            configs = {
                v: dataclasses.replace(model_config(engine.config, name, {**found.table(v), **override}), name=f"{name}.v{v}")
                for v in found.versions
            }
            await engine.load_versions(name, configs)
        else:
            await engine.load_model(model_config(engine.config, name, {**table, **override}))
    except ExecutorStartError as error:
        # The executor's whole output (a traceback, the gateway's own paths) goes to the log; the
        # client gets what failed and ONNX Runtime's last word on it.
        log.warning("model '%s' failed to load: %s", name, error)
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        said = f"{lines[0]}: {lines[-1]}" if len(lines) > 1 else str(error)
        raise InvalidRequest(f"model '{name}' failed to load: {said}") from None
