"""mentor.lab.compiled_step: the report of a metric update inside a compiled step, pinned on tiny steps traced with
dynamo's eager backend (graph breaks, recompiles, equality with eager); on CUDA (``@gpu``) the book's step."""

from __future__ import annotations

import pytest
import torch

from marks import gpu
from mentor.lab.compiled_step import StepReport, step_report
from mentor.suite import FusedMetrics

BATCHES = [(torch.tensor([[2.0, 0.0, 1.0], [0.0, 1.0, 3.0]]), torch.tensor([0, 1])),
           (torch.tensor([[0.0, 5.0, 1.0], [4.0, 1.0, 0.0]]), torch.tensor([1, 2]))]


def _plain(x, y):
    return x.sum(), x


def test_an_update_inside_traces_once_and_equals_eager():
    torch._dynamo.reset()
    metric, reference = FusedMetrics(3), FusedMetrics(3)

    def step(x, y):
        metric.update(x.sum(), x, y)
        return x.sum(), x

    report = step_report(torch.compile(step, backend="eager"), torch.compile(_plain, backend="eager"), metric,
                         reference, BATCHES, train=lambda out: None, steps=3, warmup=2)
    assert report == StepReport(5, 0, 0, 0, None, None, True)
    assert metric.tp.tolist() == [1 * 3, 1 * 2, 0] and int(metric.loss_count) == 5


SCALE = 1


def test_a_break_a_recompile_and_a_difference_are_reported():
    torch._dynamo.reset()
    metric, reference = FusedMetrics(3), FusedMetrics(3)

    def step(x, y):
        global SCALE
        SCALE += 1  # a global int that changes at every call: dynamo guards on its value and recompiles
        metric.update(x.sum(), x, y)
        return x.sum() * SCALE, x  # the reference sums the scaled losses: not equal

    report = step_report(torch.compile(step, backend="eager"), torch.compile(_plain, backend="eager"), metric,
                         reference, BATCHES, train=lambda out: None, steps=3, warmup=2)
    assert (report.graph_breaks, report.recompiles, report.equal_to_eager) == (0, 3, False)


def test_graph_breaks_are_counted():
    torch._dynamo.reset()
    metric, reference = FusedMetrics(3), FusedMetrics(3)

    def step(x, y):
        metric.update(x.sum(), x, y)
        torch._dynamo.graph_break()
        return x.sum(), x

    report = step_report(torch.compile(step, backend="eager"), torch.compile(_plain, backend="eager"), metric,
                         reference, BATCHES, train=lambda out: None, steps=3, warmup=2)
    assert (report.graph_breaks, report.recompiles, report.equal_to_eager) == (1, 0, True)


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps must be an int >= 1, got 0."),
    ({"warmup": 0}, r"warmup must be an int >= 1 \(the first call compiles\), got 0."),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        step_report(_plain, _plain, FusedMetrics(3), FusedMetrics(3), BATCHES, train=lambda out: None, **kwargs)


def test_no_batches_is_refused():
    with pytest.raises(ValueError, match=r"batches is empty: pass at least one \(images, labels\) batch."):
        step_report(_plain, _plain, FusedMetrics(3), FusedMetrics(3), [], train=lambda out: None)


def test_the_table():
    assert StepReport(4, 1, 2, 0, None, None, False).table().splitlines()[-3:] == [
        "launches per step, with update  n/a (CPU)", "launches per step, without      n/a (CPU)",
        "states equal to eager              no"]
