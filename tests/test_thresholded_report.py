"""The report of FusedBinary and FusedMultilabel (mentor._thresholded.ThresholdedMetric): compute() in a fixed
number of operations whatever the number of labels, reset() in one, values that outlive a reset, torchmetrics'
warning and cache kept, values equal to torchmetrics' for counts beyond float32's integers and for more labels than
a CPU sums on one thread, under a float64 default dtype too. On CUDA (``@gpu``): every value equal to torchmetrics'
to the bit, and no sync per report."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.classification import (BinaryAccuracy, BinaryF1Score, BinaryPrecision, BinaryRecall,
                                         MultilabelAccuracy, MultilabelF1Score, MultilabelPrecision,
                                         MultilabelRecall)

from marks import gpu
from mentor.binary import FusedBinary
from mentor.multilabel import AVERAGES, FusedMultilabel
from test_binary import assert_same
from test_multilabel import multilabel_reference
from test_suite import _operations

SCORES = ("accuracy", "precision", "recall", "f1")
BINARY = dict(zip(SCORES, (BinaryAccuracy, BinaryPrecision, BinaryRecall, BinaryF1Score)))
MULTILABEL = dict(zip(SCORES, (MultilabelAccuracy, MultilabelPrecision, MultilabelRecall, MultilabelF1Score)))
COUNTS = ("tp", "fp", "tn", "fn")


def _updated(num_labels: int | None, device: str = "cpu", **kwargs) -> FusedBinary | FusedMultilabel:
    """A FusedBinary (``num_labels=None``) or FusedMultilabel updated with one batch of 8 rows."""
    shape = (8,) if num_labels is None else (8, num_labels)
    metric = (FusedBinary(**kwargs) if num_labels is None else FusedMultilabel(num_labels, **kwargs)).to(device)
    gen = torch.Generator().manual_seed(0)
    metric.update(torch.tensor(0.5, device=device), torch.randn(shape, generator=gen).to(device),
                  torch.randint(0, 2, shape, generator=gen).to(device))
    return metric


# CPU non-view aten operations (tests/test_suite.py's _operations) of one compute(), torchmetrics' wrapper included.
# Before the scores were made from one table: 44 for FusedBinary, 154 for FusedMultilabel (158 with per_label=True),
# one operation or more per score and average, and torchmetrics' clone of every value.
@pytest.mark.parametrize("cls, kwargs, expected", [
    (FusedBinary, {}, 18), (FusedBinary, {"zero_division": 1}, 20),
    (FusedMultilabel, {}, 39), (FusedMultilabel, {"per_label": True}, 39), (FusedMultilabel, {"zero_division": 1}, 41),
])
def test_compute_makes_as_many_operations_with_3_labels_as_with_1000(cls, kwargs, expected):
    counts = [len(_operations(_updated(None if cls is FusedBinary else labels, **kwargs).compute))
              for labels in (3, 1000)]
    assert counts == [expected, expected]


@pytest.mark.parametrize("num_labels", [None, 3, 1000])
def test_reset_zeroes_every_state_in_one_operation_and_keeps_its_memory(num_labels):
    """Before: 21 operations (torchmetrics' detach and clone of each of the 7 defaults, then a zero_ of each)."""
    metric = _updated(num_labels)
    before = {name: (getattr(metric, name), getattr(metric, name).data_ptr()) for name in metric._defaults}
    assert metric.loss_count.item() == 1
    assert _operations(metric.reset) == ["aten._foreach_zero_.default"]
    for name, (tensor, address) in before.items():
        assert getattr(metric, name) is tensor and tensor.data_ptr() == address and not tensor.any(), name
    assert not metric.update_called and metric._computed is None


def _batch(num_labels: int | None, seed: int = 1, invalid: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (6,) if num_labels is None else (6, num_labels)
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 2, shape, generator=gen)
    if invalid:
        target.view(-1)[0] = 7
    return torch.randn(shape, generator=gen), target


@pytest.mark.parametrize("num_labels, kwargs", [(None, {}), (3, {"per_label": True}), (1, {"per_label": True})])
def test_values_share_no_memory_with_the_states_and_outlive_a_reset_and_later_updates(num_labels, kwargs):
    metric = FusedBinary(**kwargs) if num_labels is None else FusedMultilabel(num_labels, **kwargs)
    for invalid in (True, False):
        metric.update(torch.tensor(2.0), *_batch(num_labels, invalid=invalid))
        got = metric.compute()
        kept = {key: value.clone() for key, value in got.items()}
        states = {getattr(metric, name).untyped_storage().data_ptr() for name in metric._defaults}
        assert not states & {value.untyped_storage().data_ptr() for value in got.values()}
        assert int(got["invalid_labels"]) == int(invalid) and math.isnan(float(got["loss"])) == invalid
        metric.reset()
        metric.update(torch.tensor(1.0), *_batch(num_labels, seed=2))
        metric.compute()
        for key, value in kept.items():
            assert torch.equal(got[key].nan_to_num(-1.0), value.nan_to_num(-1.0)), key
        metric.reset()


def test_one_label_per_label_values_are_0_dim_as_torchmetrics_squeezes_them():
    out = _updated(1, per_label=True).compute()
    assert all(value.shape == () for value in out.values())


@pytest.mark.parametrize("num_labels", [None, 3])
def test_compute_keeps_torchmetrics_warning_and_cache(num_labels):
    metric = FusedBinary() if num_labels is None else FusedMultilabel(num_labels)
    with pytest.warns(UserWarning, match="called before the ``update`` method"):
        metric.compute()
    metric.update(torch.tensor(1.0), *_batch(num_labels))
    first = metric.compute()
    assert metric.compute() is first  # cached until the next update or reset
    metric.update(torch.tensor(1.0), *_batch(num_labels, seed=3))
    second = metric.compute()
    assert second is not first and metric.compute() is second
    metric.reset()
    with pytest.warns(UserWarning, match="called before the ``update`` method"):
        assert metric.compute() is not second


def _set_counts(metric, counts: dict[str, torch.Tensor]) -> None:
    for name, value in counts.items():
        setattr(metric, name, value.clone())
    metric._update_count = 1


@pytest.mark.parametrize("num_labels", [None, 5, 40000])
@pytest.mark.parametrize("zero_division", [0, 1])
def test_counts_past_float32_integers_and_many_labels_equal_torchmetrics(num_labels, zero_division):
    """Counts up to 2**40 (float32 rounds them: the sums must be taken where torchmetrics takes them, in long or in
    float) with zeros (zero_division), and 40000 labels, more than a 2-thread CPU sums in one piece (a 1-dim sum
    splits past 32768 values): states set directly, compared with torchmetrics' classes given the same states."""
    shape = () if num_labels is None else (num_labels,)
    gen = torch.Generator().manual_seed(5)
    counts = {name: torch.randint(0, 2**40, shape, generator=gen) * (torch.rand(shape, generator=gen) > 0.3)
              for name in COUNTS}
    fused = (FusedBinary(zero_division=zero_division) if num_labels is None
             else FusedMultilabel(num_labels, zero_division=zero_division, per_label=True))
    _set_counts(fused, {**counts, "loss_sum": torch.tensor(3.0), "loss_count": torch.tensor(2)})
    got = fused.compute()
    for name in SCORES:
        kwargs = {} if name == "accuracy" else {"zero_division": zero_division}
        if num_labels is None:
            metric = BINARY[name](**kwargs)
            _set_counts(metric, counts)
            assert torch.equal(got[name], metric.compute()), name
            continue
        for average in (*AVERAGES, "none"):
            metric = MULTILABEL[name](num_labels, average=average, **kwargs)
            _set_counts(metric, counts)
            key = f"{name}_{'per_label' if average == 'none' else average}"
            assert got[key].dtype == metric.compute().dtype and torch.equal(got[key], metric.compute()), key


@pytest.mark.parametrize("per_label", [False, True])
def test_a_float64_default_dtype_gives_torchmetrics_dtypes_and_values(per_label):
    """Under a float64 default, torchmetrics' F1 is float64 (``(1 + beta2) * tp``: a Python float times a long) and
    accuracy, precision and recall float32 (``_safe_divide`` casts to float32); the loss keeps the default dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        steps = [(torch.tensor(0.25), *_batch(4, seed=s)) for s in range(3)]
        fused = FusedMultilabel(4, per_label=per_label)
        binary = FusedBinary()
        for loss, preds, target in steps:
            fused.update(loss, preds, target)
            binary.update(loss, preds[:, 0], target[:, 0])
        want = multilabel_reference(4, 0.5, None, 0, steps, per_label)
        got = fused.compute()
        assert_same(got, want)
        assert got["loss"].dtype == got["f1_macro"].dtype == torch.float64 and got["recall_micro"].dtype == torch.float32
        out = binary.compute()
        assert [out[key].dtype for key in out] == [torch.float64, torch.float32, torch.float32, torch.float32,
                                                   torch.float64, torch.int64]
    finally:
        torch.set_default_dtype(previous)


@gpu
@pytest.mark.parametrize("num_labels", [None, 3, 37, 1000, 40000])
def test_on_cuda_every_value_equals_torchmetrics_to_the_bit_and_a_report_makes_no_sync(num_labels):
    """Micro and per-label scores are elementwise arithmetic, equal by construction. A macro or weighted average is a
    float32 sum over the labels: each of the 8 is summed alone from a row aligned as a new tensor, as torchmetrics sums
    its one (L,) tensor, so CUDA reduces it in the same order (one sum of a (2, 4, L) table would not: on an H100,
    torch 2.11, such a sum differed from the row's own in the last bits for 18 of 80 rows of 1000 labels). Seen
    passing on an H100 with torch 2.11, as a script: 3 to 6 seeds per label count, 2 to 40000 labels."""
    from mentor.measure import update_cost

    fused = (FusedBinary() if num_labels is None else FusedMultilabel(num_labels, per_label=True)).cuda()
    if num_labels is None:
        reference = {name: cls().cuda() for name, cls in BINARY.items()}
    else:
        reference = {f"{name}_{'per_label' if average == 'none' else average}": cls(num_labels, average=average).cuda()
                     for name, cls in MULTILABEL.items() for average in (*AVERAGES, "none")}
    gen = torch.Generator(device="cuda").manual_seed(7)
    shape = (256,) if num_labels is None else (256, num_labels)
    for _ in range(3):
        logits = torch.randn(shape, device="cuda", generator=gen) * 2
        target = (torch.rand(shape, device="cuda", generator=gen) < 0.2).long()  # some labels never positive
        fused.update(torch.tensor(1.0, device="cuda"), logits, target)
        for metric in reference.values():
            metric.update(logits, target)
    got = fused.compute()
    for key, metric in reference.items():
        want = metric.compute()
        assert got[key].dtype == want.dtype and torch.equal(got[key], want), key

    def report():
        fused._computed = None
        fused.compute()

    cost = update_cost("report", report, repeats=5)
    assert cost.syncs == 0, cost
