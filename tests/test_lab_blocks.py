"""mentor.lab.blocks: short alternating blocks, with a fake train() whose step times are set per configuration and a
fake clock for the hooks' host time, so that every value is exact; and sweep_blocks."""

from dataclasses import asdict

import numpy as np
import pytest

import mentor.lab.blocks as blocks
from marks import gpu
from mentor.lab.configs import Config, OperatingPoint
from mentor.lab.train import RunStats, Step


@pytest.fixture(scope="module")
def cpu():
    from mentor.lab.train import build_setup

    return build_setup(num_classes=10)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def fake(monkeypatch):
    """train() runs the hook on every step and returns step times taken from the step hook's ``ms``
    (a number, or a list with one value per call of train for that configuration). ``calls`` records
    ``(step hook, warmup, steps, setup, batches)`` of every call; the environment report is ``ENV``."""
    clock = FakeClock()
    monkeypatch.setattr(blocks.time, "perf_counter", clock)
    calls = []

    def train(setup, batches, steps, *, warmup=0, on_step=None, **_):
        calls.append((on_step.on_step, warmup, steps, setup, batches))
        for i in range(warmup + steps):
            on_step(Step(i, None, None, None, None, 0.0))
        ms = getattr(on_step.on_step, "ms", 10.0)
        if isinstance(ms, list):
            ms = ms.pop(0)
        return RunStats([float(ms)] * steps, 1, "cpu")

    monkeypatch.setattr(blocks, "train", train)
    monkeypatch.setattr(blocks, "environment_report", lambda: dict(ENV))
    return clock, calls


ENV = {"host": "fake"}


class Recorder:
    """A configuration whose hooks record what they see; ``cost`` advances the fake clock on each step."""

    def __init__(self, name, clock, ms=10.0, cost=0.0, report=True):
        self.name, self.clock, self.ms, self.cost, self.report = name, clock, ms, cost, report
        self.made = 0
        self.steps = []
        self.reports = []

    def config(self):
        def make():
            self.made += 1

            def on_step(step):
                self.steps.append(step.index)
                self.clock.now += self.cost

            on_step.ms = self.ms
            return on_step, (self.reports.append if self.report else None)

        return Config(self.name, make)


def batches():
    while True:
        yield (_Batch(), None)


class _Batch:
    shape = (4,)


# ----------------------------------------------------------------------------------------------------------
# compare_blocks


def test_overhead_pairs_the_blocks_of_one_round(fake, cpu):
    clock, _ = fake
    base = Recorder("none", clock, ms=[10.0, 20.0, 15.0])
    slow = Recorder("slow", clock, ms=[11.0, 22.0, 16.5])
    cmp = blocks.compare_blocks([base.config(), slow.config()], cpu, batches(), rounds=3, block=4, settle=1,
                                report_every=0)
    assert cmp["slow"].round_step_ms == [[11.0] * 3, [22.0] * 3, [16.5] * 3]
    assert cmp.overhead("slow", kind="throughput").fmt(3) == "+10.000 % [10.000, 10.000]"
    assert cmp.baseline == "none" and cmp.batch_size == 4


def test_hooks_are_made_once_and_settle_steps_update_but_are_not_timed(fake, cpu):
    clock, calls = fake
    m = Recorder("m", clock)
    cmp = blocks.compare_blocks([Recorder("none", clock).config(), m.config()], cpu, batches(), rounds=3,
                                block=5, settle=2, report_every=0)
    assert m.made == 1
    assert m.steps == [0, 1, 2, 3, 4] * 3
    assert [(w, s) for hook, w, s, *_ in calls if hook is not None and hook.ms == 10.0][:1] == [(2, 3)]
    assert [len(steps) for steps in cmp["m"].round_step_ms] == [3, 3, 3]
    assert cmp.settings["steps"] == 3 and cmp.settings["warmup"] == 2


def test_reports_come_every_n_timed_steps_inside_a_timed_step(fake, cpu):
    clock, _ = fake
    m = Recorder("m", clock)
    cmp = blocks.compare_blocks([Recorder("none", clock, report=False).config(), m.config()], cpu, batches(),
                                rounds=5, block=4, settle=1, report_every=4)
    # 3 timed steps per block: timed steps 4 and 8 are round 1 position 0 and round 2 position 1; timed step 12
    # is round 3's last (position 2), so its report waits for the next timed step, round 4 position 0 (step 13)
    assert m.reports == [4, 8, 13]
    assert cmp.settings["report_steps"] == {"none": [], "m": [[1, 0], [2, 1], [4, 0]]}


