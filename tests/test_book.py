"""The book: every _toc.yml entry exists, the book builds with -W -n, and the workflows lint clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nbtools_loader import book as nb_book

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
    missing = [entry for entry in nb_book.toc_files() if nb_book.toc_source(entry) is None]
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
    return nodes.section("", nodes.title("12. Two GPUs", "12. Two GPUs"), nodes.paragraph("Intro.", "Intro."), box), box


class _App:
    """The parts of a Sphinx app that run_box reads: the document being read and its source file."""

    def __init__(self, path: Path) -> None:
        self.env = type("Env", (), {"docname": "book/12", "doc2path": staticmethod(lambda name: str(path))})()


def test_the_run_box_shows_a_waiver(tmp_path: Path) -> None:
    """A waived notebook's page gets the note under its title (with its account folded) and the waiver's sentence in
    its "Run this chapter" box; a notebook without a waiver, and a box with another title, are left alone."""
    import json

    from docutils import nodes

    run_box = _run_box()
    meta = {"mentor_sha256": "0123456789abcdef", "executed": "2026-12-01T10:10:47+00:00",
            "provenance": {"gpu": "NVIDIA H200", "gpu_count": 2},
            "waiver": {"modules": ["lab/worker.py"], "reason": "rerunning needs two GPUs", "accepts": "x"}}
    path = tmp_path / "12.ipynb"
    path.write_text(json.dumps({"metadata": {"mentor": meta}, "cells": []}))
    page, box = _page_with_box("Run this chapter")
    run_box._show_waiver(_App(path), page)
    assert [p.astext() for p in box.findall(nodes.paragraph)] == [
        "The outputs", "Rerun pending: the stored run of 2026-12-01 used an earlier mentor; since then, rerunning "
        "needs two GPUs."]
    banner = page.children[1]  # right under the title, before the page's first paragraph
    assert isinstance(banner, nodes.container) and banner["classes"] == ["pending-rerun"]
    assert banner[0].astext() == ("Rerun pending. Measured on two NVIDIA H200 GPUs on 2026-12-01, with an earlier "
                                  "mentor; since then, rerunning needs two GPUs.")
    assert banner[1].astext() == (
        "<details><summary>What changed</summary><p>The stored run used mentor at 0123456789ab (the hash of its "
        "source). Since then: mentor/lab/worker.py changed.</p></details>")
    assert page.children[2].astext() == "Intro."
    other_page, other = _page_with_box("Note")
    run_box._show_waiver(_App(path), other_page)  # no run box: nothing is added, and Sphinx is warned
    assert len(list(other.findall(nodes.paragraph))) == 1 and not list(other_page.findall(nodes.container))
    path.write_text(json.dumps({"metadata": {"mentor": {"mentor_sha256": "x"}}, "cells": []}))
    page, box = _page_with_box("Run this chapter")
    run_box._show_waiver(_App(path), page)
    assert len(list(box.findall(nodes.paragraph))) == 1 and not list(page.findall(nodes.container))


@pytest.mark.book
def test_every_waiver_is_on_its_page(built_book) -> None:
    """Each notebook that keeps its stored run under a waiver shows the waiver in its run box on the built page."""
    import html as html_module
    import json

    _, html, present = built_book
    waived = {}
    for entry in present:
        source = nb_book.toc_source(entry)
        if source is not None and source.suffix == ".ipynb":
            meta = json.loads(source.read_text()).get("metadata", {}).get("mentor", {})
            if meta.get("waiver"):
                waived[entry] = _run_box().waiver_text(meta)
    for entry, text in waived.items():
        page = html_module.unescape((html / f"{entry}.html").read_text())
        assert text in page, f"{entry}.html does not show its waiver: {text}"


def _repository():
    import importlib.util

    spec = importlib.util.spec_from_file_location("repository", REPO / "book" / "_ext" / "repository.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Config:
    """The part of a Sphinx config that the repository extension writes: the theme's options."""

    def __init__(self, options: dict) -> None:
        self.html_theme_options = options


