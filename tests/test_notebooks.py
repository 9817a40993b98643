"""The book's notebooks: CPU smoke runs, stored GPU runs up to date, and the nbtools script itself."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from nbtools_loader import book as nb_book
from nbtools_loader import check as nb_check
from nbtools_loader import gpu as nb_gpu
from nbtools_loader import hashes as nb_hashes
from nbtools_loader import nbtools
from nbtools_loader import outputs as nb_outputs
from nbtools_loader import runs as nb_runs
from nbtools_loader import waivers as nb_waivers

REPO = Path(__file__).resolve().parent.parent

NOTEBOOKS = nb_book.default_notebooks()


def write_notebook(path: Path, *sources: str) -> Path:
    """Write a notebook with a markdown title and one code cell per source."""
    nb = new_notebook(cells=[new_markdown_cell("# Title"), *(new_code_cell(s) for s in sources)])
    nbformat.write(nb, path)
    return path


def test_toc_lists_an_existing_notebook() -> None:
    """The smoke tests below have something to run: _toc.yml names at least one notebook in book/."""
    in_toc = [nb_book.toc_source(entry) for entry in nb_book.toc_files()]
    notebooks = [path for path in in_toc if path is not None and path.suffix == ".ipynb"]
    assert notebooks, "no notebook listed in _toc.yml exists in book/ yet"


@pytest.mark.notebooks
@pytest.mark.parametrize("notebook", NOTEBOOKS or [None], ids=lambda p: p.name if p else "no-notebooks")
def test_notebook_smoke(notebook: Path | None, smoke_runs: dict) -> None:
    """The notebook runs without error on the CPU with MENTOR_PROFILE=smoke, in a copy of book/ (the run starts in
    the background when the tests are collected: see tests/conftest.py)."""
    assert notebook is not None, "book/ has no notebooks to smoke-test"
    before, outcome = smoke_runs[notebook]
    if isinstance(outcome, nb_runs.NotebookFailed):
        pytest.fail(str(outcome), pytrace=False)
    assert outcome > 0
    assert notebook.read_bytes() == before, f"{notebook.name} changed during its smoke run (written by it, or edited meanwhile)"


def test_stored_gpu_runs_are_current() -> None:
    """Every notebook's stored outputs come from a GPU run of its current code (as `make check-notebooks`)."""
    messages = nb_check.stale(NOTEBOOKS)
    assert not messages, "\n".join(messages)


# --- the script itself, on synthetic notebooks ---


def test_code_hash_follows_code_only() -> None:
    """The hash changes with the code, not with outputs, counts, metadata, markdown or trailing spaces."""
    nb = new_notebook(cells=[new_markdown_cell("# A"), new_code_cell("x = 1\ny = 2"), new_code_cell("print(x)")])
    reference = nb_hashes.code_hash(nb)

    nb.cells[0].source = "# B, rewritten"
    nb.cells[1].execution_count = 7
    nb.cells[2].outputs = [new_output("stream", name="stdout", text="1\n")]
    nb.cells[2].metadata["tags"] = ["hide-input"]
    nb.metadata["mentor"] = {"code_sha256": "x"}
    nb.cells[1].source = "x = 1   \ny = 2\n"
    nb.cells.append(new_markdown_cell("more prose"))
    assert nb_hashes.code_hash(nb) == reference

    nb.cells[2].source = "print(x + 1)"
    assert nb_hashes.code_hash(nb) != reference
    nb.cells[2].source = "print(x)"
    nb.cells[1].source, nb.cells[2].source = "x = 1", "y = 2\nprint(x)"  # same lines, other cell boundary
    assert nb_hashes.code_hash(nb) != reference


