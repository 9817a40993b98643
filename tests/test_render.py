"""Split notebooks: a measurement kept as data, presenting cells rendered from it on any machine, and the checks
that keep the two apart (scripts/nb/render.py, convert.py, gpu.py, check.py, waivers.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from nbtools_loader import check as nb_check
from nbtools_loader import convert as nb_convert
from nbtools_loader import gpu as nb_gpu
from nbtools_loader import hashes as nb_hashes
from nbtools_loader import book as nb_book
from nbtools_loader import nbtools
from nbtools_loader import outputs as nb_outputs
from nbtools_loader import render as nb_render
from nbtools_loader import runs as nb_runs
from nbtools_loader import waivers as nb_waivers

REPO = Path(__file__).resolve().parent.parent
SPLIT = [p for p in sorted((REPO / "book").glob("*.ipynb")) if nb_hashes.is_split(nbformat.read(p, as_version=4))]

MEASURE = ('import json, pathlib\npathlib.Path("results").mkdir(exist_ok=True)\n'
           'json.dump({"x": 0.25}, open("results/t.json", "w"))\nprint("measured")')
PRESENT = 'import json\nfrom myst_nb import glue\nx = json.load(open("results/t.json"))["x"]\nprint(f"x is {x}")\n' \
          'glue("x", x, display=False)'


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}


def split_notebook(folder: Path, present: str = PRESENT) -> Path:
    """A notebook in ``folder`` with one measuring cell, which writes results/t.json, and one presenting cell."""
    nb = new_notebook(cells=[new_markdown_cell("# T"), new_code_cell(MEASURE, metadata={"tags": ["measure"]}),
                             new_code_cell(present)])
    path = folder / "t.ipynb"
    nbformat.write(nb, path)
    return path


def messages(path: Path) -> list[str]:
    return nb_check.stale([path])


def test_a_split_notebook_is_measured_rendered_and_checked_in_two_parts(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """measure() runs only the measuring cell and records the file it wrote; render() runs only the presenting
    cell from that file; the check then passes, and each kind of change names the command that renews it."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "older.json").write_text("{}")  # there before the run: not the measurement's
    path = split_notebook(tmp_path)
    nb_gpu.measure(path, _env())
    nb = nbformat.read(path, as_version=4)
    meta = nb.metadata["mentor"]
    assert nb.cells[1].outputs[0]["text"] == "measured\n" and nb.cells[2].outputs == []
    assert meta["scope"] == "measure" and list(meta["results"]) == ["results/t.json"]
    assert meta["code_sha256"] == nb_hashes.code_hash(nb, scope="measure") != nb_hashes.code_hash(nb)
    assert any("has no stored render" in m for m in messages(path))

    nb_render.render(path, env=_env())
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[2].outputs[0]["text"] == "x is 0.25\n"
    assert nb.cells[1].outputs[0]["text"] == "measured\n"  # the measurement's output, kept
    assert messages(path) == []
    capsys.readouterr()
    assert nbtools.main(["check", str(path)]) == 0
    assert capsys.readouterr().out == "ok: 1 notebook(s) match their stored GPU run (1 split: by its measurement)\n"
    assert nb_render.render_differences(path, book=tmp_path, env=_env()) == []

    # a presentation change not rendered: the hash check and the fresh render both fail, and name `render`
    nb.cells[2].source = PRESENT.replace("x is", "x =")
    nbformat.write(nb, path)
    assert messages(path) == [f"{path}: its presenting cells changed since its render; render it (any machine): "
                              f"python scripts/nbtools.py render {path}"]
    differences = nb_render.render_differences(path, book=tmp_path, env=_env())
    assert len(differences) == 1 and "cell 2's stored outputs differ from a fresh render" in differences[0]
    assert "x is 0.25" in differences[0] and "x = 0.25" in differences[0]
    nb_render.render(path, env=_env())
    assert messages(path) == []

    # an output edited by hand, with the render's hash forged to match: only the fresh render sees it
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].outputs[0]["text"] = "x is 0.3\n"
    nb.metadata["mentor"]["render"]["outputs_sha256"] = nb_hashes.outputs_hash(nb, "present")
    nbformat.write(nb, path)
    assert messages(path) == []
    assert len(nb_render.render_differences(path, book=tmp_path, env=_env())) == 1


