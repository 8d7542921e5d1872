"""The live page's files, served from the package (``static/``) under /ui, each at a path of its own.

They are package data (pyproject.toml), so an installed gateway serves them without its checkout.
The page itself, its script and style hold no data and no token: they are open, as /openapi.json
is; what they show comes from ``GET /admin/live``, which needs the admin token like the rest of /admin.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

PAGE = "index.html"
# The files under /ui/, with the media type each is answered with. uPlot (MIT, uPlot.LICENSE) is
# taken unchanged from its npm package's dist/ (version in the first line of the script).
ASSETS: dict[str, str] = {
    "live.js": "text/javascript",
    "live.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}


@cache
def read_asset(name: str) -> str:
    """A file of ``static/`` (``PAGE`` or one of ``ASSETS``), read once."""
    if name != PAGE and name not in ASSETS:
        raise KeyError(name)
    return files("gateway.ui").joinpath("static", name).read_text(encoding="utf-8")
