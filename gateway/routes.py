"""Every route of the gateway's HTTP API, declared once, as data.

``gateway.server.build_app`` adds each to the aiohttp app (``handler`` names a method of its
``Handlers``); ``gateway.openapi.openapi_document`` builds the document's paths from the same
entries. A route is served and documented or neither (Starlette's routing.py declares routes
the same way). Which bearer token guards a path is one rule too, ``plane``, read by the
server's guard and by the document's ``security``.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.ui.assets import ASSETS
from gateway.ui.live import DEFAULT_SECONDS
from gateway.ui.series import SECONDS

Plane = Literal["admin", "data"]


def bearer_token_matches(authorization: bytes, token: str) -> bool:
    """Whether an Authorization value carries ``token``: ``Bearer TOKEN``, the scheme in any
    case and spaces around the token allowed (RFC 9110 11.1), read the same over HTTP and gRPC."""
    scheme, _, given = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token.encode())


def plane(path: str) -> Plane | None:
    """The token a path needs: the admin API the admin token, the data plane the data token.

    Health, /metrics and /openapi.json stay open: probes and scrapers must reach them. So do the
    live page /ui and its files: they hold no data, and the page asks /admin/live with the token.
    """
    if path.startswith(("/admin", "/v2/repository")):  # loading and unloading models is the admin's
        return "admin"
    if path.startswith("/v2") and not path.startswith("/v2/health"):
        return "data"
    return None


@dataclass(frozen=True)
class Reply:
    """One answer of a route, as the document shows it."""

    schema: str | dict[str, Any]  # a component of the document (gateway/openapi.py), or a schema
    says: str
    media_type: str = "application/json"


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # aiohttp's template: {name} is a path parameter
    handler: str  # the method of gateway.server.Handlers that answers it
    summary: str
    ok: Reply  # the 200 answer
    # Statuses answered with an Error body; a guarded route (plane) can also answer 401.
    errors: tuple[int, ...] = ()
    others: Mapping[int, Reply] = field(default_factory=dict)  # answers that are not an Error
    body: str | None = None  # the component of the JSON request body
    binary_body: bool = False  # the body may also be the binary tensor extension's
    headers: tuple[dict[str, Any], ...] = ()  # request headers, as OpenAPI parameters
    query: tuple[dict[str, Any], ...] = ()  # query parameters, as OpenAPI parameters

    @property
    def plane(self) -> Plane | None:
        return plane(self.path)


MODEL_STATE = Reply("ModelState", "the model")
# What an SLA set through the admin API may be, in ms (the server's check and the document's
# SetSla): under a microsecond is no response time the gateway can measure or meet, and over a
# day is no response time at all.
SLA_MS_RANGE = (0.001, 86_400_000.0)
MODEL_VERSION_PREFIXES = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
INFERENCE_HEADER = {
    "name": "Inference-Header-Content-Length",
    "in": "header",
    "required": False,
    "schema": {"type": "integer", "minimum": 1},
    "description": "binary tensor extension: length of the JSON header before the binary data",
}
ACCEPT_ENCODING = {
    "name": "Accept-Encoding",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "an answer of at least [server] compress_min_bytes (64 KiB by default) is compressed in "
    "the one of gzip and deflate this weighs highest (RFC 9110 12.5.3); Inference-Header-Content-Length "
    "then counts the header before compression",
}


def _model_routes(prefix: str) -> tuple[Route, ...]:
    """The KServe v2 model routes, served under a model's path with or without its version."""
    return (
        Route("GET", prefix, "model_metadata", "Model metadata", Reply("ModelMetadata", "inputs and outputs"), (404,)),
        Route("GET", prefix + "/ready", "model_ready", "Model readiness", Reply("Ready", "ready"), (404, 503)),
        Route(
            "GET",
            prefix + "/config",
            "model_config",
            "Triton model configuration (read by perf_analyzer)",
            Reply({"type": "object"}, "the configuration"),
            (404,),
        ),
        Route(
            "GET",
            prefix + "/stats",
            "model_stats",
            "Triton's statistics of the model since start (read by perf_analyzer)",
            Reply("ModelStats", "model_stats with the model's one entry"),
            (404,),
        ),
        Route(
            "POST",
            prefix + "/infer",
            "infer",
            "Inference",
            Reply("InferResponse", "the outputs"),
            (400, 404, 413, 429, 503, 504),
            body="InferRequest",
            binary_body=True,
            headers=(INFERENCE_HEADER, ACCEPT_ENCODING),
        ),
    )


LIVE_SECONDS = {
    "name": "seconds",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": SECONDS, "default": DEFAULT_SECONDS},
    "description": f"how many whole seconds before now (the series keep the last {SECONDS})",
}


