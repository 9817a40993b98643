"""mentor.lab.compiled: graph breaks and recompiles of the three metric sets' updates, pinned on the CPU pins
(torch 2.14.1, torchmetrics 1.9.0). The counts are dynamo's and need no GPU."""

from __future__ import annotations

import pytest
import torch

from mentor.lab.compiled import COMPILE_SETS, CompileReport, GraphBreak, compile_report, compile_set, compile_table


@pytest.fixture(scope="module")
def reports() -> dict[str, CompileReport]:
    return {name: compile_report(name, steps=10) for name in COMPILE_SETS}


def test_the_fused_suite_is_one_graph_compiled_once(reports: dict[str, CompileReport]) -> None:
    r = reports["fused suite"]
    assert (r.graphs, r.graph_breaks, r.breaks, r.frames_after_step, r.error) == (1, 0, (), (1,) * 10, None)


def test_the_optimized_set_recompiles_every_step_until_dynamo_gives_up(reports: dict[str, CompileReport]) -> None:
    """No break, but each update bumps torchmetrics' _update_count, an int attribute dynamo guards on: one
    recompile per call until config.recompile_limit (8), after which dynamo runs the update eagerly."""
    r = reports["optimized"]
    limit = torch._dynamo.config.recompile_limit
    assert (r.graphs, r.graph_breaks, limit) == (1, 0, 8)
    assert r.frames_after_step == (1, 2, 3, 4, 5, 6, 7, 8, 8, 8)
    assert r.recompiles == 7
    assert r.recompile_calls == (2, 3, 4, 5, 6, 7, 8)


def test_with_int_attributes_unspecialized_the_optimized_set_recompiles_once() -> None:
    """torch/_dynamo/config.py: allow_unspec_int_on_nn_module lets an int attribute of a module go dynamic. The
    first call specializes on _update_count == 1, the second sees it change and recompiles with it unspecialized,
    and no later call recompiles; the setting is restored after the block."""
    with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
        r = compile_report("optimized", steps=10, label="optimized, ints unspecialized")
    assert torch._dynamo.config.allow_unspec_int_on_nn_module is False
    assert (r.name, r.graphs, r.graph_breaks, r.error) == ("optimized, ints unspecialized", 1, 0, None)
    assert r.frames_after_step == (1, 2, 2, 2, 2, 2, 2, 2, 2, 2)
    assert r.recompile_calls == (2,)


def test_a_report_and_a_config_carry_the_label_they_are_given() -> None:
    from mentor.lab.compiled import compiled_update_config

    assert compile_report("fused suite", steps=1).name == "fused suite"
    assert compile_report("fused suite", steps=1, label="the suite").name == "the suite"
    assert compiled_update_config("optimized", 10, "cpu").name == "optimized, compiled"
    assert compiled_update_config("optimized", 10, "cpu", "reduce-overhead").name == "optimized, compiled (reduce-overhead)"
    assert compiled_update_config("optimized", 10, "cpu", label="compiled optimized").name == "compiled optimized"


def test_torchmetrics_defaults_break_at_the_nan_check_and_at_bincount(reports: dict[str, CompileReport]) -> None:
    """MeanMetric's NaN check branches on a tensor (aggregation.py:93) and each of the four macro classifiers
    counts with bincount, whose output shape depends on the data (utilities/data.py:206)."""
    r = reports["torchmetrics defaults"]
    assert (r.graphs, r.graph_breaks) == (16, 15)
    assert {(b.reason, b.where) for b in r.breaks} == {
        ("Data-dependent branching", "torchmetrics/aggregation.py:93"),
        ("generic_jump TensorVariable()", "torchmetrics/aggregation.py:93"),
        ("Dynamic shape operator", "torchmetrics/utilities/data.py:206")}
    assert r.frames_after_step == (16,) * 10  # compiled at the first call, no recompile after it


def test_the_table_names_each_set_and_its_breaks(reports: dict[str, CompileReport]) -> None:
    table = compile_table(list(reports.values()))
    assert table.splitlines()[0] == "torchmetrics defaults: 16 graphs, 15 graph breaks, 0 recompiles in 10 calls"
    assert "  - Dynamic shape operator  at torchmetrics/utilities/data.py:206  (6x)" in table
    assert "optimized: 1 graph, 0 graph breaks, 7 recompiles in 10 calls" in table
    assert table.splitlines()[-1] == "fused suite: 1 graph, 0 graph breaks, 0 recompiles in 10 calls"


def test_a_tracing_error_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo as dynamo

    def broken(fn):
        def run(*args):
            raise RuntimeError("dynamo could not trace this\nsecond line")
        return run

    monkeypatch.setattr(dynamo, "explain", broken)
    r = compile_report("fused suite", steps=1)
    assert (r.graphs, r.frames_after_step, r.error) == (0, (), "RuntimeError: dynamo could not trace this")
    assert compile_table([r]) == "fused suite: tracing failed: RuntimeError: dynamo could not trace this"


def test_table_counts_repeated_breaks_and_singulars() -> None:
    r = CompileReport("x", 1, 1, (GraphBreak("a", "f.py:1"), GraphBreak("a", "f.py:1"), GraphBreak("b", "g.py:2")),
                      (3,))
    assert compile_table([r]) == ("x: 1 graph, 1 graph break, 0 recompiles in 1 call\n  - a  at f.py:1  (2x)\n"
                                  "  - b  at g.py:2")


