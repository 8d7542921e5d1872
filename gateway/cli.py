"""The ``gateway`` command: ``serve`` and ``bench``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from gateway.config import ConfigError, load_config


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
    from executors.lifecycle import ExecutorStartError
    from gateway.server import run

    try:
        run(config)
    except ExecutorStartError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 1
    return 0


def _bench(args: argparse.Namespace) -> int:
    from gateway.bench import run_bench

    return run_bench(args)


def _identify(args: argparse.Namespace) -> int:
    from gateway.identify import run_identify

    return run_identify(args)


def _simulate(args: argparse.Namespace) -> int:
    from gateway.simulate import run_simulate

    return run_simulate(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description="SLA-aware inference gateway")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the models of a TOML config over HTTP")
    serve.add_argument("config")
    serve.add_argument("--host", help="overrides server.host")
    serve.add_argument("--port", type=int, help="overrides server.port")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(run=_serve)

    bench = commands.add_parser("bench", help="drive load against a running gateway")
    from gateway.bench import add_arguments

    add_arguments(bench)
    bench.add_argument("--log-level", default="WARNING")
    bench.set_defaults(run=_bench)

    identify = commands.add_parser("identify", help="step test of a model's cores on a running gateway: measures k")
    from gateway.identify import add_arguments as add_identify_arguments

    add_identify_arguments(identify)
    identify.add_argument("--log-level", default="WARNING")
    identify.set_defaults(run=_identify)

    simulate = commands.add_parser("simulate", help="the GPU scheduler on a virtual clock against emulated GPUs")
    from gateway.simulate import add_arguments as add_simulate_arguments

    add_simulate_arguments(simulate)
    simulate.add_argument("--log-level", default="WARNING")
    simulate.set_defaults(run=_simulate)

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