def test_the_repository_button_shows_only_when_an_address_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """BOOK_REPOSITORY_URL turns the theme's repository button on and points it there, normalised; unset or empty,
    the theme's options stay exactly as _config.yml made them (button off, no address)."""
    repository = _repository()
    built = {"repository_url": "", "use_repository_button": False, "use_issues_button": False}
    for unset in (None, "", "  "):
        if unset is None:
            monkeypatch.delenv("BOOK_REPOSITORY_URL", raising=False)
        else:
            monkeypatch.setenv("BOOK_REPOSITORY_URL", unset)
        config = _Config(dict(built))
        repository._set_repository(None, config)
        assert config.html_theme_options == built
    monkeypatch.setenv("BOOK_REPOSITORY_URL", " https://GitHub.com/owner/metrics-book/ ")
    config = _Config(dict(built))
    repository._set_repository(None, config)
    assert config.html_theme_options == {"repository_url": "https://github.com/owner/metrics-book",
                                         "use_repository_button": True, "use_issues_button": False}
    assert built["use_repository_button"] is False  # the options are replaced, not edited in place


@pytest.mark.parametrize("value", ["github.com/owner/name", "http://github.com/owner/name",
                                   "https://example.org/owner/name", "https://github.com/owner",
                                   "https://github.com/owner/name/tree/main", "https://github.com/owner/name?tab=1"])
def test_a_wrong_repository_address_fails_the_build_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                         value: str) -> None:
    from sphinx.errors import ConfigError

    repository = _repository()
    monkeypatch.setenv("BOOK_REPOSITORY_URL", value)
    with pytest.raises(ConfigError) as raised:
        repository._set_repository(None, _Config({}))
    assert str(raised.value) == (
        f"BOOK_REPOSITORY_URL={value!r} is not a repository address: pass https://HOST/OWNER/NAME with HOST one of "
        "github.com, gitlab.com, bitbucket.org, or leave it unset for no repository link")


def test_the_repository_address_examples_hold() -> None:
    import doctest

    result = doctest.testmod(_repository(), optionflags=doctest.ELLIPSIS)
    assert result.attempted == 3 and result.failed == 0


@pytest.mark.parametrize("address", ["https://github.com/owner/metrics-book", None])
def test_a_sphinx_build_shows_the_repository_button_exactly_when_told(tmp_path: Path, address: str | None) -> None:
    """A one-page build with the book's theme and this extension: with BOOK_REPOSITORY_URL set, the page's header
    links to the repository; without it, no page names a repository at all."""
    import os

    (tmp_path / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\n"
        "extensions = ['repository']\n"
        "html_theme = 'sphinx_book_theme'\n"
        "html_theme_options = {'repository_url': '', 'use_repository_button': False}\n")
    (tmp_path / "index.rst").write_text("Title\n=====\n\nText.\n")
    env = {key: value for key, value in os.environ.items() if key != "BOOK_REPOSITORY_URL"}
    if address is not None:
        env["BOOK_REPOSITORY_URL"] = address
    build = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(tmp_path), str(tmp_path / "out")],
                           capture_output=True, text=True, env=env)
    assert build.returncode == 0, build.stderr[-4000:]
    page = (tmp_path / "out" / "index.html").read_text()
    if address is None:
        assert "github.com/owner" not in page and "Source repository" not in page
    else:
        assert f'href="{address}"' in page and "Source repository" in page


@pytest.mark.parametrize("extension", [True, False])
def test_the_search_index_holds_the_parts_of_underscored_names(tmp_path: Path, extension: bool) -> None:
    """With book/_ext/search_parts.py, a page that names only ``scatter_stat_scores`` is indexed under "scatter" too
    (stemmed as Sphinx stems it); without it, only under the whole name, which is why the search missed it."""
    import json

    (tmp_path / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\n"
        f"extensions = {['search_parts'] if extension else []!r}\n")
    (tmp_path / "index.rst").write_text("Title\n=====\n\n.. toctree::\n\n   other\n\nA plain scatter plot.\n")
    (tmp_path / "other.rst").write_text("Other\n=====\n\nCount with ``scatter_stat_scores``.\n")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(tmp_path), str(tmp_path / "out")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    text = (tmp_path / "out" / "searchindex.js").read_text()
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])

    def pages(term: str) -> list[str]:
        found = index["terms"].get(term, [])
        return sorted(index["docnames"][i] for i in ([found] if isinstance(found, int) else found))

    assert pages("scatter") == (["index", "other"] if extension else ["index"])
    assert pages("scatter_stat_scor") == ["other"]
    assert pages("stat") == (["other"] if extension else [])


