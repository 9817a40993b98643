"""mentor.lab.stored: values another chapter glued, read back from its stored notebook, and two verdicts in words."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from mentor.lab.stored import GLUE_TEXT, both, glued

stored_book = pytest.mark.skipif(not (Path(__file__).resolve().parents[1] / "book").is_dir(),
                                 reason="reads the stored book, which mutmut's copy of the tree does not hold")


def _glue_output(name: str, text: object) -> dict:
    return new_output("display_data", data={GLUE_TEXT: text},
                      metadata={"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}})


def test_glued_reads_literals_by_name_and_skips_other_objects(tmp_path: Path) -> None:
    cell = new_code_cell("", outputs=[
        _glue_output("bound", "'host-bound'"), _glue_output("ms", "4.346560001373291"),
        _glue_output("fig", "<IPython.core.display.SVG object>"),
        _glue_output("split", ["'two ", "lines'"]),
        new_output("stream", name="stdout", text="printed, not glued\n")])
    path = tmp_path / "n.ipynb"
    nbformat.write(new_notebook(cells=[cell]), path)
    assert glued(path) == {"bound": "host-bound", "ms": 4.346560001373291, "split": "two lines"}


@stored_book
def test_glued_reads_the_stored_regimes_of_chapter_9() -> None:
    values = glued(Path(__file__).resolve().parents[1] / "book" / "09_when_it_matters.ipynb")
    points = ("fp32_b128", "fp32_b64", "fp32_b32", "bf16_b128", "bf16_b32", "bf16_b32_96px")
    assert {values[f"{p}_bound"] for p in points} <= {"host-bound", "GPU-bound"}


def test_glued_names_a_missing_notebook(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no.ipynb does not exist; pass the path of a chapter's .ipynb"):
        glued(tmp_path / "no.ipynb")


@pytest.mark.parametrize(("first", "second", "said"), [
    ("slower", "slower", "both lie above 0"),
    ("faster", "faster", "both lie below 0"),
    ("no difference resolved", "no difference resolved", "both contain 0"),
    ("slower", "no difference resolved", "the first lies above 0 and the second contains 0"),
    ("no difference resolved", "faster", "the first contains 0 and the second lies below 0"),
])
def test_both_says_where_two_intervals_lie(first: str, second: str, said: str) -> None:
    assert both(first, second) == said


def test_both_refuses_a_word_that_is_not_a_verdict() -> None:
    with pytest.raises(ValueError, match="a verdict is one of 'slower', 'faster', 'no difference resolved', got 'worse'"):
        both("slower", "worse")


@stored_book
def test_chapter_9_stores_the_withdrawals_its_results_give_and_its_lists_keep_them() -> None:
    """The glued ``unranked`` of chapter 9's stored run matches its stored results (the sync-free macro pair is
    listed at a point exactly when the rule withdraws it there), and its quoted list names each such point as not
    ranked: the word that chapters 8 and 15 quote from it."""
    from mentor.lab.comparison import load_sweep
    from mentor.lab.wording import side, withdrawn

    book = Path(__file__).resolve().parents[1] / "book"
    values = glued(book / "09_when_it_matters.ipynb")
    results = load_sweep(str(book / "results" / "ch09"))
    label = "the sync-free macro set against the syncing one"
    for point, cmp in results.items():
        aa = cmp.overhead("no metrics, again", kind="throughput")
        pair = cmp.overhead("macro sync-free", kind="throughput", against="macro")
        expected = side(aa) != "containing 0" and withdrawn(pair, aa)
        assert (label in values["unranked"].get(point, [])) == expected, point
        said = values["msf_vs_macro"].split("not ranked in that run", 1)
        assert (len(said) == 2 and point in said[1].split("; ")[0]) == expected, point
