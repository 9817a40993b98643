"""scripts/nb/plan.py: which notebooks need the GPU machine, and how they are packed into calls and stretches."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from nbtools_loader import check as nb_check
from nbtools_loader import hashes as nb_hashes

from nb import plan  # scripts/ is on sys.path once nbtools_loader is imported

Run = plan.PlannedRun
N09, N11, N14, N16, N10 = ("09_when_it_matters.ipynb", "11_reading_values.ipynb", "14_compile.ipynb",
                           "16_frameworks.ipynb", "10_macro_and_collections.ipynb")
INSTALL = ("bash .whl/install.sh && export PYTHONPATH=/tmp/site:$PYTHONPATH && "
           "python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . && ")
OLD = ("mkdir -p .venv/torchmetrics-1.6.1 && python3 -m pip install -q --no-index --no-deps --target "
       ".venv/torchmetrics-1.6.1 .whl-old/*.whl && touch .venv/torchmetrics-1.6.1/.installed && ")
PACK = "; tar -czf $OUT/results.tgz book/*.ipynb book/results book/traces"


def layout(calls: list[plan.Call]) -> list[tuple[list[str], float, bool, int, str]]:
    return [([r.name for r in c.runs], c.seconds, c.in_stretch, c.gpus, c.flag) for c in calls]


def test_the_chapters_runs_are_packed_first_fit_in_priority_order() -> None:
    """09 (506 s) does not fit in a call with the 40 s install (546 > 540): a call of its own, flagged too long.
    Then 11 opens a call, 14 does not fit in it, 16 does, and 10 fits in neither; the fourth call starts after
    120 + 546 + 472 + 425 = 1563 s, past the stretch, and so does the third."""
    runs = [Run(N10, 193.0, "stale"), Run(N16, 208.0, "stale"), Run(N14, 385.0, "stale"),
            Run(N11, 224.0, "stale"), Run(N09, 506.0, "stale")]  # the order given does not matter
    calls = plan.pack(runs, call_limit_s=540, overhead_s=40)
    assert layout(calls) == [([N09], 546.0, True, 1, plan.TOO_LONG), ([N11, N16], 472.0, True, 1, ""),
                             ([N14], 425.0, False, 1, ""), ([N10], 233.0, False, 1, "")]
    assert plan.command(calls[0]) == (f"MODE=start JOB='python3 scripts/nbtools.py gpu-run book/{N09}' "
                                      "bash scripts/device_job.sh")
    text = plan.format_plan(calls)
    assert text.splitlines()[-1] == ("2 of 4 one-GPU calls (1138 s of 1796 s) fit in one 25-minute stretch, "
                                     "machine start included")
    assert "Call 1: ~546 s, in the first 25-minute stretch" in text and "Call 3: ~425 s, in a later stretch" in text
    assert "start it in the background with scripts/device_job.sh" in text
    assert text.splitlines()[:3] == ["notebook                        why      last GPU run",
                                     f"{N09}        stale    506 s", f"{N11}         stale    224 s"]


def test_a_run_longer_than_a_call_or_of_unknown_length_gets_a_call_of_its_own() -> None:
    runs = [Run("a.ipynb", 100.0, "stale"), Run("b.ipynb", 600.0, "stale"), Run("c.ipynb", None, "pending"),
            Run("d.ipynb", 500.0, "stale"), Run("e.ipynb", 50.0, "stale")]
    calls = plan.pack(runs, call_limit_s=540, overhead_s=40, start_s=0, stretch_s=10_000)
    # 500 s is exactly what a call holds besides its install; the unknown run counts as a full call
    assert layout(calls) == [(["a.ipynb", "e.ipynb"], 190.0, True, 1, ""), (["b.ipynb"], 640.0, True, 1, plan.TOO_LONG),
                             (["c.ipynb"], 540.0, True, 1, plan.UNKNOWN), (["d.ipynb"], 540.0, True, 1, "")]
    # two runs that fill a call to exactly 540 s share it
    assert layout(plan.pack([Run("a.ipynb", 300.0, "stale"), Run("b.ipynb", 200.0, "stale")])) == [
        (["a.ipynb", "b.ipynb"], 540.0, True, 1, "")]
    text = plan.format_plan(calls)
    assert "  c.ipynb (unknown, pending)\n  unknown duration: no stored GPU run to time it by" in text
    assert plan.command(calls[2]).startswith(INSTALL + "python3 scripts/nbtools.py gpu-run book/c.ipynb;")


def test_a_reader_runs_after_what_it_reads_even_when_it_comes_first() -> None:
    """08 reads 02 and comes before it in PRIORITY: it moves after 02 and into 02's call, though the first call
    had room for it."""
    runs = [Run("08_summary.ipynb", 50.0, "stale"), Run("02_naive_metrics.ipynb", 200.0, "stale"),
            Run(N09, 400.0, "stale")]
    calls = plan.pack(runs)
    assert layout(calls) == [([N09], 440.0, True, 1, ""),
                             (["02_naive_metrics.ipynb", "08_summary.ipynb"], 290.0, True, 1, "")]
    # without the reading rule, first-fit would have put 08 with 09
    assert layout(plan.pack([Run("x.ipynb", 50.0, "stale"), runs[1], runs[2]]))[0][0] == [N09, "x.ipynb"]
    assert "gpu-run book/02_naive_metrics.ipynb book/08_summary.ipynb;" in plan.command(calls[1])


@pytest.mark.parametrize("last, in_stretch", [(300.0, True), (301.0, False)])
def test_the_stretch_ends_at_1500_s_machine_start_included(last: float, in_stretch: bool) -> None:
    """120 + (40 + 500) + (40 + 460) + (40 + last), the three apart (none fits beside another): 1500 s exactly is
    in, one more second is out."""
    runs = [Run("a.ipynb", 500.0, "stale"), Run("b.ipynb", 460.0, "stale"), Run("c.ipynb", last, "stale")]
    calls = plan.pack(runs)
    assert [c.in_stretch for c in calls] == [True, True, in_stretch]
    assert sum(c.seconds for c in calls) + plan.MACHINE_START_S == 1500.0 + (last - 300.0)


def test_chapter_12_gets_a_two_gpu_call_outside_the_stretch() -> None:
    runs = [Run("12_two_gpus.ipynb", 163.0, "pending", gpus=2), Run("a.ipynb", 100.0, "stale"),
            Run("b.ipynb", 100.0, "stale")]
    calls = plan.pack(runs)
    assert layout(calls) == [(["a.ipynb", "b.ipynb"], 240.0, True, 1, ""),
                             (["12_two_gpus.ipynb"], 203.0, False, 2, "")]
    text = plan.format_plan(calls)
    assert "Call 2: ~203 s, two GPUs: run it on the two-GPU kind" in text
    assert text.splitlines()[-1].startswith("1 of 1 one-GPU calls (360 s of 360 s)")
    assert plan.command(calls[1]) == INSTALL + "python3 scripts/nbtools.py gpu-run book/12_two_gpus.ipynb" + PACK


def test_the_command_runs_exactly_the_calls_notebooks_in_run_order() -> None:
    names = ["08_summary.ipynb", "13_since_1_6_1.ipynb", "01_baseline.ipynb", "02_naive_metrics.ipynb",
             "03_profiler.ipynb", "04_record_function.ipynb", "05_weight.ipynb", "06_nan_check.ipynb",
             "07_device_and_ddp.ipynb", N10]
    call = plan.Call(tuple(Run(n, 10.0, "stale") for n in names), 140.0, True, 1)
    order = ["13_since_1_6_1.ipynb", "01_baseline.ipynb", "02_naive_metrics.ipynb", "03_profiler.ipynb",
             "04_record_function.ipynb", "05_weight.ipynb", "06_nan_check.ipynb", "08_summary.ipynb",
             "07_device_and_ddp.ipynb", N10]
    text = plan.command(call)
    assert text == (INSTALL + OLD + "python3 scripts/nbtools.py gpu-run " + " ".join(f"book/{n}" for n in order)
                    + PACK)
    assert len(text) == 685 <= 2000
    assert plan.carry(call) == [".whl", ".whl-old"]
    without = plan.Call(call.runs[2:], 120.0, True, 1)
    assert ".whl-old" not in plan.command(without) and plan.carry(without) == [".whl"]


MEASURE = 'print("measured")'
PRESENT = 'print("presented")'


def stored_split(folder: Path, name: str, duration: float | None, measure: str | None = MEASURE) -> Path:
    """A split notebook whose stored measurement and render match it (no outputs, nothing written); with
    ``measure`` None, a page whose cells all present."""
    cells = [new_markdown_cell("# T"), new_code_cell(PRESENT)]
    if measure is not None:
        cells.insert(1, new_code_cell(measure, metadata={"tags": ["measure"]}))
    nb = new_notebook(cells=cells)
    when = "2026-01-01T00:00:00+00:00"
    render = {"hash_scheme": nb_hashes.HASH_SCHEME, "measured": None, "read": {}, "mentor_sources": {},
              "code_sha256": nb_hashes.code_hash(nb, scope="present"),
              "outputs_sha256": nb_hashes.outputs_hash(nb, "present")}
    meta = {"scope": "measure", "render": render}
    if measure is not None:
        meta.update({"executed": when, "hash_scheme": nb_hashes.HASH_SCHEME, "mentor_sources": {}, "results": {},
                     "code_sha256": nb_hashes.code_hash(nb, scope="measure"),
                     "outputs_sha256": nb_hashes.outputs_hash(nb, "measure")})
        meta["render"]["measured"] = when
        if duration is not None:
            meta["duration_s"] = duration
    nb.metadata["mentor"] = meta
    path = folder / name
    nbformat.write(nb, path)
    return path


def test_gather_lists_stale_and_waived_runs_and_never_a_page_that_only_renders(tmp_path: Path) -> None:
    current = stored_split(tmp_path, "a_current.ipynb", 30.0)
    waived = stored_split(tmp_path, "b_waived.ipynb", 12.5)
    nb = nbformat.read(waived, as_version=4)
    nb.cells[1].source = 'print("measured again")'
    nb.metadata["mentor"]["waiver"] = {"reason": "needs two GPUs", "scheme": nb_hashes.HASH_SCHEME,
                                       "accepts": nb_hashes.measure_digest(nb, nb_hashes.HASH_SCHEME)}
    nbformat.write(nb, waived)
    changed = stored_split(tmp_path, "c_changed.ipynb", 80.0)
    nb = nbformat.read(changed, as_version=4)
    nb.cells[1].source = 'print("changed")'
    nbformat.write(nb, changed)
    unrun = tmp_path / "d_unrun.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), unrun)
    page = stored_split(tmp_path, "e_page.ipynb", None, measure=None)
    nb = nbformat.read(page, as_version=4)
    nb.cells[1].source = 'print("presented again")'  # its render is stale: a render, not a GPU run, renews it
    nb.metadata["mentor"]["waiver"] = {"reason": "left behind"}  # and a waiver left behind is no pending rerun
    nbformat.write(nb, page)
    rendered = stored_split(tmp_path, "f_rendered.ipynb", 20.0)
    nb = nbformat.read(rendered, as_version=4)
    nb.cells[2].source = 'print("presented again")'
    nbformat.write(nb, rendered)
    notebooks = [current, waived, changed, unrun, page, rendered]
    assert [nb_check.stale([p]) != [] for p in notebooks] == [False, False, True, True, True, True]
    assert plan.gather(notebooks) == [Run("b_waived.ipynb", 12.5, "pending"), Run("c_changed.ipynb", 80.0, "stale"),
                                      Run("d_unrun.ipynb", None, "stale")]
    twelve = stored_split(tmp_path, "12_two_gpus.ipynb", 163.0, measure='print("two")')
    nb = nbformat.read(twelve, as_version=4)
    nb.cells[1].source = 'print("two GPUs")'
    nbformat.write(nb, twelve)
    assert plan.gather([twelve]) == [Run("12_two_gpus.ipynb", 163.0, "stale", gpus=2)]


def test_main_prints_nothing_to_rerun_when_every_run_is_current(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main([str(stored_split(tmp_path, "a.ipynb", 30.0))]) == 0
    assert capsys.readouterr().out == "nothing to rerun\n"


def test_a_run_with_a_prepared_next_version_says_to_copy_it_first(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """book/next/ holds chapters prepared for their next run: the plan names the copy before the call's command."""
    (tmp_path / "next").mkdir()
    (tmp_path / "next" / "11_reading_values.ipynb").write_text("{}")
    monkeypatch.setattr(plan, "BOOK", tmp_path)
    calls = plan.pack([plan.PlannedRun("11_reading_values.ipynb", 224.0, "pending"),
                       plan.PlannedRun("16_frameworks.ipynb", 208.0, "pending")])
    text = plan.format_plan(calls)
    assert ("  11_reading_values.ipynb: its next version waits in book/next/11_reading_values.ipynb: copy it into "
            "book/ first, as book/next/README.md says") in text.splitlines()
    assert "16_frameworks.ipynb: its next version" not in text