ROUTES: tuple[Route, ...] = (
    Route("GET", "/openapi.json", "openapi", "This document", Reply({"type": "object"}, "OpenAPI 3.0")),
    # -- KServe v2 / Open Inference Protocol ---------------------------------------------------
    Route("GET", "/v2", "server_metadata", "Server metadata", Reply("ServerMetadata", "name, version, extensions")),
    Route("GET", "/v2/health/live", "live", "Liveness", Reply("Live", "live")),
    Route(
        "GET",
        "/v2/health/ready",
        "ready",
        "Readiness (false while starting or draining)",
        Reply("Ready", "ready"),
        others={503: Reply("Ready", "not ready")},
    ),
    # Before the model routes: "stats" is no model name here (aiohttp matches in order).
    Route(
        "GET",
        "/v2/models/stats",
        "all_model_stats",
        "Triton's statistics of every model since start",
        Reply("ModelStats", "model_stats, one entry a model"),
    ),
    *(route for prefix in MODEL_VERSION_PREFIXES for route in _model_routes(prefix)),
    # -- Triton's model repository extension (the admin token where one is set) ----------------
    Route(
        "POST",
        "/v2/repository/index",
        "repository_index",
        "The models of the config and of model_dir's repository, with their states",
        Reply({"type": "array", "items": {"type": "object"}}, "name, version, state, reason of each model"),
        (400,),
    ),
    Route(
        "POST",
        "/v2/repository/models/{model}/load",
        "repository_load",
        "Load (or reload) a model: its executor started and profiled, then served",
        Reply({"type": "object"}, "empty once the model is ready"),
        (400, 404),
    ),
    Route(
        "POST",
        "/v2/repository/models/{model}/unload",
        "repository_unload",
        "Unload a model: new requests 404, those accepted finish, its executor stops",
        Reply({"type": "object"}, "empty once unloaded"),
        (400, 404),
    ),
    # -- the gateway's own ----------------------------------------------------------------------
    Route("GET", "/metrics", "metrics", "Prometheus metrics", Reply({"type": "string"}, "text exposition", "text/plain")),
    Route("GET", "/admin/models", "admin_models", "Every model's state", Reply({"type": "object"}, "models")),
    Route(
        "GET", "/admin/models/{model}", "admin_model", "A model's SLA, executors, profiles and statistics", MODEL_STATE, (404,)
    ),
    Route(
        "GET",
        "/admin/models/{model}/history",
        "admin_history",
        "One entry per control period",
        Reply({"type": "object"}, "the history"),
        (404,),
    ),
    Route(
        "PUT",
        "/admin/models/{model}/sla",
        "admin_set_sla",
        "Change the model's SLA at run time",
        MODEL_STATE,
        (400, 404),
        body="SetSla",
    ),
    Route(
        "PUT",
        "/admin/models/{model}/cores",
        "admin_pin_cores",
        "Pin the model's cores, or hand them back to the controller with null",
        MODEL_STATE,
        (400, 404),
        body="PinCores",
    ),
    Route(
        "PUT",
        "/admin/models/{model}/dispatch_batch",
        "admin_set_dispatch_batch",
        "Change the model's planned CPU batch size at run time (what `gateway plan` chooses)",
        MODEL_STATE,
        (400, 404),
        body="SetDispatchBatch",
    ),
    Route(
        "PUT",
        "/admin/models/{model}/replicas",
        "admin_set_replicas",
        "A dispatcher's replicas of the model: how many workers run its CPU executor (null: every one)",
        MODEL_STATE,
        (400, 404),
        body="SetReplicas",
    ),
    Route(
        "GET",
        "/admin/live",
        "admin_live",
        "Per-second series of every model (response time, SLA, load, cores, queue, batches), the node and its GPUs",
        Reply({"type": "object"}, "the series, one value per second, null where a second had nothing to measure"),
        (400,),
        query=(LIVE_SECONDS,),
    ),
    # -- the live page: the page and its files hold no data (open); it reads /admin/live -------
    Route("GET", "/ui", "ui_page", "The live page", Reply({"type": "string"}, "the page", "text/html")),
    *(
        Route("GET", f"/ui/{name}", "ui_asset", f"The live page's {name}", Reply({"type": "string"}, name, media_type))
        for name, media_type in ASSETS.items()
    ),
    Route("GET", "/admin/node", "admin_node", "The node's cores and control settings", Reply({"type": "object"}, "the node")),
    Route(
        "GET",
        "/admin/cluster",
        "admin_cluster",
        "A dispatcher's workers and replicas (400 on a gateway that serves alone)",
        Reply({"type": "object"}, "workers"),
        (400,),
    ),
)


# Triton's extensions this gateway does not serve: what each is, what to do instead, the paths of
# its HTTP routes and the names of its gRPC methods. Both protocols refuse them with the reason
# (HTTP 501, gRPC UNIMPLEMENTED), where HTTP answered a bare 404 "Not Found" and perf_analyzer
# printed only "Unable to init infer data manager: Not Found".
@dataclass(frozen=True)
class NotServed:
    what: str
    instead: str
    http_paths: str  # a regular expression of the paths
    grpc_methods: tuple[str, ...]

    @property
    def reason(self) -> str:
        return f"{self.what} is not served by this gateway: {self.instead}"


IN_THE_REQUEST = "tensors travel in the request"
NOT_SERVED = (
    NotServed(
        "CUDA shared memory",
        IN_THE_REQUEST,
        r"/v2/cudasharedmemory(/.*)?",
        ("CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister"),
    ),
    NotServed(
        "system shared memory",
        IN_THE_REQUEST,
        r"/v2/systemsharedmemory(/.*)?",
        ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister"),
    ),
    NotServed(
        "Triton's trace settings",
        "traces go to OpenTelemetry ([tracing] in the config)",
        r"/v2(/models/[^/]+(/versions/[^/]+)?)?/trace/setting",
        ("TraceSetting",),
    ),
    NotServed(
        "Triton's log settings", "logs are set by gateway serve's --log-format and --access-log", r"/v2/logging", ("LogSettings",)
    ),
)


def not_served_reason(path: str) -> str | None:
    """Why a path of Triton's HTTP API that this gateway has no route for is not served, or None."""
    return next((entry.reason for entry in NOT_SERVED if re.fullmatch(entry.http_paths, path)), None)