def test_check_stale_and_fresh(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`check` fails with the make command to run while a notebook's stored run is missing or outdated."""
    path = write_notebook(tmp_path / "x.ipynb", "print(1)")
    assert nbtools.main(["check", str(path)]) == 1
    assert f"refresh it with: make gpu-run NB={path}" in capsys.readouterr().out

    nb = nbformat.read(path, as_version=4)
    nb.metadata["mentor"] = {"hash_scheme": nb_hashes.HASH_SCHEME, "code_sha256": nb_hashes.code_hash(nb), "mentor_sha256": nb_hashes.mentor_hash(),
                             "outputs_sha256": nb_hashes.outputs_hash(nb)}
    nbformat.write(nb, path)
    assert nbtools.main(["check", str(path)]) == 0
    assert "ok" in capsys.readouterr().out

    nb.cells[1].source = "print(2)"
    nbformat.write(nb, path)
    assert nbtools.main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: code cells changed since its stored GPU run; refresh it with: make gpu-run NB={path}" in out


def test_run_order_puts_intro_then_reproducibility_last() -> None:
    """gpu-run executes the intro (it reads chapter 8's results) and then reproducibility.ipynb (it reads
    every notebook's metadata) after the chapters."""
    paths = [Path("book/reproducibility.ipynb"), Path("book/intro.ipynb"), Path("book/02.ipynb"), Path("book/01.ipynb")]
    assert nb_book.run_order(paths) == [Path("book/02.ipynb"), Path("book/01.ipynb"), Path("book/intro.ipynb"),
                                        Path("book/reproducibility.ipynb")]


def test_run_order_runs_a_chapter_after_the_chapters_whose_results_it_reads() -> None:
    """Chapter 8 reads the results files of chapters 2, 5 and 6 (READS): in one gpu-run it runs after those of them
    that are listed, and the others keep their order."""
    names = ["08_summary.ipynb", "05_weight.ipynb", "reproducibility.ipynb", "02_naive_metrics.ipynb",
             "01_baseline.ipynb", "intro.ipynb"]
    ordered = [p.name for p in nb_book.run_order([Path("book", n) for n in names])]
    assert ordered == ["05_weight.ipynb", "02_naive_metrics.ipynb", "08_summary.ipynb", "01_baseline.ipynb",
                       "intro.ipynb", "reproducibility.ipynb"]


def test_smoke_runs_a_copy_with_the_smoke_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """smoke sets MENTOR_PROFILE=smoke, runs in a copy of the folder and leaves the original alone."""
    monkeypatch.delenv("MENTOR_PROFILE", raising=False)
    book = tmp_path / "book"
    book.mkdir()
    (book / "data.txt").write_text("beside the notebook")
    code = "import os\nassert os.environ['MENTOR_PROFILE'] == 'smoke'\nopen('data.txt').read()\nopen('made.txt', 'w')"
    path = write_notebook(book / "ok.ipynb", code)
    before = path.read_bytes()
    nb_runs.smoke([path], book=book, workdir=tmp_path / "work")
    assert (tmp_path / "work" / "book" / "made.txt").exists()
    assert not (book / "made.txt").exists()
    assert path.read_bytes() == before
    assert "MENTOR_PROFILE" not in os.environ, "smoke left MENTOR_PROFILE set in this process"


def test_smoke_failure_names_notebook_and_cell(tmp_path: Path) -> None:
    """A failing cell stops the smoke run with the notebook's name, the cell and the error."""
    path = write_notebook(tmp_path / "bad.ipynb", "x = 1", "# the broken one\nraise ValueError('boom')")
    with pytest.raises(nb_runs.NotebookFailed) as error:
        nb_runs.smoke([path], book=tmp_path, workdir=tmp_path / "work")
    message = str(error.value)
    assert "bad.ipynb" in message and "cell 2" in message and "the broken one" in message and "boom" in message


def test_gpu_run_stores_outputs_and_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-run writes outputs and metadata.mentor back in place, after which check passes (CPU here)."""
    monkeypatch.setenv("MENTOR_PROFILE", "smoke")  # gpu-run keeps a profile already set; there is no GPU here
    first = write_notebook(tmp_path / "a.ipynb", "import os\nprint(os.environ['MENTOR_PROFILE'], os.getcwd())")
    reads = "import json\nprint(json.load(open('a.ipynb'))['metadata']['mentor']['code_sha256'])"
    last = write_notebook(tmp_path / "reproducibility.ipynb", reads)
    nb_gpu.gpu_run([last, first])

    nb = nbformat.read(first, as_version=4)
    assert nb.cells[1].outputs[0]["text"].split() == ["smoke", str(tmp_path.resolve())]
    stored = nb.metadata["mentor"]
    assert set(stored) == {"provenance", "executed", "duration_s", "hash_scheme", "code_sha256", "mentor_sha256", "mentor_sources",
                           "outputs_sha256"}
    assert stored["mentor_sources"] == {}  # the notebook imports nothing from mentor
    assert stored["mentor_sha256"] == nb_hashes.mentor_hash()
    assert stored["outputs_sha256"] == nb_hashes.outputs_hash(nb)
    assert stored["code_sha256"] == nb_hashes.code_hash(nb) and stored["duration_s"] > 0
    assert "torch" in stored["provenance"]
    assert nbformat.read(last, as_version=4).cells[1].outputs[0]["text"].strip() == stored["code_sha256"]
    assert nb_check.stale([first, last]) == []


# --- the hash scheme: code layout, comments and docstrings do not make a run stale; a run stored as text stays so ---


def test_cell_fingerprint_ignores_layout_and_comments_but_not_code() -> None:
    same = ["x = f(1, 'ab')", "x = f(  1,\n  'a' 'b',  # split\n)\n", "# note\nx = f(1, 'ab')  # why"]
    assert len({nb_hashes.cell_fingerprint(s) for s in same}) == 1
    fstrings = ['print(f"{a:>{w}} and {b!r}")', 'print(\n    f"{a:>{w}}"\n    f" and {b!r}"\n)']
    assert nb_hashes.cell_fingerprint(fstrings[0]) == nb_hashes.cell_fingerprint(fstrings[1])
    other = ["x = f(1, 'abc')", "x = f(2, 'ab')", "y = f(1, 'ab')", "x = f(1, 'ab');", "%time x = f(1, 'ab')",
             "x = f(1, 'ab')\n'shown'"]
    assert len({nb_hashes.cell_fingerprint(s) for s in same[:1] + other}) == 1 + len(other)
    # a ';' inside a string or a comment hides nothing; one before a trailing comment does
    assert nb_hashes.cell_fingerprint("x  # end;") == nb_hashes.cell_fingerprint("x")
    assert nb_hashes.cell_fingerprint("x;  # quiet") == nb_hashes.cell_fingerprint("x;")
    assert nb_hashes.cell_fingerprint("print('#');") != nb_hashes.cell_fingerprint("print('#')")
    # a cell that is not Python is compared as text
    assert nb_hashes.cell_fingerprint("x = (") != nb_hashes.cell_fingerprint("x  = (")
    assert nb_hashes.cell_fingerprint("x = (") == nb_hashes.cell_fingerprint("x = (  ")


def test_tree_text_drops_the_empty_fstring_pieces_python_3_12_keeps() -> None:
    parsed = ast.parse('f"a{x}b"').body[0].value
    padded = ast.JoinedStr(values=[ast.Constant(""), ast.Constant("a"), parsed.values[1],
                                           ast.Constant("b"), ast.Constant("")])
    split = ast.JoinedStr(values=[ast.Constant("a"), parsed.values[1], ast.Constant("b")])
    assert nb_hashes._tree_text(padded) == nb_hashes._tree_text(parsed) == nb_hashes._tree_text(split)
    assert "lineno" not in nb_hashes._tree_text(parsed) and "'a'" in nb_hashes._tree_text(parsed)


def test_module_fingerprint_ignores_docstrings_and_comments_but_not_code() -> None:
    base = "def f(x):\n    return x + 1\n"
    documented = '"""Module."""\n\ndef f(x):  # one\n    """Add one."""\n    return (\n        x + 1\n    )\n"""after"""\n'
    assert nb_hashes.module_fingerprint(documented) == nb_hashes.module_fingerprint(base)
    assert nb_hashes.module_fingerprint("def f(x):\n    'only a docstring'\n") == nb_hashes.module_fingerprint(
        "def f(x):\n    pass\n")
    assert nb_hashes.module_fingerprint(base.replace("1", "2")) != nb_hashes.module_fingerprint(base)
    assert nb_hashes.module_fingerprint("X = 'a string value'\n") != nb_hashes.module_fingerprint("X = 'another'\n")
    assert nb_hashes.module_fingerprint("def (") == "text:def ("


def test_a_run_stored_without_a_scheme_is_checked_as_text(tmp_path: Path) -> None:
    """Runs stored before hash_scheme keep their text hashes: a new comment makes them stale, as it did; a run
    stored with the current scheme ignores the comment, and still sees a change of code."""
    path = write_notebook(tmp_path / "x.ipynb", "print(1)")
    nb = nbformat.read(path, as_version=4)
    old = {"code_sha256": nb_hashes.code_hash(nb, "raw"), "mentor_sha256": nb_hashes.mentor_hash(),
           "outputs_sha256": nb_hashes.outputs_hash(nb)}
    new = {**old, "hash_scheme": nb_hashes.HASH_SCHEME, "code_sha256": nb_hashes.code_hash(nb)}
    assert nb_hashes.stored_scheme(old) == "raw" and nb_hashes.stored_scheme(new) == nb_hashes.HASH_SCHEME == "ast-2"
    for meta in (old, new):
        nb.metadata["mentor"] = meta
        nb.cells[1].source = "print(1)"
        nbformat.write(nb, path)
        assert nb_check.stale([path]) == []
    nb.cells[1].source = "print(\n    1\n)  # reformatted"
    for meta, reasons in ((old, 1), (new, 0)):
        nb.metadata["mentor"] = meta
        nbformat.write(nb, path)
        assert len(nb_check.stale([path])) == reasons
    nb.cells[1].source = "print(2)"
    nbformat.write(nb, path)
    assert [m.split(": ", 1)[1].split(";")[0] for m in nb_check.stale([path])] == [
        "code cells changed since its stored GPU run"]


# --- what makes a stored run stale ---


def stored_run(path: Path, package: Path) -> Path:
    """Give the notebook at ``path`` an output and the metadata gpu-run would store, with ``package`` as mentor."""
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="0.25\n")]
    nbformat.write(nb, path)
    nb = nbformat.read(path, as_version=4)
    nb.metadata["mentor"] = {"hash_scheme": nb_hashes.HASH_SCHEME, "code_sha256": nb_hashes.code_hash(nb), "mentor_sha256": nb_hashes.mentor_hash(package),
                             "outputs_sha256": nb_hashes.outputs_hash(nb)}
    nbformat.write(nb, path)
    return path


@pytest.fixture
def fake_mentor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "mentor"
    package.mkdir()
    (package / "bench.py").write_text("X = 1\n")
    monkeypatch.setattr(nb_hashes, "MENTOR", package)
    return package


def test_check_passes_on_a_current_run(tmp_path: Path, fake_mentor: Path) -> None:
    path = stored_run(write_notebook(tmp_path / "x.ipynb", "print(0.25)"), fake_mentor)
    assert nb_check.stale([path]) == []


def test_check_fails_when_mentor_changes(tmp_path: Path, fake_mentor: Path) -> None:
    """A run that records only the whole package's hash (made before per-module hashes) goes stale on any change."""
    path = stored_run(write_notebook(tmp_path / "x.ipynb", "print(0.25)"), fake_mentor)
    (fake_mentor / "bench.py").write_text("X = 2\n")
    assert nb_check.stale([path]) == [
        f"{path}: the mentor package changed since its stored GPU run; refresh it with: make gpu-run NB={path}"]
    (fake_mentor / "bench.py").write_text("X = 1\n")
    (fake_mentor / "new.py").write_text("")  # a new module counts too
    assert len(nb_check.stale([path])) == 1


@pytest.fixture
def layered_mentor(fake_mentor: Path) -> Path:
    """__init__ <- env; bench imports env at the top and trace inside a function; ddp and worker are unused."""
    (fake_mentor / "__init__.py").write_text('"""Mentions mentor.ddp in its docstring only."""\n')
    (fake_mentor / "env.py").write_text("PROFILE = 'full'\n")
    (fake_mentor / "trace.py").write_text("from . import env\n")
    (fake_mentor / "bench.py").write_text(
        "from mentor.env import PROFILE\n\ndef plot():\n    from .trace import env\n    return env\n")
    (fake_mentor / "ddp.py").write_text("X = 1\n")
    (fake_mentor / "worker.py").write_text("import mentor.ddp\n")
    return fake_mentor


def test_imported_modules_reads_every_way_to_import() -> None:
    code = ("%matplotlib inline\nimport mentor.trace as t\nfrom mentor import bench, suite\n"
            "from mentor.metrics import host_scalar\nimport os, torch\n"
            "cmd = ['python', '-m', 'mentor.worker', '--steps', '3']\n"
            "def f():\n    '''Not this: mentor.ddp.'''\n    from mentor.env import get_profile\n")
    assert nb_hashes.imported_modules(code) == {
        "mentor", "mentor.trace", "mentor.bench", "mentor.suite", "mentor.metrics", "mentor.metrics.host_scalar",
        "mentor.worker", "mentor.env", "mentor.env.get_profile"}
    assert nb_hashes.imported_modules("from . import env\nfrom .trace import x", module="mentor.bench") == {
        "mentor", "mentor.env", "mentor.trace", "mentor.trace.x"}


def test_mentor_sources_follow_imports_through_the_package(layered_mentor: Path) -> None:
    nb = new_notebook(cells=[new_markdown_cell("uses mentor.ddp in prose only"),
                             new_code_cell("from mentor.bench import plot\nplot()")])
    sources = nb_hashes.mentor_sources(nb, scheme="ast-1")
    assert sorted(sources) == ["__init__.py", "bench.py", "env.py", "trace.py"] == sorted(nb_hashes.mentor_sources(nb))
    assert sources["env.py"] == hashlib.sha256(nb_hashes.module_fingerprint("PROFILE = 'full'\n").encode()).hexdigest()
    assert nb_hashes.mentor_sources(nb, scheme="raw")["env.py"] == hashlib.sha256(b"PROFILE = 'full'\n").hexdigest()
    launched = new_notebook(cells=[new_code_cell("import subprocess, sys\n"
                                                 "subprocess.run([sys.executable, '-m', 'mentor.worker'])")])
    assert sorted(nb_hashes.mentor_sources(launched)) == ["__init__.py", "ddp.py", "worker.py"]
    assert nb_hashes.mentor_sources(new_notebook(cells=[new_code_cell("import torch")])) == {}


def recorded_run(path: Path) -> Path:
    """Store the metadata gpu-run writes now, with per-module sources, for the notebook at ``path``."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata["mentor"] = {"hash_scheme": nb_hashes.HASH_SCHEME, "code_sha256": nb_hashes.code_hash(nb), "mentor_sha256": nb_hashes.mentor_hash(),
                             "mentor_sources": nb_hashes.mentor_sources(nb), "outputs_sha256": nb_hashes.outputs_hash(nb)}
    nbformat.write(nb, path)
    return path


def test_check_follows_only_the_modules_a_notebook_imports(tmp_path: Path, layered_mentor: Path) -> None:
    path = recorded_run(write_notebook(tmp_path / "x.ipynb", "from mentor.bench import plot\nplot()"))
    assert nb_check.stale([path]) == []
    (layered_mentor / "ddp.py").write_text("X = 2\n")  # not imported: the stored run still stands
    (layered_mentor / "readback.py").write_text("")
    assert nb_check.stale([path]) == []
    (layered_mentor / "trace.py").write_text("from . import env\nY = 1\n")  # imported lazily by bench.plot
    assert nb_check.stale([path]) == [
        f"{path}: the mentor source it imports changed since its stored GPU run (mentor/trace.py); "
        f"refresh it with: make gpu-run NB={path}"]


def test_check_sees_a_new_dependency_and_a_lost_one(tmp_path: Path, layered_mentor: Path) -> None:
    path = recorded_run(write_notebook(tmp_path / "x.ipynb", "from mentor.bench import plot\nplot()"))
    (layered_mentor / "bench.py").write_text("import mentor.ddp\n")  # bench changed: it imports ddp, no longer env or trace
    assert nb_check.stale([path]) == [
        f"{path}: the mentor source it imports changed since its stored GPU run "
        f"(mentor/bench.py, mentor/ddp.py, mentor/env.py, mentor/trace.py); refresh it with: make gpu-run NB={path}"]


def test_check_fails_when_an_output_is_edited_by_hand(tmp_path: Path, fake_mentor: Path) -> None:
    path = stored_run(write_notebook(tmp_path / "x.ipynb", "print(0.25)"), fake_mentor)
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs[0]["text"] = "0.20\n"
    nbformat.write(nb, path)
    assert nb_check.stale([path]) == [
        f"{path}: its outputs were edited after its stored GPU run; refresh it with: make gpu-run NB={path}"]


@pytest.mark.parametrize("tag", ["skip-execution", "raises-exception"])
def test_check_fails_on_tags_that_skip_or_hide_errors(tmp_path: Path, fake_mentor: Path, tag: str) -> None:
    path = stored_run(write_notebook(tmp_path / "x.ipynb", "print(0.25)"), fake_mentor)
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata["tags"] = ["hide-input", tag]
    nbformat.write(nb, path)
    (message,) = nb_check.stale([path])
    assert f"cell 1 is tagged {tag}" in message and f"make gpu-run NB={path}" in message


@pytest.mark.parametrize("source", ["%%capture\nraise ValueError('hidden')", "!false", "x = 1\n  !ls missing"])
def test_captured_errors_and_shell_lines_are_refused(tmp_path: Path, fake_mentor: Path, source: str) -> None:
    path = stored_run(write_notebook(tmp_path / "x.ipynb", "print(0.25)", source), fake_mentor)
    (message,) = nb_check.stale([path])
    assert "cell 2 uses %%capture or a ! shell line" in message
    with pytest.raises(nb_runs.NotebookFailed, match="cell 2 uses %%capture"):
        nb_runs.smoke([path], book=tmp_path, workdir=tmp_path / "work")


def test_check_reports_bad_notebooks_and_keeps_checking(tmp_path: Path, fake_mentor: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "garbage.ipynb"
    garbage.write_text("{not json")
    empty = tmp_path / "empty.ipynb"
    nbformat.write(new_notebook(), empty)
    good = stored_run(write_notebook(tmp_path / "x.ipynb", "print(0.25)"), fake_mentor)
    messages = nb_check.stale([garbage, empty, good])
    assert messages[0].startswith(f"{garbage}: not a readable notebook")
    assert f"{empty}: has no cells" in messages[1]
    assert not any(str(good) in m for m in messages)
    assert nbtools.main(["check", str(garbage), str(good)]) == 1
    assert "not a readable notebook" in capsys.readouterr().out


def test_parallel_smoke_runs_each_notebook_in_a_copy_of_its_own(tmp_path: Path) -> None:
    """With jobs > 1 the notebooks run at once, each in its own copy, each kernel with one OpenMP thread, and a
    failure is returned for its notebook while the others still run."""
    book = tmp_path / "book"
    book.mkdir()
    first = write_notebook(book / "a.ipynb", "import os\nopen('from_a.txt', 'w').write(os.environ['OMP_NUM_THREADS'])")
    bad = write_notebook(book / "b.ipynb", "raise ValueError('boom')")
    third = write_notebook(book / "c.ipynb", "import os\nprint(os.path.exists('from_a.txt'))")
    outcomes = nb_runs.smoke_each([first, bad, third], book=book, workdir=tmp_path / "work", jobs=2)
    assert list(outcomes) == [first, bad, third]
    assert outcomes[first] > 0 and outcomes[third] > 0
    assert isinstance(outcomes[bad], nb_runs.NotebookFailed) and "boom" in str(outcomes[bad])
    assert (tmp_path / "work" / "00" / "book" / "from_a.txt").read_text() == "1"
    assert not (tmp_path / "work" / "02" / "book" / "from_a.txt").exists()
    with pytest.raises(ValueError, match="jobs must be a whole number"):
        nb_runs.smoke_each([first], book=book, jobs=0)


def test_sequential_smoke_stops_at_the_first_failure(tmp_path: Path) -> None:
    book = tmp_path / "book"
    book.mkdir()
    bad = write_notebook(book / "a.ipynb", "raise ValueError('boom')")
    later = write_notebook(book / "b.ipynb", "x = 1")
    outcomes = nb_runs.smoke_each([bad, later], book=book, workdir=tmp_path / "work")
    assert list(outcomes) == [bad] and isinstance(outcomes[bad], nb_runs.NotebookFailed)


def test_smoke_names_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(nb_runs.NotebookFailed, match="no such notebook"):
        nb_runs.smoke([tmp_path / "missing.ipynb"], book=tmp_path)


# --- which notebooks run by default, and that smoke runs all of them ---


def test_default_notebooks_are_every_notebook_directly_in_the_book(tmp_path: Path) -> None:
    """Every *.ipynb directly in the folder, sorted by name: fails if the glob is narrowed (0*.ipynb, 0[1-5]*)."""
    book = tmp_path / "book"
    (book / "sub").mkdir(parents=True)
    for name in ("zz.ipynb", "reproducibility.ipynb", "01_a.ipynb", "intro.ipynb", "sub/inner.ipynb"):
        write_notebook(book / name, "x = 1")
    (book / "notes.md").write_text("# not a notebook")
    (book / "01_a.ipynb.bak").write_text("{}")
    assert nb_book.default_notebooks(book) == [book / "01_a.ipynb", book / "intro.ipynb",
                                               book / "reproducibility.ipynb", book / "zz.ipynb"]


def test_every_notebook_in_the_toc_is_a_default_notebook() -> None:
    """`make smoke`/`check` without arguments cover every notebook the book's table of contents lists."""
    in_toc = [nb_book.toc_source(entry) for entry in nb_book.toc_files()]
    listed = [p for p in in_toc if p is not None and p.suffix == ".ipynb" and p.parent == nb_book.BOOK]
    assert len(listed) >= 2 and nb_book.BOOK / "intro.ipynb" in listed
    missing = sorted(set(listed) - set(nb_book.default_notebooks()))
    assert missing == [], f"notebooks in _toc.yml that default_notebooks() leaves out: {missing}"


def test_smoke_runs_every_notebook_it_is_given(tmp_path: Path) -> None:
    """smoke executes each notebook, not only the first, and returns one (name, seconds) per notebook."""
    book = tmp_path / "book"
    book.mkdir()
    first = write_notebook(book / "a.ipynb", "open('from_a.txt', 'w').write('a')")
    second = write_notebook(book / "b.ipynb", "open('from_b.txt', 'w').write('b')")
    results = nb_runs.smoke([first, second], book=book, workdir=tmp_path / "work")
    assert [name for name, _ in results] == [str(book.resolve() / "a.ipynb"), str(book.resolve() / "b.ipynb")]
    assert all(seconds > 0 for _, seconds in results)
    copy = tmp_path / "work" / "book"
    assert (copy / "from_a.txt").read_text() == "a" and (copy / "from_b.txt").read_text() == "b"
    assert not (book / "from_a.txt").exists() and not (book / "from_b.txt").exists()


# --- a waiver: a stored run kept across one mentor change, for a rerun that needs missing hardware ---


def waived_run(tmp_path: Path, layered_mentor: Path) -> Path:
    """A current run of a notebook that imports mentor.bench, then a change of trace.py, which bench imports."""
    path = recorded_run(write_notebook(tmp_path / "x.ipynb", "from mentor.bench import plot\nplot()", "print(0.25)"))
    (layered_mentor / "trace.py").write_text("from . import env\nY = 1\n")
    return path


def test_a_waiver_accepts_the_change_it_names(tmp_path: Path, layered_mentor: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = waived_run(tmp_path, layered_mentor)
    before = nbformat.read(path, as_version=4)
    assert len(nb_check.stale([path])) == 1
    assert nbtools.main(["waive", str(path), "--reason", "needs two GPUs; none available"]) == 0
    assert capsys.readouterr().out == f"{path}: pending a rerun; waived the change of mentor/trace.py\n"
    nb = nbformat.read(path, as_version=4)
    waiver = nb.metadata["mentor"]["waiver"]
    assert waiver["reason"] == "needs two GPUs; none available" and waiver["modules"] == ["trace.py"]
    assert waiver["added"] == [] and waiver["removed"] == []
    assert waiver["scheme"] == "ast-2" == nb_hashes.HASH_SCHEME
    assert waiver["accepts"] == nb_hashes.sources_digest(nb_hashes.mentor_sources(nb, scheme="ast-2"))
    assert [c.get("outputs") for c in nb.cells] == [c.get("outputs") for c in before.cells]
    assert nb_check.stale([path]) == []
    assert nbtools.main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "ok: 1 notebook(s) match their stored GPU run; 1 pending rerun(s), kept under a waiver:",
        f"  {path}: Rerun pending: the stored run used an earlier mentor; since then, needs two GPUs; none available."]


def test_a_waiver_does_not_accept_another_mentor_change(tmp_path: Path, layered_mentor: Path) -> None:
    path = waived_run(tmp_path, layered_mentor)
    nb_waivers.waive(path, "needs two GPUs")
    (layered_mentor / "env.py").write_text("PROFILE = 'smoke'\n")  # a second change, after the waiver
    assert nb_check.stale([path]) == [
        f"{path}: the mentor source it imports changed since its stored GPU run (mentor/env.py, mentor/trace.py), "
        f"and its waiver ('needs two GPUs') accepts another change (waive this one with python scripts/nbtools.py "
        f"waive {path} --reason ...); refresh it with: make gpu-run NB={path}"]
    (layered_mentor / "env.py").write_text("PROFILE = 'full'\n")
    (layered_mentor / "trace.py").write_text("from . import env\nY = 2\n")  # the same module, other content
    assert len(nb_check.stale([path])) == 1
    (layered_mentor / "trace.py").write_text("from . import env\nY = 1\n")  # back to the waived content
    assert nb_check.stale([path]) == []


def test_a_waiver_does_not_accept_a_code_change_or_an_edited_output(tmp_path: Path, layered_mentor: Path) -> None:
    path = waived_run(tmp_path, layered_mentor)
    nb_waivers.waive(path, "needs two GPUs")
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source = "print(0.5)"
    nbformat.write(nb, path)
    assert nb_check.stale([path]) == [
        f"{path}: code cells changed since its stored GPU run; refresh it with: make gpu-run NB={path}"]
    nb.cells[2].source = "print(0.25)"
    nb.cells[2].outputs = [new_output("stream", name="stdout", text="0.20\n")]
    nbformat.write(nb, path)
    assert nb_check.stale([path]) == [
        f"{path}: its outputs were edited after its stored GPU run; refresh it with: make gpu-run NB={path}"]


def test_a_waiver_left_behind_when_nothing_changed_fails(tmp_path: Path, layered_mentor: Path) -> None:
    path = waived_run(tmp_path, layered_mentor)
    nb_waivers.waive(path, "needs two GPUs")
    (layered_mentor / "trace.py").write_text("from . import env\n")  # the change is undone
    assert nb_check.stale([path]) == [
        f"{path}: carries a waiver, but the mentor modules it imports are unchanged since its stored run: remove "
        f"metadata.mentor.waiver; refresh it with: make gpu-run NB={path}"]


def test_waive_refuses_what_it_cannot_accept(tmp_path: Path, layered_mentor: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    unchanged = recorded_run(write_notebook(tmp_path / "same.ipynb", "from mentor.bench import plot\nplot()"))
    with pytest.raises(nb_waivers.WaiverRefused, match="unchanged since its stored run: there is nothing to waive"):
        nb_waivers.waive(unchanged, "needs two GPUs")
    never_run = write_notebook(tmp_path / "new.ipynb", "from mentor.bench import plot\nplot()")
    assert nbtools.main(["waive", str(never_run), "--reason", "needs two GPUs"]) == 1
    assert capsys.readouterr().err == (f"{never_run}: no stored GPU run with per-module hashes to waive a change of; "
                                       f"run it first: make gpu-run NB={never_run}\n")
    path = waived_run(tmp_path, layered_mentor)
    with pytest.raises(nb_waivers.WaiverRefused, match="a waiver needs a reason"):
        nb_waivers.waive(path, "  ")
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source = "print(0.5)"
    nbformat.write(nb, path)
    with pytest.raises(nb_waivers.WaiverRefused) as refused:
        nb_waivers.waive(path, "needs two GPUs")
    assert str(refused.value) == (f"{path}: a waiver accepts a change of mentor modules only, and this run also "
                                  f"code cells changed since its stored GPU run; rerun it: make gpu-run NB={path}")
    assert "waiver" not in nbformat.read(path, as_version=4).metadata["mentor"]


def test_the_folded_account_lists_every_changed_module() -> None:
    meta = {"mentor_sha256": "0123456789abcdef", "executed": "2026-12-01T10:10:47+00:00",
            "waiver": {"modules": ["a.py", "b.py", "lab/c.py"], "reason": "rerunning needs two GPUs."}}
    assert nb_waivers.waiver_text(meta) == ("Rerun pending: the stored run of 2026-12-01 used an earlier mentor; since "
                                            "then, rerunning needs two GPUs.")
    assert nb_waivers._run_box().changes_text(meta) == [
        "The stored run used mentor at 0123456789ab (the hash of its source). Since then: mentor/a.py, mentor/b.py and "
        "mentor/lab/c.py changed."]
    meta["waiver"].update(added=["lab/c.py"], removed=["a.py"], written="2026-12-06T00:00:00+00:00",
                          details="The longer account.")
    assert nb_waivers._run_box().changes_text(meta) == [
        "The longer account.",
        "The stored run used mentor at 0123456789ab (the hash of its source). By 2026-12-06, when the rerun was "
        "deferred: mentor/b.py changed, mentor/lab/c.py is now imported and mentor/a.py is no longer imported."]
    assert nb_waivers.waiver_text({"mentor_sha256": "x"}) is None


def test_waive_records_the_modules_that_were_added_and_removed(tmp_path: Path, layered_mentor: Path) -> None:
    path = recorded_run(write_notebook(tmp_path / "x.ipynb", "from mentor.bench import plot\nplot()"))
    (layered_mentor / "bench.py").write_text("import mentor.ddp\n")  # no longer env or trace; now ddp
    waiver = nb_waivers.waive(path, "needs two GPUs")
    assert (waiver["modules"], waiver["added"], waiver["removed"]) == (
        ["bench.py", "ddp.py", "env.py", "trace.py"], ["ddp.py"], ["env.py", "trace.py"])


# --- what else makes a stored run untrustworthy: figures without images, runs older than what they read ---


def _figure_output(glued: bool, image: bool) -> dict:
    data = {"text/plain": "<Figure size 640x480 with 1 Axes>"}
    if image:
        data["image/png"] = "iVBORw0KGgo="
    if glued:
        data = {nb_outputs.GLUE_PREFIX + key: value for key, value in data.items()}
    return new_output("display_data", data=data)


@pytest.mark.parametrize("glued", [False, True], ids=["displayed", "glued"])
def test_check_fails_on_a_figure_stored_without_its_image(tmp_path: Path, fake_mentor: Path, glued: bool) -> None:
    path = stored_run(write_notebook(tmp_path / "x.ipynb", "print(0.25)", "fig"), fake_mentor)
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].outputs = [_figure_output(glued, image=True)]
    nb.metadata["mentor"]["outputs_sha256"] = nb_hashes.outputs_hash(nb)
    nbformat.write(nb, path)
    assert nb_check.stale([path]) == []
    nb.cells[2].outputs = [_figure_output(glued, image=False)]
    nb.metadata["mentor"]["outputs_sha256"] = nb_hashes.outputs_hash(nb)
    nbformat.write(nb, path)
    assert nb_check.stale([path]) == [
        f"{path}: cell 2 stored a matplotlib figure without its image (<Figure size 640x480 with 1 Axes>); "
        f"refresh it with: make gpu-run NB={path}"]


def _run_at(path: Path, executed: str) -> Path:
    nb = nbformat.read(path, as_version=4) if path.exists() else new_notebook(cells=[new_code_cell("x = 1")])
    nb.metadata["mentor"] = {"executed": executed}
    nbformat.write(nb, path)
    return path


def test_a_notebook_must_run_after_the_notebooks_whose_results_it_reads(tmp_path: Path) -> None:
    assert nb_book.READS["08_summary.ipynb"] == ("02_naive_metrics.ipynb", "05_weight.ipynb", "06_nan_check.ipynb")
    summary = _run_at(tmp_path / "08_summary.ipynb", "2026-12-02T03:10:52+00:00")
    _run_at(tmp_path / "02_naive_metrics.ipynb", "2026-12-02T03:16:12+00:00")
    _run_at(tmp_path / "05_weight.ipynb", "2026-12-02T03:00:00+00:00")
    meta = nbformat.read(summary, as_version=4).metadata["mentor"]
    assert nb_check.read_after(summary, meta) == [
        "its stored run (2026-12-02T03:10:52+00:00) is older than the stored run of 02_naive_metrics.ipynb "
        "(2026-12-02T03:16:12+00:00), whose results it reads; rerun it after 02_naive_metrics.ipynb"]
    _run_at(summary, "2026-12-02T03:20:00+00:00")
    assert nb_check.read_after(summary, nbformat.read(summary, as_version=4).metadata["mentor"]) == []
    assert nb_check.read_after(tmp_path / "02_naive_metrics.ipynb", {"executed": "2026-12-01T00:00:00+00:00"}) == []


def test_the_reproducibility_page_must_run_after_every_notebook(tmp_path: Path) -> None:
    page = _run_at(tmp_path / "reproducibility.ipynb", "2026-12-02T03:16:58+00:00")
    _run_at(tmp_path / "03_profiler.ipynb", "2026-12-02T03:20:00+00:00")
    _run_at(tmp_path / "04_record_function.ipynb", "2026-12-02T03:00:00+00:00")
    (tmp_path / "broken.ipynb").write_text("{not json")  # its own check reports it
    assert nb_check.read_after(page, {"executed": "2026-12-02T03:16:58+00:00"}) == [
        "its stored run (2026-12-02T03:16:58+00:00) is older than the stored run of 03_profiler.ipynb "
        "(2026-12-02T03:20:00+00:00), whose results it reads; rerun it after 03_profiler.ipynb"]
    assert nb_check.read_after(page, {}) == []  # no stored run: reported as such elsewhere


def test_gpu_run_draws_figures_inline_whatever_mpl_backend_the_caller_set(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """This process runs with MPLBACKEND=Agg (tests/conftest.py); gpu-run's kernels must not inherit it."""
    assert os.environ["MPLBACKEND"] == "Agg"
    monkeypatch.setenv("MENTOR_PROFILE", "smoke")
    path = write_notebook(tmp_path / "fig.ipynb", "import os\nprint(os.environ.get('MPLBACKEND'))",
                          "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    nb_gpu.gpu_run([path])
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[1].outputs[0]["text"] == "module://matplotlib_inline.backend_inline\n"  # ipykernel's own
    assert any("image/png" in o.get("data", {}) for o in nb.cells[2].outputs)
    assert nb_outputs.figures_without_images(nb) == []
    assert os.environ["MPLBACKEND"] == "Agg"


def test_gpu_run_refuses_a_python_without_mentor_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    path = write_notebook(tmp_path / "x.ipynb", "x = 1")
    with pytest.raises(nb_runs.NotebookFailed) as refused:
        nb_gpu.gpu_run([path])
    assert str(refused.value) == (
        "mentor is not installed in this Python, so pytest would not load its no_syncs plugin (chapter 11 needs "
        "it); install it first: python -m pip install --no-deps --no-build-isolation -e . (or make gpu-run, which "
        "uses .venv)")
    assert "mentor" not in nbformat.read(path, as_version=4).metadata


def test_a_recorded_read_must_still_be_the_stored_run_of_what_it_read(tmp_path: Path) -> None:
    """gpu-run records the run of each notebook it read; a later run of one of them, or one it never saw (a copy
    of the book that held an older run of it), makes the reader stale, whatever the timestamps say."""
    _run_at(tmp_path / "02_naive_metrics.ipynb", "2026-12-02T03:16:12+00:00")
    _run_at(tmp_path / "05_weight.ipynb", "2026-12-02T03:14:09+00:00")
    path = tmp_path / "08_summary.ipynb"
    meta = {"executed": "2026-12-02T03:20:00+00:00",
            "read": {"02_naive_metrics.ipynb": "2026-12-01T03:26:15+00:00", "05_weight.ipynb": "2026-12-02T03:14:09+00:00",
                     "06_nan_check.ipynb": None}}
    assert nb_check.read_after(path, meta) == [
        "it read the stored run of 02_naive_metrics.ipynb from 2026-12-01T03:26:15+00:00, and that notebook's stored "
        "run is now from 2026-12-02T03:16:12+00:00; rerun it after 02_naive_metrics.ipynb"]
    _run_at(tmp_path / "06_nan_check.ipynb", "2026-12-02T03:15:09+00:00")
    assert nb_check.read_after(path, meta)[1] == (
        "it read the stored run of 06_nan_check.ipynb from nowhere, and that notebook's stored run is now from "
        "2026-12-02T03:15:09+00:00; rerun it after 06_nan_check.ipynb")
    meta["read"].update({"02_naive_metrics.ipynb": "2026-12-02T03:16:12+00:00", "06_nan_check.ipynb": "2026-12-02T03:15:09+00:00"})
    assert nb_check.read_after(path, meta) == []


def test_gpu_run_records_the_runs_a_notebook_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MENTOR_PROFILE", "smoke")
    first = write_notebook(tmp_path / "a.ipynb", "x = 1")
    page = write_notebook(tmp_path / "reproducibility.ipynb", "y = 2")
    nb_gpu.gpu_run([page, first])
    executed_a = nbformat.read(first, as_version=4).metadata["mentor"]["executed"]
    meta = nbformat.read(page, as_version=4).metadata["mentor"]
    assert meta["read"] == {"a.ipynb": executed_a}
    assert "read" not in nbformat.read(first, as_version=4).metadata["mentor"]
    assert nb_check.stale([first, page]) == []
    nb_gpu.gpu_run([first])  # a's run changes after the page read it
    (message,) = nb_check.stale([first, page])
    assert message.startswith(f"{page}: it read the stored run of a.ipynb from {executed_a}, and that notebook's")


# --- a waiver across a move: the modules went into a subpackage, so the code cells import them by new names ---


def moved_run(tmp_path: Path, layered_mentor: Path) -> Path:
    """A current run of a notebook that imports mentor.env and mentor.worker, then both moved into mentor/lab/."""
    path = recorded_run(write_notebook(tmp_path / "x.ipynb", "from mentor.env import PROFILE",
                                       "import mentor.worker\nprint(mentor.worker.__name__)", "print(0.25)"))
    lab = layered_mentor / "lab"
    lab.mkdir()
    (lab / "__init__.py").write_text("")
    (layered_mentor / "env.py").rename(lab / "env.py")
    (layered_mentor / "worker.py").rename(lab / "worker.py")
    (lab / "worker.py").write_text("import mentor.ddp\n")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = "from mentor.lab.env import PROFILE"
    nb.cells[2].source = "import mentor.lab.worker\nprint(mentor.lab.worker.__name__)"
    nbformat.write(nb, path)
    return path


RENAMES = ["--rename", "mentor.env=mentor.lab.env", "--rename", "mentor.worker=mentor.lab.worker"]


def test_mentor_sources_follow_modules_into_a_subpackage(tmp_path: Path, layered_mentor: Path) -> None:
    path = moved_run(tmp_path, layered_mentor)
    assert sorted(nb_hashes.mentor_sources(nbformat.read(path, as_version=4))) == [
        "__init__.py", "ddp.py", "lab/__init__.py", "lab/env.py", "lab/worker.py"]


def test_a_waiver_with_renames_accepts_code_that_differs_only_by_them(tmp_path: Path, layered_mentor: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = moved_run(tmp_path, layered_mentor)
    assert sorted(nb_check.stale([path])) == sorted([
        f"{path}: code cells changed since its stored GPU run; refresh it with: make gpu-run NB={path}",
        f"{path}: the mentor source it imports changed since its stored GPU run (mentor/env.py, mentor/lab/__init__.py, "
        f"mentor/lab/env.py, mentor/lab/worker.py, mentor/worker.py); refresh it with: make gpu-run NB={path}"])
    assert nbtools.main(["waive", str(path), "--reason", "needs two GPUs", *RENAMES]) == 0
    assert capsys.readouterr().out == (
        f"{path}: pending a rerun; waived the change of mentor/env.py, mentor/lab/__init__.py, mentor/lab/env.py, mentor/lab/worker.py, "
        "mentor/worker.py; code cells accepted with the renames mentor.env -> mentor.lab.env, "
        "mentor.worker -> mentor.lab.worker\n")
    meta = nbformat.read(path, as_version=4).metadata["mentor"]
    assert meta["waiver"]["renames"] == {"mentor.env": "mentor.lab.env", "mentor.worker": "mentor.lab.worker"}
    assert nb_check.stale([path]) == []
    assert nb_waivers._run_box().changes_text(meta)[-1] == (
        "Its code cells now import mentor.lab.env and mentor.lab.worker where the stored run imported mentor.env and "
        "mentor.worker; nothing else in them changed.")


def test_a_waiver_with_renames_still_refuses_any_other_code_change(tmp_path: Path, layered_mentor: Path) -> None:
    path = moved_run(tmp_path, layered_mentor)
    nb_waivers.waive(path, "needs two GPUs", {"mentor.env": "mentor.lab.env", "mentor.worker": "mentor.lab.worker"})
    nb = nbformat.read(path, as_version=4)
    nb.cells[3].source = "print(0.5)"
    nbformat.write(nb, path)
    assert nb_check.stale([path]) == [
        f"{path}: code cells changed since its stored GPU run; refresh it with: make gpu-run NB={path}"]
    nb.cells[3].source = "print(0.25)"
    nb.cells[1].source = "from mentor.lab.env import PROFILE as P"  # same modules, but more than a rename
    nbformat.write(nb, path)
    assert nb_check.stale([path]) == [
        f"{path}: code cells changed since its stored GPU run; refresh it with: make gpu-run NB={path}"]


def test_waive_refuses_renames_that_do_not_explain_the_code_change(tmp_path: Path, layered_mentor: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = moved_run(tmp_path, layered_mentor)
    with pytest.raises(nb_waivers.WaiverRefused) as refused:  # one rename missing: cell 2 still differs
        nb_waivers.waive(path, "needs two GPUs", {"mentor.env": "mentor.lab.env"})
    assert str(refused.value) == (f"{path}: a waiver accepts a change of mentor modules only, and this run also "
                                  f"code cells changed since its stored GPU run; rerun it: make gpu-run NB={path}")
    for renames, message in [
        ({"mentor.env": "mentor.env"}, "the rename mentor.env -> mentor.env renames nothing"),
        ({"env": "mentor.lab.env"}, "a rename maps an old mentor module to its new name, e.g. mentor.env=mentor.lab.env; "
                                    "got 'env' -> 'mentor.lab.env'"),
        ({"mentor.env": "mentor.lab.env", "mentor.worker": "mentor.lab.env"},
         "two modules are renamed to one name: {'mentor.env': 'mentor.lab.env', 'mentor.worker': 'mentor.lab.env'}"),
    ]:
        with pytest.raises(nb_waivers.WaiverRefused) as refused:
            nb_waivers.waive(path, "needs two GPUs", renames)
        assert str(refused.value) == f"{path}: {message}"
    with pytest.raises(SystemExit):
        nbtools.main(["waive", str(path), "--reason", "x", "--rename", "mentor.env"])
    assert "--rename takes OLD=NEW, e.g. mentor.env=mentor.lab.env; got 'mentor.env'" in capsys.readouterr().err
    assert "waiver" not in nbformat.read(path, as_version=4).metadata["mentor"]


def test_waive_refuses_renames_when_the_code_did_not_change(tmp_path: Path, layered_mentor: Path) -> None:
    path = waived_run(tmp_path, layered_mentor)  # a mentor change only, the code cells as stored
    with pytest.raises(nb_waivers.WaiverRefused) as refused:
        nb_waivers.waive(path, "needs two GPUs", {"mentor.env": "mentor.lab.env"})
    assert str(refused.value) == (f"{path}: its code cells do not use the renamed modules (mentor.env -> "
                                  "mentor.lab.env): leave --rename out")


def test_unrenamed_replaces_whole_dotted_names_only() -> None:
    nb = new_notebook(cells=[new_markdown_cell("mentor.lab.env in prose stays"),
                             new_code_cell("import mentor.lab.env as e, mentor.lab.envs\nx = 'mentor.lab.env.f'\n"
                                           "y = amentor.lab.env")])
    out = nb_check.unrenamed(nb, {"mentor.env": "mentor.lab.env"})
    assert out.cells[1].source == ("import mentor.env as e, mentor.lab.envs\nx = 'mentor.env.f'\n"
                                   "y = amentor.lab.env")
    assert out.cells[0].source == "mentor.lab.env in prose stays"
    assert nb.cells[1].source.startswith("import mentor.lab.env as e")  # the notebook itself is left alone


def test_gpu_run_leaves_out_the_stderr_of_cells_tagged_remove_stderr(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell tagged remove-stderr keeps its stdout and loses its stderr in the stored run; an untagged cell keeps
    both, with the machine's prefix cut from a path into site-packages; the stored outputs hash is that of what is
    stored, so check passes."""
    monkeypatch.setenv("MENTOR_PROFILE", "smoke")
    speak = "import sys\nprint('out')\nprint('/opt/x/site-packages/warn.py:1: Warning', file=sys.stderr)"
    path = write_notebook(tmp_path / "a.ipynb", speak, speak)
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata["tags"] = ["remove-stderr"]
    nbformat.write(nb, path)
    nb_gpu.gpu_run([path])

    nb = nbformat.read(path, as_version=4)
    streams = [[(out["name"], out["text"].strip()) for out in cell.outputs] for cell in nb.cells[1:]]
    assert streams == [[("stdout", "out")],
                       [("stdout", "out"), ("stderr", "site-packages/warn.py:1: Warning")]]
    assert nb_check.stale([path]) == []


def test_drop_hidden_stderr_counts_what_it_removed() -> None:
    nb = new_notebook(cells=[new_code_cell("x", outputs=[new_output("stream", name="stderr", text="w"),
                                                         new_output("stream", name="stderr", text="v"),
                                                         new_output("stream", name="stdout", text="o")]),
                             new_code_cell("y", outputs=[new_output("stream", name="stderr", text="kept")])])
    nb.cells[0].metadata["tags"] = ["remove-stderr", "other"]
    assert nb_outputs.drop_hidden_stderr(nb) == 2
    assert [out["text"] for out in nb.cells[0].outputs] == ["o"]
    assert [out["text"] for out in nb.cells[1].outputs] == ["kept"]
    assert nb_outputs.drop_hidden_stderr(nb) == 0


# --- the code a reader sees fits the book's column ---

_spec = importlib.util.spec_from_file_location("format_cells", REPO / "scripts" / "format_cells.py")
format_cells = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(format_cells)

RAW_UNTIL_RERUN: dict[str, str] = {}
"""Notebooks whose stored run hashes code as text (no ``hash_scheme``): formatting their cells would make the run
stale, so they keep their width until they are run again."""


def _code_blocks(markdown: str) -> list[str]:
    """The lines of the fenced code blocks in ``markdown`` (not MyST directives such as ```{note})."""
    lines, info = [], None
    for line in markdown.splitlines():
        fence = re.match(r"^\s*(```+|~~~+)\s*(\S*)", line)
        if fence:
            info = fence.group(2) if info is None else None
            continue
        if info is not None and not info.startswith("{"):
            lines.append(line)
    return lines


def test_code_blocks_find_code_not_directives() -> None:
    text = "```python\nx = 1\n```\n\n```{note}\nprose\n```\n~~~\ny\n~~~\n"
    assert _code_blocks(text) == ["x = 1", "y"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_visible_code_fits_the_column(notebook: Path) -> None:
    """The code cells a reader sees, and the code blocks of the prose, are at most LINE_LENGTH columns
    (scripts/format_cells.py formats them)."""
    nb = nbformat.read(notebook, as_version=4)
    blocks = [line for c in nb.cells if c.cell_type == "markdown" for line in _code_blocks(c.source)]
    too_long = [line for line in blocks if len(line) > format_cells.LINE_LENGTH]
    scheme = nb_hashes.stored_scheme(nb.metadata.get("mentor", {}))
    if nb_hashes.is_split(nb):  # its presenting cells render anywhere; a change of its measuring cells is checked
        too_long += [line for c in format_cells.visible_code(nb) for line in format_cells.long_lines(c.source)]
    elif notebook.name in RAW_UNTIL_RERUN:
        assert scheme == "raw", f"{notebook.name} was run again: take it out of RAW_UNTIL_RERUN"
    else:
        assert scheme != "raw", (f"{notebook.name}: its stored run hashes code as text; run it again "
                                 "(make gpu-run) before formatting its cells")
        too_long += [line for c in format_cells.visible_code(nb) for line in format_cells.long_lines(c.source)]
    assert not too_long, f"{notebook.name}: lines over {format_cells.LINE_LENGTH} columns:\n" + "\n".join(too_long)


@pytest.mark.parametrize("page", sorted((REPO / "book").glob("*.md")), ids=lambda p: p.name)
def test_code_blocks_of_markdown_pages_fit_the_column(page: Path) -> None:
    too_long = [line for line in _code_blocks(page.read_text()) if len(line) > format_cells.LINE_LENGTH]
    assert not too_long, f"{page.name}: lines over {format_cells.LINE_LENGTH} columns:\n" + "\n".join(too_long)


def test_long_lines_counts_columns() -> None:
    assert format_cells.long_lines("x" * format_cells.LINE_LENGTH + "\n" + "y" * (format_cells.LINE_LENGTH + 1)) == [
        "y" * (format_cells.LINE_LENGTH + 1)]
    nb = new_notebook(cells=[new_code_cell("a"), new_code_cell("b", metadata={"tags": ["remove-input"]}),
                             new_code_cell("c", metadata={"tags": ["hide-input"]}), new_markdown_cell("d")])
    assert [c.source for c in format_cells.visible_code(nb)] == ["a", "c"]


def test_shorten_paths_cuts_the_machine_prefix_in_streams_and_tracebacks() -> None:
    warning = "/opt/torch/.venv/lib/python3.12/site-packages/torch/x.py:83: UserWarning: w\n  return f()\n"
    nb = new_notebook(cells=[
        new_code_cell("a", outputs=[new_output("stream", name="stderr", text=warning),
                                    new_output("stream", name="stdout", text="/tmp/a.json saved\n"),
                                    new_output("stream", name="stdout",
                                               text="/tmp/site/lightning/fabric/a.py:134 x5, /tmp/sites/b\n"),
                                    new_output("error", ename="E", evalue="v", traceback=[
                                        "File /root/.venv/lib/site-packages/mentor/a.py:1", "plain line"])]),
        new_markdown_cell("/opt/x/site-packages/ stays in prose")])
    assert nb_outputs.shorten_paths(nb) == 3
    outs = nb.cells[0].outputs
    assert outs[0].text == "site-packages/torch/x.py:83: UserWarning: w\n  return f()\n"
    assert outs[1].text == "/tmp/a.json saved\n"  # only paths into installed packages are the machine's
    assert outs[2].text == "lightning/fabric/a.py:134 x5, /tmp/sites/b\n"  # a carried wheel's install folder
    assert outs[3].traceback == ["File site-packages/mentor/a.py:1", "plain line"]
    assert nb.cells[1].source == "/opt/x/site-packages/ stays in prose"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_name_no_path_of_the_gpu_machine(notebook: Path) -> None:
    """A downloaded notebook carries no path of the machine it ran on (gpu-run shortens them: shorten_paths)."""
    nb = nbformat.read(notebook, as_version=4)
    found = [f"cell {i}: {m.group(0)}" for i, c in enumerate(nb.cells) if c.cell_type == "code"
             for out in c.get("outputs", []) for m in [nb_outputs.MACHINE_PATH.search(str(out))] if m]
    assert not found, f"{notebook.name}: " + "; ".join(found)


# --- the background lane of tests/conftest.py ---


def test_the_tests_that_read_the_lane_run_last_in_their_order() -> None:
    import conftest
    from types import SimpleNamespace

    def item(name: str, *fixtures: str) -> SimpleNamespace:
        return SimpleNamespace(originalname=name, fixturenames=fixtures)

    a, smoke, site, b, render = (item("test_a", "tmp_path"), item("test_notebook_smoke", "smoke_runs"),
                                 item("test_page", "site", "built_book"), item("test_b"),
                                 item("test_split_chapters_render_as_stored", "render_outcomes"))
    items = [a, smoke, site, b, render]
    conftest.pytest_collection_modifyitems(None, None, items)
    assert items == [a, b, smoke, site, render]


def test_a_lane_that_ends_without_its_file_fails_with_its_log(tmp_path: Path) -> None:
    import subprocess
    import sys
    from types import SimpleNamespace

    import conftest

    log = tmp_path / "lane.log"
    log.write_text("jupyter-book: command failed\n")
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    stash = pytest.Stash()
    stash[conftest.LANE] = {"process": process, "log": log, "smoke": tmp_path / "never.json", "waited": 0.0}
    request = SimpleNamespace(config=SimpleNamespace(stash=stash))
    with pytest.raises(pytest.fail.Exception, match="the smoke run wrote nothing:\n.*command failed"):
        conftest._lane(request, "smoke run", "smoke")
    (tmp_path / "never.json").write_text("{}")
    assert conftest._lane(request, "smoke run", "smoke") == tmp_path / "never.json"


def test_the_lane_summary_gives_each_finished_steps_seconds_its_end_and_the_wait(tmp_path: Path) -> None:
    import conftest

    lane = {"timing": tmp_path / "timing.txt", "started": 1000.0, "waited": 12.4}
    assert conftest.lane_summary(lane) == ("background lane: no step finished; had not ended; the tests that read it "
                                           "waited 12 s for it")
    lane["timing"].write_text("build: 61\nrenders: 150\n")
    assert conftest.lane_summary(lane) == ("background lane: build 61 s, renders 150 s; had not ended; the tests that "
                                           "read it waited 12 s for it")
    with lane["timing"].open("a") as f:
        f.write("smoke run: 380\nend: 1612.6\n")
    assert conftest.lane_summary(lane) == ("background lane: build 61 s, renders 150 s, smoke run 380 s; ended 613 s "
                                           "after it started; the tests that read it waited 12 s for it")


def test_the_lane_records_each_steps_seconds_and_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's shell script (started at collection) writes a line per finished step and its end, which the
    summary reads: run with the steps made to finish at once."""
    import time
    from types import SimpleNamespace

    import conftest

    monkeypatch.setattr(conftest, "_selected", lambda session, name: [])
    monkeypatch.setattr(conftest, "_prepare_book_build", lambda root: None)
    monkeypatch.setattr(conftest.shutil, "which", lambda name, path=None: "true")  # a build that does nothing
    monkeypatch.setattr("tempfile.mkdtemp", lambda prefix="": str(tmp_path))  # the lane's folder
    stash = pytest.Stash()
    config = SimpleNamespace(stash=stash, option=SimpleNamespace(collectonly=False))
    session = SimpleNamespace(config=config, items=[SimpleNamespace(fixturenames=("built_book",))])
    began = time.time()
    conftest.pytest_collection_finish(session)
    lane = stash[conftest.LANE]
    assert lane["process"].wait(timeout=60) == 0
    took = time.time() - began
    lane["log_file"].close()
    lines = lane["timing"].read_text().splitlines()
    assert lines[0] == "build: 0" and lines[1].startswith("end: ") and len(lines) == 2
    assert 0 <= float(lines[1].removeprefix("end: ")) - lane["started"] <= took
    assert conftest.lane_summary(lane).startswith("background lane: build 0 s; ended ")


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the C library from /proc (Linux)")
def test_the_malloc_settings_reach_this_process_and_the_processes_it_starts() -> None:
    """tests/conftest.py keeps freed buffers in the heap: mallopt here, the environment for every child."""
    import json
    import subprocess
    import sys

    import conftest

    if "libc.so.6" not in Path("/proc/self/maps").read_text():
        pytest.skip("not glibc: the settings are ignored")
    assert conftest._mallopt() is True
    names = sorted(conftest.MALLOC_SETTINGS)
    code = f"import os, json; print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # conftest's values, or the ones set before the tests started (setdefault keeps those)
    assert json.loads(child.stdout) == {name: os.environ.get(name, str(value)) for name, value in
                                        conftest.MALLOC_SETTINGS.items()}
