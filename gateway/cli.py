"""The ``gateway`` command: ``serve``, ``worker`` (one node of a cluster), and the tools
``bench``, ``identify``, ``simulate``, ``plan``, ``docker-image`` and ``config-schema``.

Only the sub-command named is imported: ``gateway serve`` loads no client tool, and a tool
loads neither the server nor the config's schema unless it uses them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import GatewayConfig


def port_number(text: str) -> int:
    """A TCP port, 0-65535, as the config's ports are: the kernel took 86936 as 21400."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {port}")
    return port


# Python's logging levels, by their names (its aliases WARN and FATAL left out: one name each).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """A level of LOG_LEVELS, in any case: logging refused another only once the gateway had
    begun (a traceback, 'Unknown level')."""
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)} (in any case), got {text!r}")
    return level


def listen_address(text: str) -> str:
    """HOST:PORT, as worker.listen is checked in the config."""
    from gateway.config.schema import host_port

    try:
        return host_port(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config")
    parser.add_argument("--host", help="overrides server.host")
    parser.add_argument("--port", type=port_number, help="overrides server.port")
    parser.add_argument("--grpc-port", type=port_number, help="overrides server.grpc_port (0: no gRPC)")


def _log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", type=log_level, default="INFO", help=f"one of {', '.join(LOG_LEVELS)}")
    parser.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="json: one JSON object per line for every log record"
    )
    parser.add_argument("--access-log", action="store_true", help="log every HTTP request, one line each")


def load_or_report(path: str) -> GatewayConfig | None:
    """The config at ``path``, or None once what is wrong with it is printed (exit status 2)."""
    from gateway.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as error:
        print(f"gateway: config error: {error}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    from gateway.config import exposure_error

    config = load_or_report(args.config)
    if config is None:
        return 2
    server = config.server
    if args.host is not None:
        server = dataclasses.replace(server, host=args.host)
    if args.port is not None:
        server = dataclasses.replace(server, port=args.port)
    if args.grpc_port is not None:
        server = dataclasses.replace(server, grpc_port=args.grpc_port)
    config = dataclasses.replace(config, server=server)
    refusal = exposure_error(server)
    if refusal is not None:
        print(f"gateway: {refusal}", file=sys.stderr)
        return 2
    from executors.container import DockerUnavailable
    from executors.lifecycle import ExecutorStartError
    from gateway.server import run

    try:
        run(config)
    except (ExecutorStartError, DockerUnavailable) as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 1
    return 0


def _worker(args: argparse.Namespace) -> int:
    from gateway.config import worker_token_error

    config = load_or_report(args.config)
    if config is None:
        return 2
    worker = config.worker
    if args.listen is not None:
        worker = dataclasses.replace(worker, listen=args.listen)
    if args.http_port is not None:
        worker = dataclasses.replace(worker, http_port=args.http_port)
    if args.name is not None:
        worker = dataclasses.replace(worker, name=args.name)
    problem = worker_token_error(worker.token)
    if problem is not None:
        print(f"gateway: worker.token: {problem}", file=sys.stderr)
        return 2
    import asyncio

    from executors.container import DockerUnavailable
    from executors.lifecycle import ExecutorStartError
    from gateway.cluster.worker import serve_worker

    try:
        asyncio.run(serve_worker(dataclasses.replace(config, worker=worker)))
    except (ExecutorStartError, DockerUnavailable) as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        # Its own listen address, or its HTTP port: the error names the one that failed.
        print(f"gateway: cannot listen: {error}", file=sys.stderr)
        return 1
    return 0


# Sub-commands other than serve: name -> (module, help); each module has add_arguments(parser)
# and run(args), and is imported only when its sub-command is the one run.
COMMANDS = {
    "bench": ("gateway.tools.bench", "drive load against a running gateway"),
    "identify": ("gateway.tools.identify", "step test of a model's cores on a running gateway: measures k"),
    "simulate": ("gateway.tools.simulate", "the GPU scheduler on a virtual clock against emulated GPUs"),
    "docker-image": ("gateway.tools.docker_image", "make the host-runtime executor image with docker import (no registry)"),
    "config-schema": ("gateway.tools.config_schema", "print the JSON Schema of the config file"),
    "plan": ("gateway.tools.plan", "plan a pipeline's devices, cores and batch sizes for a rate within its SLAs (FA2, Harpagon)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="gateway", description="SLA-aware inference gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    # The top level has no option of its own but -h: its first other word names the sub-command.
    chosen = next((word for word in argv if not word.startswith("-")), None)

    serve = commands.add_parser("serve", help="serve the models of a TOML config over HTTP")
    _serve_arguments(serve)
    _log_arguments(serve)
    serve.set_defaults(run=_serve)

    worker = commands.add_parser("worker", help="run one node of a cluster: its executors and their cores, for dispatchers")
    worker.add_argument("config")
    worker.add_argument("--listen", type=listen_address, help="overrides worker.listen (HOST:PORT)")
    worker.add_argument("--http-port", type=port_number, help="overrides worker.http_port")
    worker.add_argument("--name", help="overrides worker.name")
    _log_arguments(worker)
    worker.set_defaults(run=_worker)

    for name, (module_name, help_text) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--log-level", type=log_level, default="WARNING", help=f"one of {', '.join(LOG_LEVELS)}")
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(command)
            command.set_defaults(run=module.run)

    args = parser.parse_args(argv)
    if args.command in ("serve", "worker"):
        from gateway.logs import configure_logging

        configure_logging(args.log_level, args.log_format, args.access_log)
    else:
        logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        try:
            return args.run(args)
        except KeyboardInterrupt:  # Ctrl-C ends a tool's run: a line, not a traceback
            print(f"gateway {args.command}: interrupted", file=sys.stderr)
            return 130
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
