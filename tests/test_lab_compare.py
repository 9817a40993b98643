"""mentor.lab.compare: compare on the CPU (random order, warm-up and timed steps, report steps, the sync pass),
report_positions, at_each_point, sweep and record_point."""

import inspect
import itertools
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import mentor.lab.compare as lab_compare
from exact import whole
from fakes import expected_orders, FlushRecorder
from marks import gpu
from mentor.lab.compare import at_each_point, compare, record_point, report_positions, sweep
from mentor.lab.comparison import Comparison
from mentor.lab.configs import OPERATING_POINTS, Config, OperatingPoint
from mentor.lab.data import device_batches
from mentor.lab.env import get_profile
from mentor.lab.stats import Result
from mentor.lab.train import build_setup

CUDA = torch.device("cuda")




def recording_config(name, log):
    """A Config whose on_step appends its name to ``log`` (one entry per training step)."""
    return Config(name, lambda: ((lambda step: log.append(name)), None), description=f"records {name}")


def cuda_profile():
    """The smoke profile with a CUDA device: only passed on (builders are faked), nothing runs on it."""
    return get_profile("smoke").with_(device=CUDA)


# ----------------------------------------------------------------------------------------------------------
# compare on the CPU




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
    import mentor.lab.train

    report_ms = 1000.0
    ahead = [0.0]
    real = time.perf_counter
    monkeypatch.setattr(mentor.lab.train, "time", SimpleNamespace(perf_counter=lambda: real() + ahead[0]))

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




def test_compare_prints_each_round_s_wall_time_and_flushes(setup, batches, monkeypatch):
    clock = iter([100.0, 102.5, 200.0, 200.25])
    monkeypatch.setattr(lab_compare, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    out = FlushRecorder()
    monkeypatch.setattr(sys, "stdout", out)
    compare([Config("A"), Config("B")], setup, batches, steps=1, warmup=0, rounds=2, count_syncs=False)
    monkeypatch.undo()
    assert out.events == ["round 1/2: 2 runs in 2.5 s", "\n", "<flush>", "round 2/2: 2 runs in 0.2 s", "\n",
                          "<flush>"]


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


def test_every_run_gets_fresh_hooks(setup, batches):
    made = []
    compare([counting_config("A", made)], setup, batches, steps=3, warmup=1, rounds=3, report_every=2,
            progress=False)
    assert len(made) == 3  # one make() per run, no sync pass on the CPU
    assert [c["step"] for c in made] == [1 + 3] * 3  # each hook object served exactly one run of 1 + 3 steps
    assert [c["report"] for c in made] == [2] * 3


# ----------------------------------------------------------------------------------------------------------
# the sync pass


class FakeReport:
    count = 0


def fake_sync_guard(counter):
    """A stand-in for mentor.syncs.sync_guard that counts ``counter["syncs"]`` increments inside the block."""

    @contextmanager
    def guard(strict=False):
        report = FakeReport()
        before = counter["syncs"]
        yield report
        report.count = counter["syncs"] - before

    return guard


@contextmanager
def no_sync_guard(strict=False):
    yield FakeReport()


def test_sync_pass_counts_step_and_report_syncs(setup, batches, monkeypatch):
    import mentor.syncs

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

    monkeypatch.setattr(mentor.syncs, "sync_guard", fake_sync_guard(counter))
    monkeypatch.setattr(lab_compare, "_is_cuda", lambda s: True)  # take the CUDA branch on the CPU
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


def test_sync_pass_uses_the_config_s_own_batches_and_reports_the_step_count(setup, batches, monkeypatch):
    import mentor.syncs

    own = itertools.repeat((torch.full((2, 3, 32, 32), 7.0), torch.tensor([1, 2])))
    seen, reported = [], []

    def make():
        return (lambda s: seen.append(bool((s.images == 7.0).all()))), reported.append

    monkeypatch.setattr(mentor.syncs, "sync_guard", no_sync_guard)
    monkeypatch.setattr(lab_compare, "_is_cuda", lambda s: True)
    cmp = compare([Config("own", make, description="its own data", batches=own)], setup, batches, steps=1, warmup=0,
                  rounds=1, sync_steps=3, progress=False)
    assert seen == [True] * (1 + 2 + 3)  # the timed run, then the sync pass's 2 untimed and 3 counted steps
    assert reported == [2 + 3]  # the sync pass reports once, after its 2 + 3 steps
    assert cmp["own"].description == "its own data"
    assert cmp.batch_size == 2  # device_batches(2, 32, 10): images of shape (2, 3, 32, 32)


def test_syncs_note_on_cpu_and_when_not_counted(setup, batches, monkeypatch):
    cmp = compare([Config("A")], setup, batches, steps=1, warmup=0, rounds=1, progress=False)
    assert (cmp["A"].syncs_per_step, cmp["A"].syncs_note) == (None, "n/a (CPU)")
    assert "n/a (CPU)" in cmp.table().splitlines()[3]

    cmp = compare([Config("A")], setup, batches, steps=1, warmup=0, rounds=1, progress=False, count_syncs=False)
    assert cmp["A"].syncs_note == "not counted"  # not counted, whatever the device

    def no_sync_pass(*args, **kwargs):
        raise AssertionError("count_syncs=False must not run the sync pass")

    monkeypatch.setattr(lab_compare, "_is_cuda", lambda s: True)
    monkeypatch.setattr(lab_compare, "_syncs_per_step", no_sync_pass)
    cmp = compare([Config("A")], setup, batches, steps=1, warmup=0, rounds=1, progress=False, count_syncs=False)
    assert (cmp["A"].syncs_per_step, cmp["A"].report_syncs, cmp["A"].syncs_note) == (None, None, "not counted")
    assert "not counted" in cmp.table().splitlines()[3]


def test_is_cuda_reads_the_setup_device():
    assert lab_compare._is_cuda(SimpleNamespace(device=torch.device("cuda", 0)))
    assert not lab_compare._is_cuda(SimpleNamespace(device=torch.device("cpu")))


# ----------------------------------------------------------------------------------------------------------
# report_positions and bad input


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
    ([], TypeError, "configs must be a non-empty sequence of mentor.lab.configs.Config"),
    (["A"], TypeError, "configs must be a non-empty sequence of mentor.lab.configs.Config"),
    ([Config("A"), Config("A")], ValueError, r"configuration names must be unique, got \['A', 'A'\]"),
])
def test_compare_rejects_bad_configs(setup, batches, configs, error, message):
    with pytest.raises(error, match=message):
        compare(configs, setup, batches, steps=1, warmup=0, rounds=1)


