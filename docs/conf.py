"""The documentation site: `uv run nox -s docs` builds docs/ into docs/_build/html.

Sphinx with MyST (the pages are Markdown, readable as they are on a forge) and
the Furo theme. The build is strict: any warning, a broken link or reference
among them, fails it.
"""

project = "blockx"
author = "the blockx authors"
copyright = "2026, the blockx authors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_heading_anchors = 3
"""Links may name a section of a page, `worker.md#configuration`, down to `###`."""
myst_enable_extensions = ["colon_fence"]

html_theme = "furo"
html_title = "blockx"
html_static_path: list[str] = []
nitpicky = True
