"""Pending reruns: a library change lands with the stored runs it stales kept under a waiver, named on their pages
and in the README, until they are rerun (scripts/nb/waivers.py, scripts/nb/check.py, book/_ext/run_box.py)."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbtools_loader import book as nb_book
from nbtools_loader import check as nb_check
from nbtools_loader import hashes as nb_hashes
from nbtools_loader import nbtools
from nbtools_loader import render as nb_render
from nbtools_loader import waivers as nb_waivers

REPO = Path(__file__).resolve().parent.parent


def test_the_readme_lists_the_pending_reruns() -> None:
    """The README's list is what ``nbtools pending --readme`` writes from the notebooks' waivers."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    listed = text.split(nb_waivers.README_START)[1].split(nb_waivers.README_END)[0].strip()
    assert listed == nb_waivers.pending_markdown(nb_book.default_notebooks()), (
        "README.md's list of pending reruns is not current: python scripts/nbtools.py pending --readme")


def test_every_pending_rerun_is_named_at_the_top_of_its_page() -> None:
    """Each waived notebook's page shows the banner (the extension needs a title and a run box to put it in)."""
    box = nb_waivers._run_box()
    for path in nb_book.default_notebooks():
        nb = nbformat.read(path, as_version=4)
        meta = nb.metadata.get("mentor", {})
        if not meta.get("waiver"):
            continue
        banner = box.banner_text(meta)
        assert banner.startswith("Rerun pending. Measured on ") and meta["waiver"]["reason"].rstrip(".") in banner
        markdown = [c.source for c in nb.cells if c.cell_type == "markdown"]
        assert markdown and markdown[0].startswith("# "), f"{path.name}: the banner goes under a title"
        assert any(box.BOX_TITLE in s for s in markdown), f"{path.name}: no '{box.BOX_TITLE}' box"
        assert len(meta["waiver"]["reason"]) <= nb_waivers.REASON_LIMIT


def test_a_reason_too_long_for_four_phone_lines_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), path)
    assert nbtools.main(["waive", str(path), "--reason", "x" * (nb_waivers.REASON_LIMIT + 1)]) == 1
    assert capsys.readouterr().err.strip() == (
        "the waiver: the reason has 91 characters, and the page shows it at the top of the chapter in at most four "
        "phone lines: say it in 90 or fewer, and put the rest in --details (shown folded)")


def _edit_compute(package: Path, statement: str) -> None:
    """Put ``statement`` first in the body of ``FusedMetrics.compute`` in ``package``'s suite.py."""
    path = package / "suite.py"
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    suite = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FusedMetrics")
    compute = next(n for n in suite.body if isinstance(n, ast.FunctionDef) and n.name == "compute")
    lines = text.splitlines(keepends=True)
    first = compute.body[0].lineno - 1
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    lines.insert(first, f"{indent}{statement}\n")
    path.write_text("".join(lines), encoding="utf-8")


@pytest.fixture
def book_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The book's notebooks and the mentor package, copied; the notebook tools pointed at the copies."""
    book = tmp_path / "book"
    book.mkdir()
    for path in nb_book.default_notebooks():
        shutil.copy(path, book / path.name)
    for folder in ("results", "traces", "_ext"):
        (book / folder).symlink_to(REPO / "book" / folder)
    shutil.copytree(REPO / "mentor", tmp_path / "mentor", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(nb_hashes, "MENTOR", tmp_path / "mentor")
    monkeypatch.setattr(nb_book, "default_notebooks", lambda folder=book: sorted(folder.glob("*.ipynb")))
    return book


def _needs(messages: list[str]) -> dict[str, set[str]]:
    """Notebook names by what their messages ask for: a GPU run ("gpu") or a render ("render")."""
    out: dict[str, set[str]] = {"gpu": set(), "render": set()}
    for message in messages:
        name = Path(message.split(":")[0]).name
        out["gpu" if "make gpu-run" in message else "render"].add(name)
    return out


def test_a_library_edit_is_pending_until_waived_and_stales_only_what_runs_it(book_copy: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """On a copy of the book: an edit of ``FusedMetrics.compute`` fails the check for the chapters that build a
    FusedMetrics (the README names them) and none of part I; waiving the stale runs (and rendering the page that
    presents the suite) passes it; a second edit fails it again until those runs are waived again.

    The renders here record what a render records (hashes of the presenting code and of the mentor source it
    reaches, the results read, the outputs) but do not execute the cells, which keep their stored outputs: the
    made-up edit changes no value, and tests/test_render.py executes renders (four of them here took 40 s)."""
    monkeypatch.setattr(nb_render, "_present", lambda nb, folder, name, env: 0.0)
    notebooks = nb_book.default_notebooks()
    assert nb_check.stale(notebooks) == []
    _edit_compute(nb_hashes.MENTOR, "first_edit = 1")
    needs = _needs(nb_check.stale(notebooks))
    building = {"09_when_it_matters.ipynb", "10_macro_and_collections.ipynb", "12_two_gpus.ipynb",
                "13_since_1_6_1.ipynb", "14_compile.ipynb", "16_frameworks.ipynb"}
    # the pages that present the suite's values need a render (chapter 12's presenting cells read the worker, whose
    # table of tasks names the suite's configuration; chapter 14's read its compile reports with
    # mentor.lab.compiled, which reaches the suite; chapter 13's rebuild its releases' records with
    # mentor.lab.releases, whose table of updates names the suite): on any machine
    presenting = {"12_two_gpus.ipynb", "13_since_1_6_1.ipynb", "14_compile.ipynb", "adopting.ipynb"}
    assert needs == {"gpu": building, "render": presenting}

    reason = "a made-up edit of FusedMetrics.compute, to test the pending reruns"
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(nb_hashes.MENTOR.parent), env.get("PYTHONPATH", "")])
    assert nbtools.main(["waive", "--stale", "--reason", reason]) == 0
    assert _needs(nb_check.stale(notebooks)) == {"gpu": set(), "render": presenting}
    for name in sorted(presenting):
        nb_render.render(book_copy / name, env=env)
    assert nb_check.stale(notebooks) == []
    for name in building:
        meta = nbformat.read(book_copy / name, as_version=4).metadata["mentor"]
        assert meta["waiver"]["reason"] == reason
        assert nb_waivers.waiver_text(meta).endswith(f"since then, {reason}.")
    for name in ("01_baseline.ipynb", "02_naive_metrics.ipynb"):  # untouched: part I never runs the suite
        assert (nbformat.read(book_copy / name, as_version=4).metadata["mentor"]
                == nbformat.read(REPO / "book" / name, as_version=4).metadata["mentor"]), name

    _edit_compute(nb_hashes.MENTOR, "second_edit = 2")  # the waivers accept the first edit only
    assert _needs(nb_check.stale(notebooks)) == {"gpu": building, "render": presenting}
    assert nbtools.main(["waive", "--stale", "--reason", reason]) == 0
    assert _needs(nb_check.stale(notebooks)) == {"gpu": set(), "render": presenting}  # renders as above