def test_the_search_part_examples_hold() -> None:
    import doctest
    import importlib.util

    spec = importlib.util.spec_from_file_location("search_parts", REPO / "book" / "_ext" / "search_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = doctest.testmod(module)
    assert result.attempted == 1 and result.failed == 0


def test_the_run_box_examples_hold() -> None:
    import doctest

    result = doctest.testmod(_run_box(), optionflags=doctest.ELLIPSIS)
    assert result.attempted == 11 and result.failed == 0


@pytest.mark.parametrize(("provenance", "shown"), [({"gpu": "NVIDIA H200", "gpu_count": 2}, "two NVIDIA H200 GPUs"),
                                                   ({"gpu": "NVIDIA H200", "gpu_count": 1}, "one NVIDIA H200 GPU"),
                                                   (None, None)])
def test_a_sphinx_build_writes_the_stored_runs_gpus(tmp_path: Path, provenance: dict | None, shown: str | None) -> None:
    """A one-page build of a notebook with myst-nb: ``{stored-run}`gpus``` shows the GPUs of the stored run's
    metadata; a notebook without a stored GPU run fails the build (-W) with a message that says how to store one."""
    import json

    (tmp_path / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\n"
        "extensions = ['myst_nb', 'run_box']\n"
        "nb_execution_mode = 'off'\n")
    meta = {"executed": "2026-12-01T10:10:47+00:00"} | ({"provenance": provenance} if provenance else {})
    cell = {"cell_type": "markdown", "metadata": {}, "source": "# Title\n\nRan on {stored-run}`gpus` on {stored-run}`date`."}
    (tmp_path / "index.ipynb").write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": [cell],
                                                      "metadata": {"mentor": meta}}))
    build = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-W", "-b", "html", str(tmp_path),
                            str(tmp_path / "out")], capture_output=True, text=True)
    if shown is None:
        assert build.returncode != 0
        assert "index: the notebook has no stored GPU run" in build.stderr and "make gpu-run" in build.stderr
    else:
        assert build.returncode == 0, build.stderr[-4000:]
        page = (tmp_path / "out" / "index.html").read_text()
        assert f'<span class="stored-run">{shown}</span> on <span class="stored-run">2026-12-01</span>' in page


@pytest.mark.book
def test_no_page_links_to_a_file_url(built_book) -> None:
    """docutils turns a bare ``file:line`` in a docstring into a link to the URL "file:line"; no page may carry one."""
    import re

    _, html, _ = built_book
    bad = {str(page.relative_to(html)): sorted(set(re.findall(r'href="(file:[^"]*)"', page.read_text())))
           for page in html.rglob("*.html")}
    assert not {page: links for page, links in bad.items() if links}


def _docstring_literals():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docstring_literals", REPO / "book" / "_ext" / "docstring_literals.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docstring_literal_examples_hold() -> None:
    import doctest

    result = doctest.testmod(_docstring_literals())
    assert result.attempted == 2 and result.failed == 0


@pytest.mark.parametrize("extension", [True, False])
def test_a_bare_file_line_in_a_docstring_links_nowhere_with_the_extension(tmp_path: Path, extension: bool) -> None:
    """A one-page autodoc build of a module whose docstrings say file:line bare: without book/_ext/docstring_literals.py
    each becomes a link to the URL "file:line" (the defect); with it, each is shown as inline code and nothing links."""
    (tmp_path / "plain.py").write_text('"""Every sync with its file:line."""\n\n\ndef f():\n    """(file:line is where it points)."""\n')
    (tmp_path / "conf.py").write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(tmp_path)!r}, {str(REPO / 'book' / '_ext')!r}]\n"
        f"extensions = {['sphinx.ext.autodoc'] + (['docstring_literals'] if extension else [])!r}\n")
    (tmp_path / "index.rst").write_text("Title\n=====\n\n.. automodule:: plain\n   :members:\n")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(tmp_path), str(tmp_path / "out")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    page = (tmp_path / "out" / "index.html").read_text()
    assert page.count('href="file:line"') == (0 if extension else 2)
    assert page.count('<span class="pre">file:line</span>') == (2 if extension else 0)
