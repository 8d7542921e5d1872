"""The KServe v2 gRPC service (the `GRPCInferenceService` of the protocol, as Triton serves it),
on a port of its own beside HTTP, sharing the one engine: tritonclient.grpc works unchanged.

The service classes are the ones tritonclient ships (tritonclient.grpc.service_pb2_grpc, from
the protocol's grpc_service.proto), served with grpc.aio on the gateway's event loop.

One infer path for both protocols: a ModelInferRequest is written as the HTTP request with the
binary tensor extension it is equivalent to (raw contents, or typed contents turned into raw)
and checked by the same parser (gateway/protocol.py), so a request is refused for the same
reason, with the same words, whichever protocol carries it. The refusals map to gRPC codes as
Triton maps its HTTP statuses: 400 INVALID_ARGUMENT, 404 NOT_FOUND, 413 RESOURCE_EXHAUSTED,
429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 401 UNAUTHENTICATED.

Tokens are the HTTP ones, as metadata (``authorization: Bearer TOKEN``): health calls are open,
the rest need the data token where one is set, and the model repository calls the admin token,
as HTTP's /v2/repository. ModelStreamInfer serves a stream's requests side by side, each answered
once. Shared memory, trace and log settings are not served (UNIMPLEMENTED, with the reason).

Each infer request, of a call or of a stream, is logged and traced as an HTTP one is
(gateway/observe.py): its id is the ``x-request-id`` metadata or else the message's ``id``, and a
W3C ``traceparent`` in the metadata makes its spans part of the caller's trace. (A stream's
metadata is the stream's: its ``x-request-id`` names each of its requests.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# gRPC's fork handlers are for children that go on using gRPC; the gateway's children (its
# executors) exec at once. With the handlers on, each executor started while gRPC served wrote a
# raw line of gRPC's own to stderr ("skipping fork() handlers"), breaking the JSON log. Read by
# gRPC's core when it is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# gRPC's core logs on its own, raw lines on stderr ("E1127 ... hpack_parser.cc:1048] Error parsing
# 'grpc-timeout' metadata"), one for each malformed header any client sends: they broke the JSON
# log, and a client needing no token could flood it. Off unless the user sets GRPC_VERBOSITY (DEBUG,
# INFO, ERROR) to see them; this module is the first of the gateway to import grpc.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc  # noqa: E402
import numpy as np
import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from executors.tensors import KSERVE_TO_NUMPY, encode_bytes_elements, tensor_to_bytes
from gateway.connections import connection_cap, descriptor_limit
from gateway.engine import RequestFailed
from gateway.observe import REQUEST_ID_HEADER, RequestRecord, new_request_id, report, usable_request_id
from gateway.protocol import InferRequest, InvalidRequest, Limits, parse_infer_request, refuse_shared_memory
from gateway.repository import load_from_repository, repository_index
from gateway.routes import NOT_SERVED, bearer_token_matches
from gateway.signature import ModelSignature

if TYPE_CHECKING:
    from gateway.engine import Engine, ModelRuntime, Result
    from gateway.server import Handlers
    from gateway.tracing import RequestTracer

log = logging.getLogger("gateway.grpc")


class EndedCallAnswered(logging.Filter):
    """grpc.aio logs an ERROR with a traceback when a handler answers a call that has already
    ended (its client's deadline passed, or the client left, as the answer was written): the
    client went, as over HTTP, and the request is accounted for already. Such lines are left out;
    every other line of grpc's passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("ExecuteBatchError raised in core by servicer method")


logging.getLogger("grpc._cython.cygrpc").addFilter(EndedCallAnswered())

STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# The typed contents field of InferTensorContents that carries each datatype (FP16 only raw).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
OPEN_METHODS = {"ServerLive", "ServerReady"}
REPOSITORY_METHODS = {"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"}
# Requests of one stream read but not yet answered to its client, at most (a model's default
# max_queue_size): enough for any perf_analyzer concurrency.
STREAM_IN_FLIGHT = 1024
# The largest message either way, as Triton's server sets it (INT32_MAX): max_body_bytes bounds
# requests; sent as the bound of answers too, it failed a stream whose one answer was larger,
# with the requests counted as served and their answers never sent.
MAX_MESSAGE_BYTES = (1 << 31) - 1
# An answer's room for what is not its outputs' bytes (names, shapes, parameters).
ANSWER_HEAD_BYTES = 1 << 20
# Typed values converted to bytes in one numpy call, at most (about 1 ms).
PIECE_VALUES = 1 << 15
# The parameter of a stream's answer that says it is its request's last (Triton's, for decoupled
# models; each request here has one answer).
FINAL_RESPONSE = "triton_final_response"


class Refused(Exception):
    """A request refused with ``status``, the HTTP status it would have had, and the gRPC code
    Triton answers for that status (``fallback`` for one Triton does not map)."""

    def __init__(self, status: int, message: str, fallback: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message)
        self.status = status
        self.code = STATUS_CODES.get(status, fallback)


def _parameter(value: Any) -> service_pb2.InferParameter:
    if isinstance(value, bool):
        return service_pb2.InferParameter(bool_param=value)
    if isinstance(value, int):
        return service_pb2.InferParameter(int64_param=value)
    if isinstance(value, float):
        return service_pb2.InferParameter(double_param=value)
    return service_pb2.InferParameter(string_param=str(value))


def _parameter_value(parameter: service_pb2.InferParameter) -> Any:
    which = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, which) if which is not None else None


