"""CPU tests of mentor.bench: Config, compare (random order, report steps, syncs), bootstrap intervals, table, JSON,
plot, the CLI."""

import json
import math
import re
import random
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mentor import bench
from mentor.metrics import ARTICLE_SETS
from mentor.bench import (Comparison, Config, Interval, Result, article_configs, catalogue, compare, metrics_config,
                          report_positions)
from mentor.data import device_batches
from mentor.env import get_profile
from mentor.metrics import METRIC_SETS
from mentor.train import build_setup

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup():
    return build_setup(num_classes=10)


@pytest.fixture
def batches():
    return device_batches(2, 32, 10)


@pytest.fixture
def close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def recording_config(name, log):
    """A Config whose on_step appends its name to ``log`` (one entry per training step)."""
    return Config(name, lambda: ((lambda step: log.append(name)), None), description=f"records {name}")


# ----------------------------------------------------------------------------------------------------------
# Config and the configuration catalogue


def test_config_defaults():
    c = Config("no metrics")
    assert c.make() == (None, None) and c.description == "" and c.batches is None


@pytest.mark.parametrize("bad", ["", None, 3])
def test_config_rejects_bad_names(bad):
    with pytest.raises(ValueError, match=f"Config name must be a non-empty string, got {bad!r}"):
        Config(bad)


def test_config_rejects_non_callable_make():
    with pytest.raises(TypeError, match=r"Config.make must be a function returning \(on_step, on_report\)"):
        Config("x", make=(None, None))


def test_metrics_config_feeds_and_reports_a_metric_set(setup, batches):
    cfg = metrics_config("optimized", num_classes=10, device="cpu", name="opt")
    assert cfg.name == "opt" and cfg.description == METRIC_SETS["optimized"]
    on_step, on_report = cfg.make()
    from mentor.train import train

    reported = []
    train(setup, batches, steps=2, on_step=on_step, on_report=lambda n: reported.append(on_report(n)),
          report_every=2)
    assert len(reported) == 1 and reported[0]["step"] == 2
    assert set(reported[0]) == {"step", "loss", "accuracy", "precision", "recall", "f1_score"}
    assert 0.0 <= reported[0]["accuracy"] <= 1.0 and reported[0]["loss"] > 0


def test_metrics_config_fresh_hooks_per_make():
    cfg = metrics_config("naive", num_classes=10, device="cpu")
    (_, report_a), (_, report_b) = cfg.make(), cfg.make()
    assert report_a.__self__ is not report_b.__self__  # a new LossAndScores for every run


def test_metrics_config_rejects_unknown_variant():
    with pytest.raises(ValueError, match=r"Unknown metric set 'x': pass one of"):
        metrics_config("x", num_classes=10, device="cpu")


def test_catalogue_and_article_configs():
    profile = get_profile("smoke")
    cat = catalogue(profile)
    assert all(name == c.name for name, c in cat.items())
    assert list(cat) == ["no metrics", *ARTICLE_SETS, "step time: CPU", "step time: GPU float",
                         "step time: GPU tensor"]
    assert all(c.description for c in cat.values())
    assert [c.name for c in article_configs(profile)] == ["no metrics", "naive", "optimized"]


@pytest.mark.parametrize("update,kind", [("float", float), ("tensor", torch.Tensor)])
def test_step_time_config_averages_host_seconds(monkeypatch, update, kind):
    import torchmetrics

    from mentor.bench import step_time_config

    made = []

    class Recording(torchmetrics.MeanMetric):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen, self.computed = [], []
            made.append(self)

        def update(self, value, weight=None):
            self.seen.append(value)
            super().update(value)

        def compute(self):
            value = super().compute()
            self.computed.append(float(value))
            return value

    monkeypatch.setattr(torchmetrics, "MeanMetric", Recording)  # step_time_config imports it when called
    cfg = step_time_config("t", "cpu", update, sync_on_compute=False)
    on_step, on_report = cfg.make()

    class FakeStep:
        def __init__(self, s):
            self.host_seconds = s

    for s in (0.5, 1.5):
        on_step(FakeStep(s))
    on_report(2)
    on_step(FakeStep(4.0))
    on_report(3)
    (metric,) = made
    assert all(isinstance(v, kind) for v in metric.seen)
    assert metric.computed == [1.0, 4.0]  # mean of the first two, then reset: the third alone
    assert not metric.sync_on_compute
    assert "CPU" in cfg.description and update in cfg.description


def test_step_time_config_rejects_unknown_update():
    from mentor.bench import step_time_config

    with pytest.raises(ValueError, match="update must be 'float' or 'tensor', got 'int'"):
        step_time_config("t", "cpu", "int")


# ----------------------------------------------------------------------------------------------------------
# compare on the CPU