def test_a_report_never_falls_on_the_last_timed_step_of_a_block(fake, cpu):
    """Whatever the block and the rate, the step after every report is a timed step of the same block: reports due
    at a block's last timed step run at the next block's first, and reports due together run once."""
    clock, _ = fake
    for block, settle, every in ((3, 1, 1), (3, 1, 2), (10, 2, 50), (10, 2, 4), (5, 0, 5)):
        m = Recorder("m", clock)
        rounds = 60
        cmp = blocks.compare_blocks([m.config()], cpu, batches(), rounds=rounds, block=block, settle=settle,
                                    report_every=every)
        timed = block - settle
        positions = [p for _, p in cmp.settings["report_steps"]["m"]]
        assert positions and max(positions) <= timed - 2, (block, settle, every)
        # each report runs at the first timed step, not the last of its block, at or after the step that made it due
        due = [t for t in range(1, rounds * timed + 1) if t % every == 0]
        runnable = [t for t in range(1, rounds * timed + 1) if (t - 1) % timed != timed - 1]
        expected = sorted({min(r for r in runnable if r >= t) for t in due if t <= max(runnable)})
        assert m.reports == expected, (block, settle, every)


def test_reports_need_two_timed_steps_per_block(cpu):
    with pytest.raises(ValueError, match=r"block - settle is 1 timed step with report_every=5: a report needs a "
                                         r"timed step after it in its block; pass a block at least settle \+ 2 long"):
        blocks.compare_blocks([Config("a")], cpu, batches(), rounds=1, block=3, settle=2, report_every=5)


def test_hook_ms_is_the_median_host_time_of_the_non_report_steps(fake, cpu):
    clock, _ = fake
    cheap = Recorder("cheap", clock, cost=0.25)
    dear = Recorder("dear", clock, cost=0.5)
    cmp = blocks.compare_blocks([cheap.config(), dear.config(), Config("bare")], cpu, batches(), rounds=2,
                                block=3, settle=1, report_every=2)
    assert cmp.settings["hook_ms"] == {"cheap": 250.0, "dear": 500.0, "bare": 0.0}
    # 2 timed steps per block: the reports due at timed steps 2 and 4 (each a block's last) run at 3 and never
    assert cheap.reports == [3] and len(cheap.steps) == 6


def test_orders_are_shuffled_per_round_from_the_seed(fake, cpu):
    clock, _ = fake
    configs = [Recorder(n, clock).config() for n in "abc"]
    one = blocks.compare_blocks(configs, cpu, batches(), rounds=3, block=2, settle=0, report_every=0, seed=7)
    two = blocks.compare_blocks(configs, cpu, batches(), rounds=3, block=2, settle=0, report_every=0, seed=7)
    assert one.settings["orders"] == two.settings["orders"]
    assert len({tuple(o) for o in one.settings["orders"]}) > 1
    assert all(sorted(o) == ["a", "b", "c"] for o in one.settings["orders"])


def test_syncs_are_not_counted_on_the_cpu(fake, cpu):
    clock, _ = fake
    cmp = blocks.compare_blocks([Config("a")], cpu, batches(), rounds=1, block=1, settle=0, report_every=0)
    assert cmp["a"].syncs_note == "n/a (CPU)"
    cmp = blocks.compare_blocks([Config("a")], cpu, batches(), rounds=1, block=1, settle=0, report_every=0,
                                count_syncs=False)
    assert cmp["a"].syncs_note == "not counted"


def test_settings_record_the_defaults(fake, cpu):
    # block=10, settle=2: 8 timed steps after 2 untimed; one round of one configuration, no report in 8 steps
    cmp = blocks.compare_blocks([Config("a")], cpu, batches(), rounds=1)
    assert cmp.settings == {"design": "blocks", "block": 10, "settle": 2, "steps": 8, "warmup": 2, "rounds": 1,
                            "report_every": 50, "sync_steps": 5, "seed": 0, "orders": [["a"]],
                            "report_steps": {"a": []}, "hook_ms": {"a": 0.0}, "warmup_rounds": 0}
    assert cmp["a"].round_step_ms == [[10.0] * 8]