def rough_size(request: service_pb2.ModelInferRequest) -> int:
    """About how many bytes ``request``'s tensors take decoded, without converting them: whether
    it is converted off the event loop. A typed field of numbers is its length (known without
    reading it) times 8; strings are their encoded size (protobuf's count, in C) and 8 more each
    (their conversion's cost is by the string: 520,000 short ones held the loop 0.5 s)."""
    size = sum(len(blob) for blob in request.raw_input_contents)
    for tensor in request.inputs:
        if tensor.datatype == "BYTES":
            size += tensor.contents.ByteSize() + 8 * len(tensor.contents.bytes_contents)
        elif (field := CONTENTS_FIELD.get(tensor.datatype)) is not None:
            size += 8 * len(getattr(tensor.contents, field))
    return size


def _typed_contents(tensor: service_pb2.ModelInferRequest.InferInputTensor, values: Any) -> bytes:
    """The raw bytes of a tensor's typed ``values``, in pieces of ``PIECE_VALUES`` (one numpy call
    holds the GIL, and a request converted in the codec thread must let the loop run between
    them), once their number is the one its shape gives: 5,000,000 strings sent for a shape of
    [1] were all converted, on the loop, before the parser refused them (3.7 s of every client's
    time, and 600 MB)."""
    count = len(values)
    shape = list(tensor.shape)
    if all(dimension >= 0 for dimension in shape) and count != math.prod(shape):
        raise InvalidRequest(
            f"input '{tensor.name}': its contents hold {count} values, and its shape {shape} has {math.prod(shape)} elements"
        )
    # One iterator, each piece the next PIECE_VALUES of it: islice(values, start, ...) from the
    # field itself skipped the first ``start`` values again for each piece (quadratic: 8 s for 16 MiB).
    values = iter(values)
    pieces = (itertools.islice(values, PIECE_VALUES) for _ in range(0, count, PIECE_VALUES))
    if tensor.datatype == "BYTES":
        return b"".join(encode_bytes_elements(np.fromiter(piece, np.object_)) for piece in pieces)
    dtype = KSERVE_TO_NUMPY[tensor.datatype]
    try:  # int_contents carries INT8 and INT16 as int32: 300 is a valid field, not an INT8
        return b"".join(np.fromiter(piece, dtype).tobytes() for piece in pieces)
    except OverflowError:
        raise InvalidRequest(f"input '{tensor.name}': a value is outside the range of {tensor.datatype}") from None