def test_compare_refuses_non_configs_with_the_whole_message(setup, batches):
    with pytest.raises(TypeError, match=whole("configs must be a non-empty sequence of mentor.lab.configs.Config.")):
        compare(["A"], setup, batches, steps=1, warmup=0, rounds=1)


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
# at_each_point


def fake_point_setup(built):
    """A stand-in for point_setup that records (point, profile) in ``built`` and builds nothing."""

    def point_setup(point, profile):
        built.append((point, profile))
        return ("setup", point.name), ("batches", point.name)

    return point_setup


def test_at_each_point_runs_each_point_on_its_own_setup_and_records_the_point(monkeypatch, capsys):
    built, ran = [], []
    monkeypatch.setattr(lab_compare, "point_setup", fake_point_setup(built))

    def run(setup, batches):
        ran.append((setup, batches))
        return Comparison([Result("a", "", [[1.0]]), Result("b", "", [[2.0]])], "a", 1, settings={"seed": 3})

    profile = get_profile("smoke")
    points = (OperatingPoint("p", 2, 32), OperatingPoint("q", 3, 40, "bf16", True))
    out = at_each_point(points, profile, run)
    assert built == [(points[0], profile), (points[1], profile)]
    assert ran == [(("setup", "p"), ("batches", "p")), (("setup", "q"), ("batches", "q"))]
    assert list(out) == ["p", "q"]  # by point name, in the order of the points
    assert [cmp.settings for cmp in out.values()] == [{"seed": 3, "point": asdict(p)} for p in points]
    assert out["q"].settings["point"] == {"name": "q", "batch_size": 3, "image_size": 40, "precision": "bf16",
                                          "channels_last": True}
    assert capsys.readouterr().out == "p: batch 2, 32 px, fp32\nq: batch 3, 40 px, bf16, channels-last\n"
    at_each_point(points[:1], profile, run, progress=False)
    assert capsys.readouterr().out == ""


