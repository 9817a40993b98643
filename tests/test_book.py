"""The book: every _toc.yml entry exists, the book builds with -W -n, and the workflows lint clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nbtools_loader import nbtools

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def prune_toc(node: object, keep: set[str]) -> object:
    """A copy of a toc without the file entries outside ``keep``, and without parts left empty."""
    if isinstance(node, dict):
        pruned = {key: prune_toc(value, keep) for key, value in node.items()}
        return {key: value for key, value in pruned.items() if value != []}
    if isinstance(node, list):
        items = []
        for item in node:
            if isinstance(item, dict) and "file" in item and item["file"] not in keep:
                continue
            item = prune_toc(item, keep)
            if isinstance(item, dict) and "file" not in item and not any(isinstance(v, list) for v in item.values()):
                continue  # a part whose chapters are all gone
            items.append(item)
        return items
    return node


def test_toc_entries_exist() -> None:
    """Every entry of _toc.yml exists as book/NAME.ipynb or book/NAME.md."""
    missing = [entry for entry in nbtools.toc_files() if nbtools.toc_source(entry) is None]
    assert not missing, f"_toc.yml lists entries with neither .ipynb nor .md: {', '.join(missing)}"


@pytest.mark.book
def test_book_builds(built_book) -> None:
    """jupyter-book builds a copy of the book with -W -n (the chapters that exist so far), one page per entry."""
    build, html, present = built_book
    assert build.returncode == 0, f"jupyter-book build failed:\n{build.stderr[-8000:]}\n{build.stdout[-2000:]}"
    pages = [entry for entry in present if not (html / f"{entry}.html").is_file()]
    assert not pages, f"no HTML page for {pages}"
    assert (html / "index.html").is_file()


def test_workflows_pass_actionlint() -> None:
    """.github/workflows/*.yml pass actionlint (the binary installed in the venv)."""
    actionlint = shutil.which("actionlint", path=str(BIN))
    assert actionlint, f"actionlint is not installed next to {sys.executable}; pip install -r requirements.txt"
    workflows = sorted((REPO / ".github" / "workflows").glob("*.yml"))
    assert workflows, "no workflow files in .github/workflows"
    lint = subprocess.run(
        [actionlint, "-no-color", *map(str, workflows)], capture_output=True, text=True, cwd=REPO
    )
    assert lint.returncode == 0, f"actionlint:\n{lint.stdout}{lint.stderr}"


def test_local_inventories_are_current() -> None:
    """book/_inv/*.inv list exactly the names and pages of scripts/inventories.py."""
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "inventories.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.book
def test_api_reference_links_the_library_docs(built_book) -> None:
    """Types in mentor's signatures link to the Python, PyTorch and TorchMetrics docs through intersphinx."""
    _, html, _ = built_book
    page = (html / "book" / "api.html").read_text()
    for url in ("https://docs.pytorch.org/docs/stable/tensors.html#torch.Tensor",
                "https://docs.python.org/3/library/pathlib.html#pathlib.Path",
                "https://lightning.ai/docs/torchmetrics/stable/references/metric.html#torchmetrics.Metric"):
        assert f'href="{url}"' in page, f"api.html has no link to {url}"