def as_http_request(request: service_pb2.ModelInferRequest) -> tuple[bytes, int]:
    """The HTTP body (JSON header, then the tensors' bytes) that says what ``request`` says,
    and the header's length: the binary tensor extension of the same request."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs")
    inputs, blobs = [], []
    for i, tensor in enumerate(request.inputs):
        if "shared_memory_region" in tensor.parameters:  # looked up only where named: a tensor's usual path builds nothing
            refuse_shared_memory({k: _parameter_value(v) for k, v in tensor.parameters.items()}, f"input '{tensor.name}'")
        if raw:
            if tensor.contents.ByteSize():  # the protocol's rule: one or the other, never both
                raise InvalidRequest(f"input '{tensor.name}': contents must not be given when raw_input_contents are")
            blob = raw[i]
        else:
            field = CONTENTS_FIELD.get(tensor.datatype)
            if field is None:
                raise InvalidRequest(f"input '{tensor.name}': {tensor.datatype} must be sent in raw_input_contents")
            blob = _typed_contents(tensor, getattr(tensor.contents, field))
        blobs.append(blob)
        inputs.append(
            {
                "name": tensor.name,
                "datatype": tensor.datatype,
                "shape": list(tensor.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
    header: dict[str, Any] = {"inputs": inputs}
    if request.id:
        header["id"] = request.id
    parameters = {k: _parameter_value(v) for k, v in request.parameters.items()}
    if parameters:
        header["parameters"] = parameters
    if request.outputs:
        # Each output's own parameters go along, so that one the parser refuses (classification,
        # tritonclient's class_count) is refused here too.
        header["outputs"] = [
            {"name": o.name, "parameters": {**{k: _parameter_value(v) for k, v in o.parameters.items()}, "binary_data": True}}
            for o in request.outputs
        ]
    head = orjson.dumps(header)
    return head + b"".join(bytes(b) for b in blobs), len(head)


def _parsed(
    request: service_pb2.ModelInferRequest, signature: ModelSignature, max_batch_size: int, limits: Limits
) -> InferRequest:
    body, header_length = as_http_request(request)
    return parse_infer_request(body, str(header_length), signature, max_batch_size, limits)


def why_answer_too_large(response: service_pb2.ModelInferResponse) -> str | None:
    """Why ``response`` cannot go out as one gRPC message, or None. Sent, grpc failed the call (a
    stream as a whole), and the request had been counted as served."""
    size = sum(len(blob) for blob in response.raw_output_contents)
    if size <= MAX_MESSAGE_BYTES - ANSWER_HEAD_BYTES:
        return None
    return (
        f"the answer's outputs take {size} bytes, over the {MAX_MESSAGE_BYTES} of one gRPC message: "
        "ask for fewer rows or outputs, or over HTTP"
    )


@dataclass(frozen=True)
class MalformedMessage:
    """A message that is no valid protobuf of the type its method takes, as its handler gets it.
    grpc answered such a call UNKNOWN ("Unexpected <class 'DecodeError'>") and wrote an ERROR
    with a traceback to the log for each, which any client could fill."""

    kind: str
    error: str

    def describe(self) -> str:
        return f"the message is no valid {self.kind}: {self.error}"


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    kind = getattr(getattr(deserialize, "__self__", None), "__name__", "message")

    def read(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as error:
            return MalformedMessage(kind, str(error))

    return read


def _refusing_malformed(behaviour: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def serve(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, MalformedMessage):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        return await behaviour(request, context)

    return serve


class _LenientRegistration:
    """Stands for the server in the generated ``add_GRPCInferenceServiceServicer_to_server``: its
    method handlers go to ``server`` with each request's deserializer answering a
    MalformedMessage rather than raising, and each unary method refusing one INVALID_ARGUMENT
    (a stream's request gets its own error answer: ``ModelStreamInfer``)."""

    def __init__(self, server: grpc.aio.Server):
        self.server, self.registered = server, False

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Built by the generated code from the handlers that ``add_registered_method_handlers``
        gets, which builds its own from them."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        lenient = {}
        for method, handler in handlers.items():
            changes: dict[str, Any] = {"request_deserializer": _lenient(handler.request_deserializer)}
            if handler.unary_unary is not None:
                changes["unary_unary"] = _refusing_malformed(handler.unary_unary)
            lenient[method] = handler._replace(**changes)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, lenient),))
        self.server.add_registered_method_handlers(service, lenient)
        self.registered = True


