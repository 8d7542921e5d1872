"""The OpenAPI 3.0 document of the gateway's whole HTTP API, served at /openapi.json.

The data plane is the KServe v2 / Open Inference Protocol (its REST document) with Triton's
model configuration and binary tensor extensions; the admin API, /metrics and this document
are the gateway's own. The paths come from the route table (gateway/routes.py), the schemas
of bodies and answers from here.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.routes import ROUTES, SLA_MS_RANGE, Reply, Route
from gateway.triton_stats import BATCH_STATS, INFERENCE_STATS

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]


# What an Error answer of each status means, in every operation that can give it.
ERRORS = {
    400: "a client mistake, named in the message",
    401: "the bearer token is missing or wrong",
    404: "no such model or version",
    408: "the body did not all arrive within the request timeout (the connection is closed)",
    413: "the body (a compressed one once inflated) or a tensor is over its limit",
    415: "a Content-Encoding other than gzip or deflate",
    417: "an Expect header other than 100-continue",
    429: "the model's queue is full; see Retry-After",
    503: "not ready, shutting down, refused before running, or the executor failed",
    504: "the request's timeout passed",
}
SECURITY = {"admin": [{"adminToken": []}], "data": [{"dataToken": []}]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _reply(reply: Reply) -> dict[str, Any]:
    schema = _ref(reply.schema) if isinstance(reply.schema, str) else reply.schema
    return {"description": reply.says, "content": {reply.media_type: {"schema": schema}}}


# Every request may name itself (gateway/observe.py); every response carries the name back.
REQUEST_ID = {
    "name": "X-Request-ID",
    "in": "header",
    "required": False,
    "description": "names the request in the gateway's logs and traces (1-200 visible ASCII characters; "
    "else the gateway names it); the response's X-Request-ID carries the name back",
    "schema": {"type": "string"},
}


def _operation(route: Route) -> dict[str, Any]:
    """One route's operation: its path parameters, token, body and answers."""
    operation: dict[str, Any] = {"summary": route.summary}
    if route.plane is not None:
        operation["security"] = SECURITY[route.plane]
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", route.path)
    ] + [*route.headers, *route.query, REQUEST_ID]
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        content: dict[str, Any] = {"application/json": {"schema": _ref(route.body)}}
        if route.binary_body:
            content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
        operation["requestBody"] = {"required": True, "content": content}
    # Any request may carry an Expect header; any that reads a body may stall in it.
    reads_body = route.body is not None or route.path.startswith("/v2/repository")
    errors = sorted({*route.errors, *([401] if route.plane is not None else []), 417, *([408, 415] if reads_body else [])})
    operation["responses"] = {
        "200": _reply(route.ok),
        **{str(status): _reply(Reply("Error", ERRORS[status])) for status in errors},
        **{str(status): _reply(reply) for status, reply in route.others.items()},
    }
    return operation


def paths(routes: tuple[Route, ...] = ROUTES) -> dict[str, Any]:
    """The document's paths: one operation per route of the table."""
    built: dict[str, Any] = {}
    for route in routes:
        built.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return built


def openapi_document(version: str) -> dict[str, Any]:
    scalar = {"oneOf": [{"type": "number"}, {"type": "boolean"}, {"type": "string"}]}
    tensor_data = {"type": "array", "items": {}, "description": "row-major values, flat or nested by the shape"}
    schemas: dict[str, Any] = {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "Ready": {"type": "object", "properties": {"ready": {"type": "boolean"}, "name": {"type": "string"}}},
        "Live": {"type": "object", "properties": {"live": {"type": "boolean"}}},
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "TensorMetadata": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string", "enum": DATATYPES},
                "shape": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("TensorMetadata")},
                "outputs": {"type": "array", "items": _ref("TensorMetadata")},
            },
        },
        "InferInput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "datatype": {"type": "string", "enum": DATATYPES},
                "parameters": {
                    "type": "object",
                    "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
                    "additionalProperties": scalar,
                },
                "data": tensor_data,
            },
        },
        "InferRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": {
                    "type": "object",
                    "properties": {
                        "timeout": {"type": "integer", "minimum": 0, "description": "microseconds, as Triton"},
                        "binary_data_output": {"type": "boolean"},
                    },
                    "additionalProperties": scalar,
                },
                "inputs": {"type": "array", "minItems": 1, "items": _ref("InferInput")},
                "outputs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
                    },
                },
            },
        },
        "InferResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "parameters": {
                    "type": "object",
                    "description": "executed_on, executor, batch_size, queue_ms, compute_ms",
                },
                "outputs": {"type": "array", "items": {"type": "object"}},
            },
        },
        "SetSla": {
            "type": "object",
            "required": ["sla_ms"],
            "properties": {"sla_ms": {"type": "number", "minimum": SLA_MS_RANGE[0], "maximum": SLA_MS_RANGE[1]}},
        },
        "PinCores": {
            "type": "object",
            "required": ["cores"],
            "properties": {
                "cores": {
                    "type": "number",
                    "nullable": True,
                    "exclusiveMinimum": True,
                    "minimum": 0,
                    "description": "at most the node's cores (node.cpu_cores); null hands them back to the policy",
                }
            },
        },
        "SetReplicas": {
            "type": "object",
            "required": ["replicas"],
            "properties": {
                "replicas": {
                    "type": "integer",
                    "nullable": True,
                    "minimum": 1,
                    "description": "workers that run the model's CPU executor; null: every worker that holds it",
                }
            },
        },
        "SetDispatchBatch": {
            "type": "object",
            "required": ["dispatch_batch"],
            "properties": {
                "dispatch_batch": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "rows a CPU batch waits for (batch-aware dispatch; 1: none), at most max_batch_size",
                }
            },
        },
        "ModelState": {"type": "object", "required": ["name", "sla_ms", "executors", "stats"]},
        # Triton's statistics extension (extension_statistics.md): $stats_model_response.
        "Duration": {
            "type": "object",
            "required": ["count", "ns"],
            "properties": {"count": {"type": "integer", "minimum": 0}, "ns": {"type": "integer", "minimum": 0}},
        },
        "ModelStat": {
            "type": "object",
            "required": ["name", "version", "last_inference", "inference_count", "execution_count", "inference_stats"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "last_inference": {"type": "integer", "description": "milliseconds since the epoch; 0: never"},
                "inference_count": {"type": "integer", "description": "rows of successful requests"},
                "execution_count": {"type": "integer", "description": "batches run"},
                "inference_stats": {
                    "type": "object",
                    "required": list(INFERENCE_STATS),
                    "properties": {name: {"$ref": "#/components/schemas/Duration"} for name in INFERENCE_STATS},
                },
                "batch_stats": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["batch_size", *BATCH_STATS],
                        "properties": {
                            "batch_size": {"type": "integer", "minimum": 1},
                            **{name: {"$ref": "#/components/schemas/Duration"} for name in BATCH_STATS},
                        },
                    },
                },
                "memory_usage": {"type": "array", "items": {"type": "object"}},
            },
        },
        "ModelStats": {
            "type": "object",
            "required": ["model_stats"],
            "properties": {"model_stats": {"type": "array", "items": {"$ref": "#/components/schemas/ModelStat"}}},
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "sla-gateway",
            "version": version,
            "description": "KServe v2 / Open Inference Protocol data plane, admin API and metrics of the SLA-aware gateway.",
        },
        "paths": paths(),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer", "description": "GATEWAY_ADMIN_TOKEN"},
                "dataToken": {"type": "http", "scheme": "bearer", "description": "GATEWAY_DATA_TOKEN, when set"},
            },
        },
    }
