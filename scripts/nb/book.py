"""Where the book's notebooks are and in which order they run: the toc, the run order, who reads whom."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent.parent
BOOK = REPO / "book"


LAST = ("intro.ipynb", "reproducibility.ipynb")
"""Run after the chapters, in this order: the intro reads chapter 8's results file, and
reproducibility.ipynb reads every notebook's stored metadata (the intro's included)."""


COPY_IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "_out", "__pycache__")


def display_path(path: Path) -> str:
    """``path`` relative to the repository when inside it, else as given."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def default_notebooks(book: Path = BOOK) -> list[Path]:
    """Every notebook directly in ``book``, sorted by name."""
    return sorted(book.glob("*.ipynb"))


def toc_files(toc: Path = REPO / "_toc.yml") -> list[str]:
    """Every file entry of a jb-book ``_toc.yml`` (root first), as written there: no suffix."""
    import yaml

    def walk(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            if "file" in node:
                yield str(node["file"])
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    data = yaml.safe_load(toc.read_text())
    return [str(data["root"]), *walk({k: v for k, v in data.items() if k != "root"})]


def toc_source(entry: str, root: Path = REPO) -> Path | None:
    """The .ipynb or .md file a toc entry names, or None when neither exists."""
    for suffix in (".ipynb", ".md"):
        path = root / (entry + suffix)
        if path.is_file():
            return path
    return None


def run_order(notebooks: Sequence[Path]) -> list[Path]:
    """``notebooks`` in the given order, except that a notebook runs after those of the list whose results it reads
    (:data:`READS`), and intro.ipynb then reproducibility.ipynb run last.

    Example:
        >>> [p.name for p in run_order([Path("08_summary.ipynb"), Path("intro.ipynb"), Path("02_naive_metrics.ipynb")])]
        ['02_naive_metrics.ipynb', '08_summary.ipynb', 'intro.ipynb']
    """
    chapters = [p for p in notebooks if p.name not in LAST]
    listed = {p.name for p in chapters}
    ordered: list[Path] = []
    while len(ordered) < len(chapters):
        done = {p.name for p in ordered}
        ready = next(p for p in chapters if p not in ordered
                     and all(other in done or other not in listed for other in READS.get(p.name, ())))
        ordered.append(ready)
    return ordered + sorted((p for p in notebooks if p.name in LAST), key=lambda p: LAST.index(p.name))


READS: dict[str, tuple[str, ...]] = {
    "08_summary.ipynb": ("02_naive_metrics.ipynb", "05_weight.ipynb", "06_nan_check.ipynb"),
    "15_what_to_use.ipynb": ("09_when_it_matters.ipynb", "14_compile.ipynb", "16_frameworks.ipynb"),
    "intro.ipynb": ("02_naive_metrics.ipynb", "05_weight.ipynb", "06_nan_check.ipynb", "08_summary.ipynb",
                    "09_when_it_matters.ipynb", "14_compile.ipynb", "16_frameworks.ipynb"),
}
"""Notebooks that read the results files other notebooks write (``results/...``), or the values they glued: the
stored run (or, of a split notebook, the render) of each must be newer than the stored runs of those it reads. ``reproducibility.ipynb`` reads every notebook's metadata, so its run
must be newer than all of them."""
EVERY = "reproducibility.ipynb"


def reads_of(nb_path: Path) -> tuple[str, ...]:
    """The notebooks beside ``nb_path`` whose results or metadata it reads (:data:`READS`; every one for EVERY)."""
    folder, name = Path(nb_path).parent, Path(nb_path).name
    if name == EVERY:
        return tuple(p.name for p in sorted(folder.glob("*.ipynb")) if p.name != name)
    return READS.get(name, ())


def _executed(path: Path) -> str | None:
    """The ``executed`` time of the stored run in the notebook at ``path``; None when it has none or is unreadable."""
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))["metadata"]["mentor"]["executed"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
