"""Keep one copy of sphinx-thebe's inline configuration script on every page.

sphinx-thebe 0.3.1 adds an inline script (``filename=None``) that declares
``const THEBE_JS_URL`` in ``env-before-read-docs``, after the HTML builder has built
its script list. Sphinx 7.4's ``Sphinx.add_js_file`` then puts it both in the
builder's list (filename ``None``) and in the registry, and
``StandaloneHTMLBuilder.prepare_writing`` adds the registry copy again as filename
``""``. The two copies compare unequal, so every page declared the constant twice
and the browser logged "Identifier 'THEBE_JS_URL' has already been declared".
This drops the direct copy; the registry copy stays.
"""

from __future__ import annotations

from typing import Any


def _drop_direct_copies(app: Any, env: Any, docnames: list[str]) -> None:
    scripts = getattr(app.builder, "_js_files", None)
    if scripts is not None:
        app.builder._js_files = [js for js in scripts if js.filename is not None]


def setup(app: Any) -> dict[str, Any]:
    # after sphinx-thebe's own handler (priority 500)
    app.connect("env-before-read-docs", _drop_direct_copies, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