# --- printed intervals show their side of 0 (issue 51): every glued interval against the verdict glued beside it ---

import re  # noqa: E402

from mentor.lab.stored import glued  # noqa: E402

_INTERVAL = re.compile(r"^[+-]?[\d.]+ % \[([+-]?[\d.]+), ([+-]?[\d.]+)\]$")
STORED_BEFORE_THE_FORMAT: set[tuple[str, str]] = set()  # chapter 7's two, rerun on 2026-12-07, went
"""Glued intervals of pending runs, printed before an end that rounds to 0 got the decimals that show its side:
their stored text reads "[0.0, 0.1]" beside "slower". The chapter's rerun prints them afresh; then the entry goes."""


def _disagreements(notebook: Path) -> set[tuple[str, str]]:
    """The (notebook, name) of each interval that ``Comparison.facts`` glued (``X_overhead``, ``X_tput_overhead``)
    whose printed ends do not show the side of 0 that the verdict glued beside it (``X_verdict``) says."""
    values = glued(notebook)
    out = set()
    for name, text in values.items():
        for suffix, verdict_suffix in (("_tput_overhead", "_tput_verdict"), ("_overhead", "_verdict")):
            if not name.endswith(suffix):
                continue
            verdict = values.get(name[: -len(suffix)] + verdict_suffix)
            match = _INTERVAL.match(text) if isinstance(text, str) else None
            if match and verdict in ("slower", "faster"):
                lo, hi = float(match.group(1)), float(match.group(2))
                if not (lo > 0 if verdict == "slower" else hi < 0):
                    out.add((notebook.name, name))
            break
    return out


def test_every_glued_interval_shows_the_side_of_0_its_verdict_says() -> None:
    found = set().union(*(_disagreements(p) for p in nb_book.default_notebooks()))
    assert found - STORED_BEFORE_THE_FORMAT == set(), "printed ends that do not show the verdict's side of 0"
    assert STORED_BEFORE_THE_FORMAT - found == set(), "rerun since: take these out of STORED_BEFORE_THE_FORMAT"
    pending = {p.name for p in nb_book.default_notebooks()
               if nbformat.read(p, as_version=4).metadata.get("mentor", {}).get("waiver")}
    assert {name for name, _ in STORED_BEFORE_THE_FORMAT} <= pending  # only runs that await their rerun are excused


def test_the_check_of_printed_ends_finds_an_end_that_hides_its_side(tmp_path: Path) -> None:
    def glue(name: str, text: str) -> dict:
        return {"output_type": "display_data", "data": {"application/papermill.record/text/plain": repr(text)},
                "metadata": {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}}}

    cell = {"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1, "outputs": [
        glue("a_overhead", "+0.0 % [0.0, 0.1]"), glue("a_verdict", "slower"),
        glue("b_tput_overhead", "+0.03 % [0.01, 0.04]"), glue("b_tput_verdict", "slower"),
        glue("c_overhead", "-0.02 % [-0.04, -0.001]"), glue("c_verdict", "faster")]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert _disagreements(path) == {("x.ipynb", "a_overhead")}
