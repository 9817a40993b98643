"""CPU tests of mentor.bench that pin what the mutation run found unpinned: whole error messages, the devices and
sizes passed on to metrics, setups and batches, defaults, the table's sync columns, JSON keys, and what the charts
show (bar colours by verdict, error-bar extents, labels, the syncs/step notes inside the axes)."""

import inspect
import io
import itertools
import json
import math
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mentor import bench
from mentor.bench import Comparison, Config, Interval, Result, compare
from mentor.data import device_batches
from mentor.env import get_profile
from exact import whole
from test_mentor_bench import batches, close_figures, setup  # noqa: F401  the fixtures of the older file

CUDA = torch.device("cuda")


def cuda_profile():
    """The smoke profile with a CUDA device: only passed on (builders are faked), nothing runs on it."""
    return get_profile("smoke").with_(device=CUDA)


# ----------------------------------------------------------------------------------------------------------
# value checks: whole messages, and the values just inside the limits


@pytest.mark.parametrize("kwargs,message", [
    (dict(syncs_per_step="3"), "Result 'x': syncs_per_step must be a number >= 0 or None (not counted), got '3'."),
    (dict(report_syncs=True), "Result 'x': report_syncs must be a number >= 0 or None (not counted), got True."),
    (dict(report_steps=[0.0]), "Result 'x': report_steps must be increasing step positions in 0..1, got [0.0]; "
                               "report_positions(warmup, steps, report_every) gives them."),
    (dict(report_steps=[True]), "Result 'x': report_steps must be increasing step positions in 0..1, got [True]; "
                                "report_positions(warmup, steps, report_every) gives them."),
])
def test_result_refuses_non_numbers_with_the_whole_message(kwargs, message):
    with pytest.raises(ValueError, match=whole(message)):
        Result("x", "", [[1.0, 2.0]], **kwargs)


@pytest.mark.parametrize("name,rounds,message", [
    (3, [[1.0]], "Result name must be a non-empty string, got 3."),
    ("x", 5, "Result 'x': round_step_ms must be a non-empty list of rounds, each a list of step times in ms, got 5."),
    ("x", "ab", "Result 'x': round_step_ms must be a non-empty list of rounds, each a list of step times in ms, "
                "got 'ab'."),
])
def test_result_refuses_bad_names_and_rounds_with_the_whole_message(name, rounds, message):
    with pytest.raises(ValueError, match=whole(message)):
        Result(name, "", rounds)


@pytest.mark.parametrize("rounds,message", [
    ([[1.0], [True]], "Result 'x': step 0 of round 1 is True; step times must be finite positive milliseconds."),
    ([[1.0, "2"]], "Result 'x': step 1 of round 0 is '2'; step times must be finite positive milliseconds."),
    ([[float("inf")]], "Result 'x': step 0 of round 0 is inf; step times must be finite positive milliseconds."),
    ([[0.0]], "Result 'x': step 0 of round 0 is 0.0; step times must be finite positive milliseconds."),
])
def test_result_refuses_bad_step_times_with_the_whole_message(rounds, message):
    # a bool is a number to Python (True == 1) but not a step time; a string is refused before math.isfinite sees it
    with pytest.raises(ValueError, match=whole(message)):
        Result("x", "", rounds)


@pytest.mark.parametrize("level", [0, 1, 1.5])
def test_interval_level_must_lie_strictly_between_0_and_1(level):
    message = f"Interval.level must be between 0 and 1 (0.95 for 95 %), got {level!r}."
    with pytest.raises(ValueError, match=whole(message)):
        Interval(1.0, 0.0, 2.0, level)


def test_interval_fmt_defaults_to_one_decimal_and_refuses_fractional_digits():
    assert Interval(7.0, 6.1, 8.0).fmt() == "+7.0 % [6.1, 8.0]"
    for digits in (1.5, True):
        with pytest.raises(ValueError, match=whole(f"digits must be an int >= 0, got {digits!r}.")):
            Interval(7.0, 6.1, 8.0).fmt(digits)


def test_operating_point_accepts_one():
    p = bench.OperatingPoint("tiny", 1, 1)  # the smallest batch and image the checks allow (>= 1)
    assert (p.batch_size, p.image_size) == (1, 1)


