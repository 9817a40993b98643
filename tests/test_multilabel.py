"""mentor.multilabel.FusedMultilabel against torchmetrics 1.9.0's Multilabel{Accuracy, Precision, Recall, F1Score}
for every average (hypothesis, on the CPU): dtypes, layouts, thresholds, ignore_index, zero_division, ties, NaN and
infinite logits; what multilabel accuracy and macro mean; invalid targets; bad input; two gloo ranks. On CUDA
(``@gpu``): equal to torchmetrics and the plain path, one kernel and no sync per update, a step compiled with
``reduce-overhead`` (CUDA graphs) without a graph break."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchmetrics.classification import (MultilabelAccuracy, MultilabelExactMatch, MultilabelF1Score,
                                         MultilabelPrecision, MultilabelRecall)

from marks import gpu
from mentor import _threshold_kernel as kernel
from mentor.binary import FusedBinary
from mentor.flat_sync import flat_sync
from mentor.multilabel import AVERAGES, FusedMultilabel
from mentor.syncs import sync_guard
import ranks
from ranks import short_gloo_group
from test_binary import ANY_THRESHOLD, COUNTS, FEW_THRESHOLDS, _cuda, assert_same, mean_loss, settings_and_steps

MULTILABEL = {"accuracy": MultilabelAccuracy, "precision": MultilabelPrecision, "recall": MultilabelRecall,
              "f1": MultilabelF1Score}


def multilabel_reference(num_labels, threshold, ignore_index, zero_division, steps,
                         per_label=False) -> dict[str, torch.Tensor]:
    """torchmetrics' MeanMetric and Multilabel* metrics over the same steps, keyed as FusedMultilabel's compute()."""
    device = steps[0][1].device
    metrics = {}
    for name, cls in MULTILABEL.items():
        kwargs = {} if name == "accuracy" else {"zero_division": zero_division}
        for average in (*AVERAGES, "none"):
            metrics[name, average] = cls(num_labels, threshold=threshold, average=average, ignore_index=ignore_index,
                                         **kwargs).to(device)
    for _, preds, target in steps:
        for metric in metrics.values():
            metric.update(preds, target.long())
    out = {"loss": mean_loss([loss for loss, _, _ in steps])}
    for name in MULTILABEL:
        for average in AVERAGES:
            out[f"{name}_{average}"] = metrics[name, average].compute()
        if per_label:
            out[f"{name}_per_label"] = metrics[name, "none"].compute()
    out["invalid_labels"] = torch.tensor(0, device=device)
    return out


@st.composite
def multilabel_cases(draw, rows=st.integers(1, 20), thresholds=ANY_THRESHOLD):
    """(num_labels, per_label, threshold, ignore_index, zero_division, inputs, steps) with (N, num_labels) steps."""
    num_labels = draw(st.integers(2, 7))
    steps = draw(settings_and_steps(st.tuples(rows, st.just(num_labels)), thresholds))
    return (num_labels, draw(st.booleans()), *steps)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multilabel_cases())
def test_equals_torchmetrics_for_every_score_and_average(case):
    num_labels, per_label, threshold, ignore_index, zero_division, inputs, steps = case
    metric = FusedMultilabel(num_labels, threshold, ignore_index=ignore_index, zero_division=zero_division,
                             inputs=inputs, per_label=per_label)
    for step in steps:
        metric.update(*step)
    want = multilabel_reference(num_labels, threshold, ignore_index, zero_division, steps, per_label)
    assert_same(metric.compute(), want)


def test_accuracy_counts_decisions_with_true_negatives_not_exact_matches():
    """Two samples of three labels: 5 of the 6 decisions are right, so accuracy is 5/6, where the exact match (every
    label of a sample right) is 1/2; a label never positive is right by its true negatives."""
    probs = torch.tensor([[0.9, 0.1, 0.2], [0.8, 0.7, 0.1]])
    target = torch.tensor([[1, 0, 0], [1, 0, 0]])
    metric = FusedMultilabel(3, inputs="probs", per_label=True)
    metric.update(torch.tensor(0.0), probs, target)
    out = metric.compute()
    assert out["accuracy_micro"].item() == pytest.approx(5 / 6)
    assert out["accuracy_per_label"].tolist() == [1.0, 0.5, 1.0]
    assert out["accuracy_macro"].item() == pytest.approx(5 / 6)
    assert out["accuracy_weighted"].item() == 1.0  # only label 0 has support, and it is always right
    assert MultilabelExactMatch(3)(probs, target).item() == 0.5


@pytest.mark.parametrize("zero_division", [0, 1])
def test_macro_averages_over_every_label_even_one_never_seen(zero_division):
    """Label 2 is never a target nor a prediction: its precision, recall and F1 are zero_division and macro still
    counts it (torchmetrics' multiclass macro would leave such a class out)."""
    probs = torch.tensor([[0.9, 0.1, 0.2], [0.8, 0.7, 0.1]])
    target = torch.tensor([[1, 1, 0], [1, 1, 0]])
    metric = FusedMultilabel(3, inputs="probs", zero_division=zero_division, per_label=True)
    metric.update(torch.tensor(0.0), probs, target)
    out = metric.compute()
    assert out["precision_per_label"].tolist() == [1.0, 1.0, float(zero_division)]
    assert out["recall_macro"].item() == pytest.approx((1.0 + 0.5 + zero_division) / 3)
    assert_same(out, multilabel_reference(3, 0.5, None, zero_division, [(torch.tensor(0.0), probs, target)], True))


def test_one_label_equals_the_binary_metric_on_that_column():
    gen = torch.Generator().manual_seed(0)
    steps = [(torch.rand((), generator=gen), torch.randn(16, 1, generator=gen),
              torch.randint(0, 2, (16, 1), generator=gen)) for _ in range(3)]
    single, binary = FusedMultilabel(1, threshold=0.6), FusedBinary(threshold=0.6)
    for loss, preds, target in steps:
        single.update(loss, preds, target)
        binary.update(loss, preds[:, 0], target[:, 0])
    got, want = single.compute(), binary.compute()
    for score in ("accuracy", "precision", "recall", "f1"):
        for average in AVERAGES:
            assert got[f"{score}_{average}"].item() == want[score].item(), (score, average)


def test_invalid_targets_make_every_value_nan_and_are_counted():
    metric = FusedMultilabel(3, ignore_index=-100, per_label=True)
    metric.update(torch.tensor(0.5), torch.randn(2, 3), torch.tensor([[1, 0, -100], [2, -1, 1]]))
    out = metric.compute()
    assert out["invalid_labels"].item() == 2
    assert all(torch.isnan(value).all() for key, value in out.items() if key != "invalid_labels")
    assert int(metric.tp.sum() + metric.fp.sum() + metric.tn.sum() + metric.fn.sum()) == 3
    with pytest.raises(RuntimeError, match="Detected the following values in `target`"):
        MultilabelAccuracy(3, ignore_index=-100)(torch.randn(2, 3), torch.tensor([[1, 0, -100], [2, -1, 1]]))


def test_counts_per_label_across_updates_and_reset():
    metric = FusedMultilabel(2, inputs="probs")
    metric.update(torch.tensor(1.0), torch.tensor([[0.7, 0.2], [0.4, 0.9]]), torch.tensor([[1, 1], [0, 1]]))
    metric.update(torch.tensor(3.0), torch.tensor([[0.6, 0.6]]), torch.tensor([[0, 0]]))
    assert (metric.tp.tolist(), metric.fp.tolist(), metric.tn.tolist(), metric.fn.tolist()) == (
        [1, 1], [1, 1], [1, 0], [0, 1])
    assert metric.compute()["loss"].item() == 2.0
    held = metric.tp
    metric.reset()
    assert metric.tp is held and held.tolist() == [0, 0] and int(metric.loss_count) == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"num_labels": 0}, "num_labels must be an int of at least 1 (the number of labels, the width of preds), got 0."),
    ({"num_labels": -2}, "num_labels must be an int of at least 1"),
    ({"num_labels": True}, "num_labels must be an int of at least 1"),
    ({"num_labels": 2.0}, "num_labels must be an int of at least 1"),
    ({"num_labels": 3, "per_label": "yes"}, "per_label must be True or False, got 'yes'."),
    ({"num_labels": 3, "threshold": 1.0}, "threshold must be a float strictly between 0 and 1"),
    ({"num_labels": 3, "inputs": "sigmoid"}, "inputs must be 'logits'"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError) as error:
        FusedMultilabel(**kwargs)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("preds_shape, target_shape", [((4,), (4,)), ((4, 2), (4, 2)), ((4, 3), (4, 3, 1)),
                                                       ((4, 3, 2), (4, 3, 2)), ((4, 3), (5, 3))])
