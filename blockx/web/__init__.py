"""What the browser pages of the worker and the hub share, served under `/assets/`.

`assets/` holds the shared stylesheet and chart helper (`base.css`,
`charts.js`); `vendor/` the third-party code, one folder per library with its
licence and version (uPlot, for the charts). Nothing is built or fetched: the
files are served as they are, from the installed package.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Final

ASSETS_PATH: Final = "/assets/"
"""Where the shared files are served, on the worker's metrics port and the hub's port."""
_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
    ".png": "image/png",
}
_FILES: Final = {
    "base.css": "assets/base.css",
    "charts.js": "assets/charts.js",
    "vendor/uplot/uPlot.iife.min.js": "vendor/uplot/uPlot.iife.min.js",
    "vendor/uplot/uPlot.min.css": "vendor/uplot/uPlot.min.css",
    "vendor/uplot/LICENSE": "vendor/uplot/LICENSE",
    "vendor/uplot/README.md": "vendor/uplot/README.md",
}
"""Every file served (a fixed list: a path from a request never reaches the file system)."""
CACHE_CONTROL: Final = "public, max-age=300"


def content_type(name: str) -> str:
    return _TYPES.get(name[name.rfind(".") :], "application/octet-stream")


@functools.cache
def asset(path: str) -> tuple[bytes, str] | None:
    """The body and content type of the shared file at request path `path` (under
    `ASSETS_PATH`), or None if there is none."""
    name = _FILES.get(path.removeprefix(ASSETS_PATH)) if path.startswith(ASSETS_PATH) else None
    if name is None:
        return None
    body = importlib.resources.files(__name__).joinpath(name).read_bytes()
    return body, content_type(name)