def two_rounds(name, a, b):
    return Result(name, "", [[a], [b]])


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(results=[]), TypeError, "Comparison.results must be a non-empty list of mentor.bench.Result."),
    (dict(batch_size=2.5), ValueError, "batch_size must be an int >= 1 (images per step), got 2.5."),
    (dict(batch_size=True), ValueError, "batch_size must be an int >= 1 (images per step), got True."),
    (dict(settings={"seed": "x"}), ValueError, "settings['seed'] must be an int, got 'x'."),
    (dict(settings={"seed": 1.0}), ValueError, "settings['seed'] must be an int, got 1.0."),
])
def test_comparison_refuses_bad_values_with_the_whole_message(kwargs, error, message):
    args = dict(results=[two_rounds("a", 10.0, 10.0)], baseline="a", batch_size=1) | kwargs
    with pytest.raises(error, match=whole(message)):
        Comparison(**args)


@pytest.mark.parametrize("level", [0, 1, "0.5"])
def test_overhead_level_is_checked_before_the_interval_is_built(level):
    cmp = Comparison([two_rounds("a", 10.0, 10.0), two_rounds("b", 11.0, 11.0)], "a", 1)
    message = f"level must be a number between 0 and 1 (0.95 for 95 %), got {level!r}."
    with pytest.raises(ValueError, match=whole(message)):
        cmp.overhead("b", level=level)


def test_overhead_keeps_the_level_asked_for():
    two = Comparison([two_rounds("a", 10.0, 10.0), two_rounds("b", 11.0, 11.0)], "a", 1)
    one = Comparison([Result("a", "", [[10.0]]), Result("b", "", [[11.0]])], "a", 1)
    assert two.overhead("b", level=0.9).level == 0.9
    assert one.overhead("b", level=0.8).level == 0.8


# ----------------------------------------------------------------------------------------------------------
# the bootstrap itself


def documented_bootstrap(a, b, kind, level, seed):
    """The interval as overhead's docstring describes it, computed here step by step."""
    rng = np.random.default_rng(seed)
    n = len(a)
    idx = rng.integers(0, n, size=(bench.RESAMPLES, n))
    ratios = []
    for row in idx:
        if kind == "median":
            pooled_a, pooled_b = np.concatenate([a[i] for i in row]), np.concatenate([b[i] for i in row])
            ratios.append(np.median(pooled_a) / np.median(pooled_b))
        else:
            ratios.append(sum(math.fsum(a[i]) for i in row) / sum(math.fsum(b[i]) for i in row))
    return tuple(np.quantile((np.array(ratios) - 1) * 100, [(1 - level) / 2, (1 + level) / 2]))


@pytest.mark.parametrize("kind", ["median", "throughput"])
@pytest.mark.parametrize("level", [0.95, 0.5])
def test_interval_is_the_documented_percentile_bootstrap(kind, level):
    # eight rounds, each with its own overhead: the quantiles fall between different resample values
    base = [[10.0, 10.0, 10.0]] * 8
    cfg = [[10.0 * f, 10.0 * f, 10.0 * f + 20.0 * k % 7] for k, f in enumerate([1.0, 1.02, 1.05, 1.1, 1.13, 1.2,
                                                                                    1.3, 1.41])]
    cmp = Comparison([Result("base", "", base), Result("cfg", "", cfg)], "base", 1, settings={"seed": 5})
    iv = cmp.overhead("cfg", kind, level=level)
    assert (iv.lo, iv.hi) == pytest.approx(documented_bootstrap(cfg, base, kind, level, 5), abs=1e-9)


def test_median_interval_resamples_pooled_step_medians_not_totals():
    # one long report step per round: the median step is 10 % slower in every round, the total time 110 %
    base = [[10.0, 10.0, 10.0, 10.0]] * 3
    cfg = [[11.0, 11.0, 11.0, 51.0]] * 3
    cmp = Comparison([Result("base", "", base), Result("cfg", "", cfg, [3])], "base", 4)
    iv = cmp.overhead("cfg", "median")
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((10.0, 10.0, 10.0))


@pytest.mark.parametrize("cfg_rounds", [
    [[11.0], [11.0, 11.0]],               # two lengths (1 and 2 steps)
    [[11.0], [11.0, 11.0], [11.0] * 3],   # three lengths
])
def test_overhead_of_rounds_of_different_lengths(cfg_rounds):
    base = [[10.0] * len(r) for r in cfg_rounds]
    cmp = Comparison([Result("base", "", base), Result("cfg", "", cfg_rounds)], "base", 1)
    iv = cmp.overhead("cfg")  # every pooled median is 11 over 10, whatever rounds a resample draws
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((10.0, 10.0, 10.0))