def test_shapes_other_than_n_by_num_labels_are_refused(preds_shape, target_shape):
    metric = FusedMultilabel(3)
    with pytest.raises(ValueError) as error:
        metric.update(torch.tensor(0.5), torch.zeros(preds_shape), torch.zeros(target_shape, dtype=torch.long))
    assert str(error.value) == (f"preds and target must both have shape (N, num_labels) = (N, 3), got preds of shape "
                                f"{preds_shape} and target of shape {target_shape}.")


def multilabel_on_a_shard(rank: int, world_size: int) -> dict[str, list[float]]:
    """Worker: flat_sync(FusedMultilabel) with this rank's steps; compute() syncs both ranks in one all-reduce."""
    gen = torch.Generator().manual_seed(2)
    steps = [(torch.tensor(i / 4), torch.randn(10, 4, generator=gen), torch.randint(0, 2, (10, 4), generator=gen))
             for i in range(4)]
    metric = flat_sync(FusedMultilabel)(4, per_label=True, process_group=short_gloo_group())
    for step in steps[rank::world_size]:
        metric.update(*step)
    return {key: value.reshape(-1).tolist() for key, value in metric.compute().items()}


MULTILABEL_ON_A_SHARD_KEY = ranks.on_two_ranks(multilabel_on_a_shard)


