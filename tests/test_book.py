"""The book: every _toc.yml entry exists, the book builds with -W -n, and the workflows lint clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


def _run_box():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_box", REPO / "book" / "_ext" / "run_box.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page_with_box(title: str):
    from docutils import nodes

    box = nodes.admonition("", nodes.title(title, title), nodes.paragraph("The outputs", "The outputs"))
    return nodes.section("", box), box


class _App:
    """The parts of a Sphinx app that run_box reads: the document being read and its source file."""

    def __init__(self, path: Path) -> None:
        self.env = type("Env", (), {"docname": "book/12", "doc2path": staticmethod(lambda name: str(path))})()


def test_the_run_box_shows_a_waiver(tmp_path: Path) -> None:
    """A waived notebook's "Run this chapter" box gets the waiver's sentence; a notebook without a waiver,
    and a box with another title, are left alone."""
    import json

    from docutils import nodes

    run_box = _run_box()
    meta = {"mentor_sha256": "0123456789abcdef", "executed": "2026-12-01T10:10:47+00:00",
            "waiver": {"modules": ["lab/worker.py"], "reason": "rerunning needs two GPUs", "accepts": "x"}}
    path = tmp_path / "12.ipynb"
    path.write_text(json.dumps({"metadata": {"mentor": meta}, "cells": []}))
    page, box = _page_with_box("Run this chapter")
    other_page, other = _page_with_box("Note")
    run_box._show_waiver(_App(path), page)
    run_box._show_waiver(_App(path), other_page)
    assert [p.astext() for p in box.findall(nodes.paragraph)] == [
        "The outputs", "The stored run used mentor at 0123456789ab (the hash of its source, 2026-12-01); "
        "since then mentor/lab/worker.py changed. It was not rerun: rerunning needs two GPUs."]
    assert len(list(other.findall(nodes.paragraph))) == 1
    path.write_text(json.dumps({"metadata": {"mentor": {"mentor_sha256": "x"}}, "cells": []}))
    page, box = _page_with_box("Run this chapter")
    run_box._show_waiver(_App(path), page)
    assert len(list(box.findall(nodes.paragraph))) == 1


@pytest.mark.book
def test_every_waiver_is_on_its_page(built_book) -> None:
    """Each notebook that keeps its stored run under a waiver shows the waiver in its run box on the built page."""
    import html as html_module
    import json

    _, html, present = built_book
    waived = {}
    for entry in present:
        source = nbtools.toc_source(entry)
        if source is not None and source.suffix == ".ipynb":
            meta = json.loads(source.read_text()).get("metadata", {}).get("mentor", {})
            if meta.get("waiver"):
                waived[entry] = _run_box().waiver_text(meta)
    for entry, text in waived.items():
        page = html_module.unescape((html / f"{entry}.html").read_text())
        assert text in page, f"{entry}.html does not show its waiver: {text}"