def test_an_interval_just_above_zero_is_slower():
    # +0.5 % in each of two rounds: the interval [0.5, 0.5] lies above 0
    cmp = Comparison([two_rounds("a", 100.0, 200.0), two_rounds("b", 100.5, 201.0)], "a", 1)
    iv = cmp.overhead("b")
    assert (iv.lo, iv.hi) == pytest.approx((0.5, 0.5))
    assert cmp.verdict("b") == "slower"


def test_the_baseline_verdicts_in_facts_and_rows():
    cmp = Comparison([two_rounds("a", 10.0, 20.0), two_rounds("b", 11.0, 22.0)], "a", 1)
    assert (cmp.facts("a")["verdict"], cmp.facts("a")["tput_verdict"]) == ("baseline", "baseline")
    row = cmp.rows()[0]
    assert (row["verdict"], row["throughput_verdict"]) == ("baseline", "baseline")


def test_bench_is_cuda_reads_the_setup_device():
    assert bench._is_cuda(SimpleNamespace(device=torch.device("cuda", 0)))
    assert not bench._is_cuda(SimpleNamespace(device=torch.device("cpu")))


# ----------------------------------------------------------------------------------------------------------
# configurations: what is passed on to the metrics


def recording_metric_set(monkeypatch):
    """Replace bench.metric_set by one that records its keyword arguments and builds the set on the CPU."""
    calls = []
    real = bench.metric_set

    def fake(variant, **kwargs):
        calls.append((variant, kwargs))
        return real(variant, **{**kwargs, "device": "cpu"})

    monkeypatch.setattr(bench, "metric_set", fake)
    return calls


def test_metrics_config_checks_its_options_at_once_and_passes_them_on(monkeypatch):
    calls = recording_metric_set(monkeypatch)
    cfg = bench.metrics_config("optimized", 7, CUDA, compute_groups=True, forward=True)
    (variant, check), = calls  # the options are checked at once, on a throw-away set
    assert variant == "optimized" and (check["compute_groups"], check["forward"]) == (True, True)
    cfg.make()
    assert calls[1] == ("optimized", dict(num_classes=7, device=CUDA, compute_groups=True, forward=True))
    with pytest.raises(ValueError, match=whole("forward must be True or False, got 'yes'.")):
        bench.metrics_config("optimized", 7, "cpu", forward="yes")  # refused when the config is made


def test_metrics_config_names_unknown_options():
    with pytest.raises(TypeError, match=whole("metrics_config got unknown option(s) ['bogus', 'x']; it takes "
                                              "compute_groups and forward.")):
        bench.metrics_config("naive", 10, "cpu", x=1, bogus=2)


def test_catalogue_passes_the_profile_s_classes_and_device(monkeypatch):
    import torchmetrics

    calls = recording_metric_set(monkeypatch)
    moved = []

    class Recording(torchmetrics.MeanMetric):
        def to(self, *args, **kwargs):
            moved.append(args)
            return self

    monkeypatch.setattr(torchmetrics, "MeanMetric", Recording)
    profile = cuda_profile()
    cat = bench.catalogue(profile)
    assert cat["no metrics"].description == "the training step alone"
    assert cat["step time: CPU"].description == "MeanMetric of the step time on the CPU, updated with a float"
    assert cat["step time: GPU float"].description == "MeanMetric of the step time on the GPU, updated with a float"
    assert cat["step time: GPU tensor"].description == "MeanMetric of the step time on the GPU, updated with a tensor"
    del calls[:]
    for name in bench.ARTICLE_SETS:
        cat[name].make()
    assert calls == [(name, dict(num_classes=profile.num_classes, device=CUDA)) for name in bench.ARTICLE_SETS]
    for name in ("step time: CPU", "step time: GPU float", "step time: GPU tensor"):
        cat[name].make()
    assert moved == [("cpu",), ("cuda",), ("cuda",)]


def test_available_configs_pass_the_profile_to_the_macro_sets_and_the_suite(monkeypatch):
    import mentor.suite

    calls = recording_metric_set(monkeypatch)
    made = []

    class Recording(mentor.suite.FusedMetrics):
        def __init__(self, num_classes):
            super().__init__(num_classes)
            made.append(num_classes)

        def to(self, *args, **kwargs):
            made.append(args)
            return self

    monkeypatch.setattr(mentor.suite, "FusedMetrics", Recording)
    profile = cuda_profile().with_(num_classes=6)
    available = bench.available_configs(profile)
    del calls[:]
    for name in ("macro", "macro sync-free", "fused suite"):
        available[name].make()
    assert calls == [(v, dict(num_classes=6, device=CUDA)) for v in ("macro", "macro sync-free")]
    assert made == [6, (CUDA,)]


