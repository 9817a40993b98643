"""mentor.lab.decomposition: a stored decomposition of the suite's cost read back, on hand-made dicts (exact), and
the stored runs that chapters 9 and 14 read."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mentor.lab.decomposition import (
    BASELINE,
    GATE,
    SYNC,
    ProfiledBatch,
    Spread,
    changed_kernels,
    decomposition_table,
    example_batch,
    example_variant,
    load_decomposition,
    recorded_differences,
    variants,
)

REPO = Path(__file__).resolve().parent.parent
STORED = REPO / "book" / "results" / "decomposition" / "2026-12-07_h100" / "compiled.json"
STORED_EAGER = STORED.with_name("eager.json")
stored_book = pytest.mark.skipif(not (REPO / "book").is_dir(),
                                 reason="reads the stored book, which mutmut's copy of the tree does not hold")


def hand_made() -> dict:
    """Two loops at one point; every number below is chosen so that the expected values are exact."""
    none = {"step_ms": {"median": 2.5, "mean": 2.625, "p10": 2.25, "p90": 3.0, "n": 40},
            "host_issue_us": {"median": 2000.0, "mean": 2100.0, "p10": 1800.0, "p90": 2500.0, "n": 20},
            "profile": {"windows": 6, "report_windows": 0, "plain": {
                "window_us": 9000.0, "host_us": {GATE: 6000.0, SYNC: 0.0, "kernel launch": 250.0},
                "api": {"kernel_launches": 4.0, "graph_launches": 2.0, "graph_launches_without_gpu_events": 0.0,
                        "syncs": 0.0},
                "gpu": {"us": 1250.0, "kernels": 292.0, "copies": 4.0}}, "report": None}}
    suite = copy.deepcopy(none)
    suite["step_ms"] = {"median": 2.75, "mean": 3.0, "p10": 2.5, "p90": 3.5, "n": 40}
    suite["host_issue_us"] = {"median": 1975.0, "mean": 2000.0, "p10": 1750.0, "p90": 2250.0, "n": 19}
    suite["profile"]["report_windows"] = 1
    suite["profile"]["plain"]["gpu"] = {"us": 1254.5, "kernels": 293.0, "copies": 4.0}
    suite["profile"]["report"] = {
        "window_us": 12000.0, "host_us": {GATE: 5000.0, SYNC: 6.5},
        "api": {"kernel_launches": 54.0, "graph_launches": 2.0, "graph_launches_without_gpu_events": 0.0,
                "syncs": 1.0},
        "gpu": {"us": 1400.0, "kernels": 343.0, "copies": 20.0}}
    diff = {"profile": {"plain": {"kernels": {
        "_update_kernel": {"count": 1.0, "us": 4.5}, "conv": {"count": 0.0, "us": -0.5},
        "gone": {"count": -2.0, "us": -1.0}, "float noise": {"count": 8.9e-16, "us": 0.25}}}}}
    return {"results": {"bf16 b32": {"variants": {BASELINE: none, "suite": suite},
                                     "differences": {f"suite - {BASELINE}": diff}}}}


def test_variants_reads_each_loop_exactly() -> None:
    loops = variants(hand_made(), "bf16 b32")
    assert list(loops) == [BASELINE, "suite"]
    none, suite = loops[BASELINE], loops["suite"]
    assert none.step_ms == Spread(median=2.5, mean=2.625, p10=2.25, p90=3.0, n=40)
    assert suite.issue_us == Spread(median=1975.0, mean=2000.0, p10=1750.0, p90=2250.0, n=19)
    assert none.report is None
    assert none.plain == ProfiledBatch(windows=6, gpu_us=1250.0, kernels=292.0, copies=4.0, kernel_launches=4.0,
                                       graph_launches=2.0, graphs_unseen=0.0, syncs=0.0, host_us=3000.0, sync_us=0.0)
    assert suite.plain.windows == 5 and suite.plain.gpu_us == 1254.5  # the report's window is not a plain one
    assert suite.report == ProfiledBatch(windows=1, gpu_us=1400.0, kernels=343.0, copies=20.0, kernel_launches=54.0,
                                         graph_launches=2.0, graphs_unseen=0.0, syncs=1.0, host_us=7000.0,
                                         sync_us=6.5)


def test_spread_holds_its_ends_and_nothing_outside() -> None:
    s = variants(hand_made(), "bf16 b32")[BASELINE].step_ms
    assert [s.holds(x) for x in (2.25, 2.75, 3.0, 2.2499, 3.0001)] == [True, True, True, False, False]
    assert s.range(2) == "2.25–3.00"


def test_changed_kernels_keeps_only_counts_that_changed() -> None:
    assert changed_kernels(hand_made(), "bf16 b32", "suite") == {"_update_kernel": (1.0, 4.5), "gone": (-2.0, -1.0)}


TABLE_TOP = [
    "bf16 b32                   none      suite",
    "step ms, median           2.500      2.750",
    "  p10–p90             2.25–3.00  2.50–3.50",
    "  mean                    2.625      3.000",
    "host issue µs, gated       2000       1975",
    "  p10–p90             1800–2500  1750–2250",
]
"""The first rows of :func:`hand_made`'s table at bf16 b32, with and without hook times: the step and the issue time."""


