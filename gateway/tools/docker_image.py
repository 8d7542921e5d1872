"""``gateway docker-image``: make the host-runtime executor image where no registry can be reached.

The image is a root of a few empty directories, made with ``docker import``; the executors run
in it with this host's Python, virtual environment and checkout bind-mounted read-only
(executors/container.py). ``gateway serve`` makes it by itself when it is missing; this command
makes it ahead of time, or anew with ``--replace``.
"""

from __future__ import annotations

import argparse

import docker
import docker.errors

from executors.container import HOST_RUNTIME_IMAGE, import_host_image


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tag", default=HOST_RUNTIME_IMAGE, help=f"image name (default {HOST_RUNTIME_IMAGE})")
    parser.add_argument("--replace", action="store_true", help="import it again even if it exists")


def run(args: argparse.Namespace) -> int:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as error:
        print(f"gateway docker-image: the Docker daemon cannot be reached: {error}")
        return 1
    try:
        try:
            client.images.get(args.tag)
            if not args.replace:
                print(f"{args.tag} already exists (--replace to import it again)")
                return 0
        except docker.errors.ImageNotFound:
            pass
        import_host_image(client, args.tag)
    except docker.errors.APIError as error:  # a tag Docker refuses ("invalid reference format"), a full disk
        print(f"gateway docker-image: {args.tag} not imported: {error.explanation or error}")
        return 1
    print(f"imported {args.tag}")
    return 0