def test_step_time_config_syncs_on_compute_by_default_and_moves_to_its_device(monkeypatch):
    import torchmetrics

    made = []

    class Recording(torchmetrics.MeanMetric):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def to(self, *args, **kwargs):
            self.moved_to = args
            return self

    monkeypatch.setattr(torchmetrics, "MeanMetric", Recording)
    bench.step_time_config("t", "cuda:1", "float").make()
    (metric,) = made
    assert metric.sync_on_compute is True and metric.moved_to == ("cuda:1",)
    assert bench.step_time_config("t", "cuda:1", "tensor").description == (
        "MeanMetric of the step time on the GPU, updated with a tensor")
    assert bench.step_time_config("t", "cpu", "float").description == (
        "MeanMetric of the step time on the CPU, updated with a float")


def test_suite_config_moves_the_suite_to_its_device(monkeypatch):
    import mentor.suite

    moved = []

    class Recording(mentor.suite.FusedMetrics):
        def to(self, *args, **kwargs):
            moved.append(args)
            return self

    monkeypatch.setattr(mentor.suite, "FusedMetrics", Recording)
    bench.suite_config(3, CUDA).make()
    assert moved == [(CUDA,)]


# ----------------------------------------------------------------------------------------------------------
# compare: messages, the sync pass, progress lines


def test_compare_refuses_non_configs_with_the_whole_message(setup, batches):
    with pytest.raises(TypeError, match=whole("configs must be a non-empty sequence of mentor.bench.Config.")):
        compare(["A"], setup, batches, steps=1, warmup=0, rounds=1)


class FakeReport:
    count = 0


@contextmanager
def no_sync_guard(strict=False):
    yield FakeReport()


def test_sync_pass_uses_the_config_s_own_batches_and_reports_the_step_count(setup, batches, monkeypatch):
    import mentor.profiling

    own = itertools.repeat((torch.full((2, 3, 32, 32), 7.0), torch.tensor([1, 2])))
    seen, reported = [], []

    def make():
        return (lambda s: seen.append(bool((s.images == 7.0).all()))), reported.append

    monkeypatch.setattr(mentor.profiling, "sync_guard", no_sync_guard)
    monkeypatch.setattr(bench, "_is_cuda", lambda s: True)
    cmp = compare([Config("own", make, description="its own data", batches=own)], setup, batches, steps=1, warmup=0,
                  rounds=1, sync_steps=3, progress=False)
    assert seen == [True] * (1 + 2 + 3)  # the timed run, then the sync pass's 2 untimed and 3 counted steps
    assert reported == [2 + 3]  # the sync pass reports once, after its 2 + 3 steps
    assert cmp["own"].description == "its own data"
    assert cmp.batch_size == 2  # device_batches(2, 32, 10): images of shape (2, 3, 32, 32)


class FlushRecorder:
    """A stdout that records what is written and when it is flushed."""

    def __init__(self):
        self.events = []

    def write(self, text):
        self.events.append(text)
        return len(text)

    def flush(self):
        self.events.append("<flush>")


def test_compare_prints_each_round_s_wall_time_and_flushes(setup, batches, monkeypatch):
    clock = iter([100.0, 102.5, 200.0, 200.25])
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    out = FlushRecorder()
    monkeypatch.setattr(sys, "stdout", out)
    compare([Config("A"), Config("B")], setup, batches, steps=1, warmup=0, rounds=2, count_syncs=False)
    monkeypatch.undo()
    assert out.events == ["round 1/2: 2 runs in 2.5 s", "\n", "<flush>", "round 2/2: 2 runs in 0.2 s", "\n",
                          "<flush>"]


# ----------------------------------------------------------------------------------------------------------
# the command line


def fake_run(monkeypatch, profile=None):
    """Fake the profile (optional), the setup, the batches and compare of bench.main; returns what they got."""
    import mentor.data

    seen = {}
    if profile is not None:
        monkeypatch.setattr(bench, "get_profile", lambda name=None: seen.setdefault("profile_name", name) and profile)

    def fake_batches(*args, **kwargs):
        seen["batches"] = (args, kwargs)
        return device_batches(2, 32, 10)

    def fake_compare(configs, setup, batches, **kwargs):
        seen["names"] = [c.name for c in configs]
        return Comparison([Result(c.name, "", [[1.0]]) for c in configs], configs[0].name, 2)

    monkeypatch.setattr(mentor.data, "device_batches", fake_batches)
    monkeypatch.setattr(bench, "build_setup", lambda *args, **kwargs: seen.setdefault("setup", (args, kwargs)))
    monkeypatch.setattr(bench, "compare", fake_compare)
    return seen


