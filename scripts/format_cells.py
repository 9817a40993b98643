#!/usr/bin/env python3
"""Format the visible code cells of the book's notebooks to fit a phone: black at LINE_LENGTH columns.

    python scripts/format_cells.py [--check] [NB ...]   # default: every book/*.ipynb

A cell the reader sees (not tagged ``remove-cell`` or ``remove-input``) is formatted with black's notebook
mode, which keeps a final ``;`` and magics. black keeps the syntax tree, so the stored run stays current
(``nbtools.py``'s ``ast-1`` hash). A line black cannot shorten (a long string) is listed; split it by hand
into adjacent literals, which Python joins, so that too leaves the syntax tree as it was. ``--check``
changes nothing and fails when a cell would change or a line is too long.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
LINE_LENGTH = 72
"""Columns of code that the book's column shows without scrolling on a 1280 px screen (77 at 14 px monospace)."""
HIDDEN = {"remove-cell", "remove-input"}


def visible_code(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The code cells a reader of the book sees."""
    return [c for c in nb.cells if c.cell_type == "code" and not HIDDEN & set(c.metadata.get("tags", []))]


def format_source(source: str, line_length: int = LINE_LENGTH) -> str:
    """``source`` as black formats a notebook cell (unchanged when black has nothing to change)."""
    try:
        import black
    except ImportError as error:
        raise SystemExit("scripts/format_cells.py needs black with its notebook support, which the book's "
                         "requirements leave out: python -m pip install 'black[jupyter]'") from error

    try:
        return black.format_cell(source, fast=False, mode=black.Mode(line_length=line_length))
    except black.NothingChanged:
        return source


def long_lines(source: str, line_length: int = LINE_LENGTH) -> list[str]:
    """The lines of ``source`` longer than ``line_length``."""
    return [line for line in source.splitlines() if len(line) > line_length]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; fail if a cell would change")
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="NB")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((REPO / "book").glob("*.ipynb"))
    status = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        changed = 0
        for cell in visible_code(nb):
            new = format_source(cell.source)
            if new != cell.source:
                changed += 1
                if not args.check:
                    cell.source = new
            for line in long_lines(new):
                print(f"{path.name}: {len(line)} columns: {line.strip()}")
                status = 1
        if changed and args.check:
            print(f"{path.name}: {changed} cells are not formatted (run python scripts/format_cells.py {path})")
            status = 1
        elif changed:
            nbformat.write(nb, path)
    return status


if __name__ == "__main__":
    sys.exit(main())
