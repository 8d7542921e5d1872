"""The ``gateway`` command: ``serve``, ``bench``, ``identify``, ``simulate`` and ``docker-image``."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys

from gateway.config import ConfigError, exposure_error, load_config


def _serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"gateway: config error: {error}", file=sys.stderr)
        return 2
    server = config.server
    if args.host is not None:
        server = dataclasses.replace(server, host=args.host)
    if args.port is not None:
        server = dataclasses.replace(server, port=args.port)
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


# Sub-commands other than serve: (module, help); each module has add_arguments(parser) and run(args).
COMMANDS = {
    "bench": ("gateway.bench", "drive load against a running gateway"),
    "identify": ("gateway.identify", "step test of a model's cores on a running gateway: measures k"),
    "simulate": ("gateway.simulate", "the GPU scheduler on a virtual clock against emulated GPUs"),
    "docker-image": ("gateway.docker_image", "make the host-runtime executor image with docker import (no registry)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description="SLA-aware inference gateway")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the models of a TOML config over HTTP")
    serve.add_argument("config")
    serve.add_argument("--host", help="overrides server.host")
    serve.add_argument("--port", type=int, help="overrides server.port")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(run=_serve)

    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = commands.add_parser(name, help=help_text)
        module.add_arguments(command)
        command.add_argument("--log-level", default="WARNING")
        command.set_defaults(run=module.run)

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
