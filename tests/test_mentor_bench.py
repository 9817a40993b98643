"""CPU tests of mentor.bench: Config, compare (interleaving, table, ratio, JSON, plot), beyond_spread, the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mentor import bench
from mentor.bench import Comparison, Config, Result, article_configs, catalogue, compare, metrics_config
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
    assert len(reported) == 1 and reported[0]["step"] == 2.0
    assert set(reported[0]) == {"step", "avg_loss", "accuracy", "precision", "recall", "f1_score"}
    assert 0.0 <= reported[0]["accuracy"] <= 1.0 and reported[0]["avg_loss"] > 0


def test_metrics_config_fresh_hooks_per_make():
    cfg = metrics_config("naive", num_classes=10, device="cpu")
    (_, report_a), (_, report_b) = cfg.make(), cfg.make()
    assert report_a.__self__ is not report_b.__self__  # a new MetricSet for every run


def test_metrics_config_rejects_unknown_variant():
    with pytest.raises(ValueError, match=r"Unknown metric set 'x': pass one of"):
        metrics_config("x", num_classes=10, device="cpu")


def test_catalogue_and_article_configs():
    profile = get_profile("smoke")
    cat = catalogue(profile)
    assert all(name == c.name for name, c in cat.items())
    assert "no metrics" in cat and set(METRIC_SETS) <= set(cat)
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


def test_compare_interleaves_rounds(setup, batches):
    log = []
    cmp = compare([recording_config("A", log), recording_config("B", log)], setup, batches,
                  steps=1, warmup=0, rounds=2, progress=False)
    assert log == ["A", "B", "A", "B"]
    assert [r.name for r in cmp.results] == ["A", "B"]


def test_compare_runs_warmup_and_steps_per_run(setup, batches):
    log = []
    cmp = compare([recording_config("A", log)], setup, batches, steps=3, warmup=2, rounds=2, progress=False)
    assert log == ["A"] * (2 * (2 + 3))
    r = cmp["A"]
    assert len(r.round_medians_ms) == 2 and len(r.step_ms) == 2 * 3
    assert all(t > 0 for t in r.step_ms)
    assert cmp.settings == dict(steps=3, warmup=2, rounds=2, report_every=0, sync_steps=5)


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
    compare([cfg], setup, batches, steps=4, warmup=0, rounds=1, report_every=2, progress=False)
    assert reports == [2, 4]


def test_compare_prints_one_line_per_round(setup, batches, capsys):
    compare([Config("A"), Config("B")], setup, batches, steps=1, warmup=0, rounds=2)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["round 1/2", "round 2/2"]
    assert all("A " in line and "B " in line for line in lines)


@pytest.fixture(scope="module")
def comparison(setup):
    cmp = compare([Config("none A"), metrics_config("optimized", 10, "cpu", name="metrics B")], setup,
                  device_batches(2, 32, 10), steps=2, warmup=0, rounds=2, progress=False)
    return cmp


def test_comparison_table(comparison):
    table = comparison.table()
    lines = table.splitlines()
    assert len(lines) == 2 + 2  # head, rule, one row per config
    assert "none A" in lines[2] and "baseline" in lines[2]
    assert "metrics B" in lines[3] and ("within spread" in lines[3] or "beyond spread" in lines[3])
    assert table.count("n/a (CPU)") == 2  # no sync counts without CUDA
    assert comparison.batch_size == 2


def test_comparison_ratio(comparison):
    assert comparison.ratio("none A") == 1.0
    assert comparison.ratio("metrics B") == comparison["metrics B"].median_ms / comparison["none A"].median_ms
    with pytest.raises(KeyError, match=r"no configuration 'zzz'; have \['none A', 'metrics B'\]"):
        comparison.ratio("zzz")


def test_comparison_json_round_trip(comparison, tmp_path):
    path = comparison.save_json(tmp_path / "sub" / "cmp.json")
    assert path == tmp_path / "sub" / "cmp.json"
    loaded = json.loads(path.read_text())
    assert loaded == comparison.to_dict()
    assert loaded["baseline"] == "none A"
    assert [r["config"] for r in loaded["rows"]] == ["none A", "metrics B"]
    assert loaded["results"][1]["step_ms"] == comparison["metrics B"].step_ms
    assert set(loaded["environment"]) >= {"torch", "torchmetrics", "python"}


def test_comparison_plot(comparison, close_figures):
    ax = comparison.plot()
    assert len(ax.patches) == 2  # one bar per configuration
    assert [t.get_text() for t in ax.get_xticklabels()] == ["none A", "metrics B"]
    labels = [t.get_text() for t in ax.texts]
    assert labels[0] == "1.000x"
    heights = [p.get_height() for p in ax.patches]
    assert heights == [comparison["none A"].median_ms, comparison["metrics B"].median_ms]


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
])
def test_compare_rejects_bad_counts(setup, batches, kwargs, message):
    args = dict(steps=1, warmup=0, rounds=1) | kwargs
    with pytest.raises(ValueError, match=message):
        compare([Config("A")], setup, batches, **args)


# ----------------------------------------------------------------------------------------------------------
# Hand-made results


def result(name, rounds, steps=None, syncs=None):
    return Result(name, f"{name} config", list(rounds), list(steps or rounds), syncs)


def test_result_median_and_spread():
    r = result("x", [3.0, 1.0, 2.0], steps=[1.0, 2.0, 3.0, 10.0])
    assert r.spread_ms == (1.0, 3.0)
    assert r.median_ms == 2.5  # median over every step, not over rounds


@pytest.mark.parametrize("rounds,beyond", [
    ([13.0, 14.0], True),    # all slower than the baseline's slowest round
    ([8.0, 9.0], True),      # all faster than its fastest
    ([11.0, 13.0], False),   # overlaps
    ([12.0, 13.0], False),   # touches the baseline's max: not beyond
    ([9.0, 10.0], False),    # touches its min
    ([10.5, 11.5], False),   # inside
    ([5.0, 20.0], False),    # contains it
])
def test_beyond_spread(rounds, beyond):
    cmp = Comparison([result("base", [10.0, 12.0]), result("other", rounds)], baseline="base", batch_size=4)
    assert cmp.beyond_spread("other") is beyond
    assert cmp.beyond_spread("base") is False
    rows = cmp.rows()
    assert rows[0]["beyond_spread"] is None and rows[1]["beyond_spread"] is beyond
    verdict = "beyond spread" if beyond else "within spread"
    assert cmp.table().splitlines()[3].endswith(verdict)


def test_rows_from_hand_made_results():
    cmp = Comparison([result("base", [10.0, 12.0], steps=[10.0, 10.0, 12.0]),
                      result("fast", [5.0], steps=[5.0], syncs=2.0)], baseline="base", batch_size=4)
    base, fast = cmp.rows()
    assert base["median_ms"] == 10.0 and base["ratio"] == 1.0
    assert base["images_per_s"] == 4 * 1000 / 10.0  # batch over the median step in seconds
    assert fast["ratio"] == 0.5 and fast["syncs_per_step"] == 2.0
    assert (fast["min_ms"], fast["max_ms"]) == (5.0, 5.0)
    table = cmp.table()
    assert "n/a (CPU)" in table.splitlines()[2]
    assert table.splitlines()[3].endswith(f"{'2':>12}  beyond spread")


def test_table_fits_long_names():
    long = "a configuration with a long name"
    cmp = Comparison([result("base", [1.0]), result(long, [1.0])], baseline="base", batch_size=1)
    head, _, _, row = cmp.table().splitlines()
    w = len(long) + 2  # the name column widens to the longest name plus two spaces
    assert row[:w] == long.ljust(w)
    assert row[w:w + 10] == f"{1.0:>10.2f}" and head[w:w + 10] == f"{'median ms':>10}"


# ----------------------------------------------------------------------------------------------------------
# The command line


def test_cli_smoke_run_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mentor.bench", "--profile", "smoke", "--rounds", "1", "--steps", "1",
         "--warmup", "0", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["rows"]] == ["no metrics", "naive", "optimized"]
    assert data["settings"]["rounds"] == 1 and data["settings"]["steps"] == 1 and data["settings"]["warmup"] == 0
    assert all(len(r["step_ms"]) == 1 for r in data["results"])
    assert f"wrote {out}" in proc.stdout
    assert "profile smoke on cpu" in proc.stdout


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
    called = {}

    def fake_compare(configs, setup, batches, **kwargs):
        called.update(kwargs)
        raise AssertionError(f"compare was called with steps={kwargs['steps']}, rounds={kwargs['rounds']} "
                             f"for {flag} 0")

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda *a, **k: None)
    with pytest.raises((SystemExit, ValueError)):
        bench.main(["--profile", "smoke", flag, "0"])