def test_a_stale_measurement_fails_until_measured_or_waived(tmp_path: Path) -> None:
    """Changing a measuring cell stales the measurement (not the render); a waiver accepts exactly that change,
    and the run box says so; an edited results file is never waived."""
    path = split_notebook(tmp_path)
    nb_gpu.measure(path, _env())
    nb_render.render(path, env=_env())
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = MEASURE.replace("0.25", "0.5")
    nbformat.write(nb, path)
    assert messages(path) == [
        f"{path}: its measuring cells changed since its measurement; measure it again on a GPU: make gpu-run "
        f"NB={path} (or, when it needs hardware that is not available, waive it: python scripts/nbtools.py waive "
        f"{path} --reason ...)"]
    waiver = nb_waivers.waive(path, "needs two GPUs")
    assert waiver["cells_changed"] is True and waiver["modules"] == []
    assert messages(path) == []
    meta = nbformat.read(path, as_version=4).metadata["mentor"]
    assert nb_waivers.waiver_text(meta) == (f"Rerun pending: the stored measurement of {meta['executed'][:10]} used "
                                            "an earlier mentor; since then, needs two GPUs.")
    assert nb_waivers._run_box().changes_text(meta)[0].endswith("its measuring cells changed.")

    nb = nbformat.read(path, as_version=4)  # a second change: the waiver accepts the first one only
    nb.cells[1].source = MEASURE.replace("0.25", "0.75")
    nbformat.write(nb, path)
    assert len(messages(path)) == 1 and "its waiver ('needs two GPUs') accepts another change" in messages(path)[0]

    (tmp_path / "results" / "t.json").write_text('{"x": 9}')
    assert any("results/t.json changed since its measurement wrote it" in m for m in messages(path))
    with pytest.raises(nb_waivers.WaiverRefused, match="results/t.json changed since its measurement"):
        nb_waivers.waive(path, "needs two GPUs")
    with pytest.raises(nb_runs.NotebookFailed, match="results/t.json changed since its measurement"):
        nb_render.render(path, env=_env())


def test_a_presenting_cell_that_uses_the_measurements_memory_fails_to_render(tmp_path: Path) -> None:
    """A presenting cell must read the stored results: one that uses a name only a measuring cell made fails."""
    path = split_notebook(tmp_path, present="print(json)")  # `json` was imported by the measuring cell
    nb_gpu.measure(path, _env())
    with pytest.raises(nb_runs.NotebookFailed, match=r"(?s)cell 2 .*NameError: name 'json' is not defined"):
        nb_render.render(path, env=_env())


def test_render_refuses_a_notebook_that_is_not_split(tmp_path: Path) -> None:
    path = tmp_path / "whole.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)")]), path)
    with pytest.raises(nb_runs.NotebookFailed, match="is not split into measuring and presenting cells"):
        nb_render.render(path)


def _current_run(path: Path) -> nbformat.NotebookNode:
    """Give the notebook at ``path`` outputs and the record a whole GPU run would store (no kernel)."""
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="measured\n")]
    nb.cells[2].outputs = [new_output("stream", name="stdout", text="x is 0.25\n")]
    nb.metadata["mentor"] = {"provenance": {"gpu": "NVIDIA H200", "gpu_count": 1, "executable": "/opt/venv/bin/python3"},
                             "executed": "2026-12-01T10:00:00+00:00", "duration_s": 3.0,
                             "hash_scheme": nb_hashes.HASH_SCHEME, "code_sha256": nb_hashes.code_hash(nb),
                             "mentor_sha256": nb_hashes.mentor_hash(), "mentor_sources": nb_hashes.mentor_sources(nb)}
    nbformat.write(nb, path)
    nb = nbformat.read(path, as_version=4)
    nb.metadata["mentor"]["outputs_sha256"] = nb_hashes.outputs_hash(nb)
    nbformat.write(nb, path)
    return nb