def test_two_gloo_ranks_equal_torchmetrics_on_all_the_data():
    gen = torch.Generator().manual_seed(2)
    steps = [(torch.tensor(i / 4), torch.randn(10, 4, generator=gen), torch.randint(0, 2, (10, 4), generator=gen))
             for i in range(4)]
    want = {k: v.reshape(-1).tolist() for k, v in multilabel_reference(4, 0.5, None, 0, steps, True).items()}
    results = ranks.results(MULTILABEL_ON_A_SHARD_KEY)
    assert [r.error for r in results] == [None, None]
    assert [r.value for r in results] == [want, want]


# On CUDA.

@gpu
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(multilabel_cases(rows=st.integers(0, 300), thresholds=FEW_THRESHOLDS))
def test_on_cuda_equals_torchmetrics_and_the_plain_path(case):
    num_labels, per_label, threshold, ignore_index, zero_division, inputs, steps = case
    steps = _cuda(steps)  # strides and storage offsets kept
    made = [FusedMultilabel(num_labels, threshold, ignore_index=ignore_index, zero_division=zero_division,
                            inputs=inputs, per_label=per_label).cuda() for _ in range(2)]
    fused, plain = made
    for step in steps:
        fused.update(*step)
        plain._plain_update(*step)
    for name in COUNTS:
        assert torch.equal(getattr(fused, name), getattr(plain, name)), name
    shown = [step for step in steps if step[1].shape[0]]  # torchmetrics refuses an empty batch
    if shown:
        want = multilabel_reference(num_labels, threshold, ignore_index, zero_division, shown, per_label)
        want["loss"] = mean_loss([loss for loss, _, _ in steps])
        assert_same(fused.compute(), want)


def _batch(n: int = 32, labels: int = 10, seed: int = 0, dtype=torch.float32):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand((), device="cuda", generator=gen),
            (torch.randn(n, labels, device="cuda", generator=gen) * 2).to(dtype),
            torch.randint(0, 2, (n, labels), device="cuda", generator=gen))


@gpu
@pytest.mark.parametrize("n, labels", [(32, 10), (32, 3000), (4096, 7)])
def test_on_cuda_one_kernel_and_no_sync_per_update(n, labels):
    from mentor.lab.update_cost import _gpu_ops

    metric = FusedMultilabel(labels, ignore_index=-1).cuda()
    batch = _batch(n, labels)
    metric.update(*batch)
    torch.cuda.synchronize()
    assert _gpu_ops(lambda: metric.update(*batch), 10) == (1, 0)
    with sync_guard(strict=True) as report:
        for seed in range(10):
            metric.update(*batch)
        metric.compute()
    assert report.count == 0
    (run,) = metric._launchers.values()
    assert isinstance(run, kernel.ThresholdLauncher) and run.bound == 1 and run.direct == 20


@gpu
def test_on_cuda_a_step_compiled_with_reduce_overhead_replays_the_update():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    metric, eager = FusedMultilabel(10, 0.4).cuda(), FusedMultilabel(10, 0.4).cuda()

    def step(loss, preds, target):
        metric.update(loss, preds, target)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for seed in range(8):
        batch = _batch(seed=seed)
        torch.compiler.cudagraph_mark_step_begin()
        compiled(*batch)
        eager.update(*batch)
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["cudagraph_skips"] == 0
    for name in COUNTS:
        assert torch.equal(getattr(metric, name), getattr(eager, name)), name
    assert_same(metric.compute(), eager.compute())
    metric.reset()  # in place: the recorded graph keeps counting into the same memory
    torch.compiler.cudagraph_mark_step_begin()
    compiled(*_batch(seed=9))
    assert int(metric.loss_count) == 1
    assert int(metric.tp.sum() + metric.fp.sum() + metric.tn.sum() + metric.fn.sum()) == 320
    assert math.isfinite(metric.compute()["f1_macro"].item())