def test_settings_record_the_values_given(fake, cpu):
    # sync_steps=1 is the smallest allowed; one configuration, so every round's order is ["a"]
    cmp = blocks.compare_blocks([Config("a")], cpu, batches(), rounds=2, block=3, settle=1, report_every=7,
                                sync_steps=1, seed=3)
    assert cmp.settings == {"design": "blocks", "block": 3, "settle": 1, "steps": 2, "warmup": 1, "rounds": 2,
                            "report_every": 7, "sync_steps": 1, "seed": 3, "orders": [["a"], ["a"]],
                            "report_steps": {"a": []}, "hook_ms": {"a": 0.0}, "warmup_rounds": 0}


def test_every_block_trains_the_given_setup_and_batches(fake, cpu):
    _, calls = fake
    data = batches()
    cmp = blocks.compare_blocks([Config("a"), Config("b")], cpu, data, rounds=2, block=2, settle=0, report_every=0)
    assert len(calls) == 4
    assert all(setup is cpu and got is data for *_, setup, got in calls)
    assert cmp.environment == ENV


def test_results_keep_the_description_and_the_counted_syncs(fake, cpu, monkeypatch):
    # a fake CUDA setup: syncs come from _syncs_per_step with each config's own make and sync_steps
    def make_a():
        return None, None

    def make_b():
        return None, None

    a = Config("a", make_a, description="bare loop")
    b = Config("b", make_b, description="with metrics")
    counted = {make_a: (0.0, None), make_b: (2.0, 3)}
    seen = []

    def syncs(setup, data, make, steps):
        seen.append((setup, data, make, steps))
        return counted[make]

    monkeypatch.setattr(blocks, "_is_cuda", lambda setup: setup is cpu)
    monkeypatch.setattr(blocks, "_syncs_per_step", syncs)
    data = batches()
    cmp = blocks.compare_blocks([a, b], cpu, data, rounds=1, block=1, settle=0, report_every=0, sync_steps=4)
    assert seen == [(cpu, data, make_a, 4), (cpu, data, make_b, 4)]
    assert [(r.name, r.description, r.syncs_per_step, r.report_syncs, r.syncs_note) for r in cmp.results] == [
        ("a", "bare loop", 0.0, None, None), ("b", "with metrics", 2.0, 3, None)]


def test_hook_ms_keeps_the_last_step_of_each_block_when_every_step_is_due(fake, cpu):
    # report_every=1: every timed step is due, but the last of each block never reports, so its host time is kept
    clock, _ = fake
    m = Recorder("m", clock, cost=0.25)
    cmp = blocks.compare_blocks([m.config()], cpu, batches(), rounds=2, block=3, settle=1, report_every=1)
    assert m.reports == [1, 3]
    assert cmp.settings["hook_ms"] == {"m": 250.0}
    assert cmp.settings["report_steps"] == {"m": [[0, 0], [1, 0]]}


@gpu
def test_blocks_count_syncs_report_on_time_and_read_every_block_on_the_gpu():
    from mentor.lab.configs import Config, metrics_config, suite_config
    from mentor.lab.blocks import compare_blocks
    from mentor.lab.data import device_batches
    from mentor.lab.train import build_setup

    setup = build_setup(num_classes=10, device="cuda")
    configs = [Config("no metrics"), metrics_config("naive", 10, "cuda"), suite_config(10, "cuda")]
    cmp = compare_blocks(configs, setup, device_batches(8, 64, 10, "cuda"), rounds=3, block=6, settle=2,
                         report_every=5)
    assert [cmp[c.name].syncs_per_step for c in configs] == [0, 2, 0]
    assert all(len(steps) == 4 and min(steps) > 0 for c in configs for steps in cmp[c.name].round_step_ms)
    # 4 timed steps per block: timed step 5 is round 1 position 0, timed step 10 round 2 position 1
    assert cmp.settings["report_steps"]["fused suite"] == [[1, 0], [2, 1]]
    hook = cmp.settings["hook_ms"]
    assert hook["no metrics"] < hook["fused suite"] < hook["naive"]


# ----------------------------------------------------------------------------------------------------------
# sweep_blocks


