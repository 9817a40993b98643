"""mentor.invalid: the invalid-label error, its check of a read report, the keys that hold a count, and the NaN
values chosen on the device (here on the CPU; the CUDA path without a read-back is pinned in test_suite.py and
test_readback.py)."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exact import whole
from mentor.invalid import COUNT_KEY, InvalidLabelsError, check_report, is_count_key, nan_if_invalid

TAIL = (" and were left out of its counts, so every value of that report is NaN; fix the labels, or pass "
        "ignore_index=<the padding label> to the metric to skip them.")


def test_a_clean_report_comes_back_without_its_count_in_order_and_unchanged():
    loss, acc = torch.tensor(0.5), torch.tensor(0.75)
    values = {"loss": loss, "invalid_labels": torch.tensor(0), "accuracy_micro": acc}
    out = check_report(values)
    assert list(out) == ["loss", "accuracy_micro"]
    assert out["loss"] is loss and out["accuracy_micro"] is acc  # the values as given, not copies
    assert "invalid_labels" in values  # the caller's mapping is left as it was
    assert check_report({"loss": 0.25, "invalid_labels": 0.0}) == {"loss": 0.25}
    assert check_report({"train/loss": 0.25, "train/invalid_labels": 0, "val/invalid_labels": 0.0}) == {
        "train/loss": 0.25}


def test_a_nonzero_count_raises_with_the_count_the_range_and_the_fix():
    with pytest.raises(InvalidLabelsError, match=whole(
            "3 prediction(s) or target(s) outside its range (0..num_classes-1 for a multiclass metric, 0 or 1 for a binary or multilabel target) reached the metric since its last reset" + TAIL)):
        check_report({"loss": math.nan, "invalid_labels": 3.0})
    with pytest.raises(InvalidLabelsError, match=whole(
            "1 prediction(s) or target(s) outside 0..9 reached the metric since its last reset (step 12)" + TAIL)):
        check_report({"loss": torch.tensor(math.nan), "invalid_labels": torch.tensor(1)}, step=12, num_classes=10)


def test_several_counts_are_named_with_theirs_and_summed():
    values = {"train/loss": math.nan, "train/invalid_labels": 2.0, "val/loss": 0.5, "val/invalid_labels": 0.0,
              "test_invalid_labels_x": 5.0}
    with pytest.raises(InvalidLabelsError) as caught:
        check_report(values, step=4)
    error = caught.value
    assert (error.count, error.step, error.counts, error.num_classes) == (
        7, 4, {"train/invalid_labels": 2, "test_invalid_labels_x": 5}, None)
    assert str(error) == ("7 prediction(s) or target(s) outside its range (0..num_classes-1 for a multiclass metric, 0 or 1 for a binary or multilabel target) reached the metric since its last "
                          "reset (step 4, train/invalid_labels: 2, test_invalid_labels_x: 5)" + TAIL)
    assert isinstance(error, ValueError)  # what compute() used to raise: except ValueError still catches it


def test_a_nan_count_is_not_zero():
    with pytest.raises(InvalidLabelsError) as caught:
        check_report({"invalid_labels": math.nan})
    assert math.isnan(caught.value.count) and list(caught.value.counts) == ["invalid_labels"]


@pytest.mark.parametrize("key, counts", [
    ("invalid_labels", True), ("train/invalid_labels", True), ("train_invalid_labels", True),
    ("suite.invalid_labels", True), ("invalid_labels_val", True), ("train/a_invalid_labels_x", True),
    ("valid_labels", False), ("xinvalid_labels", False), ("invalid_labelsx", False), ("invalid_label", False),
    ("Invalid_Labels", False), ("invalid_labels2", False), ("loss", False),
])
def test_a_count_key_has_invalid_labels_as_a_whole_word(key, counts):
    assert is_count_key(key) is counts


@pytest.mark.parametrize("values, error, message", [
    ({"loss": 0.5}, ValueError,
     "check_report checks the invalid-label count that FusedMetrics.compute() returns under 'invalid_labels'; these "
     "values have none (keys: ['loss']): pass the whole report."),
    ([("invalid_labels", 0)], TypeError,
     "check_report takes the report as a mapping of name -> value (compute()'s dict, or the values read from it), "
     "not list."),
    ({"invalid_labels": "0"}, TypeError,
     "'invalid_labels' must be the invalid-label count, a number or a one-element tensor, not str."),
    ({"invalid_labels": False}, TypeError,
     "'invalid_labels' must be the invalid-label count, a number or a one-element tensor, not bool."),
    ({"invalid_labels": torch.zeros(2)}, ValueError,
     "'invalid_labels' must hold one number (the invalid-label count), not a tensor of shape (2,)."),
])
def test_what_is_not_a_report_is_refused_by_name(values, error, message):
    with pytest.raises(error, match=whole(message)):
        check_report(values)


def test_the_error_pickles_with_its_fields():
    error = InvalidLabelsError({"train/invalid_labels": 2}, step=3, num_classes=5)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is InvalidLabelsError
    assert (copy.counts, copy.count, copy.step, copy.num_classes, str(copy)) == (
        {"train/invalid_labels": 2}, 2, 3, 5, str(error))
    assert InvalidLabelsError(4).counts == {COUNT_KEY: 4}


@settings(max_examples=80, deadline=None)
@given(counts=st.dictionaries(st.sampled_from(["invalid_labels", "a/invalid_labels", "b_invalid_labels_c"]),
                              st.integers(0, 3), min_size=1),
       others=st.dictionaries(st.sampled_from(["loss", "a/f1_macro", "valid_labels"]), st.floats(allow_nan=False)))
def test_it_raises_exactly_when_a_count_is_nonzero_and_else_returns_the_rest(counts, others):
    values = {**others, **{k: float(v) for k, v in counts.items()}}
    bad = {k: v for k, v in counts.items() if v}
    if bad:
        with pytest.raises(InvalidLabelsError) as caught:
            check_report(values)
        assert caught.value.counts == bad and caught.value.count == sum(bad.values())
    else:
        assert check_report(values) == others


# --- nan_if_invalid: the device side ---

def test_a_nonzero_count_makes_every_value_nan_and_a_zero_count_leaves_them_exact():
    values = {"loss": torch.tensor(0.5), "per_class": torch.tensor([1.0, 0.25, 0.0]),
              "wide": torch.tensor(1 / 3, dtype=torch.float64), "half": torch.tensor(0.75, dtype=torch.bfloat16)}
    bad = nan_if_invalid(values, torch.tensor(2))
    assert list(bad) == ["loss", "per_class", "wide", "half", "invalid_labels"]
    assert all(torch.isnan(bad[k]).all() for k in values) and bad["invalid_labels"].item() == 2
    assert [bad[k].dtype for k in values] == [torch.float32, torch.float32, torch.float64, torch.bfloat16]
    assert bad["per_class"].shape == (3,)
    good = nan_if_invalid(values, torch.tensor(0))
    for key, value in values.items():
        assert good[key].dtype == value.dtype and torch.equal(good[key], value), key
    assert good["invalid_labels"].item() == 0


def test_an_integer_value_becomes_a_float_to_hold_nan():
    out = nan_if_invalid({"seen": torch.tensor(7)}, torch.tensor(1))
    assert out["seen"].dtype == torch.get_default_dtype() and math.isnan(out["seen"].item())
    assert nan_if_invalid({"seen": torch.tensor(7)}, torch.tensor(0))["seen"].tolist() == 7.0


def test_infinities_and_nans_of_a_clean_report_pass_unchanged():
    out = nan_if_invalid({"a": torch.tensor([math.inf, -math.inf, math.nan, -0.0])}, torch.tensor(0))
    got = out["a"].tolist()
    assert got[:2] == [math.inf, -math.inf] and math.isnan(got[2]) and math.copysign(1, got[3]) == -1


@pytest.mark.parametrize("values, count, error, message", [
    ({"loss": torch.tensor(0.5)}, torch.tensor(1.0), TypeError,
     "count must be a 0-dim integer tensor (the invalid-label count), not torch.float32 of shape ()."),
    ({"loss": torch.tensor(0.5)}, torch.tensor([1]), TypeError,
     "count must be a 0-dim integer tensor (the invalid-label count), not torch.int64 of shape (1,)."),
    ({"loss": torch.tensor(0.5)}, 1, TypeError, "count must be a 0-dim integer tensor (the invalid-label count), "
                                                "not int."),
    ({"loss": 0.5}, torch.tensor(0), TypeError, "value 'loss' is a float; pass the tensors compute() made, unread."),
    ({"invalid_labels": torch.tensor(0)}, torch.tensor(0), ValueError,
     "values already hold 'invalid_labels'; pass the values without it and the count as count."),
])
def test_nan_if_invalid_refuses_bad_arguments_by_name(values, count, error, message):
    with pytest.raises(error, match=whole(message)):
        nan_if_invalid(values, count)
