"""CPU tests of mentor.train: build_setup, train (timing, hooks, reports, progress, profiler) and RunStats."""

import pytest
import torch

from mentor.data import device_batches
from mentor.train import RunStats, Setup, Step, build_setup, train

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def setup():
    return build_setup(num_classes=NUM_CLASSES)


@pytest.fixture
def batches():
    return device_batches(2, image_size=32, num_classes=NUM_CLASSES)


def test_build_setup():
    s = build_setup(num_classes=NUM_CLASSES)
    assert isinstance(s, Setup)
    assert type(s.model).__name__ == "ResNet"
    assert s.model.fc.out_features == NUM_CLASSES
    assert isinstance(s.criterion, torch.nn.CrossEntropyLoss)
    assert isinstance(s.optimizer, torch.optim.SGD)
    assert s.device == torch.device("cpu")


def _weights(setup):
    return [p.detach().clone() for p in setup.model.parameters()]


def test_build_setup_is_seeded():
    a, b, c = build_setup(NUM_CLASSES, seed=0), build_setup(NUM_CLASSES, seed=0), build_setup(NUM_CLASSES, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b)))
    assert not all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(c)))


@pytest.mark.parametrize("bad", [1, 0, True, 2.0, "10"])
def test_build_setup_rejects_bad_num_classes(bad):
    with pytest.raises(ValueError, match=f"num_classes must be an int >= 2, got {bad!r}"):
        build_setup(num_classes=bad)


@pytest.mark.parametrize("steps,warmup", [(1, 0), (3, 2)])
def test_train_times_each_step(setup, batches, steps, warmup):
    stats = train(setup, batches, steps=steps, warmup=warmup)
    assert isinstance(stats, RunStats)
    assert len(stats.step_ms) == steps
    assert all(t > 0 for t in stats.step_ms)
    assert stats.batch_size == 2 and stats.device == "cpu"


def test_train_updates_the_weights(setup, batches):
    before = _weights(setup)
    train(setup, batches, steps=1)
    assert not all(torch.equal(x, y) for x, y in zip(before, _weights(setup)))


def test_on_step_sees_every_step_with_its_index(setup, batches):
    seen: list[Step] = []
    train(setup, batches, steps=3, warmup=2, on_step=seen.append)
    assert [s.index for s in seen] == [0, 1, 2, 3, 4]  # warm-up steps included, 0-based
    for s in seen:
        assert tuple(s.images.shape) == (2, 3, 32, 32)
        assert tuple(s.labels.shape) == (2,)
        assert tuple(s.output.shape) == (2, NUM_CLASSES)
        assert s.loss.shape == () and torch.isfinite(s.loss)
        assert s.host_seconds > 0


def test_on_step_gets_the_loss_of_its_batch(setup):
    # the loss handed to the hook is the criterion of this step's output and labels
    def check(s: Step):
        torch.testing.assert_close(s.loss, setup.criterion(s.output, s.labels))

    train(setup, device_batches(2, 32, NUM_CLASSES), steps=2, on_step=check)


@pytest.mark.parametrize("warmup,steps,every,expected", [
    (0, 4, 2, [2, 4]),
    (1, 4, 2, [2, 4]),        # 5 steps in all: reports after steps 2 and 4
    (0, 5, 3, [3]),
    (2, 4, 1, [1, 2, 3, 4, 5, 6]),
])
def test_on_report_every_n_steps_one_based(setup, batches, warmup, steps, every, expected):
    reports: list[int] = []
    train(setup, batches, steps=steps, warmup=warmup, on_report=reports.append, report_every=every)
    assert reports == expected


def test_on_report_without_report_every_is_never_called(setup, batches):
    reports: list[int] = []
    train(setup, batches, steps=2, on_report=reports.append)
    assert reports == []


def test_progress_prints_whole_lines(setup, batches, capsys):
    train(setup, batches, steps=3, warmup=1, progress="run x")
    out = capsys.readouterr().out
    assert "\r" not in out
    assert out.endswith("\n")
    lines = out.splitlines()
    assert len(lines) == 4  # a line at each quarter of 4 steps
    assert all(line.startswith("run x") for line in lines)
    assert "4/4" in lines[-1]


def test_no_progress_prints_nothing(setup, batches, capsys):
    train(setup, batches, steps=2)
    assert capsys.readouterr().out == ""


class FakeProfiler:
    def __init__(self):
        self.calls = 0

    def step(self):
        self.calls += 1


def test_profiler_step_called_once_per_step(setup, batches):
    prof = FakeProfiler()
    train(setup, batches, steps=3, warmup=2, profiler=prof)
    assert prof.calls == 5


def test_profiler_step_after_each_hook(setup, batches):
    events: list[str] = []

    class Recorder:
        def step(self):
            events.append("profiler")

    train(setup, batches, steps=2, on_step=lambda s: events.append(f"step {s.index}"), profiler=Recorder())
    assert events == ["step 0", "profiler", "step 1", "profiler"]


def test_train_rejects_non_setup(batches):
    with pytest.raises(TypeError, match=r"setup must be a mentor.train.Setup from build_setup\(\), not dict"):
        train({}, batches, steps=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=0), r"steps must be an int >= 1, got 0"),
    (dict(steps=True), r"steps must be an int >= 1, got True"),
    (dict(steps=1.5), r"steps must be an int >= 1, got 1.5"),
    (dict(steps=1, warmup=-1), r"warmup must be an int >= 0, got -1"),
    (dict(steps=1, report_every=-2), r"report_every must be an int >= 0, got -2"),
    (dict(steps=1, report_every=2), r"report_every is set but on_report is None"),
])
def test_train_rejects_bad_counts(setup, batches, kwargs, message):
    with pytest.raises(ValueError, match=message):
        train(setup, batches, **kwargs)


@pytest.mark.parametrize("hook", ["on_step", "on_report"])
def test_train_rejects_non_callable_hooks(setup, batches, hook):
    with pytest.raises(TypeError, match=f"{hook} must be callable or None, not int"):
        train(setup, batches, steps=1, **{hook: 3})


def test_train_with_too_few_batches_says_so(setup):
    batch = next(device_batches(2, 32, NUM_CLASSES))
    with pytest.raises((ValueError, RuntimeError), match="batch"):
        train(setup, [batch], steps=2)


def test_run_stats_from_a_list():
    stats = RunStats([1.0, 4.0, 2.0], batch_size=4, device="cpu")
    assert stats.step_ms == [1.0, 4.0, 2.0]
    assert stats.median_ms == 2.0
    assert stats.images_per_s == 4 * 1000.0 / 2.0  # batch over median seconds
    assert repr(stats) == "RunStats(3 steps, median 2.00 ms, batch 4)"
