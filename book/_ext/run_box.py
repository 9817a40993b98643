"""Show a notebook's waiver in its "Run this chapter" box.

A chapter whose stored run needs hardware that is not available can keep that run across one change
of the ``mentor`` modules it imports, under a waiver in its metadata (``metadata.mentor.waiver``,
written by ``python scripts/nbtools.py waive NB --reason ...``). The reader must see that the
stored outputs come from older code: this extension appends :func:`waiver_text` to the page's
admonition titled "Run this chapter", and warns (an error under ``-W``) when a waived chapter has
no such box. :func:`waiver_text` is also what ``nbtools check`` prints.

The box's facts about the stored run come from the same metadata, through the role
``{stored-run}`gpus``` (the machine's GPUs, from ``metadata.mentor.provenance``: "two NVIDIA H200 GPUs"),
``{stored-run}`date``` (the day of the run, or of a split notebook's measurement) and, for a split notebook,
``{stored-run}`rendered``` (the day and the commit of the render of its presenting cells, from
``metadata.mentor.render``), so that no page types them by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BOX_TITLE = "Run this chapter"


def _listed(modules: list[str]) -> str:
    return _names(["mentor/" + m for m in modules])


def waiver_text(meta: dict[str, Any]) -> str | None:
    """The run box's sentence for a notebook's waiver, in plain words; None when ``meta`` carries none.

    >>> print(waiver_text({"mentor_sha256": "628507b8548e5cfe", "executed": "2026-12-01T10:10:47+00:00",
    ...                    "waiver": {"modules": ["bench.py", "lab/bench.py", "lab/env.py"], "added": ["lab/bench.py"],
    ...                               "removed": ["bench.py"], "reason": "needs two GPUs"}}))
    The stored run used mentor at 628507b8548e (the hash of its source, 2026-12-01); since then mentor/lab/env.py changed, mentor/lab/bench.py is now imported and mentor/bench.py is no longer imported. It was not rerun: needs two GPUs.

    A waiver for modules that moved (``renames``, old name to new) also says that the code cells import them
    under their new names. The waiver of a split notebook's measurement (``scope: "measure"``) speaks of the
    measurement, and says when its measuring cells changed too:

    >>> print(waiver_text({"scope": "measure", "mentor_sha256": "628507b8548e5cfe", "executed": "2026-12-01T10:10:47",
    ...                    "waiver": {"modules": ["suite.py"], "cells_changed": True, "reason": "needs two GPUs"}}))
    The stored measurement used mentor at 628507b8548e (the hash of its source, 2026-12-01); since then its measuring cells changed and mentor/suite.py changed. It was not measured again: needs two GPUs.
    """
    waiver = meta.get("waiver")
    if not waiver:
        return None
    added, removed = waiver.get("added", []), waiver.get("removed", [])
    parts = ["its measuring cells changed"] if waiver.get("cells_changed") else []
    for group, one, many in (([m for m in waiver["modules"] if m not in added and m not in removed], "changed", "changed"),
                             (added, "is now imported", "are now imported"),
                             (removed, "is no longer imported", "are no longer imported")):
        if group:
            parts.append(f"{_listed(group)} {one if len(group) == 1 else many}")
    said = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    when = f", {meta['executed'][:10]}" if meta.get("executed") else ""
    renames = waiver.get("renames") or {}
    moved = ""
    if renames:
        news, olds = _names(list(renames.values())), _names(list(renames))
        moved = f" Its code cells now import {news} where the stored run imported {olds}; nothing else in them changed."
    if meta.get("scope") == "measure":  # a split notebook: the waiver covers its measurement only
        return (f"The stored measurement used mentor at {str(meta.get('mentor_sha256') or '?')[:12]} (the hash of "
                f"its source{when}); since then {said}.{moved} It was not measured again: "
                f"{waiver['reason'].rstrip('.')}.")
    return (f"The stored run used mentor at {str(meta.get('mentor_sha256') or '?')[:12]} (the hash of its "
            f"source{when}); since then {said}.{moved} It was not rerun: {waiver['reason'].rstrip('.')}.")


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _show_waiver(app: Any, doctree: Any) -> None:
    from docutils import nodes
    from sphinx.util import logging

    docname = app.env.docname
    path = Path(app.env.doc2path(docname))
    if path.suffix != ".ipynb":
        return
    text = waiver_text(json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("mentor", {}))
    if text is None:
        return
    boxes = [box for box in doctree.findall(nodes.admonition)
             if box.children and isinstance(box[0], nodes.title) and box[0].astext() == BOX_TITLE]
    if not boxes:
        logging.getLogger(__name__).warning(
            f"{docname} carries a waiver but has no '{BOX_TITLE}' admonition to show it in; add the box",
            location=docname)
        return
    boxes[0] += nodes.paragraph(text, text, classes=["waiver"])


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
STORED_RUN_KEYS = ("gpus", "date", "rendered")


def stored_run_text(key: str, meta: dict[str, Any]) -> str:
    """What ``{stored-run}`key``` shows for a notebook whose ``metadata.mentor`` is ``meta``.

    >>> meta = {"executed": "2026-12-01T10:10:47+00:00", "provenance": {"gpu": "NVIDIA H200", "gpu_count": 2}}
    >>> stored_run_text("gpus", meta), stored_run_text("date", meta)
    ('two NVIDIA H200 GPUs', '2026-12-01')
    >>> stored_run_text("gpus", {"provenance": {"gpu": "NVIDIA H200", "gpu_count": 1}})
    'one NVIDIA H200 GPU'
    >>> stored_run_text("gpus", {})
    Traceback (most recent call last):
    ...
    ValueError: the notebook has no stored GPU run (metadata.mentor.provenance names no GPU); store one with make gpu-run NB=<the notebook>
    """
    if key not in STORED_RUN_KEYS:
        raise ValueError(f"{{stored-run}} knows {', '.join(repr(k) for k in STORED_RUN_KEYS)}, not {key!r}")
    if key == "rendered":
        return rendered_text(meta.get("render"))
    if key == "date":
        if not meta.get("executed"):
            raise ValueError("the notebook has no stored run (metadata.mentor.executed is missing); store one with "
                             "make gpu-run NB=<the notebook>")
        return str(meta["executed"])[:10]
    provenance = meta.get("provenance") or {}
    gpu, count = provenance.get("gpu"), provenance.get("gpu_count")
    if not gpu or isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError("the notebook has no stored GPU run (metadata.mentor.provenance names no GPU); store one "
                         "with make gpu-run NB=<the notebook>")
    word = NUMBER_WORDS[count] if count < len(NUMBER_WORDS) else str(count)
    return f"{word} {gpu} GPU{'s' if count > 1 else ''}"


def rendered_text(render: dict[str, Any] | None) -> str:
    """What ``{stored-run}`rendered``` shows: the day of a split notebook's render and the commit it rendered from.

    >>> rendered_text({"rendered": "2026-12-04T20:01:02+00:00", "commit": "39ba96d0c847fb84d578", "changes": []})
    'on 2026-12-04, at commit 39ba96d0c847'
    >>> rendered_text({"rendered": "2026-12-04T20:01:02+00:00", "commit": "39ba96d0c847fb84d578",
    ...                "changes": ["mentor/lab/plots.py"]})
    'on 2026-12-04, at commit 39ba96d0c847 with uncommitted changes to mentor/lab/plots.py'
    >>> rendered_text({"rendered": "2026-12-04T20:01:02+00:00", "commit": None, "changes": []})
    'on 2026-12-04, outside a git checkout'
    """
    if not render or not render.get("rendered"):
        raise ValueError("the notebook has no stored render (metadata.mentor.render is missing); render it with "
                         "python scripts/nbtools.py render <the notebook>")
    day = str(render["rendered"])[:10]
    if not render.get("commit"):
        return f"on {day}, outside a git checkout"
    changes = render.get("changes") or []
    return f"on {day}, at commit {render['commit'][:12]}" + (
        f" with uncommitted changes to {_names(changes)}" if changes else "")


def _stored_run_role(name: str, rawtext: str, text: str, lineno: int, inliner: Any,
                     options: Any = None, content: Any = None) -> tuple[list[Any], list[Any]]:
    from docutils import nodes

    env = inliner.document.settings.env
    path = Path(env.doc2path(env.docname))
    try:
        if path.suffix != ".ipynb":
            raise ValueError(f"{{stored-run}} reads a notebook's stored run, and {path.name} is not a notebook")
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("mentor", {})
        shown = stored_run_text(text.strip(), meta)
    except ValueError as error:
        message = inliner.reporter.error(f"{env.docname}: {error}", line=lineno)
        problem = inliner.problematic(rawtext, rawtext, message)
        return [problem], [message]
    return [nodes.inline(rawtext, shown, classes=["stored-run"])], []


def setup(app: Any) -> dict[str, Any]:
    app.connect("doctree-read", _show_waiver)
    app.add_role("stored-run", _stored_run_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