def test_cli_runs_two_configurations_on_the_profile_s_device(monkeypatch, capsys):
    profile = cuda_profile()
    seen = fake_run(monkeypatch, profile)
    assert bench.main(["--profile", "smoke", "--configs", "no metrics,naive"]) == 0  # two is enough
    assert seen["profile_name"] == "smoke" and seen["names"] == ["no metrics", "naive"]
    assert seen["batches"] == ((profile.batch_size, profile.image_size, profile.num_classes, CUDA), {})
    assert seen["setup"] == ((profile.num_classes, CUDA), dict(precision="fp32", channels_last=False))


def test_cli_flushes_the_run_line_before_the_run(monkeypatch):
    fake_run(monkeypatch)
    out = FlushRecorder()
    monkeypatch.setattr(sys, "stdout", out)
    bench.main(["--profile", "smoke", "--steps", "1"])
    monkeypatch.undo()
    assert out.events[1:3] == ["\n", "<flush>"] and out.events[0].startswith("profile smoke on cpu: ")
    assert "<flush>" not in out.events[3:]  # the table is printed after the run, no flush needed


def test_cli_list_uses_the_profile_asked_for(monkeypatch, capsys):
    asked = []
    real = bench.get_profile
    monkeypatch.setattr(bench, "get_profile", lambda name=None: asked.append(name) or real("smoke"))
    assert bench.main(["--profile", "smoke", "--list"]) == 0
    assert asked == ["smoke"]


@pytest.mark.parametrize("configs, detail", [
    ("no metrics,nonsense,bogus", " (unknown: nonsense, bogus)"),
    ("no metrics", ""),
])
def test_cli_bad_configs_error_is_the_whole_last_line(monkeypatch, capsys, configs, detail):
    fake_run(monkeypatch)
    with pytest.raises(SystemExit):
        bench.main(["--profile", "smoke", "--configs", configs])
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m mentor.bench: error: --configs takes two or more different names from --list, got {configs!r}"
        f"{detail}")


# ----------------------------------------------------------------------------------------------------------
# part II: sweep, record_point, sweep_table


def test_sweep_defaults_and_the_profile_s_device(monkeypatch, capsys):
    import mentor.data

    seen = []

    def fake_compare(configs, setup, batches, **kwargs):
        seen.append(kwargs["seed"])
        return Comparison([Result(c.name, "", [[1.0]]) for c in configs], configs[0].name, 2)

    built = []
    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda *args, **kwargs: built.append((args, kwargs)))
    monkeypatch.setattr(mentor.data, "device_batches", lambda *args, **kwargs: built.append((args, kwargs)))
    point = bench.OperatingPoint("p", 3, 40, "bf16", True)
    bench.sweep([point], cuda_profile(), ["no metrics", "naive"], steps=1, warmup=0, rounds=1)
    assert seen == [0]  # seed 0 by default
    assert capsys.readouterr().out == point.label + "\n"  # progress by default
    classes = cuda_profile().num_classes
    assert built == [((classes, CUDA), dict(precision="bf16", channels_last=True)), ((3, 40, classes, CUDA), {})]


def test_sweep_refuses_non_points_with_the_whole_message():
    with pytest.raises(TypeError, match=whole("points must be a non-empty sequence of mentor.bench.OperatingPoint, "
                                              "e.g. OPERATING_POINTS.")):
        bench.sweep([], get_profile("smoke"), steps=1, warmup=0, rounds=1)