def test_the_table_is_exact() -> None:
    table = decomposition_table(hand_made(), "bf16 b32", {BASELINE: "none"})
    assert table.splitlines() == TABLE_TOP + [
        "batch without report",
        "  GPU µs                   1250       1254",
        "  kernels, copies        292, 4     293, 4",
        "  launches, graphs         4, 2       4, 2",
        "  syncs                       0          0",
        "  host µs, profiled        3000       3000",
        "report batch",
        "  GPU µs                      –       1400",
        "  kernels, copies             –    343, 20",
        "  launches, graphs            –      54, 2",
        "  syncs                       –          1",
        "  host µs, profiled           –       7000",
    ]


def test_a_mean_count_keeps_one_decimal() -> None:
    doc = {"results": {"p": {"variants": {BASELINE: example_variant(2.0, kernels=22.32)}}}}
    assert "22.3, 2" in decomposition_table(doc, "p")


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.pop("results"), "the decomposition has no 'results'"),
    (lambda d: d["results"]["bf16 b32"]["variants"].pop(BASELINE), "must start with 'no metrics'"),
    (lambda d: d["results"].update({"bf16 b32": {"error": "RuntimeError: out of memory"}}),
     "results['bf16 b32'] holds no measurement: the script recorded 'RuntimeError: out of memory'"),
    (lambda d: d["results"]["bf16 b32"]["variants"]["suite"]["step_ms"].update(median="2.7"),
     "results['bf16 b32']['variants']['suite']['step_ms']['median'] must be a finite number, got '2.7'"),
    (lambda d: d["results"]["bf16 b32"]["variants"]["suite"]["step_ms"].update(median=9.0),
     "p10 <= median <= p90 must hold"),
    (lambda d: d["results"]["bf16 b32"]["variants"]["suite"]["profile"]["report"]["api"].pop("syncs"),
     "results['bf16 b32']['variants']['suite']['profile']['report']['api'] has no 'syncs'"),
    (lambda d: d["results"]["bf16 b32"]["variants"]["suite"].update(profile={"error": "ValueError: x"}),
     "holds no profile: the script recorded 'ValueError: x'"),
])
def test_bad_input_is_named(mutate, message: str) -> None:
    doc = hand_made()
    mutate(doc)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        variants(doc, "bf16 b32")


def test_an_unknown_point_names_the_points_there() -> None:
    with pytest.raises(ValueError, match="point 'fp32 b32' is not in the decomposition; its points: bf16 b32"):
        decomposition_table(hand_made(), "fp32 b32")


def test_load_names_the_file(tmp_path: Path) -> None:
    bad = hand_made()
    bad["results"]["bf16 b32"]["variants"]["suite"]["profile"]["plain"] = None
    path = tmp_path / "compiled.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"compiled\.json: .*\['plain'\] is None"):
        load_decomposition(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"compiled\.json is not JSON"):
        load_decomposition(path)
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        load_decomposition(tmp_path / "missing.json")
    path.write_text(json.dumps(hand_made()))
    assert load_decomposition(path) == hand_made()