def text_metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """A call's metadata that is text (its keys in lower case, as gRPC sends them), as a carrier
    of trace context and request ids; binary (``-bin``) entries are left out."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Each call answered from the engine the HTTP handlers use (``handlers``' models, limits,
    draining); with ``tracer``, each infer request's spans go to it."""

    def __init__(self, handlers: Handlers, tracer: RequestTracer | None = None):
        self.handlers = handlers
        self.engine: Engine = handlers.engine
        self.tracer = tracer

    # -- health and metadata -------------------------------------------------------------------
    async def ServerLive(self, request, context):  # noqa: N802 (the protocol's method names)
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        ready = not self.handlers.draining and all(r.ready for r in self.engine.models.values())
        return service_pb2.ServerReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context):  # noqa: N802
        from gateway import __version__
        from gateway.server import EXTENSIONS, SERVER_NAME

        return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=list(EXTENSIONS))

    async def ModelReady(self, request, context):  # noqa: N802
        # Triton's ModelIsReady: a model (or version) not served is not ready, no error; tritonclient's
        # is_model_ready polled after an unload raised NOT_FOUND where it returns False (as over HTTP).
        try:
            await self.engine.settled(request.name)
        except InvalidRequest:  # shutting down
            return service_pb2.ModelReadyResponse(ready=False)
        runtime = self.engine.served(request.name, request.version or None)
        return service_pb2.ModelReadyResponse(ready=runtime is not None and runtime.ready and not self.handlers.draining)

    async def ModelMetadata(self, request, context):  # noqa: N802

        runtime = await self._runtime(request.name, request.version, context)
        signature = runtime.signature
        assert signature is not None

        def tensors(specs):
            return [
                service_pb2.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape))
                for t in specs
            ]

        return service_pb2.ModelMetadataResponse(
            name=runtime.served_name,
            versions=self.engine.versions_of(runtime),
            platform=getattr(runtime, "platform", "onnxruntime_onnx"),
            inputs=tensors(signature.inputs),
            outputs=tensors(signature.outputs),
        )

    async def ModelConfig(self, request, context):  # noqa: N802
        runtime = await self._runtime(request.name, request.version, context)
        config = json_format.ParseDict(
            self.handlers.triton_config(runtime), model_config_pb2.ModelConfig(), ignore_unknown_fields=True
        )
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request, context):  # noqa: N802
        runtime = await self._runtime(request.name, request.version, context) if request.name else None
        stats = {"model_stats": self.engine.triton_statistics(runtime, every_version=not request.version)}
        return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())

    # -- the model repository (gateway/repository.py, as HTTP's /v2/repository) ---------------------
    async def RepositoryIndex(self, request, context):  # noqa: N802
        entries = repository_index(self.engine, request.ready)
        return service_pb2.RepositoryIndexResponse(models=[service_pb2.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

    async def RepositoryModelLoad(self, request, context):  # noqa: N802
        await self._refuse_while_draining(context)
        # Whatever the parameter's type: parse_override refuses one that is not a string, naming it.
        config = _parameter_value(request.parameters["config"]) if "config" in request.parameters else None
        try:
            await load_from_repository(self.engine, request.model_name, config, request.parameters)
        except InvalidRequest as error:
            await context.abort(STATUS_CODES.get(error.status, grpc.StatusCode.INVALID_ARGUMENT), str(error))
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):  # noqa: N802
        await self._refuse_while_draining(context)
        try:
            await self.engine.unload_model(request.model_name)
        except InvalidRequest as error:
            await context.abort(STATUS_CODES.get(error.status, grpc.StatusCode.INVALID_ARGUMENT), str(error))
        return service_pb2.RepositoryModelUnloadResponse()

    async def _refuse_while_draining(self, context: grpc.aio.ServicerContext) -> None:
        if self.handlers.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the gateway is shutting down; no model is loaded or unloaded now")

    # -- inference -----------------------------------------------------------------------------
    async def ModelInfer(self, request, context):  # noqa: N802
        metadata = text_metadata(context)
        record = self._record(request, metadata, "ModelInfer")
        # Its id goes back as HTTP's does in X-Request-ID (an abort sends these trailers too).
        context.set_trailing_metadata(((REQUEST_ID_HEADER.lower(), record.id),))
        try:
            return await self._observed_infer(request, record, metadata)
        except Refused as refused:
            await context.abort(refused.code, str(refused))

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        """Triton's streaming inference, for models that answer each request once: the requests
        of a stream are served side by side, each answered as it ends (the response names its
        request's id), a refusal as the response's ``error_message``; the stream goes on."""
        answers: asyncio.Queue[service_pb2.ModelStreamInferResponse | None] = asyncio.Queue()
        serving: set[asyncio.Task[None]] = set()
        # Requests of the stream read and not yet answered to the client (running, or their
        # answers waiting to be written): at the bound, no more is read, and HTTP/2's flow control
        # holds the client back. A client that sends and never reads grew the gateway without end.
        room = asyncio.Semaphore(STREAM_IN_FLIGHT)

        metadata = text_metadata(context)

        async def serve(request: service_pb2.ModelInferRequest | MalformedMessage) -> None:
            # Exactly one answer for each request read: the stream ends once all are taken.
            try:
                if isinstance(request, MalformedMessage):  # no request of any model: its own error, the stream goes on
                    answer = service_pb2.ModelStreamInferResponse(error_message=request.describe())
                    answer.infer_response.parameters[FINAL_RESPONSE].bool_param = True
                else:
                    answer = await self._stream_answer(request, metadata)
            except Exception:
                log.exception("unexpected error answering a stream's request")
                answer = service_pb2.ModelStreamInferResponse(error_message="internal error; see the gateway's log")
            answers.put_nowait(answer)

        unanswered = 0  # requests read whose answers the client has not taken

        async def read() -> None:
            nonlocal unanswered
            try:
                async for request in request_iterator:
                    await room.acquire()
                    unanswered += 1
                    task = asyncio.create_task(serve(request))
                    serving.add(task)
                    task.add_done_callback(serving.discard)
            finally:
                answers.put_nowait(None)  # the client sent its last request (or the stream broke)

        reader = asyncio.create_task(read())
        read_all = False
        try:
            # Until every request read is answered: each serve() puts one answer. Once the client
            # half-closed, the answers still went out as they ended (waiting for all of them
            # held a fast request's answer back until the stream's slowest one ended).
            while not read_all or unanswered:
                answer = await answers.get()
                if answer is None:
                    read_all = True
                    continue
                yield answer  # returns once grpc has taken it: the client is reading
                unanswered -= 1
                room.release()
            await reader  # a stream that broke ends with its error
        finally:  # the client left, or the stream failed: what is still running is let go
            reader.cancel()
            for task in serving:
                task.cancel()

    async def _stream_answer(
        self, request: service_pb2.ModelInferRequest, metadata: Mapping[str, str]
    ) -> service_pb2.ModelStreamInferResponse:
        record = self._record(request, metadata, "ModelStreamInfer")
        try:
            answer = service_pb2.ModelStreamInferResponse(infer_response=await self._observed_infer(request, record, metadata))
        except Refused as refused:
            # A refusal carries its request's id, as Triton's does: the answers of a stream come
            # in the order they end, so the id is what tells a client which request failed.
            named = service_pb2.ModelInferResponse(
                id=request.id, model_name=request.model_name, model_version=request.model_version
            )
            answer = service_pb2.ModelStreamInferResponse(error_message=str(refused), infer_response=named)
        # Each request has one answer, its last: Triton marks a stream's final answer so, and a
        # client that asks for empty final responses reads until it sees the mark.
        answer.infer_response.parameters[FINAL_RESPONSE].bool_param = True
        return answer

    @staticmethod
    def _record(request: service_pb2.ModelInferRequest, metadata: Mapping[str, str], rpc_method: str) -> RequestRecord:
        """The request's record, named as an HTTP request is: by the ``x-request-id`` metadata
        (HTTP's header), else by the message's ``id`` (HTTP's body), else by an id made here."""
        given = usable_request_id(metadata.get(REQUEST_ID_HEADER.lower()))
        record = RequestRecord(
            given or new_request_id(), given is not None, request.model_name, time.perf_counter(), rpc_method=rpc_method
        )
        record.name_from_body(request.id)
        return record

    async def _observed_infer(
        self, request: service_pb2.ModelInferRequest, record: RequestRecord, metadata: Mapping[str, str]
    ) -> service_pb2.ModelInferResponse:
        """``_infer`` on the model the request names, then its request-log line and its spans
        (``metadata`` carries its caller's trace context), answered, refused or left."""
        # Taken before a reload's swap is waited out: its timeout and response time count the
        # wait, as HTTP's do (taken after, a request past its timeout was served).
        arrival = time.perf_counter()
        admitted = not self.handlers.draining  # at its arrival, not after the swap: as over HTTP
        try:
            try:
                await self.engine.settled(request.model_name)  # a reload's swap, as over HTTP
            except InvalidRequest as error:
                raise Refused(error.status, str(error)) from None
            runtime = self.engine.served(request.model_name, request.model_version or None)
            if runtime is None:
                raise Refused(404, self.engine.not_served(request.model_name, request.model_version or None))
            response = await self._infer(runtime, request, record, arrival, admitted)
            record.status, record.rpc_code = 200, grpc.StatusCode.OK.value[0]
            return response
        except Refused as refused:
            record.status, record.rpc_code = refused.status, refused.code.value[0]
            raise
        except Exception:
            # Answered as HTTP's middleware answers what it did not expect: INTERNAL, the cause in
            # the log. Raised on, it was grpc's UNKNOWN with the exception's text, and a stream's
            # request was never answered (its slot among the stream's in flight never freed).
            log.exception("unexpected error serving %s over gRPC", request.model_name)
            refused = Refused(500, "internal error; see the gateway's log", fallback=grpc.StatusCode.INTERNAL)
            record.status, record.rpc_code = refused.status, refused.code.value[0]
            raise refused from None
        finally:
            report(record, self.tracer, metadata)

    async def _infer(
        self,
        runtime: ModelRuntime,
        request: service_pb2.ModelInferRequest,
        record: RequestRecord,
        arrival: float,
        admitted: bool,
    ) -> service_pb2.ModelInferResponse:
        """One request, arrived at ``arrival``, served and accounted for as HTTP's are, its phases
        noted in ``record``; a Refused with its code otherwise. ``admitted``: it came before the
        drain began."""
        engine = self.engine
        engine.received(runtime)
        outcome, result = "internal_error", None
        try:
            if not admitted:
                outcome = "shutdown"
                raise Refused(503, "the gateway is shutting down; no new requests")
            try:
                signature = runtime.signature
                assert signature is not None
                # As HTTP's bodies: a large request is converted and parsed in the codec thread.
                parsed = await self.handlers.off_loop(
                    rough_size(request), _parsed, request, signature, runtime.config.max_batch_size, self.handlers.limits
                )
            except InvalidRequest as error:
                outcome = "too_large" if error.status == 413 else "invalid"
                raise Refused(error.status, str(error)) from None
            record.entered_queue()
            try:
                served, datatypes = await engine.answer(runtime, parsed, arrival)
            except InvalidRequest as error:  # what only the model's settings refuse (its priority levels)
                outcome = "invalid"
                raise Refused(error.status, str(error)) from None
            except RequestFailed as error:
                outcome = error.outcome
                record.failed(str(error), error.dispatched)
                raise Refused(error.status, str(error), fallback=grpc.StatusCode.INTERNAL) from None
            record.served(served)
            # Built before the request counts as served: an output that cannot be encoded fails it.
            response = self._response(runtime, parsed, served, datatypes)
            if (reason := why_answer_too_large(response)) is not None:
                outcome = "too_large"
                raise Refused(413, reason)
            outcome, result = "success", served
            return response
        except asyncio.CancelledError:
            # grpc.aio cancels the call's task when its client cancels or its deadline passes;
            # context.cancelled() is not yet true then.
            if outcome == "internal_error":
                outcome = "client_gone"
            raise
        finally:
            record.outcome = outcome
            engine.record(runtime, outcome, arrival, result)

    @staticmethod
    def _response(
        runtime: ModelRuntime, parsed: Any, result: Result, datatypes: dict[str, str]
    ) -> service_pb2.ModelInferResponse:
        outputs, raw = [], []
        for wanted in parsed.outputs:
            array = result.outputs[wanted.name]
            datatype = datatypes[wanted.name]
            outputs.append(
                service_pb2.ModelInferResponse.InferOutputTensor(name=wanted.name, datatype=datatype, shape=list(array.shape))
            )
            raw.append(bytes(tensor_to_bytes(array, datatype)))
        parameters = result.parameters()
        return service_pb2.ModelInferResponse(
            model_name=runtime.served_name,
            model_version=runtime.version,
            id=parsed.id or "",
            outputs=outputs,
            raw_output_contents=raw,
            parameters={k: _parameter(v) for k, v in parameters.items()},
        )

    async def _runtime(self, name: str, version: str, context) -> Any:
        engine = self.engine
        try:
            await engine.settled(name)
        except InvalidRequest as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        runtime = engine.served(name, version or None)
        if runtime is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, engine.not_served(name, version or None))
        return runtime