def test_at_each_point_on_the_cpu_builds_the_point_s_model_and_data():
    profile = get_profile("smoke").with_(num_classes=10)
    seen = []

    def run(setup, batches):
        images, labels = next(iter(batches))
        seen.append((setup.autocast, setup.channels_last, tuple(images.shape)))
        return Comparison([Result("a", "", [[1.0]])], "a", int(images.shape[0]))

    out = at_each_point([OperatingPoint("tiny", 2, 32, "bf16", True)], profile, run, progress=False)
    assert seen == [(torch.bfloat16, True, (2, 3, 32, 32))]
    assert out["tiny"].settings == {"point": {"name": "tiny", "batch_size": 2, "image_size": 32, "precision": "bf16",
                                              "channels_last": True}}


@pytest.mark.parametrize("points", [[], (), [OPERATING_POINTS[0], "fp32 b64"], ["fp32 b128"]])
def test_at_each_point_refuses_anything_but_points_before_it_runs(monkeypatch, points):
    built = []
    monkeypatch.setattr(lab_compare, "point_setup", fake_point_setup(built))
    message = "points must be a non-empty sequence of mentor.lab.configs.OperatingPoint, e.g. OPERATING_POINTS."
    with pytest.raises(TypeError, match=whole(message)):
        at_each_point(points, get_profile("smoke"), lambda setup, batches: pytest.fail("ran a bad point"))
    assert built == []


# ----------------------------------------------------------------------------------------------------------
# sweep and record_point


def test_sweep_builds_each_point_and_compares_the_named_configs(monkeypatch):
    seen = []

    def fake_compare(configs, setup, batches, **kw):
        images, _ = next(iter(batches))
        seen.append(([c.name for c in configs], setup.autocast, setup.channels_last, tuple(images.shape), kw))
        return Comparison([Result(c.name, "", [[1.0]]) for c in configs], configs[0].name, int(images.shape[0]))

    monkeypatch.setattr(lab_compare, "compare", fake_compare)
    points = (OperatingPoint("a", 2, 32), OperatingPoint("b", 3, 40, "bf16", True))
    out = sweep(points, get_profile("smoke"), ["no metrics", "fused suite"], steps=4, warmup=1, rounds=2, seed=7,
                progress=False)
    assert list(out) == ["a", "b"]
    assert seen[0][:4] == (["no metrics", "fused suite"], None, False, (2, 3, 32, 32))
    assert seen[1][:4] == (["no metrics", "fused suite"], torch.bfloat16, True, (3, 3, 40, 40))
    assert seen[1][4] == dict(steps=4, warmup=1, rounds=2, report_every=get_profile("smoke").report_every, seed=7,
                              progress=False)
    assert out["b"].settings["point"] == {"name": "b", "batch_size": 3, "image_size": 40, "precision": "bf16",
                                          "channels_last": True}


def test_sweep_defaults_and_the_profile_s_device(monkeypatch, capsys):
    import mentor.lab.configs
    import mentor.lab.data

    seen = []

    def fake_compare(configs, setup, batches, **kwargs):
        seen.append(kwargs["seed"])
        return Comparison([Result(c.name, "", [[1.0]]) for c in configs], configs[0].name, 2)

    built = []
    monkeypatch.setattr(lab_compare, "compare", fake_compare)
    monkeypatch.setattr(mentor.lab.configs, "build_setup", lambda *args, **kwargs: built.append((args, kwargs)))
    monkeypatch.setattr(mentor.lab.data, "device_batches", lambda *args, **kwargs: built.append((args, kwargs)))
    point = OperatingPoint("p", 3, 40, "bf16", True)
    sweep([point], cuda_profile(), ["no metrics", "naive"], steps=1, warmup=0, rounds=1)
    assert seen == [0]  # seed 0 by default
    assert capsys.readouterr().out == point.label + "\n"  # progress by default
    classes = cuda_profile().num_classes
    assert built == [((classes, CUDA), dict(precision="bf16", channels_last=True)), ((3, 40, classes, CUDA), {})]


def test_sweep_runs_on_the_cpu_and_round_trips_through_json(tmp_path):
    profile = get_profile("smoke").with_(num_classes=10)
    point = OperatingPoint("tiny", 2, 32)
    out = sweep([point], profile, ["no metrics", "macro sync-free"], steps=2, warmup=0, rounds=1, progress=False)
    cmp = out["tiny"]
    assert [r.name for r in cmp.results] == ["no metrics", "macro sync-free"]
    assert [len(r.step_ms) for r in cmp.results] == [2, 2]
    back = Comparison.load_json(cmp.save_json(tmp_path / "tiny.json"))
    assert back.settings["point"]["name"] == "tiny"


