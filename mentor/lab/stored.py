"""What another chapter stored: the values a notebook glued in its stored run, read back from its file.

A page that gathers other chapters' results (chapter 15) computes its words from what those chapters stored:
their results files under ``book/results/`` where the value is there, and, where a chapter computed a value in
its run and glued it without writing it to a file (a regime read off a trace, say), the glued value itself, as
the notebook stores it (``myst_nb.glue`` keeps each value's mime bundle in a ``display_data`` output whose
metadata names it: ``{"scrapbook": {"name": ...}}``). Only values that print as Python literals are read:
strings and numbers.
"""

from __future__ import annotations

import ast
import json
import os
from typing import Any

GLUE_TEXT = "application/papermill.record/text/plain"


def glued(notebook: str | os.PathLike[str]) -> dict[str, Any]:
    """Every value ``notebook`` glued in its stored run whose text form is a Python literal, by name.

    Example:
        >>> import tempfile, pathlib
        >>> cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": [{"output_type": "display_data",
        ...         "metadata": {"scrapbook": {"name": "bound", "mime_prefix": "application/papermill.record/"}},
        ...         "data": {GLUE_TEXT: "'host-bound'"}}]}
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "n.ipynb"
        >>> _ = path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        >>> glued(path)
        {'bound': 'host-bound'}
    """
    try:
        cells = json.loads(open(notebook, encoding="utf-8").read())["cells"]
    except FileNotFoundError:
        raise FileNotFoundError(f"glued reads a stored notebook, and {notebook} does not exist; pass the path of a "
                                "chapter's .ipynb file, e.g. 09_when_it_matters.ipynb from the book's folder") from None
    values: dict[str, Any] = {}
    for cell in cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get(GLUE_TEXT)
            if name is None or text is None:
                continue
            try:
                values[name] = ast.literal_eval("".join(text) if isinstance(text, list) else text)
            except (ValueError, SyntaxError):
                continue  # a figure or another object: not a value a sentence reads
    return values


def both(first: str, second: str, words: dict[str, str] | None = None) -> str:
    """What two verdicts of :meth:`mentor.lab.comparison.Comparison.verdict` say together, in words.

    Example:
        >>> both("slower", "slower"), both("slower", "no difference resolved")
        ('both lie above 0', 'the first lies above 0 and the second contains 0')
    """
    words = words or {"slower": "above 0", "faster": "below 0", "no difference resolved": "contains 0"}
    for verdict in (first, second):
        if verdict not in words:
            raise ValueError(f"a verdict is one of {', '.join(map(repr, words))}, got {verdict!r}")
    if first == second:
        plain = words[first]
        return "both contain 0" if plain == "contains 0" else f"both lie {plain}"
    said = ["lies " + words[v] if words[v] != "contains 0" else "contains 0" for v in (first, second)]
    return f"the first {said[0]} and the second {said[1]}"
