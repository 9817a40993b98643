"""mentor.blocks: short alternating blocks, with a fake train() whose step times are set per configuration and a
fake clock for the hooks' host time, so that every value is exact."""

import pytest

import mentor.blocks as blocks
from mentor.bench import Config
from mentor.train import RunStats, Step


@pytest.fixture(scope="module")
def cpu():
    from mentor.train import build_setup

    return build_setup(num_classes=10)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def fake(monkeypatch):
    """train() runs the hook on every step and returns step times taken from the step hook's ``ms``
    (a number, or a list with one value per call of train for that configuration)."""
    clock = FakeClock()
    monkeypatch.setattr(blocks.time, "perf_counter", clock)
    calls = []

    def train(setup, batches, steps, *, warmup=0, on_step=None, **_):
        calls.append((on_step.on_step, warmup, steps))
        for i in range(warmup + steps):
            on_step(Step(i, None, None, None, None, 0.0))
        ms = getattr(on_step.on_step, "ms", 10.0)
        if isinstance(ms, list):
            ms = ms.pop(0)
        return RunStats([float(ms)] * steps, 1, "cpu")

    monkeypatch.setattr(blocks, "train", train)
    monkeypatch.setattr(blocks, "environment_report", lambda: {})
    return clock, calls


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
    assert [(w, s) for hook, w, s in calls if hook is not None and hook.ms == 10.0][:1] == [(2, 3)]
    assert [len(steps) for steps in cmp["m"].round_step_ms] == [3, 3, 3]
    assert cmp.settings["steps"] == 3 and cmp.settings["warmup"] == 2


def test_reports_come_every_n_timed_steps_inside_a_timed_step(fake, cpu):
    clock, _ = fake
    m = Recorder("m", clock)
    cmp = blocks.compare_blocks([Recorder("none", clock, report=False).config(), m.config()], cpu, batches(),
                                rounds=4, block=4, settle=1, report_every=4)
    # 3 timed steps per block: timed steps 4, 8, 12 are round 1 position 0, round 2 position 1, round 3 position 2
    assert m.reports == [4, 8, 12]
    assert cmp.settings["report_steps"] == {"none": [], "m": [[1, 0], [2, 1], [3, 2]]}


def test_hook_ms_is_the_median_host_time_of_the_non_report_steps(fake, cpu):
    clock, _ = fake
    cheap = Recorder("cheap", clock, cost=0.25)
    dear = Recorder("dear", clock, cost=0.5)
    cmp = blocks.compare_blocks([cheap.config(), dear.config(), Config("bare")], cpu, batches(), rounds=2,
                                block=3, settle=1, report_every=2)
    assert cmp.settings["hook_ms"] == {"cheap": 250.0, "dear": 500.0, "bare": 0.0}
    assert cheap.reports == [2, 4] and len(cheap.steps) == 6


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


@pytest.mark.parametrize("kwargs, message", [
    (dict(rounds=0), "rounds must be an int >= 1"),
    (dict(rounds=2, block=0), "block must be an int >= 1"),
    (dict(rounds=2, block=3, settle=3), "settle (3) must be smaller than block (3)"),
    (dict(rounds=2, settle=-1), "settle must be an int >= 0"),
    (dict(rounds=2, report_every=True), "report_every must be an int >= 0"),
    (dict(rounds=2, seed="x"), "seed must be an int"),
])
def test_bad_settings_are_named(kwargs, message, cpu):
    with pytest.raises(ValueError) as err:
        blocks.compare_blocks([Config("a")], cpu, batches(), **kwargs)
    assert message in str(err.value)


def test_bad_configs_are_named(cpu):
    with pytest.raises(TypeError, match="non-empty sequence of mentor.bench.Config"):
        blocks.compare_blocks([], cpu, batches(), rounds=1)
    with pytest.raises(ValueError, match="unique"):
        blocks.compare_blocks([Config("a"), Config("a")], cpu, batches(), rounds=1)
    with pytest.raises(TypeError, match="setup must be a mentor.train.Setup"):
        blocks.compare_blocks([Config("a")], "cuda", batches(), rounds=1)
    with pytest.raises(ValueError, match="same batches"):
        blocks.compare_blocks([Config("a", batches=[1])], cpu, batches(), rounds=1)


def test_drift_means_whole_windows_only():
    assert blocks.drift([1.0, 3.0, 2.0, 6.0, 9.0], window=2) == [2.0, 4.0]
    assert blocks.drift([5.0, 7.0], window=2) == [6.0]
    with pytest.raises(ValueError, match="fewer than one window of 3"):
        blocks.drift([1.0, 2.0], window=3)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        blocks.drift([1.0], window=0)


def test_plot_drift_draws_the_steps_and_the_window_means():
    fig = blocks.plot_drift([10.0, 12.0, 11.0, 9.0, 30.0], window=2)
    ax = fig.axes[0]
    assert list(ax.lines[0].get_ydata()) == [10.0, 12.0, 11.0, 9.0, 30.0]
    stairs = [p for p in ax.patches]
    assert list(stairs[0].get_data().values) == [11.0, 10.0]