def test_sweep_rejects_bad_input():
    profile = get_profile("smoke")
    with pytest.raises(TypeError, match="points must be a non-empty sequence of mentor.lab.configs.OperatingPoint"):
        sweep([], profile, steps=1, warmup=0, rounds=1)
    with pytest.raises(ValueError, match=r"unknown configuration\(s\) \['nope'\]: pass names from available_configs"):
        sweep(OPERATING_POINTS[:1], profile, ["no metrics", "nope"], steps=1, warmup=0, rounds=1)


def test_sweep_refuses_non_points_with_the_whole_message():
    with pytest.raises(TypeError, match=whole("points must be a non-empty sequence of "
                                              "mentor.lab.configs.OperatingPoint, e.g. OPERATING_POINTS.")):
        sweep([], get_profile("smoke"), steps=1, warmup=0, rounds=1)


def test_record_point_ranges_every_update_and_rejects_bad_configs(tmp_path):
    from mentor.lab.trace import host_time, load_trace, step_windows

    profile = get_profile("smoke").with_(num_classes=10)
    point = OperatingPoint("tiny", 2, 32)
    path = record_point(point, profile, "macro sync-free", tmp_path / "t.json.gz", active=3)
    trace = load_trace(path)
    assert len(step_windows(trace)) == 3 and host_time(trace, "metrics update").ranges == 3
    with pytest.raises(ValueError, match="unknown configuration 'x': pass a name from available_configs"):
        record_point(point, profile, "x", tmp_path / "x.json")
    with pytest.raises(ValueError, match="'no metrics' updates no metric"):
        record_point(point, profile, "no metrics", tmp_path / "x.json")


def test_record_point_passes_the_point_and_profile_on(monkeypatch, tmp_path):
    import mentor.lab.configs
    import mentor.lab.data
    import mentor.lab.profiling

    built, recorded = [], []
    monkeypatch.setattr(mentor.lab.configs, "build_setup",
                        lambda *args, **kwargs: built.append((args, kwargs)) or "setup")
    monkeypatch.setattr(mentor.lab.data, "device_batches",
                        lambda *args, **kwargs: built.append((args, kwargs)) or "data")
    signature = inspect.signature(mentor.lab.profiling.record_steps)

    def fake_record_steps(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()  # what record_steps runs with, whether passed or its default
        recorded.append((args[:3], {k: bound.arguments[k] for k in ("warmup", "active")}))
        return args[2]

    monkeypatch.setattr(mentor.lab.profiling, "record_steps", fake_record_steps)
    profile = cuda_profile()
    point = OperatingPoint("p", 3, 40, "bf16", True)
    assert record_point(point, profile, "step time: CPU", tmp_path / "t.json") == tmp_path / "t.json"
    assert built == [((profile.num_classes, CUDA), dict(precision="bf16", channels_last=True)),
                     ((3, 40, profile.num_classes, CUDA), {})]
    # two profiler warm-up steps before the trace, and 5 traced steps by default
    assert recorded == [(("setup", "data", tmp_path / "t.json"), dict(warmup=2, active=5))]


@gpu
def test_compare_counts_syncs_per_step_and_per_report_exactly():
    from mentor.lab.configs import metrics_config

    setup = build_setup(num_classes=10, device="cuda")
    batches = device_batches(4, image_size=32, num_classes=10, device="cuda")
    cmp = compare([Config("none"), metrics_config("naive", 10, "cuda"), metrics_config("optimized", 10, "cuda")],
                  setup, batches, steps=3, warmup=1, rounds=2, report_every=2, sync_steps=4, progress=False)
    # naive: the NaN check reads two booleans back per step; a report reads all five values back in one copy
    assert (cmp["naive"].syncs_per_step, cmp["naive"].report_syncs) == (2.0, 1)
    assert (cmp["optimized"].syncs_per_step, cmp["optimized"].report_syncs) == (0.0, 1)
    assert cmp["none"].syncs_per_step == 0.0 and cmp["none"].report_syncs is None
    assert cmp["naive"].syncs_note in (None, "")
