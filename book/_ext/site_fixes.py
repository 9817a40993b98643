"""Sphinx fixes for this book's pages: every script included once, and a default colour mode.

- sphinx-thebe adds its configuration script twice to every page under Jupyter Book 1, and
  the second copy raises ``Identifier 'THEBE_JS_URL' has already been declared`` in the
  browser console; the book does not use thebe, so a page keeps the first copy only.
- pydata-sphinx-theme logs ``Got invalid theme mode`` when no default mode is configured;
  the book's figures are drawn on white, so the default is ``light`` (a reader can switch).
"""

from __future__ import annotations

from typing import Any


def dedupe_scripts(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Drop every script of ``context["script_files"]`` that repeats an earlier one (same file, same attributes)."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for script in context.get("script_files", []):
        key = (str(getattr(script, "filename", script)), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def default_mode(app: Any, config: Any) -> None:
    """Set the theme's ``default_mode`` to ``light`` unless the configuration sets one."""
    options = dict(config.html_theme_options or {})
    options.setdefault("default_mode", "light")
    config.html_theme_options = options


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", default_mode)
    app.connect("html-page-context", dedupe_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