def test_the_examples_are_the_scripts_shape() -> None:
    batch = ProfiledBatch.of(example_batch(kernels=7, launches=3, syncs=1), 1, "b")
    assert (batch.kernels, batch.kernel_launches, batch.syncs, batch.host_us, batch.sync_us) == (7.0, 3.0, 1.0,
                                                                                                  900.0, 5.0)


def test_the_categories_are_the_scripts() -> None:
    """The script writes its gate and sync categories under the names this module reads (it imports them from
    here): were it to name them itself, every host time read here could be wrong."""
    name = "decompose_residuals_for_lab_decomposition"
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "decompose_residuals.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[name] = script  # dataclasses look their module up there
    spec.loader.exec_module(script)
    assert GATE == script.GATE
    assert SYNC == script.RULES[0][0] and script.RULES[0][2] == script.SYNC_CALLS


@stored_book
def test_the_stored_run_that_chapter_14_reads() -> None:
    doc = load_decomposition(STORED)
    assert doc["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    assert list(doc["results"]) == ["fp32 b32", "bf16 b32 96px"]
    fp32 = variants(doc, "fp32 b32")
    assert list(fp32) == [BASELINE, "suite inside", "suite inside, no report"]
    suite = fp32["suite inside"]
    assert (suite.plain.kernel_launches, suite.report.kernel_launches, suite.report.graph_launches,
            suite.report.syncs) == (21.0, 71.0, 2.0, 1.0)
    assert fp32["suite inside, no report"].report is None
    assert set(changed_kernels(doc, "fp32 b32", "suite inside")) == {"_update_kernel"}
    for point in doc["results"]:
        table = decomposition_table(doc, point, {BASELINE: "none", "suite inside": "suite",
                                                 "suite inside, no report": "no report"})
        assert max(map(len, table.splitlines())) <= 60  # a phone's column


def with_hook() -> dict:
    """:func:`hand_made` with the suite's update timed in the hook, as the eager loop stores it."""
    doc = hand_made()
    doc["results"]["bf16 b32"]["variants"][BASELINE]["hook_us"] = None
    doc["results"]["bf16 b32"]["variants"]["suite"]["hook_us"] = {
        "free": {"median": 80.5, "mean": 82.0, "p10": 75.0, "p90": 89.5, "n": 40},
        "gated": {"median": 76.25, "mean": 77.0, "p10": 73.0, "p90": 83.0, "n": 20}}
    return doc


def test_the_hook_is_read_exactly() -> None:
    loops = variants(with_hook(), "bf16 b32")
    assert loops[BASELINE].hook_free is None and loops[BASELINE].hook_gated is None
    assert loops["suite"].hook_free == Spread(median=80.5, mean=82.0, p10=75.0, p90=89.5, n=40)
    assert loops["suite"].hook_gated == Spread(median=76.25, mean=77.0, p10=73.0, p90=83.0, n=20)
    without = variants(hand_made(), "bf16 b32")["suite"]  # no 'hook_us' at all, as in older files: no hook
    assert (without.hook_free, without.hook_gated) == (None, None)


def test_a_hook_without_gated_batches_reads_as_none() -> None:
    doc = with_hook()
    doc["results"]["bf16 b32"]["variants"]["suite"]["hook_us"]["gated"] = None  # the script's smoke run: no gate
    suite = variants(doc, "bf16 b32")["suite"]
    assert suite.hook_gated is None and suite.hook_free.median == 80.5


def test_the_table_with_the_hook_is_exact() -> None:
    table = decomposition_table(with_hook(), "bf16 b32", {BASELINE: "none"})
    assert table.splitlines()[:10] == TABLE_TOP + [
        "hook µs, free                 –         80",
        "  p10–p90                     –      75–90",
        "hook µs, gated                –         76",
        "  p10–p90                     –      73–83",
    ]
    assert table.splitlines()[10:] == decomposition_table(hand_made(), "bf16 b32", {BASELINE: "none"}).splitlines()[6:]


def test_place_names_the_side() -> None:
    s = Spread(median=2.5, mean=2.625, p10=2.25, p90=3.0, n=40)
    assert [s.place(x) for x in (2.25, 3.0, 2.2, 3.1)] == ["inside", "inside", "below", "above"]


@pytest.mark.parametrize(("hook", "message"), [
    ([80.0], "results['bf16 b32']['variants']['suite']['hook_us'] must be None or a dict with 'free' and 'gated', "
             "got [80.0]"),
    ({"free": None}, "results['bf16 b32']['variants']['suite']['hook_us'] has no 'gated'"),
    ({"free": {"median": 1.0}, "gated": None}, "results['bf16 b32']['variants']['suite']['hook_us']['free'] has no "
                                               "'mean'"),
])
def test_a_bad_hook_is_named(hook, message: str) -> None:
    doc = hand_made()
    doc["results"]["bf16 b32"]["variants"]["suite"]["hook_us"] = hook
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        variants(doc, "bf16 b32")


def run_env() -> dict:
    return {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-07T05:06:57+00:00", "torch": "2.11.0+cu130",
            "torchmetrics": "1.9.0", "driver": "580.159.04"}


def test_recorded_differences_are_exact() -> None:
    doc = {"meta": {"device": "NVIDIA H100 80GB HBM3", "finished": "2026-12-07 05:26:12",
                    "versions": {"torch": "2.11.0+cu130", "torchmetrics": "1.9.0"}}}
    assert recorded_differences(doc, run_env()) == {}
    assert recorded_differences(doc, run_env() | {"torch": "2.10.0", "date": "2026-12-06T23:59:59+00:00"}) == {
        "day": ("2026-12-07", "2026-12-06"), "torch": ("2.11.0+cu130", "2.10.0")}
    assert recorded_differences(doc, {}) == {"GPU": ("NVIDIA H100 80GB HBM3", None), "day": ("2026-12-07", None),
                                             "torch": ("2.11.0+cu130", None), "torchmetrics": ("1.9.0", None)}


@pytest.mark.parametrize(("doc", "env", "message"), [
    ({}, {}, "the decomposition has no 'meta'"),
    ({"meta": {"device": "x", "finished": "2026-12-07"}}, {}, "the decomposition's meta has no 'versions'"),
    ({"meta": {"device": "x", "finished": "2026-12-07", "versions": {"torch": "2.11.0"}}}, {},
     "the decomposition's meta\\['versions'\\] has no 'torchmetrics'"),
    ({"meta": {}}, None, "env must be the dict of a chapter's stored environment"),
])
def test_recorded_differences_name_bad_input(doc, env, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        recorded_differences(doc, env)


@stored_book
def test_the_stored_run_that_chapter_9_reads() -> None:
    doc = load_decomposition(STORED_EAGER)
    assert doc["meta"]["device"] == "NVIDIA H100 80GB HBM3" and doc["report_every"] == 50
    assert recorded_differences(doc, run_env()) == {}
    assert list(doc["results"]) == ["fp32 b128", "fp32 b32"]
    for point, (plain, report) in {"fp32 b128": (378.0, 428.0), "fp32 b32": (375.0, 425.0)}.items():
        loops = variants(doc, point)
        assert list(loops) == [BASELINE, "suite", "suite, no report"]
        none, suite, quiet = loops.values()
        assert none.hook_free is None and none.hook_gated is None
        assert (suite.hook_free.n, suite.hook_gated.n, quiet.hook_free.n, quiet.hook_gated.n) == (80, 50, 80, 50)
        assert (none.plain.kernel_launches, suite.plain.kernel_launches, suite.report.kernel_launches,
                suite.report.syncs, suite.report.graph_launches) == (plain - 1, plain, report, 1.0, 0.0)
        assert quiet.report is None
        assert set(changed_kernels(doc, point, "suite")) == {"_update_kernel"}
        table = decomposition_table(doc, point, {BASELINE: "none", "suite": "suite", "suite, no report": "no report"})
        assert max(map(len, table.splitlines())) <= 60  # a phone's column
        assert [line.split()[-1] for line in table.splitlines() if line.startswith("hook")] == ["82", "78"] \
            if point == "fp32 b128" else ["77", "79"]
