"""mentor.lab.baselines: the buffered set gives the values of an update at every step; every-n updates the n-th
steps; the grouped set groups; bad input named."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mentor.lab.baselines import DeviceBuffer, buffered_config, every_n_config, fair_baselines, grouped_config
from mentor.lab.configs import Config, metrics_config
from mentor.lab.train import Step

C = 5


def _steps(seed: int, count: int, batch: int) -> list[Step]:
    gen = torch.Generator().manual_seed(seed)
    return [Step(k, torch.empty(0), torch.randint(0, C, (batch,), generator=gen), torch.randn(batch, C, generator=gen),
                 torch.rand((), generator=gen) * 3, 0.0) for k in range(count)]


def _run(config: Config, steps: list[Step], reports: set[int]) -> list[dict]:
    on_step, on_report = config.make()
    out = []
    for s in steps:
        on_step(s)
        if s.index in reports:
            out.append(on_report(s.index))
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 12), n=st.integers(1, 5), batch=st.integers(1, 4),
       reports=st.sets(st.integers(0, 11), max_size=4))
def test_buffered_reports_what_an_update_at_every_step_reports(seed, count, n, batch, reports):
    steps = _steps(seed, count, batch)
    reports = {r for r in reports if r < count} | {count - 1}
    plain = _run(metrics_config("optimized", C, "cpu"), steps, reports)
    buffered = _run(buffered_config(C, "cpu", n), steps, reports)
    assert [r["step"] for r in buffered] == [r["step"] for r in plain]
    for got, want in zip(buffered, plain):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key


def test_the_buffer_updates_once_per_n_steps_and_at_a_flush():
    from mentor.lab.metric_sets import metric_set

    ms = metric_set("optimized", num_classes=C)
    calls = []
    real = ms.update
    ms.update = lambda *a: (calls.append(a[0].numel()), real(*a))  # type: ignore[method-assign]
    buffer = DeviceBuffer(ms, n=3)
    for s in _steps(0, 7, 2):
        buffer.push(s.loss, s.output, s.labels)
    assert calls == [3, 3] and buffer.held == 1
    buffer.flush()
    buffer.flush()  # nothing held: no update
    assert calls == [3, 3, 1] and buffer.held == 0


def test_every_n_updates_the_nth_steps_and_reports_as_the_set_does():
    seen, reported = [], []
    counted = Config("counted", lambda: (lambda s: seen.append(s), reported.append))
    config = every_n_config(counted, 4)
    assert config.name == "counted, every 4" and "one step in 4" in config.description
    on_step, on_report = config.make()
    for k in range(10):
        on_step(k)
    on_report(10)
    assert seen == [3, 7] and reported == [10]
    assert every_n_config(Config("none"), 2).make()[0](0) is None  # a configuration without an update


def test_grouped_config_groups_the_four_scores_at_the_first_update():
    on_step, on_report = grouped_config(C, "cpu").make()
    step = _steps(1, 1, 3)[0]
    on_step(step)
    owner = on_step.__closure__  # the LossAndScores the hook updates
    ms = next(c.cell_contents for c in owner if hasattr(c.cell_contents, "scores"))
    assert ms.scores._enable_compute_groups and len(ms.scores.compute_groups) == 1
    assert sorted(ms.scores.compute_groups[0]) == ["accuracy", "f1_score", "precision", "recall"]
    assert on_report(0)["step"] == 0


def test_fair_baselines_names():
    assert [c.name for c in fair_baselines(C, "cpu", n=7)] == [
        "optimized, grouped", "optimized, every 7", "optimized, buffered 7"]


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3"])
def test_n_must_be_a_positive_int(n):
    with pytest.raises(ValueError, match=r"n must be an int >= 1 \(update every n steps\), got"):
        buffered_config(C, "cpu", n)
    with pytest.raises(ValueError, match=r"n must be an int >= 1"):
        every_n_config(Config("x"), n)


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match=r"config must be a mentor.lab.configs.Config, not str"):
        every_n_config("optimized", 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"metrics must be a mentor.lab.metric_sets.LossAndScores"):
        DeviceBuffer(object(), 2)  # type: ignore[arg-type]
    from mentor.lab.metric_sets import metric_set

    buffer = DeviceBuffer(metric_set("optimized", num_classes=C), n=3)
    buffer.push(torch.tensor(1.0), torch.randn(2, C), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"holds steps of logits \(2, 5\) and labels \(2,\); got \(3, 5\) and \(3,\)"):
        buffer.push(torch.tensor(1.0), torch.randn(3, C), torch.tensor([0, 1, 2]))


def _made_metrics(config: Config):
    """The LossAndScores a configuration's step hook updates (in the hook's closure, or the buffer's)."""
    on_step, _ = config.make()
    for cell in on_step.__closure__ or ():
        value = cell.cell_contents
        if hasattr(value, "scores"):
            return value
        if hasattr(value, "metrics"):
            return value.metrics
    raise AssertionError("no metric set in the hook")


@pytest.mark.parametrize("make", [lambda: grouped_config(7, "meta"), lambda: buffered_config(7, "meta", 3),
                                  lambda: fair_baselines(7, "meta")[0], lambda: fair_baselines(7, "meta")[2]])
def test_the_metrics_are_made_on_the_device_and_with_the_classes_asked_for(make):
    ms = _made_metrics(make())
    assert ms.loss.mean_value.device.type == "meta"
    assert all(m.num_classes == 7 for m in ms.scores.values())


def test_descriptions_say_what_each_baseline_does():
    grouped, every, buffered = fair_baselines(C, "cpu", n=4)
    assert grouped.description == ("the optimized set in a MetricCollection with torchmetrics' default "
                                   "compute_groups=True (accuracy, precision, recall and F1 share one update)")
    assert every.description == "optimized, updated at one step in 4 only: a sample of the steps, not the same values"
    assert buffered.description == ("the optimized set, its inputs buffered on the device and updated once every 4 "
                                    "steps (and at each report): the same values in fewer updates")


def test_a_change_of_labels_alone_is_refused_and_a_bad_set_named():
    from mentor.lab.metric_sets import metric_set

    buffer = DeviceBuffer(metric_set("optimized", num_classes=C), n=3)
    buffer.push(torch.tensor(1.0), torch.randn(2, C), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"got \(2, 5\) and \(1, 2\)"):
        buffer.push(torch.tensor(1.0), torch.randn(2, C), torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match=r"LossAndScores \(metric_set\(\.\.\.\)\), not object\.$"):
        DeviceBuffer(object(), 2)  # type: ignore[arg-type]