def test_convert_splits_a_current_run_and_refuses_a_stale_one(tmp_path: Path) -> None:
    path = split_notebook(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "t.json").write_text('{"x": 0.25}')
    nb = _current_run(path)
    nb.cells[1].source += "\n"  # layout only: the ast-1 hash keeps the run current
    nb.cells[2].source = "print(2)"  # a code change: the run no longer matches
    nbformat.write(nb, path)
    with pytest.raises(nb_convert.ConversionRefused, match="only a current stored run can be split.*code cells changed"):
        nb_convert.convert(path, ["results"])

    _current_run(split_notebook(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing.json is not a file or folder beside the notebook"):
        nb_convert.convert(path, ["missing.json"])
    record = nb_convert.convert(path, ["results"])
    nb = nbformat.read(path, as_version=4)
    assert record["scope"] == "measure" and record["executed"] == "2026-12-01T10:00:00+00:00"
    assert record["provenance"]["executable"] == "python3"  # the machine's path is cut
    assert record["code_sha256"] == nb_hashes.code_hash(nb, scope="measure")
    assert record["outputs_sha256"] == nb_hashes.outputs_hash(nb, "measure")
    assert record["results"] == {"results/t.json": nb_hashes.file_hash(tmp_path / "results" / "t.json")}
    assert messages(path) == [f"{path}: has no stored render of its presenting cells; render it (any machine): "
                              f"python scripts/nbtools.py render {path}"]
    with pytest.raises(nb_convert.ConversionRefused, match="is split already"):
        nb_convert.convert(path, ["results"])
    assert nbtools.main(["convert", str(path)]) == 1


def test_outputs_moved_between_measuring_cells_keep_the_measurements_hash() -> None:
    """The measuring cells' outputs hash as one sequence: a cell split in two keeps it; a changed output does not."""
    out = [new_output("stream", name="stdout", text="a\n"), new_output("stream", name="stdout", text="b\n")]
    one = new_notebook(cells=[new_code_cell("x", metadata={"tags": ["measure"]}, outputs=out)])
    two = new_notebook(cells=[new_code_cell("x", metadata={"tags": ["measure"]}, outputs=out[:1]),
                              new_code_cell("y", metadata={"tags": ["measure"]}, outputs=out[1:])])
    assert nb_hashes.outputs_hash(one, "measure") == nb_hashes.outputs_hash(two, "measure")
    assert nb_hashes.outputs_hash(one) != nb_hashes.outputs_hash(two)  # a whole run's hash stays per cell
    two.cells[1].outputs = [new_output("stream", name="stdout", text="c\n")]
    assert nb_hashes.outputs_hash(one, "measure") != nb_hashes.outputs_hash(two, "measure")


def test_scopes_select_cells_by_the_measure_tag() -> None:
    nb = new_notebook(cells=[new_markdown_cell("m"), new_code_cell("a", metadata={"tags": ["measure", "x"]}),
                             new_code_cell("b"), new_code_cell("c", metadata={"tags": ["remove-cell"]})])
    assert [c.source for c in nb_hashes.code_cells(nb, "measure")] == ["a"]
    assert [c.source for c in nb_hashes.code_cells(nb, "present")] == ["b", "c"]
    assert [c.source for c in nb_hashes.code_cells(nb)] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="scope is one of all, measure, present, not 'both'"):
        nb_hashes.code_cells(nb, "both")


def test_the_run_records_provenance_without_the_machines_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    import mentor.lab.env

    assert {"torch", "torchmetrics", "date"} <= set(nb_gpu.provenance())
    monkeypatch.setattr(mentor.lab.env, "environment_report",
                        lambda: {"gpu": "NVIDIA H200", "executable": "/opt/torch/.venv/bin/python3"})
    assert nb_gpu.provenance() == {"gpu": "NVIDIA H200", "executable": "python3"}


def test_prints_cut_into_several_stream_messages_compare_equal_to_one() -> None:
    """A kernel may deliver one cell's prints as one stream output or as several (when it flushes): the stored and
    the fresh render compare equal either way, while a different text, or stderr instead of stdout, does not."""
    one = [new_output("stream", name="stdout", text="rank 0\ntable\nrank 1\n")]
    three = [new_output("stream", name="stdout", text=t) for t in ("rank 0\n", "table\n", ["rank ", "1\n"])]
    assert nb_render.comparable(three) == nb_render.comparable(one)
    assert nb_render.comparable(three[:2]) != nb_render.comparable(one)
    mixed = [three[0], new_output("stream", name="stderr", text="table\n"), three[2]]
    assert len(nb_render.comparable(mixed)) == 3 and nb_render.comparable(mixed) != nb_render.comparable(one)


def test_comparable_outputs_ignore_execution_counts_only() -> None:
    a = [new_output("execute_result", data={"text/plain": "1"}, execution_count=3)]
    b = [new_output("execute_result", data={"text/plain": "1"}, execution_count=9)]
    c = [new_output("execute_result", data={"text/plain": "2"}, execution_count=3)]
    assert nb_render.comparable(a) == nb_render.comparable(b) != nb_render.comparable(c)
    split_text = [new_output("stream", name="stdout", text=["x", "y\n"])]
    assert nb_render.comparable(split_text) == nb_render.comparable([new_output("stream", name="stdout", text="xy\n")])


def test_compare_json_records_each_notebooks_differences_and_writes_no_notebook(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``render --compare-json`` (the tests' background lane): [] for a notebook whose render is current, the
    differing cell for one whose output was edited, the message for one that is not split, the error for one
    whose presenting cell fails; exit status 1."""
    path = split_notebook(tmp_path)
    nb_gpu.measure(path, _env())
    nb_render.render(path, env=_env())
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].outputs[0]["text"] = "x is 0.3\n"
    nbformat.write(nb, edited := tmp_path / "edited.ipynb")
    plain = tmp_path / "plain.ipynb"
    nbformat.write(new_notebook(cells=[new_markdown_cell("# P"), new_code_cell("print(1)")]), plain)
    (tmp_path / "bad").mkdir()
    failing = split_notebook(tmp_path / "bad", present='raise ValueError("boom")')
    before = {p: p.read_bytes() for p in (path, edited, plain, failing)}
    out = tmp_path / "renders.json"
    assert nbtools.main(["render", "--compare-json", str(out), str(path), str(edited), str(plain), str(failing)]) == 1
    assert "1 of 4 notebook(s) render as stored" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record[str(path)]["differences"] == [] and record[str(path)]["seconds"] > 0
    [difference] = record[str(edited)]["differences"]
    assert "cell 2's stored outputs differ from a fresh render" in difference and "x is 0.3" in difference
    assert "not split" in record[str(plain)]["differences"][0]
    assert record[str(failing)]["error"].startswith("NotebookFailed: ") and "boom" in record[str(failing)]["error"]
    assert {p: p.read_bytes() for p in before} == before
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("notebook", SPLIT, ids=lambda p: p.name)
def test_split_chapters_render_as_stored(notebook: Path, render_outcomes: dict) -> None:
    """A fresh render of each split chapter, from its stored measurement, gives exactly its stored outputs (text,
    glued values, SVG figures): a figure or a sentence cannot drift from its data. The renders run in the
    background while the other tests do (``nbtools.py render --compare-json``: tests/conftest.py)."""
    outcome = render_outcomes[notebook]
    if isinstance(outcome, str):
        pytest.fail(f"{notebook.name} did not render: {outcome}", pytrace=False)
    assert outcome == []


def test_chapter_12_is_split_and_its_page_names_no_machine_path() -> None:
    path = REPO / "book" / "12_two_gpus.ipynb"
    assert path in SPLIT
    text = path.read_text(encoding="utf-8")
    for prefix in ("/opt/", "/tmp/", "/root/", "/home/", "/usr/"):
        assert prefix not in text, f"{path.name} names a path of a machine ({prefix}...)"
    nb = nbformat.read(path, as_version=4)
    keys = [key for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
            for key in out.get("data", {})]
    assert not [k for k in keys if "image/png" in k] and [k for k in keys if "image/svg+xml" in k]
    waiver = json.loads(text)["metadata"]["mentor"]["waiver"]
    assert waiver["cells_changed"] and "two GPUs" in waiver["reason"]


@pytest.mark.parametrize("module", [nb_check, nb_hashes, nb_render, nb_outputs, nb_book],
                         ids=lambda m: m.__name__)
def test_the_examples_of_the_notebook_tools_hold(module) -> None:
    import doctest

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_a_waiver_of_a_raw_hashed_measurement_survives_a_layout_edit(tmp_path: Path) -> None:
    """A measurement stored before the ast-1 scheme hashes its code as text, and any edit of it shows as a change;
    its waiver accepts the code as it is, hashed by the current scheme, so a later change of layout alone stays
    accepted, and a change of the code does not."""
    path = split_notebook(tmp_path)
    nb_gpu.measure(path, _env())
    nb = nbformat.read(path, as_version=4)
    meta = nb.metadata["mentor"]
    meta["hash_scheme"] = "raw"
    meta["code_sha256"] = nb_hashes.code_hash(nb, "raw", "measure")
    meta["mentor_sources"] = nb_hashes.mentor_sources(nb, scheme="raw", scope="measure")
    nb.cells[1].source = MEASURE.replace("0.25", "0.5")
    nbformat.write(nb, path)
    waiver = nb_waivers.waive(path, "needs two GPUs")
    assert (waiver["scheme"], waiver["cells_changed"]) == (nb_hashes.HASH_SCHEME, True)
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("json.dump(", "json.dump(  ")  # layout only
    nbformat.write(nb, path)
    measured = [m for m in messages(path) if "no stored render" not in m]  # this test renders nothing
    assert measured == []
    nb.cells[1].source = nb.cells[1].source.replace('"x"', '"y"')
    nbformat.write(nb, path)
    measured = [m for m in messages(path) if "no stored render" not in m]
    assert len(measured) == 1 and "accepts another change" in measured[0]