def expected_orders(names, rounds, seed):
    """The orders compare documents: ``order = list(configs); random.Random(seed).shuffle(order)`` each round."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def test_compare_runs_rounds_in_seeded_random_order(setup, batches):
    names = ["A", "B", "C"]
    runs = {}
    for seed in (0, 1, 0):
        log = []
        cmp = compare([recording_config(n, log) for n in names], setup, batches, steps=1, warmup=0, rounds=4,
                      progress=False, seed=seed)
        want = expected_orders(names, 4, seed)
        assert cmp.settings["orders"] == want
        assert cmp.settings["seed"] == seed
        assert log == [n for order in want for n in order]  # the runs really happened in that order
        assert all(sorted(order) == names for order in cmp.settings["orders"])  # each round a permutation
        assert [r.name for r in cmp.results] == names and cmp.baseline == "A"  # the first config stays baseline
        runs.setdefault(seed, []).append(cmp.settings["orders"])
    assert runs[0][0] == runs[0][1]  # the same seed repeats
    assert runs[0][0] != runs[1][0]  # two seeds differ
    assert len({tuple(o) for o in runs[0][0]}) > 1  # every round its own shuffle, not one order repeated


def test_compare_runs_warmup_and_steps_per_run(setup, batches):
    log = []
    cmp = compare([recording_config("A", log)], setup, batches, steps=3, warmup=2, rounds=2, progress=False)
    assert log == ["A"] * (2 * (2 + 3))
    r = cmp["A"]
    assert len(r.round_step_ms) == 2 and all(len(s) == 3 for s in r.round_step_ms)
    assert r.step_ms == r.round_step_ms[0] + r.round_step_ms[1]
    assert r.round_medians_ms == [sorted(s)[1] for s in r.round_step_ms]
    assert r.total_ms == [pytest.approx(sum(s)) for s in r.round_step_ms]
    assert all(t > 0 for t in r.step_ms)
    assert cmp.settings == dict(steps=3, warmup=2, rounds=2, report_every=0, sync_steps=5, seed=0,
                                orders=[["A"], ["A"]])


def test_compare_uses_a_config_s_own_batches(setup, batches):
    own = device_batches(2, 32, 10, seed=1)
    own_first = next(device_batches(2, 32, 10, seed=1))[0]
    shared_first = next(device_batches(2, 32, 10))[0]
    seen = {}

    def make(name):
        return lambda: ((lambda s: seen.setdefault(name, s.images.clone())), None)

    compare([Config("shared", make("shared")), Config("own", make("own"), batches=own)], setup, batches,
            steps=1, warmup=0, rounds=1, progress=False)
    assert torch.equal(seen["shared"], shared_first)
    assert torch.equal(seen["own"], own_first)


def test_compare_reports_every_n_steps(setup, batches):
    reports = []
    cfg = Config("r", lambda: (None, reports.append))
    cmp = compare([cfg, Config("none")], setup, batches, steps=4, warmup=0, rounds=1, report_every=2,
                  progress=False)
    assert reports == [2, 4]
    assert cmp["r"].report_steps == [1, 3]
    assert cmp["none"].report_steps == []  # no on_report: no report step
    assert cmp.report_ms("none") is None


def test_compare_times_the_report_inside_its_step(setup, batches, monkeypatch):
    # each report takes 1000 ms of a virtual clock: train's step clock jumps 1 s ahead during it, so a step that
    # includes the report is 1000 ms longer than its training and a step that does not is only its training, on any
    # load (a real 1 s sleep per report cost 4 s, and a loaded CPU step had been seen at 400 ms)
    import mentor.train

    report_ms = 1000.0
    ahead = [0.0]
    real = time.perf_counter
    monkeypatch.setattr(mentor.train, "time", SimpleNamespace(perf_counter=lambda: real() + ahead[0]))

    def make():
        def on_report(n):
            ahead[0] += report_ms / 1000

        return None, on_report

    cmp = compare([Config("slow report", make)], setup, batches, steps=4, warmup=1, rounds=2, report_every=2,
                  progress=False)
    r = cmp["slow report"]
    assert ahead[0] == 4.0  # reports after global steps 1 and 3 of each run's 5
    assert r.report_steps == [0, 2]  # global steps 1 and 3 report; timed steps start at global step 1
    for steps in r.round_step_ms:
        assert steps[0] >= report_ms and steps[2] >= report_ms  # the report is timed in its step
    # the other steps only train (a loaded machine may stall one, not all four)
    assert min(s[p] for s in r.round_step_ms for p in (1, 3)) < report_ms
    assert cmp.report_ms("slow report") == float(np.median([s[p] for s in r.round_step_ms for p in (0, 2)]))
    assert cmp.report_ms("slow report") >= report_ms
    assert all(total >= 2 * report_ms for total in r.total_ms)


def test_compare_prints_one_short_line_per_round(setup, batches, capsys):
    compare([Config("A"), Config("B"), Config("C")], setup, batches, steps=1, warmup=0, rounds=3, seed=1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["round 1/3", "round 2/3", "round 3/3"]
    for line in lines:
        assert re.fullmatch(r"round \d/3: 3 runs in \d+\.\d s", line), line


def counting_config(name, made):
    """A Config whose every make() returns new hooks that count their calls; ``made`` collects the counters."""

    def make():
        calls = {"step": 0, "report": 0}
        made.append(calls)

        def on_step(step):
            calls["step"] += 1

        def on_report(n):
            calls["report"] += 1

        return on_step, on_report

    return Config(name, make)


class FakeReport:
    count = 0


def fake_sync_guard(counter):
    """A stand-in for mentor.profiling.sync_guard that counts ``counter["syncs"]`` increments inside the block."""

    @contextmanager
    def guard(strict=False):
        report = FakeReport()
        before = counter["syncs"]
        yield report
        report.count = counter["syncs"] - before

    return guard


def test_every_run_gets_fresh_hooks(setup, batches):
    made = []
    compare([counting_config("A", made)], setup, batches, steps=3, warmup=1, rounds=3, report_every=2,
            progress=False)
    assert len(made) == 3  # one make() per run, no sync pass on the CPU
    assert [c["step"] for c in made] == [1 + 3] * 3  # each hook object served exactly one run of 1 + 3 steps
    assert [c["report"] for c in made] == [2] * 3


def test_sync_pass_counts_step_and_report_syncs(setup, batches, monkeypatch):
    import mentor.profiling

    counter = {"syncs": 0}
    made = []

    def make():
        calls = {"step": 0, "report": 0}
        made.append(calls)

        def on_step(step):
            calls["step"] += 1
            counter["syncs"] += 2  # two syncs per step

        def on_report(n):
            calls["report"] += 1
            counter["syncs"] += 5  # five per report

        return on_step, on_report

    monkeypatch.setattr(mentor.profiling, "sync_guard", fake_sync_guard(counter))
    monkeypatch.setattr(bench, "_is_cuda", lambda s: True)  # take the CUDA branch on the CPU
    cmp = compare([Config("none"), Config("m", make)], setup, batches, steps=2, warmup=0, rounds=2,
                  report_every=2, sync_steps=3, progress=False)
    assert len(made) == 2 + 1  # two runs, then the sync pass
    assert [c["step"] for c in made] == [2, 2, 2 + 3]  # sync pass: 2 untimed steps, then 3 counted
    assert [c["report"] for c in made] == [1, 1, 1]  # the sync pass calls on_report once
    m, none = cmp["m"], cmp["none"]
    assert (m.syncs_per_step, m.report_syncs, m.syncs_note) == (2.0, 5, None)
    assert (none.syncs_per_step, none.report_syncs, none.syncs_note) == (0.0, None, None)
    row = cmp.rows()[1]
    assert (row["syncs_per_step"], row["report_syncs"]) == (2.0, 5)
    line = cmp.table().splitlines()[4]
    assert line.split()[-2:] == ["2", "5"]


def test_syncs_note_on_cpu_and_when_not_counted(setup, batches, monkeypatch):
    cmp = compare([Config("A")], setup, batches, steps=1, warmup=0, rounds=1, progress=False)
    assert (cmp["A"].syncs_per_step, cmp["A"].syncs_note) == (None, "n/a (CPU)")
    assert "n/a (CPU)" in cmp.table().splitlines()[3]

    cmp = compare([Config("A")], setup, batches, steps=1, warmup=0, rounds=1, progress=False, count_syncs=False)
    assert cmp["A"].syncs_note == "not counted"  # not counted, whatever the device

    def no_sync_pass(*args, **kwargs):
        raise AssertionError("count_syncs=False must not run the sync pass")

    monkeypatch.setattr(bench, "_is_cuda", lambda s: True)
    monkeypatch.setattr(bench, "_syncs_per_step", no_sync_pass)
    cmp = compare([Config("A")], setup, batches, steps=1, warmup=0, rounds=1, progress=False, count_syncs=False)
    assert (cmp["A"].syncs_per_step, cmp["A"].report_syncs, cmp["A"].syncs_note) == (None, None, "not counted")
    assert "not counted" in cmp.table().splitlines()[3]


@pytest.mark.parametrize("warmup,steps,every,positions", [
    (1, 4, 2, [0, 2]),        # global steps 1..4 timed; reports after global steps 1 and 3
    (0, 4, 2, [1, 3]),
    (10, 60, 50, [39]),       # the full profile: one report, at global step 49
    (2, 3, 2, [1]),           # global 2..4: only global 3 reports
    (3, 2, 10, []),           # no report inside the timed window
    (0, 5, 0, []),            # no reports at all
    (0, 3, 1, [0, 1, 2]),
    (5, 10, 4, [2, 6]),       # global 7 and 11
])
def test_report_positions(warmup, steps, every, positions):
    assert report_positions(warmup, steps, every) == positions


@pytest.mark.parametrize("args,message", [
    ((-1, 1, 0), "warmup must be an int >= 0, got -1"),
    ((0, 0, 0), "steps must be an int >= 1, got 0"),
    ((0, 1, 1.5), "report_every must be an int >= 0, got 1.5"),
])
def test_report_positions_rejects_bad_counts(args, message):
    with pytest.raises(ValueError, match=message):
        report_positions(*args)


@pytest.mark.parametrize("configs,error,message", [
    ([], TypeError, "configs must be a non-empty sequence of mentor.bench.Config"),
    (["A"], TypeError, "configs must be a non-empty sequence of mentor.bench.Config"),
    ([Config("A"), Config("A")], ValueError, r"configuration names must be unique, got \['A', 'A'\]"),
])
def test_compare_rejects_bad_configs(setup, batches, configs, error, message):
    with pytest.raises(error, match=message):
        compare(configs, setup, batches, steps=1, warmup=0, rounds=1)


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=0), "steps must be an int >= 1, got 0"),
    (dict(warmup=-1), "warmup must be an int >= 0, got -1"),
    (dict(rounds=0), "rounds must be an int >= 1, got 0"),
    (dict(sync_steps=0), "sync_steps must be an int >= 1, got 0"),
    (dict(report_every=True), "report_every must be an int >= 0, got True"),
    (dict(seed="1"), r"seed must be an int \(it seeds random.Random for the run order\), got '1'"),
    (dict(seed=None), "seed must be an int"),
])
def test_compare_rejects_bad_counts(setup, batches, kwargs, message):
    args = dict(steps=1, warmup=0, rounds=1) | kwargs
    with pytest.raises(ValueError, match=message):
        compare([Config("A")], setup, batches, **args)


# ----------------------------------------------------------------------------------------------------------
# Intervals and verdicts on hand-made results


def result(name, rounds, report_steps=(), syncs=None, report_syncs=None, note=None):
    return Result(name, f"{name} config", [list(r) for r in rounds], list(report_steps), syncs, report_syncs, note)


def comparison(*results, batch_size=4, seed=0):
    return Comparison(list(results), baseline=results[0].name, batch_size=batch_size, settings={"seed": seed})


BASE = [[10.0, 11.0, 9.5, 10.2], [12.0, 12.5, 11.8, 12.1], [9.0, 9.4, 9.1, 8.8], [10.5, 10.0, 10.9, 10.4],
        [11.1, 11.3, 10.7, 11.0]]


def scaled(rounds, factors):
    return [[t * f for t in steps] for steps, f in zip(rounds, factors)]


def test_interval_str():
    assert str(Interval(7.0, 6.1, 8.0)) == "+7.0 % [6.1, 8.0]"
    assert str(Interval(-2.345, -3.0, -1.25)) == "-2.3 % [-3.0, -1.2]"
    assert str(Interval(0.0, -0.04, 0.04)) == "+0.0 % [-0.0, 0.0]"
    assert Interval(7.0, 6.1, 8.0).fmt(2) == "+7.00 % [6.10, 8.00]"
    assert Interval(12.5, 6.1, 18.0).fmt(0) == "+12 % [6, 18]"
    assert str(Interval(7.0, math.nan, math.nan)) == "+7.0 % [one round: no interval]"
    assert Interval(7.0, 6.1, 8.0).level == 0.95


@pytest.mark.parametrize("args,error,message", [
    ((1.0, 2.0, 1.0), ValueError, r"Interval needs lo <= hi, got lo=2.0, hi=1.0"),
    ((1.0, math.nan, 1.0), ValueError, "lo and hi must both be numbers or both NaN"),
    ((math.nan, 0.0, 1.0), ValueError, "Interval.point must be finite"),
    ((1.0, 0.0, 2.0, 95), ValueError, r"level must be between 0 and 1 \(0.95 for 95 %\), got 95"),
    (("1", 0.0, 2.0), TypeError, "Interval.point must be a number, got '1'"),
])
def test_interval_rejects_bad_values(args, error, message):
    with pytest.raises(error, match=message):
        Interval(*args)
    with pytest.raises(ValueError, match="digits must be an int >= 0, got -1"):
        Interval(1.0, 0.0, 2.0).fmt(-1)


def test_exactly_ten_percent_slower_every_round():
    cmp = comparison(result("base", BASE), result("slow", scaled(BASE, [1.10] * 5)))
    for kind in ("median", "throughput"):
        iv = cmp.overhead("slow", kind)
        assert iv.point == pytest.approx(10.0, abs=1e-9)
        assert iv.lo == pytest.approx(10.0, abs=1e-9) and iv.hi == pytest.approx(10.0, abs=1e-9)
        assert cmp.verdict("slow", kind) == "slower"
    assert cmp.verdict("base") == "baseline"
    base = cmp.overhead("base")
    assert (base.point, base.lo, base.hi) == (0.0, 0.0, 0.0)
    assert cmp.ratio("slow") == pytest.approx(1.10)


def test_paired_bootstrap_cancels_common_drift():
    drift = [1.0, 1.2, 0.8, 1.15, 0.85]  # +-20 % from round to round, the same for both
    base_rounds = [[10.0 * d * w for w in (1.0, 1.01, 0.99, 1.02)] for d in drift]
    cmp = comparison(result("base", base_rounds), result("cfg", scaled(base_rounds, [1.05] * 5)))
    for kind in ("median", "throughput"):
        iv = cmp.overhead("cfg", kind)
        assert (iv.point, iv.lo, iv.hi) == pytest.approx((5.0, 5.0, 5.0), abs=1e-9)
        assert cmp.verdict("cfg", kind) == "slower"
    # what an unpaired bootstrap (independent round draws for each) would give: a wide interval
    rng = np.random.default_rng(0)
    a, b = np.array(base_rounds) * 1.05, np.array(base_rounds)
    ia, ib = rng.integers(0, 5, (4000, 5)), rng.integers(0, 5, (4000, 5))
    unpaired = (np.median(a[ia].reshape(4000, -1), 1) / np.median(b[ib].reshape(4000, -1), 1) - 1) * 100
    lo, hi = np.quantile(unpaired, [0.025, 0.975])
    assert hi - lo > 20 and lo < 0  # so the test above tells paired from unpaired


def test_equal_in_some_rounds_faster_in_others_is_unresolved():
    base = [[10.0], [10.0], [10.0], [10.0]]
    cmp = comparison(result("base", base), result("cfg", [[10.0], [9.0], [10.0], [9.0]]))
    iv = cmp.overhead("cfg")
    assert iv.point == pytest.approx(-5.0)  # median of 10, 9, 10, 9 over 10
    # resamples with more 10-rounds give 0 %, with more 9-rounds -10 %: each has probability 5/16 > 2.5 %
    assert iv.lo == pytest.approx(-10.0) and iv.hi == pytest.approx(0.0, abs=1e-12)
    assert iv.lo <= 0 <= iv.hi
    assert cmp.verdict("cfg") == "no difference resolved"


def test_percentile_interval_of_two_rounds():
    cmp = comparison(result("base", [[10.0], [10.0]]), result("cfg", [[10.0], [12.0]]))
    iv = cmp.overhead("cfg", "throughput")
    # resamples: rounds (0, 0) -> 0 %, mixed -> 22/20 -> +10 %, (1, 1) -> +20 %, each with probability >= 1/4
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((10.0, 0.0, 20.0))
    assert cmp.verdict("cfg", "throughput") == "no difference resolved"  # lo == 0 is not above 0


def test_faster_everywhere():
    cmp = comparison(result("base", BASE), result("fast", scaled(BASE, [0.9, 0.92, 0.88, 0.9, 0.91])))
    iv = cmp.overhead("fast")
    assert iv.hi < 0 and iv.lo >= -12.0 - 1e-9 and iv.hi <= -8.0 + 1e-9
    assert cmp.verdict("fast") == "faster"


def test_one_round_has_no_interval():
    cmp = comparison(result("base", [[10.0, 10.0]]), result("cfg", [[10.7, 10.7]]))
    iv = cmp.overhead("cfg")
    assert iv.point == pytest.approx(7.0)
    assert math.isnan(iv.lo) and math.isnan(iv.hi) and not iv.has_interval
    assert str(iv) == "+7.0 % [one round: no interval]"
    assert cmp.verdict("cfg") == "no interval (1 round)"
    assert cmp.verdict("base") == "baseline"
    row = cmp.rows()[1]
    assert row["overhead_lo"] is None and row["overhead_hi"] is None and row["overhead_pct"] == pytest.approx(7.0)


def test_bootstrap_is_seeded_and_reproducible():
    noisy = scaled(BASE, [1.02, 1.07, 0.99, 1.05, 1.03])
    a = comparison(result("base", BASE), result("cfg", noisy), seed=0)
    b = comparison(result("base", BASE), result("cfg", noisy), seed=0)
    c = comparison(result("base", BASE), result("cfg", noisy), seed=7)
    assert a.overhead("cfg") == b.overhead("cfg")
    assert a.overhead("cfg").point == c.overhead("cfg").point
    assert a.overhead("cfg", "throughput") != c.overhead("cfg", "throughput")  # the seed drives the draws
    assert a.overhead("cfg").lo < a.overhead("cfg").hi


def test_throughput_counts_the_report_steps():
    base = [[10.0, 10.0, 10.0, 10.0]] * 3
    cfg = [[11.0, 11.0, 11.0, 51.0]] * 3  # the last step of every round also ran a long report
    cmp = comparison(result("base", base), result("cfg", cfg, report_steps=[3]), batch_size=4)
    assert cmp.images_per_s("base") == 4 * 12 / (120.0 / 1000) == pytest.approx(400.0)  # 3 rounds of 40 ms
    assert cmp.images_per_s("cfg") == 4 * 12 / (3 * 84.0 / 1000)  # batch * steps / total seconds
    assert cmp.overhead("cfg").point == pytest.approx(10.0)  # the median step ignores the report
    iv = cmp.overhead("cfg", "throughput")
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((110.0, 110.0, 110.0))  # 84 ms per round instead of 40
    assert cmp.report_ms("cfg") == 51.0 and cmp.report_ms("base") is None
    assert cmp["cfg"].total_ms == [84.0, 84.0, 84.0]
    row = cmp.rows()[1]
    assert row["images_per_s"] == cmp.images_per_s("cfg") and row["report_ms"] == 51.0
    assert row["throughput_overhead_pct"] == pytest.approx(110.0) and row["overhead_pct"] == pytest.approx(10.0)
    assert row["total_ms"] == 3 * 84.0


def test_result_compat_properties():
    r = result("x", [[3.0, 1.0, 2.0], [10.0, 20.0]])
    assert r.step_ms == [3.0, 1.0, 2.0, 10.0, 20.0]
    assert r.round_medians_ms == [2.0, 15.0]
    assert r.spread_ms == (2.0, 15.0)
    assert r.median_ms == 3.0  # over every step, not over rounds
    assert r.total_ms == [6.0, 30.0]


@pytest.mark.parametrize("rounds,report_steps,message", [
    ([[1.0, math.nan]], [], r"Result 'x': step 1 of round 0 is nan; step times must be finite positive"),
    ([[1.0], [0.0]], [], "step 0 of round 1 is 0.0; step times must be finite positive milliseconds"),
    ([[1.0], [-2.0]], [], "step 0 of round 1 is -2.0"),
    ([[1.0, math.inf]], [], "step 1 of round 0 is inf"),
    ([], [], "round_step_ms must be a non-empty list of rounds"),
    ([[1.0], []], [], "round 1 of round_step_ms must be a non-empty list of step times"),
    ([1.0, 2.0], [], "round 0 of round_step_ms must be a non-empty list of step times in ms, got 1.0"),
    ([[1.0, 2.0]], [2], r"report_steps must be increasing step positions in 0..1, got \[2\]; report_positions"),
    ([[1.0, 2.0]], [1, 0], "report_steps must be increasing step positions"),
])
def test_result_rejects_bad_input(rounds, report_steps, message):
    with pytest.raises(ValueError, match=message):
        Result("x", "", rounds, report_steps)


def test_result_rejects_bad_syncs():
    with pytest.raises(ValueError, match=r"syncs_per_step must be a number >= 0 or None \(not counted\), got -1"):
        Result("x", "", [[1.0]], syncs_per_step=-1)
    with pytest.raises(ValueError, match="report_syncs must be a number >= 0 or None"):
        Result("x", "", [[1.0]], report_syncs=math.nan)


def test_comparison_rejects_bad_input():
    a, b = result("a", [[1.0], [2.0]]), result("b", [[1.0]])
    with pytest.raises(ValueError, match=r"same number of rounds .* got \{'a': 2, 'b': 1\}"):
        Comparison([a, b], "a", 1)
    with pytest.raises(KeyError, match=r"baseline 'z' is not among the results \['a'\]"):
        Comparison([a], "z", 1)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        Comparison([a], "a", 0)
    with pytest.raises(ValueError, match="result names must be unique"):
        Comparison([a, a], "a", 1)
    with pytest.raises(TypeError, match="non-empty list of mentor.bench.Result"):
        Comparison([], "a", 1)
    cmp = Comparison([a, result("c", [[1.5], [2.5]])], "a", 1)
    with pytest.raises(ValueError, match=r"unknown kind 'mean': pass one of \['median', 'throughput'\]"):
        cmp.overhead("c", "mean")
    with pytest.raises(ValueError, match=r"unknown kind 'mean': pass one of \['median', 'throughput'\]"):
        cmp.verdict("c", "mean")
    with pytest.raises(KeyError, match=r"no configuration 'zzz'; have \['a', 'c'\]"):
        cmp.overhead("zzz")
    with pytest.raises(KeyError, match=r"no configuration 'zzz'; have \['a', 'c'\]"):
        cmp.images_per_s("zzz")
    with pytest.raises(ValueError, match="level must be a number between 0 and 1"):
        cmp.overhead("c", level=1.5)


# ----------------------------------------------------------------------------------------------------------
# Table, JSON and plot


def table_comparison():
    long = "a configuration with a rather long name indeed"
    return Comparison([
        result("no metrics", BASE, note="n/a (CPU)"),
        result("naive", scaled(BASE, [1.31, 1.33, 1.30, 1.32, 1.35]), report_steps=[3], syncs=3, report_syncs=5),
        result(long, scaled(BASE, [1.0, 1.01, 0.99, 1.0, 0.98]), syncs=0.5, note=None),
        result("not counted one", scaled(BASE, [0.93, 0.95, 0.92, 0.94, 0.93]), note="not counted"),
    ], baseline="no metrics", batch_size=128, settings={"seed": 0})


def test_table_layout_and_values():
    cmp = table_comparison()
    lines = cmp.table().splitlines()
    assert all(len(line) <= 80 for line in lines), [len(line) for line in lines]
    assert len(lines) == 2 + 1 + 4 + 1  # two header lines, rule, one row per config, legend
    assert lines[0].split() == ["config", "median", "overhead", "%", "overhead", "%", "syncs", "syncs"]
    assert lines[1].split() == ["ms", "median", "step", "total", "time", "/step", "/rep"]
    assert set(lines[2]) == {"-"}
    rows = dict(zip([r.name for r in cmp.results], lines[3:7]))
    for r in cmp.results[1:]:
        for kind in ("median", "throughput"):
            iv = cmp.overhead(r.name, kind)
            assert f"{iv.point:+.1f} [{iv.lo:.1f}, {iv.hi:.1f}]" in rows[r.name]
    assert rows["no metrics"].startswith("no metrics ") and rows["no metrics"].endswith("n/a (CPU)")
    assert rows["naive"].endswith("      3      5")
    assert rows["not counted one"].endswith("  not counted")
    long_row = rows[cmp.results[2].name]
    shown = long_row.split("…")[0]  # truncated to fit 80 columns (and never beyond 22 characters)
    assert cmp.results[2].name.startswith(shown) and 12 <= len(shown) + 1 <= 22
    assert long_row.endswith("    0.5      -")
    assert lines[7] == "overhead vs no metrics [95 % bootstrap interval, 5 rounds]"


def test_table_pinned():
    cmp = comparison(result("base", [[10.0, 10.0], [20.0, 20.0]], note="n/a (CPU)"),
                     result("cfg", [[11.0, 11.0], [22.0, 22.0]], syncs=2, report_syncs=1), batch_size=8)
    assert cmp.table() == "\n".join([
        "config  median  overhead %          overhead %          syncs  syncs",
        "            ms  median step         total time          /step   /rep",
        "-" * 68,
        "base     15.00  +0.0 [0.0, 0.0]     +0.0 [0.0, 0.0]        n/a (CPU)",
        "cfg      16.50  +10.0 [10.0, 10.0]  +10.0 [10.0, 10.0]      2      1",
        "overhead vs base [95 % bootstrap interval, 2 rounds]",
    ])


def test_table_stays_within_80_columns_with_wide_values():
    names = ["baseline with a long name", "x" * 60, "y" * 30]
    cmp = comparison(result(names[0], BASE), result(names[1], scaled(BASE, [12.5, 0.3, 40.0, 1.0, 3.0]), syncs=12.25,
                                                   report_syncs=100),
                     result(names[2], scaled(BASE, [0.01, 0.5, 0.2, 0.02, 0.3]), note="not counted"))
    lines = cmp.table().splitlines()
    assert all(len(line) <= 80 for line in lines), [len(line) for line in lines]
    for name, line in zip(names[1:], lines[4:6]):
        for kind in ("median", "throughput"):
            iv = cmp.overhead(name, kind)
            assert f"{iv.point:+.1f} [{iv.lo:.1f}, {iv.hi:.1f}]" in line
    assert lines[4].split()[-2:] == ["12.25", "100"]


def test_table_with_one_round_shows_points_only():
    cmp = comparison(result("base", [[10.0]]), result("cfg", [[10.7]]))
    lines = cmp.table().splitlines()
    assert lines[4].split()[:4] == ["cfg", "10.70", "+7.0", "+7.0"] and "[" not in lines[4]
    assert lines[-1] == "overhead vs base, one round: no interval"


def test_rows_hold_numbers():
    cmp = table_comparison()
    naive = cmp.rows()[1]
    iv, tp = cmp.overhead("naive"), cmp.overhead("naive", "throughput")
    assert naive == {
        "config": "naive", "description": "naive config", "median_ms": cmp["naive"].median_ms,
        "ratio": cmp.ratio("naive"),
        "overhead_pct": iv.point, "overhead_lo": iv.lo, "overhead_hi": iv.hi,
        "throughput_overhead_pct": tp.point, "throughput_overhead_lo": tp.lo, "throughput_overhead_hi": tp.hi,
        "images_per_s": cmp.images_per_s("naive"), "total_ms": math.fsum(cmp["naive"].total_ms),
        "report_ms": cmp.report_ms("naive"), "syncs_per_step": 3, "report_syncs": 5, "syncs_note": None,
        "verdict": "slower", "throughput_verdict": "slower",
    }
    assert naive["report_ms"] == float(np.median([steps[3] for steps in cmp["naive"].round_step_ms]))
    assert 30.0 - 1e-9 <= iv.lo < iv.point < iv.hi <= 35.0 + 1e-9  # per-round factors 1.30 .. 1.35


def test_facts_for_the_book():
    cmp = table_comparison()
    naive = cmp.facts("naive")
    assert naive == {
        "median_ms": cmp["naive"].median_ms, "images_per_s": cmp.images_per_s("naive"),
        "overhead": str(cmp.overhead("naive")), "tput_overhead": str(cmp.overhead("naive", "throughput")),
        "verdict": "slower", "tput_verdict": "slower", "report_ms": cmp.report_ms("naive"),
        "syncs": 3, "report_syncs": 5, "syncs_note": "",
    }
    base = cmp.facts("no metrics")
    assert base["overhead"] == "+0.0 % [0.0, 0.0]" and base["verdict"] == "baseline"
    assert math.isnan(base["syncs"]) and math.isnan(base["report_syncs"]) and math.isnan(base["report_ms"])
    assert base["syncs_note"] == "n/a (CPU)"
    with pytest.raises(KeyError, match="no configuration 'zzz'"):
        cmp.facts("zzz")


def test_json_round_trip(tmp_path):
    cmp = table_comparison()
    cmp.settings.update(steps=4, warmup=1, rounds=5, orders=[["naive", "no metrics"]] * 5, seed=3)
    path = cmp.save_json(tmp_path / "sub" / "cmp.json")
    assert path == tmp_path / "sub" / "cmp.json"
    data = json.loads(path.read_text())
    assert data == cmp.to_dict()
    assert data["settings"]["seed"] == 3 and data["settings"]["orders"] == [["naive", "no metrics"]] * 5
    assert data["results"][1]["round_step_ms"] == cmp["naive"].round_step_ms
    assert data["results"][1]["report_steps"] == [3]
    assert data["results"][1]["step_ms"] == cmp["naive"].step_ms  # the compatible pooled view is saved too
    loaded = Comparison.load_json(path)
    assert loaded.to_dict() == cmp.to_dict()
    for r in cmp.results:
        for kind in ("median", "throughput"):
            assert loaded.overhead(r.name, kind) == cmp.overhead(r.name, kind)
    assert loaded.table() == cmp.table()


def test_json_round_trip_of_a_cpu_run(setup, batches, tmp_path):
    cmp = compare([Config("A"), metrics_config("optimized", 10, "cpu", name="B")], setup, batches, steps=2,
                  warmup=0, rounds=2, report_every=2, progress=False)
    loaded = Comparison.load_json(cmp.save_json(tmp_path / "cmp.json"))
    assert loaded.overhead("B") == cmp.overhead("B")
    assert loaded.overhead("B", "throughput") == cmp.overhead("B", "throughput")
    assert loaded["B"].report_steps == [1] and loaded["B"].syncs_note == "n/a (CPU)"
    assert set(loaded.environment) >= {"torch", "torchmetrics", "python"}


def test_load_json_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="write one with Comparison.save_json"):
        Comparison.load_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="is not JSON"):
        Comparison.load_json(bad)
    bad.write_text(json.dumps({"baseline": "a"}))
    with pytest.raises(ValueError, match=r"lacks \['batch_size', 'results'\]"):
        Comparison.load_json(bad)
    old = {"baseline": "a", "batch_size": 2, "results": [{"name": "a", "description": "", "round_medians_ms": [1.0],
                                                          "step_ms": [1.0], "syncs_per_step": None}]}
    bad.write_text(json.dumps(old))
    with pytest.raises(ValueError, match="has no round_step_ms; it was saved by an older mentor.bench"):
        Comparison.load_json(bad)


def test_plot(close_figures):
    cmp = table_comparison()
    ax = cmp.plot()
    others = [r.name for r in cmp.results[1:]]
    assert tuple(ax.figure.get_size_inches()) == pytest.approx((5.6, 1.5 + 0.5 * 3))
    assert len(ax.patches) == 3  # one bar per non-baseline configuration
    assert [p.get_width() for p in ax.patches] == pytest.approx([cmp.overhead(n).point for n in others])
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["naive", "a configuration with a …", "not counted one"]  # 24 characters
    # readable at phone width: the 5.6-inch figure shrinks to about 0.65 of its size there
    assert all(t.get_fontsize() >= 11 for t in ax.get_yticklabels() + ax.get_xticklabels() + ax.texts)
    assert ax.xaxis.label.get_fontsize() >= 11 and ax.get_title() == ""
    from matplotlib.container import ErrorbarContainer

    (errorbar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = errorbar.lines[2][0].get_segments()
    assert len(segments) == 3
    for seg, name in zip(segments, others):
        iv = cmp.overhead(name)
        assert (seg[0][0], seg[1][0]) == pytest.approx((iv.lo, iv.hi))
    assert any(list(line.get_xdata()) == [0, 0] for line in ax.lines)  # the zero line
    assert [t.get_text() for t in ax.texts] == ["3 syncs/step", "0.5 syncs/step"]  # only where counted
    assert ax.get_xlabel() == ("overhead of the median step time (%)\n"
                               "vs no metrics; bars: 95 % interval over 5 rounds")
    ax2 = cmp.plot(kind="throughput")
    assert [p.get_width() for p in ax2.patches] == pytest.approx(
        [cmp.overhead(n, "throughput").point for n in others])
    assert ax2.get_xlabel().startswith("overhead of the total time, reports included (%)")
    with pytest.raises(ValueError, match=r"unknown kind 'max': pass one of \['median', 'throughput'\]"):
        cmp.plot(kind="max")


def test_figure_is_the_throughput_plot_closed_in_pyplot(close_figures):
    import matplotlib.pyplot as plt

    cmp = table_comparison()
    before = plt.get_fignums()
    fig = cmp.figure()
    assert plt.get_fignums() == before  # not shown again at the end of a notebook cell
    (ax,) = fig.axes
    assert [p.get_width() for p in ax.patches] == pytest.approx(
        [cmp.overhead(r.name, "throughput").point for r in cmp.results[1:]])
    assert [p.get_width() for p in cmp.figure("median").axes[0].patches] == pytest.approx(
        [cmp.overhead(r.name).point for r in cmp.results[1:]])


# ----------------------------------------------------------------------------------------------------------
# The command line


def test_cli_smoke_run_writes_json(tmp_path, monkeypatch, capsys):
    # `python -m mentor.bench ...` run as python -m runs it (runpy, as __main__, exit status from sys.exit), in this
    # process: a second interpreter spent most of its time importing torch and torchmetrics again
    import runpy

    out = tmp_path / "bench.json"
    monkeypatch.setattr(sys, "argv", ["python -m mentor.bench", "--profile", "smoke", "--rounds", "2", "--steps", "1",
                                      "--warmup", "0", "--seed", "3", "--json", str(out)])
    monkeypatch.delitem(sys.modules, "mentor.bench")  # runpy warns when the module it runs was imported
    # pytest's assertion rewriter claims mentor's modules (an installed plugin's distribution) but cannot give runpy
    # their code: find the module as python -m does
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "AssertionRewritingHook"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("mentor.bench", run_name="__main__", alter_sys=True)
    stdout, stderr = capsys.readouterr()
    assert exc.value.code == 0, stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["rows"]] == ["no metrics", "naive", "optimized"]
    assert data["settings"]["rounds"] == 2 and data["settings"]["steps"] == 1 and data["settings"]["warmup"] == 0
    assert data["settings"]["seed"] == 3
    assert data["settings"]["orders"] == expected_orders(["no metrics", "naive", "optimized"], 2, 3)
    assert all(len(r["round_step_ms"]) == 2 and len(r["round_step_ms"][0]) == 1 for r in data["results"])
    loaded = Comparison.load_json(out)
    table = loaded.table()
    assert table in stdout  # the printed table is the saved comparison's
    assert all(len(line) <= 80 for line in table.splitlines())
    assert f"wrote {out}" in stdout
    assert "profile smoke on cpu" in stdout


def test_cli_full_profile_without_cuda_fails_clearly():
    if torch.cuda.is_available():
        pytest.skip("checks the behaviour without CUDA")
    with pytest.raises(RuntimeError, match="smoke"):
        bench.main(["--profile", "full"])


def test_cli_rejects_unknown_profile(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "fast"])
    assert exc.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--steps", "--rounds"])
def test_cli_rejects_zero(monkeypatch, flag):
    def fake_compare(configs, setup, batches, **kwargs):
        raise AssertionError(f"compare was called with steps={kwargs['steps']}, rounds={kwargs['rounds']} "
                             f"for {flag} 0")

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda *a, **k: None)
    with pytest.raises((SystemExit, ValueError)):
        bench.main(["--profile", "smoke", flag, "0"])


def test_cli_passes_the_seed(monkeypatch, capsys):
    seen = {}

    def fake_compare(configs, setup, batches, **kwargs):
        seen.update(kwargs)
        return comparison(result("base", [[1.0]]), result("x", [[2.0]]))

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda *a, **k: None)
    assert bench.main(["--profile", "smoke", "--seed", "11"]) == 0
    assert seen["seed"] == 11
    assert "+100.0  " in capsys.readouterr().out  # the table shows x at twice the baseline


def test_overhead_against_another_configuration_is_paired_too():
    # b is 1.10 x a and c is 1.21 x a in every round, with a drift of +-20 % across rounds
    drift = [1.0, 1.2, 0.8, 1.1, 0.9]
    a = [[10.0 * d, 10.0 * d] for d in drift]
    results = [Result("a", "", a), Result("b", "", [[x * 1.1 for x in r] for r in a]),
               Result("c", "", [[x * 1.21 for x in r] for r in a])]
    cmp = Comparison(results, "a", 1, settings={"seed": 3})
    iv = cmp.overhead("c", against="b")
    assert (round(iv.point, 9), round(iv.lo, 9), round(iv.hi, 9)) == (10.0, 10.0, 10.0)
    assert cmp.verdict("c", against="b") == "slower" and cmp.verdict("b", against="b") == "baseline"
    assert cmp.verdict("b", against="c") == "faster"
    with pytest.raises(KeyError, match="no configuration 'zz'"):
        cmp.overhead("b", against="zz")


@pytest.mark.parametrize("argv, expected", [
    ([], None),  # the smoke profile's own values
    (["--steps", "7", "--warmup", "0", "--rounds", "3", "--batch", "3", "--image-size", "40", "--precision", "bf16",
      "--channels-last", "--configs", "no metrics, fused suite,naive"],
     {"steps": 7, "warmup": 0, "rounds": 3, "batch": 3, "image_size": 40, "precision": "bf16", "channels_last": True,
      "names": ["no metrics", "fused suite", "naive"]}),
])
def test_cli_passes_every_setting_and_prints_the_run(monkeypatch, capsys, tmp_path, argv, expected):
    from mentor.env import get_profile

    smoke = get_profile("smoke")
    expected = {"steps": smoke.steps, "warmup": smoke.warmup, "rounds": smoke.rounds, "batch": smoke.batch_size,
                "image_size": smoke.image_size, "precision": "fp32", "channels_last": False,
                "names": ["no metrics", "naive", "optimized"], **(expected or {})}
    seen = {}

    def fake_compare(configs, setup, batches, **kwargs):
        images, labels = next(iter(batches))
        seen.update(kwargs, names=[c.name for c in configs], setup=setup, images=tuple(images.shape))
        return comparison(result("no metrics", [[1.0]]), result("x", [[2.0]]))

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda classes, device, precision, channels_last:
                        ("setup", classes, device.type, precision, channels_last))
    out = tmp_path / "cmp.json"
    assert bench.main(["--profile", "smoke", *argv, "--json", str(out)]) == 0
    assert seen == {"steps": expected["steps"], "warmup": expected["warmup"], "rounds": expected["rounds"],
                    "report_every": smoke.report_every, "seed": 0, "names": expected["names"],
                    "setup": ("setup", smoke.num_classes, "cpu", expected["precision"], expected["channels_last"]),
                    "images": (expected["batch"], 3, expected["image_size"], expected["image_size"])}
    lines = capsys.readouterr().out.splitlines()
    layout = ", channels-last" if expected["channels_last"] else ""
    assert lines[0] == (f"profile smoke on cpu: batch {expected['batch']}, {expected['image_size']} px, "
                        f"{expected['precision']}{layout}, {expected['rounds']} rounds of "
                        f"{expected['warmup']}+{expected['steps']} steps")
    assert lines[-1] == f"wrote {out}" and [r.name for r in Comparison.load_json(out).results] == ["no metrics", "x"]


def test_cli_lists_the_configurations(capsys):
    assert bench.main(["--profile", "smoke", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:24].rstrip() for line in lines] == list(bench.available_configs(get_profile("smoke")))
    assert lines[-1] == f"{'fused suite':<24}mentor.suite.FusedMetrics: the loss mean and every score in one update per step"


@pytest.mark.parametrize("configs, detail", [
    ("no metrics,nonsense", " (unknown: nonsense)"),
    ("no metrics", ""),
    ("naive,naive", ""),
])
def test_cli_refuses_bad_configs(monkeypatch, capsys, configs, detail):
    monkeypatch.setattr(bench, "compare", lambda *a, **k: pytest.fail("compare ran with bad --configs"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--configs", configs])
    assert exc.value.code == 2
    assert (f"--configs takes two or more different names from --list, got {configs!r}{detail}"
            in capsys.readouterr().err)


@pytest.mark.parametrize("flag, value, low", [("--steps", "0", 1), ("--warmup", "-1", 0), ("--rounds", "0", 1),
                                             ("--batch", "0", 1), ("--image-size", "31", 32)])
def test_cli_names_the_bad_flag(monkeypatch, capsys, flag, value, low):
    monkeypatch.setattr(bench, "compare", lambda *a, **k: pytest.fail("compare ran with a bad flag"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", flag, value])
    assert exc.value.code == 2
    assert f"{flag} must be at least {low}, got {value}" in capsys.readouterr().err


def test_suite_config_updates_each_step_and_resets_at_each_report():
    from mentor.train import Step

    on_step, on_report = bench.suite_config(3, "cpu").make()
    step = Step(0, torch.zeros(2, 3, 8, 8), torch.tensor([0, 2]), torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
                torch.tensor(0.5), 0.01)
    on_step(step)
    on_step(step)
    suite = on_step.__closure__[0].cell_contents if on_step.__closure__ else None
    assert suite is not None and suite.tp.tolist() == [2, 0, 0] and suite.fn.tolist() == [0, 0, 2]
    on_report(2)
    assert suite.tp.tolist() == [0, 0, 0] and suite.loss_count.item() == 0


# ----------------------------------------------------------------------------------------------------------
# part II: operating points and the sweep


def test_available_configs_add_the_macro_sets_and_the_suite():
    names = list(bench.available_configs(get_profile("smoke")))
    assert names == [*catalogue(get_profile("smoke")), "macro", "macro sync-free", "fused suite"]
    assert set(bench.SWEEP_CONFIGS) <= set(names) and bench.SWEEP_CONFIGS[0] == "no metrics"


def test_operating_point_label_and_checks():
    p = bench.OperatingPoint("x", 16, 64, "bf16", True)
    assert p.label == "x: batch 16, 64 px, bf16, channels-last"
    assert bench.OperatingPoint("y", 8).label == "y: batch 8, 224 px, fp32"
    for kw, message in ((dict(batch_size=0), "batch_size must be an int >= 1, got 0"),
                        (dict(batch_size=True), "batch_size must be an int >= 1, got True"),
                        (dict(image_size=2.5), "image_size must be an int >= 1, got 2.5"),
                        (dict(precision="fp16"), "precision must be 'fp32' or 'bf16', got 'fp16'")):
        with pytest.raises(ValueError, match=re.escape(message)):
            bench.OperatingPoint("bad", **{"batch_size": 4, **kw})


def test_operating_points_are_the_real_ones_on_cuda_and_shrunk_on_the_cpu():
    smoke = get_profile("smoke")
    assert bench.operating_points(smoke.with_(device=torch.device("cuda"))) == bench.OPERATING_POINTS
    shrunk = bench.operating_points(smoke)
    assert [(p.name, p.batch_size, p.image_size, p.precision, p.channels_last) for p in shrunk] == [
        (p.name, min(p.batch_size, smoke.batch_size), smoke.image_size, p.precision, p.channels_last)
        for p in bench.OPERATING_POINTS]
    full = [(p.batch_size, p.image_size, p.precision, p.channels_last) for p in bench.OPERATING_POINTS]
    assert full == [(128, 224, "fp32", False), (64, 224, "fp32", False), (32, 224, "fp32", False),
                    (128, 224, "bf16", True), (32, 224, "bf16", True), (32, 96, "bf16", True)]


def test_sweep_builds_each_point_and_compares_the_named_configs(monkeypatch):
    seen = []

    def fake_compare(configs, setup, batches, **kw):
        images, _ = next(iter(batches))
        seen.append(([c.name for c in configs], setup.autocast, setup.channels_last, tuple(images.shape), kw))
        return Comparison([Result(c.name, "", [[1.0]]) for c in configs], configs[0].name, int(images.shape[0]))

    monkeypatch.setattr(bench, "compare", fake_compare)
    points = (bench.OperatingPoint("a", 2, 32), bench.OperatingPoint("b", 3, 40, "bf16", True))
    out = bench.sweep(points, get_profile("smoke"), ["no metrics", "fused suite"], steps=4, warmup=1, rounds=2,
                      seed=7, progress=False)
    assert list(out) == ["a", "b"]
    assert seen[0][:4] == (["no metrics", "fused suite"], None, False, (2, 3, 32, 32))
    assert seen[1][:4] == (["no metrics", "fused suite"], torch.bfloat16, True, (3, 3, 40, 40))
    assert seen[1][4] == dict(steps=4, warmup=1, rounds=2, report_every=get_profile("smoke").report_every, seed=7,
                              progress=False)
    assert out["b"].settings["point"] == {"name": "b", "batch_size": 3, "image_size": 40, "precision": "bf16",
                                          "channels_last": True}


def test_sweep_runs_on_the_cpu_and_round_trips_through_json(tmp_path):
    profile = get_profile("smoke").with_(num_classes=10)
    point = bench.OperatingPoint("tiny", 2, 32)
    out = bench.sweep([point], profile, ["no metrics", "macro sync-free"], steps=2, warmup=0, rounds=1,
                      progress=False)
    cmp = out["tiny"]
    assert [r.name for r in cmp.results] == ["no metrics", "macro sync-free"]
    assert [len(r.step_ms) for r in cmp.results] == [2, 2]
    back = Comparison.load_json(cmp.save_json(tmp_path / "tiny.json"))
    assert back.settings["point"]["name"] == "tiny"


def test_sweep_rejects_bad_input():
    profile = get_profile("smoke")
    with pytest.raises(TypeError, match="points must be a non-empty sequence of mentor.bench.OperatingPoint"):
        bench.sweep([], profile, steps=1, warmup=0, rounds=1)
    with pytest.raises(ValueError, match=r"unknown configuration\(s\) \['nope'\]: pass names from available_configs"):
        bench.sweep(bench.OPERATING_POINTS[:1], profile, ["no metrics", "nope"], steps=1, warmup=0, rounds=1)


def _two_points() -> dict:
    a = Comparison([Result("none", "", [[10.0, 10.0], [10.0, 10.0]]),
                    Result("m", "", [[11.0, 11.0], [11.0, 11.0]]),
                    Result("n", "", [[12.0, 12.0], [13.0, 13.0]])], "none", 4)
    b = Comparison([Result("none", "", [[5.0], [5.0]]), Result("m", "", [[6.0], [6.0]]),
                    Result("n", "", [[5.0], [5.0]])], "none", 4)
    return {"slow point": a, "fast": b}


def test_sweep_table_pins_every_cell():
    lines = bench.sweep_table(_two_points()).splitlines()
    assert lines == [
        "point           base ms  m                   n",
        "slow point        10.00  +10.0 [10.0, 10.0]  +25.0 [20.0, 30.0]",
        "fast               5.00  +20.0 [20.0, 20.0]  +0.0 [0.0, 0.0]",
    ]
    with pytest.raises(ValueError, match="results is empty: pass the dict that sweep"):
        bench.sweep_table({})


def test_plot_sweep_draws_each_config_against_the_base_step(close_figures):
    fig = bench.plot_sweep(_two_points())
    ax = fig.axes[0]
    assert [c.get_label() for c in ax.containers] == ["m", "n"]
    m, n = (c.lines[0] for c in ax.containers)
    assert list(m.get_ydata()) == pytest.approx([10.0, 20.0]) and list(n.get_ydata()) == pytest.approx([25.0, 0.0])
    # the x positions are the base step times, nudged apart by 1.2 % per configuration
    assert list(m.get_xdata()) == pytest.approx([10.0 * 0.988, 5.0 * 0.988])
    assert list(n.get_xdata()) == pytest.approx([10.0, 5.0])
    assert [t.get_text() for t in ax.texts] == ["slow point", "fast"]
    assert ax.get_ylabel() == "overhead over no metrics (%)"
    with pytest.raises(ValueError, match="results is empty"):
        bench.plot_sweep({})


def test_record_point_ranges_every_update_and_rejects_bad_configs(tmp_path):
    from mentor.trace import host_time, load_trace, step_windows

    profile = get_profile("smoke").with_(num_classes=10)
    point = bench.OperatingPoint("tiny", 2, 32)
    path = bench.record_point(point, profile, "macro sync-free", tmp_path / "t.json.gz", active=3)
    trace = load_trace(path)
    assert len(step_windows(trace)) == 3 and host_time(trace, "metrics update").ranges == 3
    with pytest.raises(ValueError, match="unknown configuration 'x': pass a name from available_configs"):
        bench.record_point(point, profile, "x", tmp_path / "x.json")
    with pytest.raises(ValueError, match="'no metrics' updates no metric"):
        bench.record_point(point, profile, "no metrics", tmp_path / "x.json")


def test_cli_help_names_the_program_and_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal width: compare words
    assert text.startswith(
        "usage: python -m mentor.bench [-h] [--list] [--configs CONFIGS] [--profile {full,smoke}] [--batch BATCH] "
        "[--image-size IMAGE_SIZE] [--precision {fp32,bf16}] [--channels-last] [--steps STEPS] [--warmup WARMUP] "
        "[--rounds ROUNDS] [--seed SEED] [--json JSON] "
        "Time ResNet-18 training steps under metric configurations (by default: no metrics, the article's naive "
        "TorchMetrics set and its optimized set), in rounds run in a seeded random order, and count syncs per step; "
        "overheads over the first configuration come with paired bootstrap intervals over rounds. ")
    for line in [
        "--list list the configurations and exit",
        "--configs CONFIGS comma-separated configuration names, the first is the baseline "
        "(default: no metrics,naive,optimized)",
        "--profile {full,smoke} run profile (default: full with CUDA, smoke without)",
        "--batch BATCH images per step (default: the profile's)",
        "--image-size IMAGE_SIZE image height and width in pixels (default: the profile's)",
        "--precision {fp32,bf16} fp32, or bf16 autocast around the forward pass and the loss (default: fp32)",
        "--channels-last channels-last weights and images --steps",  # followed by the next option: no text lost
        "--steps STEPS timed steps per run (default: the profile's)",
        "--warmup WARMUP untimed steps per run (default: the profile's)",
        "--rounds ROUNDS rounds, each running every configuration once in a seeded random order "
        "(default: the profile's)",
        "--seed SEED seed of the per-round random order of the configurations (default: 0)",
        "--json JSON also write the results to this JSON file",
    ]:
        assert line in text


def test_cli_error_usage_names_the_program(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--steps", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m mentor.bench [-h]")
    assert err.rstrip().endswith("python -m mentor.bench: error: argument --steps: invalid int value: 'x'")


def test_cli_precision_takes_fp32_or_bf16_only(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(bench, "compare", lambda configs, setup, batches, **kwargs:
                        seen.append(setup) or comparison(result("no metrics", [[1.0]]), result("x", [[2.0]])))
    monkeypatch.setattr(bench, "build_setup", lambda classes, device, precision, channels_last: precision)
    assert bench.main(["--profile", "smoke", "--precision", "fp32"]) == 0  # the default, also given by name
    assert seen == ["fp32"]
    assert ", fp32, " in capsys.readouterr().out.splitlines()[0]
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--precision", "fp16"])
    assert exc.value.code == 2
    assert "argument --precision: invalid choice: 'fp16'" in capsys.readouterr().err  # quoting varies by Python
    assert seen == ["fp32"]  # refused before building anything