# What is not served (gateway/routes.py's NOT_SERVED): UNIMPLEMENTED with the reason, where the
# servicer's default answered "Method not implemented!" and left a traceback in the log for each call.
def _not_served(reason: str) -> Any:
    async def refuse(self: InferenceService, request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, reason)

    return refuse


for _extension in NOT_SERVED:
    for _method in _extension.grpc_methods:
        setattr(InferenceService, _method, _not_served(_extension.reason))


class TokenGuard(grpc.aio.ServerInterceptor):
    """The tokens of HTTP, as ``authorization: Bearer TOKEN`` metadata: the repository calls the
    admin token (HTTP's /v2/repository), the others the data token (/v2); health stays open."""

    def __init__(self, token: str | None, admin_token: str | None = None):
        self.expected, self.admin = token or None, admin_token or None

    async def intercept_service(self, continuation, details):
        method = details.method.rsplit("/", 1)[-1]
        which, expected = ("admin", self.admin) if method in REPOSITORY_METHODS else ("data", self.expected)
        if expected is None or method in OPEN_METHODS:
            return await continuation(details)
        # The first authorization entry, as HTTP reads the first header, in HTTP's forms.
        given = next((v for k, v in details.invocation_metadata or () if k == "authorization"), "")
        if bearer_token_matches(given.encode() if isinstance(given, str) else given, expected):
            return await continuation(details)
        return _refuse_unauthenticated(which)


