"""mentor.lab.comparison: a Comparison's overheads and verdicts, its table, rows, facts and JSON, and sweeps of
comparisons (sweep_table, save_sweep, load_sweep), on hand-made results."""

import json
import math

import numpy as np
import pytest

from exact import whole
from fakes import BASE, result, scaled, table_comparison, two_rounds, two_points
from mentor.lab.comparison import Comparison, load_sweep, save_sweep, sweep_table
from mentor.lab.stats import Result






def comparison(*results, batch_size=4, seed=0):
    return Comparison(list(results), baseline=results[0].name, batch_size=batch_size, settings={"seed": seed})


# ----------------------------------------------------------------------------------------------------------
# overheads and verdicts


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
    with pytest.raises(TypeError, match="non-empty list of mentor.lab.stats.Result"):
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


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(results=[]), TypeError, "Comparison.results must be a non-empty list of mentor.lab.stats.Result."),
    (dict(batch_size=2.5), ValueError, "batch_size must be an int >= 1 (images per step), got 2.5."),
    (dict(batch_size=True), ValueError, "batch_size must be an int >= 1 (images per step), got True."),
    (dict(settings={"seed": "x"}), ValueError, "settings['seed'] must be an int, got 'x'."),
    (dict(settings={"seed": 1.0}), ValueError, "settings['seed'] must be an int, got 1.0."),
])
def test_comparison_refuses_bad_values_with_the_whole_message(kwargs, error, message):
    args = dict(results=[two_rounds("a", 10.0, 10.0)], baseline="a", batch_size=1) | kwargs
    with pytest.raises(error, match=whole(message)):
        Comparison(**args)


# ----------------------------------------------------------------------------------------------------------
# table, rows, facts




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


# ----------------------------------------------------------------------------------------------------------
# JSON


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
    from mentor.lab.compare import compare
    from mentor.lab.configs import Config, metrics_config

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
    with pytest.raises(ValueError, match="has no round_step_ms; it was saved by an older mentor.lab.bench"):
        Comparison.load_json(bad)


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
                                              "mentor.lab.bench; re-run the comparison.")):
        Comparison.load_json(path)


# ----------------------------------------------------------------------------------------------------------
# sweeps of comparisons


def test_sweep_table_pins_every_cell():
    lines = sweep_table(two_points()).splitlines()
    assert lines == [
        "point           base ms  m                   n",
        "slow point        10.00  +10.0 [10.0, 10.0]  +25.0 [20.0, 30.0]",
        "fast               5.00  +20.0 [20.0, 20.0]  +0.0 [0.0, 0.0]",
    ]
    with pytest.raises(ValueError, match="results is empty: pass the dict that sweep"):
        sweep_table({})


def test_sweep_table_compares_the_kind_asked_for_and_truncates_point_names():
    base = [[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]
    cfg = [[11.0, 11.0, 38.0], [11.0, 11.0, 38.0]]  # median step +10 %, total time 60 / 30 ms: +100 %
    cmp = Comparison([Result("none", "", base), Result("m", "", cfg)], "none", 4)
    results = {"p": cmp, "abcdefghijklmno": cmp}  # a 15-character name: cut to 13 + "…" in 14 columns
    assert sweep_table(results).splitlines() == [
        "point           base ms  m",
        "p                 10.00  +100.0 [100.0, 100.0]",
        "abcdefghijklm…    10.00  +100.0 [100.0, 100.0]",
    ]
    assert sweep_table(results, kind="median").splitlines()[1] == "p                 10.00  +10.0 [10.0, 10.0]"
    with pytest.raises(ValueError, match=whole("results is empty: pass the dict that sweep() returns.")):
        sweep_table({})


def test_save_sweep_replaces_an_older_sweep_and_load_sweep_reads_it_back_in_order(tmp_path):
    sweep = two_points()
    sweep["slow point"].settings["point"] = {"name": "slow point"}  # as sweep() records it
    (tmp_path / "07_stale.json").write_text("{}")  # a file of an older sweep: replaced
    (tmp_path / "notes.json").write_text("keep")  # not a sweep file: kept
    paths = save_sweep(sweep, tmp_path)
    assert paths == [tmp_path / "00_slow_point.json", tmp_path / "01_fast.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00_slow_point.json", "01_fast.json", "notes.json"]
    loaded = load_sweep(tmp_path)
    assert list(loaded) == ["slow point", "fast"]  # the recorded point's name, else the file's
    assert [cmp.to_dict() for cmp in loaded.values()] == [cmp.to_dict() for cmp in sweep.values()]
    empty = tmp_path / "empty"
    with pytest.raises(FileNotFoundError, match=whole(f"no sweep files (NN_<point>.json) in {empty}; write them with "
                                                      "save_sweep().")):
        load_sweep(empty)
