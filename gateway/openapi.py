"""The OpenAPI 3.0 document of the gateway's whole HTTP API, served at /openapi.json.

The data plane is the KServe v2 / Open Inference Protocol (its REST document) with Triton's
model configuration and binary tensor extensions; the admin API, /metrics and this document
are the gateway's own.
"""

from __future__ import annotations

from typing import Any

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "a client mistake, named in the message",
        401: "the bearer token is missing or wrong",
        404: "no such model or version",
        413: "the body or a tensor is over its limit",
        429: "the model's queue is full; see Retry-After",
        503: "not ready, shutting down, refused before running, or the executor failed",
        504: "the request's timeout passed",
    }
    return {str(s): _json(_ref("Error"), meaning[s]) for s in statuses}


MODEL = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
ADMIN = [{"adminToken": []}]
DATA = [{"dataToken": []}]


def _model_paths(prefix: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        prefix: {
            "get": {
                "summary": "Model metadata",
                "security": DATA,
                "parameters": parameters,
                "responses": {"200": _json(_ref("ModelMetadata"), "inputs and outputs"), **_errors(401, 404)},
            }
        },
        prefix + "/ready": {
            "get": {
                "summary": "Model readiness",
                "security": DATA,
                "parameters": parameters,
                "responses": {"200": _json(_ref("Ready"), "ready"), **_errors(401, 404, 503)},
            }
        },
        prefix + "/config": {
            "get": {
                "summary": "Triton model configuration (read by perf_analyzer)",
                "security": DATA,
                "parameters": parameters,
                "responses": {"200": _json({"type": "object"}, "the configuration"), **_errors(401, 404)},
            }
        },
        prefix + "/infer": {
            "post": {
                "summary": "Inference",
                "security": DATA,
                "parameters": parameters
                + [
                    {
                        "name": "Inference-Header-Content-Length",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1},
                        "description": "binary tensor extension: length of the JSON header before the binary data",
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": _ref("InferRequest")},
                        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                    },
                },
                "responses": {
                    "200": _json(_ref("InferResponse"), "the outputs"),
                    **_errors(400, 401, 404, 413, 429, 503, 504),
                },
            }
        },
    }


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
                    "description": "executed_on, batch_size, queue_ms, compute_ms",
                },
                "outputs": {"type": "array", "items": {"type": "object"}},
            },
        },
        "SetSla": {
            "type": "object",
            "required": ["sla_ms"],
            "properties": {"sla_ms": {"type": "number", "exclusiveMinimum": True, "minimum": 0}},
        },
        "PinCores": {
            "type": "object",
            "required": ["cores"],
            "properties": {"cores": {"type": "number", "nullable": True, "exclusiveMinimum": True, "minimum": 0}},
        },
        "ModelState": {"type": "object", "required": ["name", "sla_ms", "executors", "stats"]},
    }
    admin_model_errors = _errors(401, 404)
    paths: dict[str, Any] = {
        "/v2": {
            "get": {
                "summary": "Server metadata",
                "security": DATA,
                "responses": {"200": _json(_ref("ServerMetadata"), "name, version, extensions"), **_errors(401)},
            }
        },
        "/v2/health/live": {"get": {"summary": "Liveness", "responses": {"200": _json(_ref("Live"), "live")}}},
        "/v2/health/ready": {
            "get": {
                "summary": "Readiness (false while starting or draining)",
                "responses": {"200": _json(_ref("Ready"), "ready"), "503": _json(_ref("Ready"), "not ready")},
            }
        },
        **_model_paths("/v2/models/{model}", [MODEL]),
        **_model_paths("/v2/models/{model}/versions/{version}", [MODEL, VERSION]),
        "/admin/models": {
            "get": {
                "summary": "Every model's state",
                "security": ADMIN,
                "responses": {"200": _json({"type": "object"}, "models"), **_errors(401)},
            }
        },
        "/admin/models/{model}": {
            "get": {
                "summary": "A model's SLA, executors, profiles and statistics",
                "security": ADMIN,
                "parameters": [MODEL],
                "responses": {"200": _json(_ref("ModelState"), "the model"), **admin_model_errors},
            }
        },
        "/admin/models/{model}/history": {
            "get": {
                "summary": "One entry per control period",
                "security": ADMIN,
                "parameters": [MODEL],
                "responses": {"200": _json({"type": "object"}, "the history"), **admin_model_errors},
            }
        },
        "/admin/models/{model}/sla": {
            "put": {
                "summary": "Change the model's SLA at run time",
                "security": ADMIN,
                "parameters": [MODEL],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("SetSla")}}},
                "responses": {"200": _json(_ref("ModelState"), "the model"), **_errors(400, 401, 404)},
            }
        },
        "/admin/models/{model}/cores": {
            "put": {
                "summary": "Pin the model's cores, or hand them back to the controller with null",
                "security": ADMIN,
                "parameters": [MODEL],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("PinCores")}}},
                "responses": {"200": _json(_ref("ModelState"), "the model"), **_errors(400, 401, 404)},
            }
        },
        "/admin/node": {
            "get": {
                "summary": "The node's cores and control settings",
                "security": ADMIN,
                "responses": {"200": _json({"type": "object"}, "the node"), **_errors(401)},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {"description": "text exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}
                },
            }
        },
        "/openapi.json": {"get": {"summary": "This document", "responses": {"200": _json({"type": "object"}, "OpenAPI 3.0")}}},
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "sla-gateway",
            "version": version,
            "description": "KServe v2 / Open Inference Protocol data plane, admin API and metrics of the SLA-aware gateway.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer", "description": "GATEWAY_ADMIN_TOKEN"},
                "dataToken": {"type": "http", "scheme": "bearer", "description": "GATEWAY_DATA_TOKEN, when set"},
            },
        },
    }