def _refuse_unauthenticated(which: str) -> grpc.RpcMethodHandler:
    async def refuse(request, context):
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, f"this call needs the {which} token: metadata authorization: Bearer TOKEN"
        )

    return grpc.unary_unary_rpc_method_handler(refuse)


async def start_grpc(handlers: Handlers, host: str, port: int, tracer: RequestTracer | None = None) -> grpc.aio.Server:
    """The gRPC service on ``host``:``port``, started; ``stop(grace)`` it at shutdown. With
    ``tracer``, each infer request's spans go to it (gateway/tracing.py)."""
    config = handlers.engine.config.server
    token, admin_token = config.data_token, config.admin_token
    server = grpc.aio.server(
        # No token, no guard: an interceptor costs every call a coroutine more.
        interceptors=[TokenGuard(token, admin_token)] if token or admin_token else [],
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # HTTP's guards on connections: a client that opens connections and says nothing held
            # one descriptor each for gRPC's 120 s handshake, until the gateway had none left for
            # HTTP, its executors or the control loop. A connection must complete HTTP/2's preface
            # within header_timeout_s, and beyond the cap new connections are closed.
            ("grpc.server_handshake_timeout_ms", round(config.header_timeout_s * 1000)),
            ("grpc.max_allowed_incoming_connections", connection_cap(config.max_connections, descriptor_limit(), 2)),
            # HTTP closes the oldest idle connection at its cap; gRPC has no such choice, so a
            # connection with no call under way for a whole request_timeout_ms is closed (GOAWAY:
            # a client's channel connects again at its next call). Connections that finished the
            # handshake and then said nothing held their slots for good, and at the cap every
            # gRPC client was refused.
            ("grpc.max_connection_idle_ms", max(1, round(config.request_timeout_ms))),
            # gRPC binds with SO_REUSEPORT by default: a second gateway on the same port started,
            # and the two split the calls between them. Taken, the port is an error, as HTTP's is.
            ("grpc.so_reuseport", 0),
        ],
    )
    registration = _LenientRegistration(server)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(handlers, tracer), registration)
    if not registration.registered:
        raise RuntimeError("tritonclient's generated gRPC service registers no method handlers (grpcio-tools before 1.63?)")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address} for gRPC")
    await server.start()
    return server
