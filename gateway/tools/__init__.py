"""The ``gateway`` sub-commands other than ``serve``: clients of a running gateway and helpers.

``gateway serve`` imports none of them (tests/test_cli.py checks it): ``bench`` and
``identify`` drive load against a gateway over HTTP, ``docker-image`` makes the executor image
ahead of time, ``config-schema`` prints the config file's JSON Schema. Each module has
``add_arguments(parser)`` and ``run(args)``; gateway/cli.py imports only the one named.
"""
