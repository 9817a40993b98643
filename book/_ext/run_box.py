"""Show a notebook's pending rerun at the top of its page and in its "Run this chapter" box.

A stored run kept across a change of ``mentor`` (a library change whose rerun waits for GPU time, or a run that
needs hardware that is not available) carries a waiver in its metadata (``metadata.mentor.waiver``, written by
``python scripts/nbtools.py waive NB ... --reason ...``). The reader must see that the stored outputs come from
older code: this extension puts :func:`banner_text` right under the page's title (at most four lines at a phone's
width: the run's GPUs and date, an earlier mentor, the reason, a rerun pending), with the longer account
(:func:`changes_text`: the files that changed, earlier reasons) folded under it, and appends the short
:func:`waiver_text` to the admonition titled "Run this chapter". It warns (an error under ``-W``) when a waived
chapter has no title or no such box. :func:`waiver_text` is also what ``nbtools check`` prints.

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


def _run_words(meta: dict[str, Any]) -> tuple[str, str]:
    """("run" or "measurement", its day or "" ) for a stored run or a split notebook's measurement."""
    what = "measurement" if meta.get("scope") == "measure" else "run"
    return what, str(meta.get("executed") or "")[:10]


def waiver_text(meta: dict[str, Any]) -> str | None:
    """The short sentence for a notebook's waiver (a pending rerun): the run box and ``nbtools check`` show it; None
    when ``meta`` carries no waiver.

    >>> print(waiver_text({"executed": "2026-12-04T15:17:34+00:00",
    ...                    "waiver": {"modules": ["suite.py"], "reason": "the report no longer reads back"}}))
    Rerun pending: the stored run of 2026-12-04 used an earlier mentor; since then, the report no longer reads back.
    >>> print(waiver_text({"scope": "measure", "waiver": {"modules": [], "reason": "needs two GPUs."}}))
    Rerun pending: the stored measurement used an earlier mentor; since then, needs two GPUs.
    """
    waiver = meta.get("waiver")
    if not waiver:
        return None
    what, day = _run_words(meta)
    return (f"Rerun pending: the stored {what}{' of ' + day if day else ''} used an earlier mentor; since then, "
            f"{waiver['reason'].rstrip('.')}.")


def banner_text(meta: dict[str, Any]) -> str | None:
    """What the top of a waived chapter says, in at most four lines at a phone's width: where and when it was
    measured, that the mentor was an earlier one, the waiver's reason, and that a rerun is pending.

    >>> print(banner_text({"executed": "2026-12-01T10:10:47+00:00",
    ...                    "provenance": {"gpu": "NVIDIA H200", "gpu_count": 2},
    ...                    "waiver": {"modules": ["suite.py"], "reason": "its rerun needs two GPUs"}}))
    Rerun pending. Measured on two NVIDIA H200 GPUs on 2026-12-01, with an earlier mentor; since then, its rerun needs two GPUs.
    """
    waiver = meta.get("waiver")
    if not waiver:
        return None
    try:
        where = f" on {stored_run_text('gpus', meta)}"
    except ValueError:
        where = ""
    _, day = _run_words(meta)
    return (f"Rerun pending. Measured{where}{' on ' + day if day else ''}, with an earlier mentor; since then, "
            f"{waiver['reason'].rstrip('.')}.")


def changes_text(meta: dict[str, Any]) -> list[str]:
    """The longer account of a waiver, one paragraph each, for the folded block under :func:`banner_text`: the
    waiver's ``details``, which files changed (which are newly imported or no longer imported), whether the
    measuring cells changed, renamed modules, and the reasons of earlier waivers of the same run.

    >>> for line in changes_text({"mentor_sha256": "628507b8548e5cfe", "scope": "measure",
    ...                           "waiver": {"modules": ["bench.py", "lab/bench.py", "lab/env.py"],
    ...                                      "added": ["lab/bench.py"], "removed": ["bench.py"], "cells_changed": True,
    ...                                      "reason": "needs two GPUs", "written": "2026-12-05T01:02:03+00:00",
    ...                                      "earlier": [{"reason": "first", "written": "2026-12-02T00:00:00+00:00"}]}}):
    ...     print(line)
    The stored measurement used mentor at 628507b8548e (the hash of its source). By 2026-12-05, when the rerun was deferred: its measuring cells changed, mentor/lab/env.py changed, mentor/lab/bench.py is now imported and mentor/bench.py is no longer imported.
    Deferred before, on 2026-12-02: first.
    """
    waiver = meta.get("waiver")
    if not waiver:
        return []
    what, _ = _run_words(meta)
    lines = [str(waiver["details"])] if waiver.get("details") else []
    added, removed = waiver.get("added", []), waiver.get("removed", [])
    parts = ["its measuring cells changed"] if waiver.get("cells_changed") else []
    for group, one, many in (([m for m in waiver.get("modules", []) if m not in added and m not in removed],
                              "changed", "changed"),
                             (added, "is now imported", "are now imported"),
                             (removed, "is no longer imported", "are no longer imported")):
        if group:
            parts.append(f"{_listed(group)} {one if len(group) == 1 else many}")
    said = ("nothing it imports" if not parts else parts[0] if len(parts) == 1
            else ", ".join(parts[:-1]) + " and " + parts[-1])
    when = f"By {str(waiver['written'])[:10]}, when the rerun was deferred" if waiver.get("written") else "Since then"
    lines.append(f"The stored {what} used mentor at {str(meta.get('mentor_sha256') or '?')[:12]} (the hash of its "
                 f"source). {when}: {said}.")
    renames = waiver.get("renames") or {}
    if renames:
        lines.append(f"Its code cells now import {_names(list(renames.values()))} where the stored run imported "
                     f"{_names(list(renames))}; nothing else in them changed.")
    for old in waiver.get("earlier") or []:
        day = f", on {str(old['written'])[:10]}" if old.get("written") else ""
        lines.append(f"Deferred before{day}: {str(old['reason']).rstrip('.')}."
                     + (f" {old['details']}" if old.get("details") else ""))
    return lines


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _show_waiver(app: Any, doctree: Any) -> None:
    """A waived chapter: :func:`banner_text` at the top, its account (:func:`changes_text`) folded under it, and
    :func:`waiver_text` in the run box."""
    import html

    from docutils import nodes
    from sphinx.util import logging

    docname = app.env.docname
    path = Path(app.env.doc2path(docname))
    if path.suffix != ".ipynb":
        return
    meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("mentor", {})
    text = waiver_text(meta)
    if text is None:
        return
    boxes = [box for box in doctree.findall(nodes.admonition)
             if box.children and isinstance(box[0], nodes.title) and box[0].astext() == BOX_TITLE]
    sections = list(doctree.findall(nodes.section))
    if not boxes or not sections:
        logging.getLogger(__name__).warning(
            f"{docname} carries a waiver but has no {'title' if not sections else repr(BOX_TITLE) + ' admonition'} "
            "to show it under; add it", location=docname)
        return
    boxes[0] += nodes.paragraph(text, text, classes=["waiver"])
    account = "".join(f"<p>{html.escape(line)}</p>" for line in changes_text(meta))
    banner = nodes.container(classes=["pending-rerun"])
    banner += nodes.paragraph(banner_text(meta), banner_text(meta))
    banner += nodes.raw("", f"<details><summary>What changed</summary>{account}</details>", format="html")
    title = next((i for i, child in enumerate(sections[0].children) if isinstance(child, nodes.title)), -1)
    sections[0].insert(title + 1, banner)


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