def test_record_point_passes_the_point_and_profile_on(monkeypatch, tmp_path):
    import mentor.data
    import mentor.profiling

    built, recorded = [], []
    monkeypatch.setattr(bench, "build_setup", lambda *args, **kwargs: built.append((args, kwargs)) or "setup")
    monkeypatch.setattr(mentor.data, "device_batches", lambda *args, **kwargs: built.append((args, kwargs)) or "data")
    signature = inspect.signature(mentor.profiling.record_steps)

    def fake_record_steps(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()  # what record_steps runs with, whether passed or its default
        recorded.append((args[:3], {k: bound.arguments[k] for k in ("warmup", "active")}))
        return args[2]

    monkeypatch.setattr(mentor.profiling, "record_steps", fake_record_steps)
    profile = cuda_profile()
    point = bench.OperatingPoint("p", 3, 40, "bf16", True)
    assert bench.record_point(point, profile, "step time: CPU", tmp_path / "t.json") == tmp_path / "t.json"
    assert built == [((profile.num_classes, CUDA), dict(precision="bf16", channels_last=True)),
                     ((3, 40, profile.num_classes, CUDA), {})]
    # two profiler warm-up steps before the trace, and 5 traced steps by default
    assert recorded == [(("setup", "data", tmp_path / "t.json"), dict(warmup=2, active=5))]


def test_sweep_table_compares_the_kind_asked_for_and_truncates_point_names():
    base = [[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]
    cfg = [[11.0, 11.0, 38.0], [11.0, 11.0, 38.0]]  # median step +10 %, total time 60 / 30 ms: +100 %
    cmp = Comparison([Result("none", "", base), Result("m", "", cfg)], "none", 4)
    results = {"p": cmp, "abcdefghijklmno": cmp}  # a 15-character name: cut to 13 + "…" in 14 columns
    assert bench.sweep_table(results).splitlines() == [
        "point           base ms  m",
        "p                 10.00  +100.0 [100.0, 100.0]",
        "abcdefghijklm…    10.00  +100.0 [100.0, 100.0]",
    ]
    assert bench.sweep_table(results, kind="median").splitlines()[1] == "p                 10.00  +10.0 [10.0, 10.0]"
    with pytest.raises(ValueError, match=whole("results is empty: pass the dict that sweep() returns.")):
        bench.sweep_table({})


# ----------------------------------------------------------------------------------------------------------
# table, JSON


def sync_table(note):
    return Comparison([
        Result("base", "", [[10.0]]),
        Result("a", "", [[12.5]], syncs_per_step=1.5625, report_syncs=100),
        Result("b", "", [[5.0]], syncs_per_step=2, syncs_note="stale"),  # counted: the numbers, not the note
        Result("c", "", [[10.0]], syncs_note=note),
    ], "base", 1)


def test_table_sync_columns_with_a_long_note():
    # widths: config 6, median 6, overheads 11 and 10, /step 6 ("1.5625"), /rep 5; the note (14) spans both
    # sync columns and widens /rep to 14 - 6 - 2 = 6
    assert sync_table("off by default").table().splitlines() == [
        "config  median  overhead %   overhead %   syncs   syncs",
        "            ms  median step  total time   /step    /rep",
        "-" * 55,
        "base     10.00  +0.0         +0.0             -       -",
        "a        12.50  +25.0        +25.0       1.5625     100",
        "b         5.00  -50.0        -50.0            2       -",
        "c        10.00  +0.0         +0.0        off by default",
        "overhead vs base, one round: no interval",
    ]


def test_table_sync_columns_with_a_short_note():
    # the note (3) is narrower than both sync columns (6 + 2 + 5): it is right-aligned under them
    assert sync_table("off").table().splitlines() == [
        "config  median  overhead %   overhead %   syncs  syncs",
        "            ms  median step  total time   /step   /rep",
        "-" * 54,
        "base     10.00  +0.0         +0.0             -      -",
        "a        12.50  +25.0        +25.0       1.5625    100",
        "b         5.00  -50.0        -50.0            2      -",
        "c        10.00  +0.0         +0.0                  off",
        "overhead vs base, one round: no interval",
    ]


@pytest.mark.parametrize("rounds, legend", [
    ([[10.0]], "overhead vs " + "b" * 19 + "…, one round: no interval"),
    ([[10.0], [10.0]], "overhead vs " + "b" * 19 + "… [95 % bootstrap interval, 2 rounds]"),
])
def test_table_truncates_long_names(rounds, legend):
    cmp = Comparison([Result("b" * 21, "", rounds), Result("x" * 30, "", rounds)], "b" * 21, 1)
    lines = cmp.table().splitlines()
    assert lines[-1] == legend  # the baseline cut to 20 characters in the legend
    assert lines[4].startswith("x" * 21 + "… ")  # names cut to 22 characters even where 80 columns allow more


def test_to_dict_keys_and_per_result_views(tmp_path):
    cmp = Comparison([Result("a", "", [[1.0, 3.0], [2.0, 2.0]]), Result("b", "", [[2.0, 2.0], [4.0, 4.0]])], "a", 1)
    d = cmp.to_dict()
    assert list(d) == ["baseline", "batch_size", "settings", "environment", "rows", "results"]
    assert d["rows"] == cmp.rows()
    assert d["results"][0]["round_medians_ms"] == [2.0, 2.0] and d["results"][0]["total_ms"] == [4.0, 4.0]
    assert d["results"][1]["round_medians_ms"] == [2.0, 4.0] and d["results"][1]["total_ms"] == [4.0, 8.0]


def test_save_json_makes_missing_folders_and_writes_one_space_indents(tmp_path):
    cmp = Comparison([Result("a", "", [[1.0]]), Result("b", "", [[2.0]])], "a", 1)
    path = cmp.save_json(tmp_path / "x" / "y" / "cmp.json")
    text = path.read_text()
    assert json.loads(text) == cmp.to_dict()
    assert text.startswith('{\n "baseline": "a",\n "batch_size": 1,\n')  # indent=1: small stored files


def test_load_json_defaults_and_names_the_old_result(tmp_path):
    cmp = Comparison([Result("a", "", [[1.0]]), Result("b", "", [[2.0]])], "a", 1)
    data = cmp.to_dict()
    del data["settings"], data["environment"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(data))
    loaded = Comparison.load_json(path)
    assert loaded.settings == {} and loaded.environment == {}
    path.write_text(json.dumps({"baseline": "a", "batch_size": 1, "results": [{"name": "a", "step_ms": [1.0]}]}))
    with pytest.raises(ValueError, match=whole(f"{path}: result 'a' has no round_step_ms; it was saved by an older "
                                              "mentor.bench; re-run the comparison.")):
        Comparison.load_json(path)


# ----------------------------------------------------------------------------------------------------------
# Comparison.plot: what the bars, error bars, labels and notes show


def verdict_comparison():
    base = [[10.0, 10.0, 10.0]] * 4
    return Comparison([
        Result("base", "", base),
        Result("slow", "", [[11.0, 11.0, 11.0]] * 4),                                      # slower: [10, 10]
        Result("fast", "", [[9.0, 9.0, 9.0]] * 4),                                         # faster: [-10, -10]
        Result("mixed", "", [[10.0] * 3, [9.0] * 3, [10.0] * 3, [9.0] * 3]),               # unresolved [-10, 0]
        Result("report", "", [[10.0, 10.0, 30.0]] * 4, [2]),  # median: +0 [0, 0]; total time: +66.7 %, slower
    ], "base", 1)


def test_plot_colours_bars_by_the_verdict_of_the_kind_shown(close_figures):
    cmp = verdict_comparison()
    for kind, report_like in (("median", "mixed"), ("throughput", "slow")):
        assert [cmp.verdict(n, kind) for n in ("slow", "fast", "mixed")] == [
            "slower", "faster", "no difference resolved"]
        colour = dict(zip(["slow", "fast", "mixed", "report"],
                          (tuple(p.get_facecolor()) for p in cmp.plot(kind=kind).patches)))
        assert len({colour["slow"], colour["fast"], colour["mixed"]}) == 3  # three verdicts, three colours
        assert colour["report"] == colour[report_like]


def error_extents(ax):
    from matplotlib.container import ErrorbarContainer

    (errorbar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    return [x for seg in errorbar.lines[2][0].get_segments() for x in (seg[0][0], seg[1][0])]  # (from, to) per bar


def test_plot_error_bars_span_the_interval_and_vanish_without_one(close_figures):
    cmp = verdict_comparison()
    assert error_extents(cmp.plot()) == pytest.approx([10.0, 10.0, -10.0, -10.0, -10.0, 0.0, 0.0, 0.0])
    one = Comparison([Result("a", "", [[10.0]]), Result("b", "", [[12.0]])], "a", 1)
    ax = one.plot()
    assert error_extents(ax) == pytest.approx([20.0, 20.0])  # no interval: no error bar around +20 %
    assert ax.get_xlabel() == "overhead of the median step time (%)\nvs a; one round: no interval"


def test_plot_label_names_the_rounds_and_a_long_baseline(close_figures):
    cmp = Comparison([two_rounds("b" * 23, 10.0, 10.0), two_rounds("c", 11.0, 11.0)], "b" * 23, 1)
    assert cmp.plot().get_xlabel() == ("overhead of the median step time (%)\nvs " + "b" * 21 + "…; "
                                       "bars: 95 % interval over 2 rounds")


def sync_plot_comparison(rounds=2, uncounted=True):
    def r(name, factor, syncs):
        return Result(name, "", [[10.0 * factor * (1 + 0.02 * k)] for k in range(rounds)], syncs_per_step=syncs)

    base = Result("base", "", [[10.0 * (1 + 0.01 * k)] for k in range(rounds)])
    middle = [r("none", 1.1, None)] if uncounted else []
    return Comparison([base, r("up", 1.3, 3), *middle, r("down", 0.8, 0.5)], "base", 1)


@pytest.mark.parametrize("uncounted", [True, False])
@pytest.mark.parametrize("rounds", [1, 2, 5])
def test_plot_writes_syncs_right_of_each_counted_bar_inside_the_axes(close_figures, rounds, uncounted):
    cmp = sync_plot_comparison(rounds, uncounted)
    ax = cmp.plot()
    ax.figure.canvas.draw()
    assert [t.get_text() for t in ax.texts] == ["3 syncs/step", "0.5 syncs/step"]  # none for an uncounted one
    box = ax.get_window_extent()
    for text, name, y in zip(ax.texts, ["up", "down"], [0, 2 if uncounted else 1]):
        iv = cmp.overhead(name)
        end = max(iv.point, iv.hi) if iv.has_interval else iv.point
        x, ty = text.get_position()
        assert ty == y and x > max(end, 0.0)  # on the bar's row, right of the bar and its error bar
        extent = text.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1  # readable: inside the axes


# ----------------------------------------------------------------------------------------------------------
# plot_sweep


def sweep_points():
    a = Comparison([Result("none", "", [[10.0, 10.0], [10.0, 10.0]]), Result("n", "", [[12.0, 12.0], [13.0, 13.0]])],
                   "none", 4)
    b = Comparison([Result("none", "", [[5.0], [5.0]]), Result("n", "", [[5.0], [5.0]])], "none", 4)
    return {"slow point": a, "fast": b}


def sweep_errors(container):
    return [y for seg in container.lines[2][0].get_segments() for y in (seg[0][1], seg[1][1])]  # (from, to) per point


def test_plot_sweep_shows_each_interval(close_figures):
    ax = bench.plot_sweep(sweep_points()).axes[0]
    (n,) = ax.containers
    # at 10 ms: total 50 over 40 ms, +25 %; resampled rounds (0, 0) give 48 / 40, (1, 1) 52 / 40, each with
    # probability 1/4: the interval is [20, 30]; at 5 ms: +0 [0, 0]
    assert list(n.lines[0].get_ydata()) == pytest.approx([25.0, 0.0])
    assert sweep_errors(n) == pytest.approx([20.0, 30.0, 0.0, 0.0])
    assert ax.get_xlabel() == "step time without metrics (ms, median)"
    assert any(list(line.get_xdata()) == [0, 1] and list(line.get_ydata()) == [0, 0] for line in ax.lines)  # 0 %
    with pytest.raises(ValueError, match=whole("results is empty: pass the dict that sweep() returns.")):
        bench.plot_sweep({})


def test_plot_sweep_kind_changes_the_values(close_figures):
    base = [[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]
    cfg = [[11.0, 11.0, 38.0], [11.0, 11.0, 38.0]]
    results = {"p": Comparison([Result("none", "", base), Result("m", "", cfg)], "none", 4)}
    (tput,) = bench.plot_sweep(results).axes[0].containers
    (median,) = bench.plot_sweep(results, kind="median").axes[0].containers
    assert list(tput.lines[0].get_ydata()) == pytest.approx([100.0])  # 60 over 30 ms
    assert list(median.lines[0].get_ydata()) == pytest.approx([10.0])  # 11 over 10 ms


def test_plot_sweep_renders_and_closes_the_figure_it_drew_on(close_figures):
    import matplotlib.pyplot as plt

    mine = plt.figure()
    ax = mine.subplots()
    other = plt.figure()  # the current figure, not the one drawn on
    fig = bench.plot_sweep(sweep_points(), ax=ax)
    assert fig is mine
    assert mine.number not in plt.get_fignums() and other.number in plt.get_fignums()
    fig.savefig(io.BytesIO(), format="png")  # it renders, the names of the points included (a closed figure's
    assert [t.get_text() for t in ax.texts] == ["slow point", "fast"]  # canvas.draw() draws nothing)


def test_plot_sweep_names_each_point_under_it():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure()
    FigureCanvasAgg(fig)  # not a pyplot figure: closing it in pyplot leaves it drawable here
    ax = fig.subplots()
    bench.plot_sweep(sweep_points(), ax=ax)
    fig.canvas.draw()
    for text, x in zip(ax.texts, [10.0, 5.0]):  # the base step times of "slow point" and "fast"
        px, py = ax.transData.transform((x, 0.0))
        box = text.get_window_extent()
        assert abs((box.x0 + box.x1) / 2 - px) < 2 and box.y1 < py  # centred under its point on the 0 % line