def test_sweep_blocks_defaults_are_blocks_of_10_settle_2_seed_0_and_progress_lines(monkeypatch, capsys):
    """Each point gets its own model and batches, and one compare_blocks with the sweep's defaults."""
    from mentor.lab.configs import operating_points
    from mentor.lab.env import get_profile

    profile = get_profile("smoke")
    points = operating_points(profile)[:2]
    calls = []
    monkeypatch.setattr("mentor.lab.configs.build_setup", lambda *a, **kw: ("setup", a, kw))
    monkeypatch.setattr("mentor.lab.data.device_batches", lambda *a: ("batches", a))

    def compare_blocks(configs, setup, batches, **kw):
        calls.append((setup, batches, kw))
        return type("FakeComparison", (), {"settings": {}})()

    monkeypatch.setattr(blocks, "compare_blocks", compare_blocks)
    out = blocks.sweep_blocks(points, profile, ["a", "b"], rounds=3)
    assert list(out) == [p.name for p in points]
    assert [kw for _, _, kw in calls] == [dict(rounds=3, block=10, settle=2, report_every=profile.report_every,
                                               seed=0)] * 2
    assert capsys.readouterr().out == "".join(f"{p.label}\n" for p in points)


def test_sweep_and_sweep_blocks_build_each_point_through_point_setup_and_record_it(monkeypatch):
    """Both sweeps go through mentor.lab.compare.at_each_point: one point_setup per point, and the point recorded
    in each comparison's settings."""
    import mentor.lab.compare as lab_compare
    from mentor.lab.comparison import Comparison
    from mentor.lab.env import get_profile
    from mentor.lab.stats import Result

    built, ran = [], []

    def point_setup(point, profile):
        built.append((point.name, profile))
        return ("setup", point.name), ("batches", point.name)

    def runner(kind):
        def run(configs, setup, batches, **kwargs):
            ran.append((kind, setup, batches))
            return Comparison([Result(c.name, "", [[1.0]]) for c in configs], configs[0].name, 1,
                              settings={"kind": kind})

        return run

    monkeypatch.setattr(lab_compare, "point_setup", point_setup)
    monkeypatch.setattr(lab_compare, "compare", runner("compare"))
    monkeypatch.setattr(blocks, "compare_blocks", runner("blocks"))
    profile = get_profile("smoke")
    points = (OperatingPoint("a", 2, 32), OperatingPoint("b", 3, 40, "bf16", True))
    swept = lab_compare.sweep(points, profile, ["no metrics", "naive"], steps=1, warmup=0, rounds=1, progress=False)
    blocked = blocks.sweep_blocks(points, profile, [Config("no metrics"), Config("m")], rounds=1, progress=False)
    assert built == [("a", profile), ("b", profile)] * 2
    assert ran == [(kind, ("setup", p), ("batches", p)) for kind in ("compare", "blocks") for p in ("a", "b")]
    for kind, out in (("compare", swept), ("blocks", blocked)):
        assert list(out) == ["a", "b"]
        assert [cmp.settings for cmp in out.values()] == [{"kind": kind, "point": asdict(p)} for p in points]


def test_warmup_rounds_run_with_the_same_hooks_and_are_not_recorded(fake, cpu):
    """Two warm-up rounds, then two timed ones: the hooks are made once and see every step; only the timed
    rounds' step times, reports (counted from the end of the warm-up) and orders are recorded."""
    clock, _ = fake
    m = Recorder("m", clock, ms=[1.0, 2.0, 3.0, 4.0])
    cmp = blocks.compare_blocks([m.config()], cpu, batches(), rounds=2, block=3, settle=1, report_every=2,
                                warmup_rounds=2)
    assert m.made == 1 and len(m.steps) == 12
    assert cmp["m"].round_step_ms == [[3.0, 3.0], [4.0, 4.0]]
    # warm-up: reports due at timed steps 2 (last of its block: deferred) and 4 (deferred again) run at 3;
    # after the warm-up the count restarts: the report due at the 2nd timed step is deferred to the 3rd
    assert m.reports == [3, 3]
    assert cmp.settings["report_steps"] == {"m": [[1, 0]]} and len(cmp.settings["orders"]) == 2
    assert cmp.settings["warmup_rounds"] == 2
    with pytest.raises(ValueError, match=r"warmup_rounds must be an int >= 0, got -1"):
        blocks.compare_blocks([m.config()], cpu, batches(), rounds=1, warmup_rounds=-1)
