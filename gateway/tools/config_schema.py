"""``gateway config-schema``: the JSON Schema of a ``gateway serve`` config file.

Editors that read a JSON Schema for TOML (Taplo, Even Better TOML) complete and check a config
with it. The schema comes from the config's classes (gateway/config/schema.py).
"""

from __future__ import annotations

import argparse
import json

from gateway.config import json_schema
from gateway.tools.arguments import output_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", type=output_file, help="write it to this file instead of standard output")


def run(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)
    else:
        print(text, end="")
    return 0
