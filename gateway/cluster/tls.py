"""TLS for the executor protocol between dispatchers and workers (optional; the token is always
checked). A worker with ``[worker] tls_cert`` and ``tls_key`` accepts TLS only; a dispatcher with
``[cluster] tls_ca`` speaks TLS to every worker and checks that the worker's certificate chains
to that CA and names the host or address it dialled, as any HTTPS client would.

The protocol is long-lived connections of many small frames, so the contexts are the standard
library's defaults for each side (TLS 1.2 at least, the default ciphers), nothing hand-tuned.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """What a worker presents; raises OSError or ssl.SSLError (a ValueError-like OSError) when the
    files do not load or do not match."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def client_context(ca: Path) -> ssl.SSLContext:
    """What a dispatcher checks workers with: only ``ca``'s certificates are trusted, not the
    system's (a worker's certificate is the cluster's own business)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