@pytest.mark.parametrize("call, error, match", [
    (lambda: compile_set("defaults"), ValueError, r"unknown metric set 'defaults': pass one of"),
    (lambda: compile_report("fused suite", steps=0), ValueError, r"steps must be a whole number of compiled calls"),
    (lambda: compile_report("fused suite", steps=True), ValueError, r"steps must be a whole number"),
    (lambda: compile_report("fused suite", label=""), ValueError, r"label must be a non-empty string naming the report, got ''"),
    (lambda: compile_report("fused suite", label=3), ValueError, r"label must be a non-empty string naming the report, got 3"),
])
def test_bad_arguments_are_refused(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_a_compiled_update_config_runs_in_a_comparison_and_counts_like_eager() -> None:
    """Through compare, on CPU with the eager backend (the tracing is dynamo's, no code is generated); the
    compiled suite counts the same as an eager one fed the same steps."""
    from mentor.lab.configs import Config
    from mentor.lab.compare import compare
    from mentor.lab.compiled import compiled_update_config
    from mentor.lab.metric_sets import read_values
    from mentor.lab.data import device_batches
    from mentor.suite import FusedMetrics
    from mentor.lab.train import build_setup, train

    configs = [Config("no metrics"), compiled_update_config("fused suite", 10, "cpu", backend="eager")]
    setup = build_setup(num_classes=10)
    cmp = compare(configs, setup, device_batches(2, 32, 10), steps=2, warmup=1, rounds=1, report_every=2,
                  progress=False)
    assert [r.name for r in cmp.results] == ["no metrics", "fused suite, compiled"]

    on_step, on_report = compiled_update_config("fused suite", 10, "cpu", backend="eager").make()
    eager = FusedMetrics(10)

    def both(s) -> None:
        on_step(s)
        eager.update(s.loss, s.output, s.labels)

    train(setup, device_batches(2, 32, 10, distinct=3), steps=3, on_step=both)
    compiled_values = on_report(3)
    assert compiled_values == read_values(eager.compute())
    assert compiled_values["loss"] > 0 and 0 <= compiled_values["accuracy_micro"] <= 1


def test_dynamo_warnings_keeps_the_recompile_limit_as_one_line_without_machine_paths():
    import logging

    from mentor.lab.compiled import dynamo_warnings

    logger = logging.getLogger("torch._dynamo")
    before = (logger.handlers[:], logger.propagate, logger.level)
    with dynamo_warnings() as seen:
        report = compile_report("optimized", steps=10)
    import inspect

    from mentor.lab.metric_sets import LossAndScores

    line = inspect.getsourcelines(LossAndScores.update)[1]
    assert report.recompiles == 7
    assert seen == [f"torch._dynamo hit config.recompile_limit (8); function: 'update' "
                    f"(mentor/lab/metric_sets.py:{line}); "
                    "last reason: 0/7: self.loss._update_count == 9"]
    assert (logger.handlers, logger.propagate, logger.level) == before


def test_dynamo_warnings_restores_the_logger_when_the_block_raises():
    import logging

    from mentor.lab.compiled import dynamo_warnings

    logger = logging.getLogger("torch._dynamo")
    before = (logger.handlers[:], logger.propagate, logger.level)
    with pytest.raises(KeyError), dynamo_warnings() as seen:
        logging.getLogger("torch._dynamo.guards").error("boom at /home/me/x/torch/_dynamo/guards.py:12")
        raise KeyError("inside")
    assert seen == ["boom at torch/_dynamo/guards.py:12"]
    assert (logger.handlers, logger.propagate, logger.level) == before


@pytest.mark.parametrize("message, line", [
    ("plain", "plain"),
    ("first\n  function: 'f' (/a/b/torchmetrics/metric.py:546)\n  other: dropped\nUser stack trace:\n  x",
     "first; function: 'f' (torchmetrics/metric.py:546)"),
    ("first\n last reason: 1/7: self.n == 3      # self.n += 1  # m.py:4 (HINT: make it dynamic.)",
     "first; last reason: 1/7: self.n == 3"),
])
def test_one_line(message, line):
    from mentor.lab.compiled import _one_line

    assert _one_line(message) == line


def test_saved_reports_load_back_equal_and_the_file_reads_on_its_own(reports: dict[str, CompileReport],
                                                                     tmp_path) -> None:
    """The chapter stores its compile reports as JSON and renders its sentences from the file: every field comes
    back (the breaks as GraphBreak, the frames as a tuple), the derived counts are in the file for a reader and
    recomputed on load, and a report whose tracing failed keeps its error."""
    import json

    from mentor.lab.compiled import load_reports, save_reports

    failed = CompileReport("broken", 0, 0, (), (), error="Unsupported: x")
    kept = [*reports.values(), failed]
    path = save_reports(kept, tmp_path / "sub" / "reports.json")
    assert load_reports(path) == kept
    stored = json.loads(path.read_text())
    assert [(s["name"], s["recompiles"], s["recompile_calls"]) for s in stored] == [
        ("torchmetrics defaults", 0, []), ("optimized", 7, [2, 3, 4, 5, 6, 7, 8]), ("fused suite", 0, []),
        ("broken", 0, [])]
    assert stored[0]["breaks"][0].keys() == {"reason", "where"}
    stored[1]["recompiles"] = 99  # derived: recomputed from frames_after_step, not read
    path.write_text(json.dumps(stored))
    assert load_reports(path)[1].recompiles == 7
    with pytest.raises(FileNotFoundError, match="no compile reports at .*missing.json; write them with save_reports"):
        load_reports(tmp_path / "missing.json")
