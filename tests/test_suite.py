"""mentor.suite.FusedMetrics: equal to torchmetrics for every average (hypothesis), invalid labels (NaN values and
their exact count, no read in compute), pickling, two gloo ranks equal to one process, and no graph break under
torch.compile's tracer; on CUDA (``@gpu``, run with `pytest -m gpu`): no sync per update, none per report (update,
compute, DeferredReadback), equal to torchmetrics on the GPU, torch.compile (inductor, and CUDA graphs) with no graph
break and no recompile."""

from __future__ import annotations

import io
import pickle
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

from exact import whole
from marks import gpu
from mentor.invalid import InvalidLabelsError, check_report
from mentor.suite import AVERAGES, SCORES, FusedMetrics, scores
from mentor.syncs import count_syncs
import ranks
from ranks import Attempts, short_gloo_group

TORCHMETRICS = {"accuracy": MulticlassAccuracy, "precision": MulticlassPrecision, "recall": MulticlassRecall,
                "f1": MulticlassF1Score}


def reference(loss_steps, batches, num_classes, ignore_index, zero_division):
    """torchmetrics' MeanMetric and Multiclass* metrics over the same updates: {key: tensor} like FusedMetrics."""
    out = {}
    mean = MeanMetric()
    for loss in loss_steps:
        mean.update(loss)
    out["loss"] = mean.compute()
    for name, cls in TORCHMETRICS.items():
        for average in (*AVERAGES, "none"):
            kwargs = {} if name == "accuracy" else {"zero_division": zero_division}
            metric = cls(num_classes=num_classes, average=average, ignore_index=ignore_index, **kwargs)
            for preds, target in batches:
                metric.update(preds, target)
            out[f"{name}_{'per_class' if average == 'none' else average}"] = metric.compute()
    out["invalid_labels"] = torch.tensor(0)  # every label of these steps is a class or ignore_index
    return out


@st.composite
def steps(draw):
    """1-3 steps of (loss, preds, target) over 2-7 classes; some classes absent, preds as logits or indices,
    an optional ignore_index (padding outside the classes, or one of them)."""
    num_classes = draw(st.integers(2, 7))
    ignore_index = draw(st.sampled_from([None, -100, 0, num_classes - 1]))
    # the labels that occur: a random subset, so that some classes are absent from preds and targets
    labels = draw(st.lists(st.integers(0, num_classes - 1), min_size=1, max_size=num_classes, unique=True))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 24))
        pick = torch.tensor(labels)
        target = pick[torch.randint(len(labels), (n,), generator=gen)]
        if ignore_index is not None:
            target = torch.where(torch.rand(n, generator=gen) < 0.25, torch.tensor(ignore_index), target)
        if draw(st.booleans()):
            preds = torch.randn(n, num_classes, generator=gen)
        else:
            preds = pick[torch.randint(len(labels), (n,), generator=gen)]
        out.append((torch.rand((), generator=gen) * 3, preds, target))
    return num_classes, ignore_index, out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=steps(), zero_division=st.sampled_from([0, 1]))
def test_equals_torchmetrics_for_every_score_and_average(data, zero_division):
    num_classes, ignore_index, batches = data
    suite = FusedMetrics(num_classes, ignore_index=ignore_index, zero_division=zero_division, per_class=True)
    for loss, preds, target in batches:
        suite.update(loss, preds, target)
    got = suite.compute()
    want = reference([b[0] for b in batches], [(b[1], b[2]) for b in batches], num_classes, ignore_index,
                     zero_division)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), (key, got[key], value)


def test_a_known_case_by_hand():
    # 3 classes; class 2 never occurs. preds [0, 0, 1, 1], target [0, 1, 1, 1]:
    # tp = [1, 2, 0], fp = [1, 0, 0], fn = [0, 1, 0]
    suite = FusedMetrics(3, per_class=True)
    suite.update(torch.tensor(2.0), torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1, 1]))
    out = {key: value.tolist() for key, value in suite.compute().items()}
    assert out["loss"] == 2.0
    assert out["precision_per_class"] == [0.5, 1.0, 0.0]
    assert out["recall_per_class"] == pytest.approx([1.0, 2 / 3, 0.0])
    assert out["accuracy_micro"] == 0.75
    assert out["precision_macro"] == 0.75  # (0.5 + 1.0) / 2: the absent class is left out
    assert out["recall_weighted"] == 0.75  # (1 * 1.0 + 3 * 2/3) / 4
    assert out["f1_macro"] == pytest.approx((2 / 3 + 0.8) / 2)


def test_scores_with_zero_division_one_when_nothing_is_predicted():
    s = scores(torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([3, 0]), zero_division=1, per_class=True)
    assert s["precision_per_class"].tolist() == [1.0, 1.0]
    assert s["recall_per_class"].tolist() == [0.0, 1.0]
    assert s["accuracy_per_class"].tolist() == [0.0, 0.0]  # accuracy has no zero_division in torchmetrics
    assert s["precision_micro"].item() == 1.0 and s["recall_micro"].item() == 0.0


def nan_or_value(values) -> dict[str, list]:
    """compute()'s values as lists, each NaN as the string "nan" (NaN != NaN would make any comparison fail)."""
    return {key: ["nan" if v != v else v for v in value.reshape(-1).tolist()] for key, value in values.items()}


def test_out_of_range_labels_make_every_value_nan_and_are_counted_at_compute():
    suite = FusedMetrics(3, ignore_index=-100, per_class=True)
    suite.update(torch.tensor(1.0), torch.tensor([0, 5, 1, 2]), torch.tensor([0, 1, -100, 7]))
    suite.update(torch.tensor(1.0), torch.tensor([-1, 1]), torch.tensor([0, 1]))
    assert suite.invalid_labels.item() == 3  # pred 5, target 7, pred -1; the ignored position is not counted
    assert suite.tp.tolist() == [1, 1, 0] and suite.fp.tolist() == [0, 0, 0] and suite.fn.tolist() == [0, 0, 0]
    computed = suite.compute()  # no error here: compute reads nothing back
    out = {key: value for key, value in computed.items() if key != "invalid_labels"}  # the dict is torchmetrics' cache
    count = computed["invalid_labels"]
    assert (count.dtype, count.shape, count.item()) == (torch.long, (), 3)
    assert nan_or_value(out) == {key: ["nan"] * (3 if key.endswith("per_class") else 1) for key in out}
    assert len(out) == 1 + 4 * 4  # the loss, and 4 scores with 3 averages and per class: all NaN
    assert [out[key].dtype for key in ("loss", "f1_macro", "f1_per_class")] == [torch.float32] * 3
    with pytest.raises(InvalidLabelsError) as caught:  # where the values are read, the error
        check_report(suite.compute(), num_classes=3)
    assert (caught.value.count, caught.value.counts) == (3, {"invalid_labels": 3})
    assert str(caught.value).startswith("3 prediction(s) or target(s) outside 0..2 reached the metric since its last "
                                        "reset and were left out of its counts, so every value of that report is NaN")
    suite.reset()
    suite.update(torch.tensor(1.0), torch.tensor([0]), torch.tensor([0]))
    clean = suite.compute()
    assert (clean["accuracy_micro"].item(), clean["loss"].item(), clean["invalid_labels"].item()) == (1.0, 1.0, 0)
    assert check_report(clean).keys() == out.keys()


def test_the_count_is_a_copy_that_a_reset_leaves_be():
    suite = FusedMetrics(3)
    suite.update(torch.tensor(1.0), torch.tensor([0, 9]), torch.tensor([0, 1]))
    out = suite.compute()
    assert out["invalid_labels"] is not suite.invalid_labels
    suite.reset()
    assert (out["invalid_labels"].item(), suite.invalid_labels.item()) == (1, 0)
    assert torch.isnan(out["loss"]) and torch.isnan(out["accuracy_micro"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=steps(), bad=st.lists(st.tuples(st.booleans(), st.sampled_from([-7, -1, 7, 100])), min_size=1,
                                   max_size=4))
def test_any_invalid_label_makes_every_value_nan_and_the_count_is_exact(data, bad):
    """Labels outside 0..C-1 put into the preds (as indices) or targets of a step: the count equals their number
    (unless the label is ignore_index), and every value is NaN; with none, the values are the clean ones."""
    num_classes, ignore_index, batches = data
    suite = FusedMetrics(num_classes, ignore_index=ignore_index, per_class=True)
    expected = 0
    for loss, preds, target in batches:
        preds = preds.argmax(dim=1) if preds.ndim == 2 else preds.clone()
        target = target.clone()
        for i, (in_target, label) in enumerate(bad[:len(target)]):
            label = label + num_classes if label > 0 else label  # 7 -> C + 7: always outside
            if ignore_index is not None and (target[i] == ignore_index or (in_target and label == ignore_index)):
                continue  # an ignored position is not counted, whatever its prediction
            (target if in_target else preds)[i] = label
            expected += 1
        suite.update(loss, preds, target)
    out = dict(suite.compute())
    assert out.pop("invalid_labels").item() == expected
    if expected:
        assert nan_or_value(out) == {key: ["nan"] * out[key].numel() for key in out}
    else:
        assert all(not torch.isnan(v).any() for k, v in out.items() if k != "loss")


def test_compute_calls_none_of_the_tensor_reads(monkeypatch):
    """On the CPU no read is a sync, so a sync guard sees nothing; instead every Python-level read of a tensor's
    value (the old compute's int(count) among them) is made to fail while compute() runs."""
    suite = FusedMetrics(3, per_class=True)
    suite.update(torch.tensor(1.0), torch.tensor([0, 5, 1]), torch.tensor([0, 1, 1]))

    def read(*args, **kwargs):
        raise AssertionError("compute() read a tensor's value")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, read)
    out = suite.compute()
    monkeypatch.undo()
    assert out["invalid_labels"].item() == 1 and torch.isnan(out["f1_per_class"]).all()


def test_a_nan_loss_makes_the_mean_nan():
    suite = FusedMetrics(2)
    suite.update(torch.tensor(float("nan")), torch.tensor([0]), torch.tensor([0]))
    suite.update(torch.tensor(1.0), torch.tensor([0]), torch.tensor([0]))
    assert torch.isnan(suite.compute()["loss"])


def test_update_is_one_call_with_no_python_branch_on_values():
    # the same update on different values takes the same path: the states change, the number of ops does not
    suite = FusedMetrics(4)
    with torch.autograd.profiler.profile() as first:
        suite.update(torch.tensor(1.0), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3]))
    with torch.autograd.profiler.profile() as second:
        suite.update(torch.tensor(9.0), torch.tensor([3, 3, 9, -4]), torch.tensor([1, 1, 1, 1]))
    assert [e.name for e in first.function_events] == [e.name for e in second.function_events]


@pytest.mark.parametrize("to_bytes", ["pickle", "torch.save"])
def test_pickles_with_its_states(to_bytes):
    suite = FusedMetrics(3, ignore_index=-100, zero_division=1, per_class=True)
    suite.update(torch.tensor(0.5), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]))
    if to_bytes == "pickle":
        copy = pickle.loads(pickle.dumps(suite))
    else:
        buffer = io.BytesIO()
        torch.save(suite, buffer)
        buffer.seek(0)
        copy = torch.load(buffer, weights_only=False)
    assert type(copy) is FusedMetrics
    assert (copy.ignore_index, copy.zero_division, copy.per_class) == (-100, 1.0, True)
    for key, value in suite.compute().items():
        assert torch.equal(copy.compute()[key], value), key


def test_state_dict_round_trip():
    suite = FusedMetrics(3)
    suite.persistent(True)
    suite.update(torch.tensor(0.5), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]))
    other = FusedMetrics(3)
    other.persistent(True)
    other.load_state_dict(suite.state_dict())
    assert other.tp.tolist() == [1, 1, 0] and other.loss_sum.item() == 0.5 and other.loss_count.item() == 1


# Two ranks: top level, so that spawned processes can import it.

def _shards(seed: int, world_size: int):
    gen = torch.Generator().manual_seed(seed)
    steps = [(torch.rand((), generator=gen), torch.randn(16, 5, generator=gen),
              torch.randint(0, 5, (16,), generator=gen)) for _ in range(4)]
    return steps, [steps[r::world_size] for r in range(world_size)]


def suite_on_a_shard(rank: int, world_size: int, seed: int) -> dict[str, list[float]]:
    """Worker: update FusedMetrics with this rank's share of the steps; compute() syncs through torchmetrics."""
    _, shards = _shards(seed, world_size)
    suite = FusedMetrics(5, per_class=True)
    for loss, preds, target in shards[rank]:
        suite.update(loss, preds, target)
    return {key: value.reshape(-1).tolist() for key, value in suite.compute().items()}


SUITE_ON_A_SHARD_KEY = ranks.on_two_ranks(suite_on_a_shard, 7)


def test_two_gloo_ranks_equal_one_process_over_all_the_data():
    steps, _ = _shards(7, 2)
    single = FusedMetrics(5, per_class=True)
    for loss, preds, target in steps:
        single.update(loss, preds, target)
    want = {key: value.reshape(-1).tolist() for key, value in single.compute().items()}
    results = ranks.results(SUITE_ON_A_SHARD_KEY)
    assert [r.error for r in results] == [None, None]
    for r in results:
        assert r.value.keys() == want.keys()
        for key in want:
            assert r.value[key] == pytest.approx(want[key], rel=1e-6), (r.rank, key)
    # and a shard alone differs: the sync is what makes them equal
    alone = FusedMetrics(5, per_class=True, sync_on_compute=False)
    for loss, preds, target in steps[0::2]:
        alone.update(loss, preds, target)
    assert alone.compute()["loss"].item() != pytest.approx(want["loss"][0])


# A call that raises leaves the metric as it was (forward), or unsynced (compute under DDP).

# losses that are exact binary fractions, so that a sum over ranks equals one process's sum whatever its order
GOOD = [(torch.tensor(0.5), torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])),
        (torch.tensor(0.25), torch.tensor([[2.0, 0.5, 0.0], [0.0, 0.5, 3.0]]), torch.tensor([0, 2]))]
BAD = (torch.tensor(1.0), torch.tensor([0, 7]), torch.tensor([0, 1]))  # prediction 7 of 3 classes
FORWARD_FLAGS = ("_update_count", "_computed", "_forward_cache", "_to_sync", "_should_unsync", "_enable_grad",
                 "compute_on_cpu", "_is_synced", "_cache")


def flags(metric) -> dict[str, object]:
    """torchmetrics' bookkeeping of ``metric``: plain values as they are, objects (cached results) by identity."""
    return {name: value if isinstance(value, (bool, int)) else ("object", id(value))
            for name in FORWARD_FLAGS for value in [getattr(metric, name)]}


def values_of(suite) -> dict[str, list[float]]:
    return {key: value.reshape(-1).tolist() for key, value in suite.compute().items()}


@pytest.mark.parametrize("kwargs", [{}, {"dist_sync_on_step": True}, {"compute_on_cpu": True}],
                         ids=["reduce path", "full-state path", "compute_on_cpu"])
@pytest.mark.parametrize("bad, error, message", [
    ((torch.tensor(1.0), torch.zeros(2, 4), torch.tensor([0, 1])), ValueError,
     "logits must have shape (N, num_classes) = (2, 3), got (2, 4)."),
    ((torch.tensor(1.0), torch.tensor([0.0, 1.0]), torch.tensor([0, 1])), ValueError,
     "preds must be logits of shape (2, 3) or integer class indices of shape (2,), got a torch.float32 tensor of "
     "shape (2,)."),
], ids=["bad shape", "float indices"])
def test_a_forward_that_raises_leaves_the_states_and_flags_as_they_were(kwargs, bad, error, message):
    """torchmetrics' forward resets the metric before it updates and computes the batch alone; it raised there and
    kept only the failed batch, with _to_sync left at dist_sync_on_step (False: the next compute would not sync)."""
    reference = FusedMetrics(3, per_class=True, **kwargs)
    suite = FusedMetrics(3, per_class=True, **kwargs)
    for batch in GOOD:
        reference.update(*batch)
        suite.update(*batch)
    states = {name: getattr(suite, name).clone() for name in suite._defaults}
    before = flags(suite)
    with pytest.raises(error, match=whole(message)):
        suite(*bad)
    assert flags(suite) == before
    assert {name: getattr(suite, name).tolist() for name in states} == {n: t.tolist() for n, t in states.items()}
    got = values_of(suite)  # computed from the states: the two good batches' values, exactly
    assert got == values_of(reference)
    # tp = [2, 1, 2], fp = [0, 0, 1], fn = [0, 1, 0]: 5 of 6 right
    assert (got["loss"], got["accuracy_micro"], got["recall_per_class"]) == (
        [0.375], [float(torch.tensor(5 / 6, dtype=torch.float32))], [1.0, 0.5, 1.0])
    # the value cached by that compute() is kept too
    first = suite._computed
    with pytest.raises(error):
        suite(*bad)
    assert suite.compute() is first
    # and a later forward adds its batch as usual
    batch_values = suite(*GOOD[0])
    assert batch_values["loss"].item() == 0.5 and suite._update_count == 3 and suite.loss_sum.item() == 1.25


def test_a_forward_with_an_invalid_label_returns_nan_values_with_its_count_and_adds_the_batch():
    """forward no longer raises for an invalid label: the batch's values are NaN with the batch's count, the batch
    is added (its valid positions counted, the invalid one in the count), and the next compute is NaN too."""
    suite = FusedMetrics(3, per_class=True)
    for batch in GOOD:
        suite.update(*batch)
    batch_values = suite(*BAD)  # preds [0, 7], target [0, 1]: position 0 counted, position 1 invalid
    assert batch_values["invalid_labels"].item() == 1
    assert nan_or_value({k: v for k, v in batch_values.items() if k != "invalid_labels"}) == {
        k: ["nan"] * v.numel() for k, v in batch_values.items() if k != "invalid_labels"}
    assert (suite.tp.tolist(), suite.fp.tolist(), suite.fn.tolist()) == ([3, 1, 2], [0, 0, 1], [0, 1, 0])
    assert (suite.invalid_labels.item(), suite.loss_count.item(), suite.loss_sum.item(), suite._update_count) == (
        1, 3, 1.75, 3)
    total = suite.compute()
    assert total["invalid_labels"].item() == 1 and torch.isnan(total["loss"]) and torch.isnan(total["f1_per_class"]).all()


def invalid_labels_on_two_ranks(rank: int, world_size: int) -> dict[str, object]:
    """Worker: (1) rank 0's forward with an invalid label, then both ranks compute; (2) rank 0 updates with an
    invalid label, both ranks compute, update again and compute, then reset and compute."""
    group = short_gloo_group()  # a gather that the other rank never joins fails after 20 s, not 30 minutes
    out = attempt = Attempts()  # an unexpected error is recorded under its key, beside the other results

    suite = FusedMetrics(3, per_class=True, process_group=group)
    for batch in GOOD[rank::2]:
        suite.update(*batch)
    if rank == 0:
        out["forward"] = attempt("forward raised", lambda: nan_or_value(suite(*BAD)))
    out["flags after forward"] = {k: v for k, v in flags(suite).items() if not isinstance(v, tuple)}
    out["after forward"] = attempt("compute after forward raised", lambda: nan_or_value(suite.compute()))

    suite = FusedMetrics(3, per_class=True, process_group=group)
    suite.update(*GOOD[rank])
    if rank == 0:
        suite.update(*BAD)
    local = {name: getattr(suite, name).clone() for name in suite._defaults}
    out["compute"] = attempt("compute raised", lambda: nan_or_value(suite.compute()))
    out["synced after"] = suite._is_synced
    out["local states kept"] = all(torch.equal(getattr(suite, n), t) for n, t in local.items())
    suite.update(*GOOD[rank])
    out["next compute"] = attempt("next compute raised", lambda: nan_or_value(suite.compute()))
    suite.reset()
    suite.update(*GOOD[rank])
    out["after reset"] = attempt("compute after reset raised", lambda: nan_or_value(suite.compute()))
    return out


INVALID_LABELS_ON_TWO_RANKS_KEY = ranks.on_two_ranks(invalid_labels_on_two_ranks)


def test_on_two_gloo_ranks_an_invalid_label_on_one_makes_both_ranks_values_nan_together():
    """compute() sums the invalid-label count over the ranks with the other states, so rank 1, which saw none,
    reports the same count and NaN values as rank 0; each rank then holds its own states again (unsynced), and
    after reset() both compute the global values of the good batches, with a count of 0."""
    single = FusedMetrics(3, per_class=True)
    for batch in GOOD:
        single.update(*batch)
    want = nan_or_value(single.compute())
    assert want["invalid_labels"] == [0] and "nan" not in str(want)
    nan = {key: ["nan"] * len(value) for key, value in want.items()}
    one = {**nan, "invalid_labels": [1]}
    results = ranks.results(INVALID_LABELS_ON_TWO_RANKS_KEY)
    assert [r.error for r in results] == [None, None]
    for r in results:
        got = r.value
        assert not [k for k in got if k.endswith("raised")], (r.rank, got)
        # rank 0's forward: its batch alone, not synced (dist_sync_on_step=False), NaN with the batch's count
        assert got.get("forward") == (one if r.rank == 0 else None), r.rank
        assert got["flags after forward"] == {"_update_count": 2 - r.rank, "_to_sync": True, "_should_unsync": True,
                                              "_enable_grad": False, "compute_on_cpu": False, "_is_synced": False}
        assert got["after forward"] == one, r.rank  # rank 0's forward added the batch; the count is global
        assert (got["compute"], got["synced after"], got["local states kept"]) == (one, False, True), r.rank
        assert got["next compute"] == one, r.rank
        assert got["after reset"] == want, r.rank


def test_traces_into_one_graph_without_a_break():
    suite = FusedMetrics(4)

    def step(loss, logits, target):
        suite.update(loss, logits, target)

    explanation = torch._dynamo.explain(step)(torch.tensor(0.5), torch.randn(8, 4), torch.randint(0, 4, (8,)))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"num_classes": 1}, r"num_classes must be an int of at least 2, got 1\."),
    ({"num_classes": 3.0}, r"num_classes must be an int of at least 2, got 3\.0\."),
    ({"num_classes": 3, "ignore_index": 1.5},
     r"ignore_index must be an int \(the padding label, e\.g\. -100\) or None, got 1\.5\."),
    ({"num_classes": 3, "zero_division": 0.5}, r"zero_division must be 0 or 1 \(as in torchmetrics\), got 0\.5\."),
    ({"num_classes": 3, "zero_division": "warn"},
     r"zero_division must be 0 or 1 \(as in torchmetrics\), got 'warn'\."),
    ({"num_classes": 3, "per_class": 1}, r"per_class must be True or False, got 1\."),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FusedMetrics(**kwargs)


@pytest.mark.parametrize("loss, preds, target, message", [
    (0.5, torch.zeros(2, 3), torch.tensor([0, 1]),
     r"loss must be a 0-dim floating-point tensor .* got float 0\.5; pass loss, not loss\.item\(\)"),
    (torch.ones(2), torch.zeros(2, 3), torch.tensor([0, 1]),
     r"loss must be a 0-dim .* got a torch\.float32 tensor of shape \(2,\)"),
    (torch.tensor(1), torch.zeros(2, 3), torch.tensor([0, 1]), r"loss must be a 0-dim floating-point tensor"),
    (torch.tensor(1.0), torch.zeros(2, 3), torch.tensor([0.0, 1.0]),
     r"target must be a 1-dim integer tensor of class indices, got a torch\.float32"),
    (torch.tensor(1.0), torch.zeros(2, 4), torch.tensor([0, 1]),
     r"logits must have shape \(N, num_classes\) = \(2, 3\), got \(2, 4\)"),
    (torch.tensor(1.0), torch.tensor([0, 1, 2]), torch.tensor([0, 1]),
     r"preds must be logits of shape \(2, 3\) or integer class indices of shape \(2,\), got a torch\.int64 tensor "
     r"of shape \(3,\)"),
    (torch.tensor(1.0), torch.tensor([0.0, 1.0]), torch.tensor([0, 1]),
     r"preds must be logits .* got a torch\.float32 tensor of shape \(2,\)"),
    (torch.tensor(1.0), [0, 1], torch.tensor([0, 1]),
     r"preds must be a tensor of logits \(N, C\) or class indices \(N,\), got list"),
])
def test_bad_inputs_are_refused_before_counting(loss, preds, target, message):
    suite = FusedMetrics(3)
    with pytest.raises(ValueError, match=message):
        suite.update(loss, preds, target)
    assert suite.tp.sum().item() == 0 and suite.loss_count.item() == 0


def test_compiled_updates_compile_once_and_compute_counts_them():
    from fakes import tensor_reads
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    suite = FusedMetrics(4)
    compiled = torch.compile(lambda loss, logits, target: suite.update(loss, logits, target),
                             backend="eager", fullgraph=True)
    for i in range(5):
        compiled(torch.tensor(float(i)), torch.randn(8, 4), torch.randint(0, 4, (8,)))
    assert counters["stats"]["unique_graphs"] == 1  # no recompile per step (torchmetrics' int counter is skipped)
    assert suite._update_count == 0 and suite.loss_count.item() == 5
    with warnings.catch_warnings(), tensor_reads() as reads:
        warnings.simplefilter("error")  # no "compute called before update" warning
        values = suite.compute()
    assert reads == []  # compute() read nothing back (on CUDA each read is a sync): update_called asks a flag
    assert values["loss"].item() == 2.0
    suite.reset()
    assert not suite.update_called  # the flag goes with reset
    compiled(torch.tensor(1.0), torch.randn(8, 4), torch.randint(0, 4, (8,)))
    assert suite.update_called and counters["stats"]["unique_graphs"] == 1


def test_compute_before_any_update_warns_as_torchmetrics_does():
    with pytest.warns(UserWarning, match="was called before the ``update`` method"):
        FusedMetrics(3).compute()


def test_inputs_on_another_device_than_the_metric_are_refused():
    suite = FusedMetrics(3)
    meta = dict(device="meta")
    with pytest.raises(ValueError, match=r"FusedMetrics is on cpu and the inputs on meta; move it with \.to\('meta'\)"):
        suite.update(torch.zeros((), **meta), torch.zeros(2, 3, **meta), torch.zeros(2, dtype=torch.long, **meta))


def test_scores_default_to_zero_division_0_for_an_absent_class():
    from mentor.suite import scores

    # class 1 is never predicted nor present: its precision, recall and F1 are 0/0
    out = scores(torch.tensor([2, 0]), torch.tensor([0, 0]), torch.tensor([1, 0]), per_class=True)
    assert out["precision_per_class"].tolist() == [1.0, 0.0]
    assert out["recall_per_class"].tolist() == pytest.approx([2 / 3, 0.0])


# --- the keys of scores(), float64 counts, the dtype of the invalid-label count ---


def test_scores_leave_out_the_per_class_values_unless_asked():
    out = scores(torch.tensor([2, 0]), torch.tensor([0, 0]), torch.tensor([1, 0]))
    assert sorted(out) == sorted(f"{s}_{a}" for s in SCORES for a in AVERAGES)


def test_scores_keep_float64_counts_exact():
    """Float counts keep their dtype: a float64 denominator past 2**24 is not rounded to float32, and the
    zero_division value of an empty class is the float64 number passed."""
    big = float(2**24 + 1)  # 16777217 is not a float32: float32 would make it 16777216
    tp = torch.tensor([big, 0.0], dtype=torch.float64)
    fp = torch.tensor([0.0, 0.0], dtype=torch.float64)
    fn = torch.tensor([0.0, 0.0], dtype=torch.float64)
    out = scores(tp, fp, fn, zero_division=0.1, per_class=True)
    assert out["recall_per_class"].dtype == torch.float64
    assert out["recall_per_class"].tolist() == [1.0, 0.1]  # 16777217 / 16777217, and class 1's 0 / 0
    assert out["precision_per_class"].tolist() == [1.0, 0.1]


def test_the_invalid_label_count_is_an_integer_state():
    """A float32 count would stop counting at 2**24 invalid labels; torchmetrics' counts are long too."""
    suite = FusedMetrics(3)
    suite.update(torch.tensor(1.0), torch.randn(2, 3), torch.tensor([0, 5]))
    assert suite.invalid_labels.dtype == torch.long and int(suite.invalid_labels) == 1


# ----------------------------------------------------------------------------------------------------------
# On CUDA


def _cuda_batch(n=256, classes=1000, seed=0, ignore_index=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(n, classes, device="cuda", generator=gen)
    target = torch.randint(0, classes, (n,), device="cuda", generator=gen)
    if ignore_index is not None:
        target[::7] = ignore_index
    return torch.rand((), device="cuda", generator=gen), logits, target


@gpu
@pytest.mark.parametrize("ignore_index", [None, -100])
def test_an_update_makes_no_sync(ignore_index):
    suite = FusedMetrics(1000, ignore_index=ignore_index).cuda()
    loss, logits, target = _cuda_batch(ignore_index=ignore_index)
    suite.update(loss, logits, target)  # the first update may allocate
    report = count_syncs(suite.update, loss, logits, target)
    assert report.count == 0, report.table()


@gpu
def test_equals_torchmetrics_on_the_gpu():
    suite = FusedMetrics(1000, ignore_index=-100).cuda()
    precision = MulticlassPrecision(1000, average="macro", ignore_index=-100).cuda()
    f1 = MulticlassF1Score(1000, average="weighted", ignore_index=-100).cuda()
    for seed in range(3):
        loss, logits, target = _cuda_batch(seed=seed, ignore_index=-100)
        suite.update(loss, logits, target)
        precision.update(logits, target)
        f1.update(logits, target)
    out = suite.compute()
    assert torch.equal(out["precision_macro"], precision.compute())
    assert torch.equal(out["f1_weighted"], f1.compute())


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiles_without_a_break_or_a_recompile(mode):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = FusedMetrics(1000).cuda()
    suite = FusedMetrics(1000).cuda()

    def step(loss, logits, target):
        suite.update(loss, logits, target)

    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for seed in range(6):
        batch = _cuda_batch(seed=seed)
        compiled(*batch)
        eager.update(*batch)
    assert counters["stats"]["unique_graphs"] == 1
    got, want = suite.compute(), eager.compute()
    for key in want:
        assert torch.allclose(got[key], want[key]), (key, got[key], want[key])


@gpu
@pytest.mark.parametrize("precision, channels_last", [("fp32", False), ("bf16", True)])
def test_the_suite_config_makes_no_sync_per_step_and_one_read_per_report(precision, channels_last):
    from mentor.lab.configs import Config, suite_config
    from mentor.lab.compare import compare
    from mentor.lab.data import device_batches
    from mentor.lab.train import build_setup

    setup = build_setup(num_classes=10, device="cuda", precision=precision, channels_last=channels_last)
    batches = device_batches(4, image_size=32, num_classes=10, device="cuda")
    cmp = compare([Config("none"), suite_config(10, "cuda")], setup, batches, steps=3, warmup=1, rounds=2,
                  report_every=2, sync_steps=4, progress=False)
    # per report: the single stacked copy of every value (compute() itself reads nothing back)
    assert (cmp["fused suite"].syncs_per_step, cmp["fused suite"].report_syncs) == (0.0, 1)


def _report_values(values, per_class):
    """compute()'s values as one-element tensors for DeferredReadback.push: per-class ones as "key/i" (views)."""
    out = {}
    for key, value in values.items():
        if per_class and key.endswith("per_class"):
            out.update({f"{key}/{i}": v for i, v in enumerate(value.unbind())})
        else:
            out[key] = value
    return out


@gpu
@pytest.mark.parametrize("route", ["suite", "per class", "collection"])
def test_update_compute_push_and_latest_make_no_sync_over_many_steps(route):
    """A strict sync_guard around 30 steps of update, a report every 3 (compute, push, reset) and latest() at every
    step: nothing waits. The first report of the route runs before the guard (the pinned buffers are allocated,
    MetricCollection's compute groups compared), then every arrived reading equals a CPU suite fed the same
    batches, its count 0."""
    from torchmetrics import MetricCollection

    from mentor.readback import DeferredReadback
    from mentor.syncs import sync_guard

    per_class = route == "per class"
    classes = 50

    def make(device):
        if route == "collection":
            return MetricCollection({"a": FusedMetrics(classes, ignore_index=-100),
                                     "b": FusedMetrics(classes, ignore_index=-100)}, prefix="train/").to(device)
        return FusedMetrics(classes, ignore_index=-100, per_class=per_class).to(device)

    metric, readback = make("cuda"), DeferredReadback()
    batches = [_cuda_batch(n=64, classes=classes, seed=s, ignore_index=-100) for s in range(30)]
    for step in range(readback.slots):  # warm: every slot's pinned buffer, the collection's compute groups
        metric.update(*batches[step])
        readback.push(_report_values(metric.compute(), per_class), step=step)
        metric.reset()
    torch.cuda.synchronize()
    readback = DeferredReadback()
    shown = []
    with sync_guard(strict=True):
        for step, batch in enumerate(batches):
            metric.update(*batch)
            if step % 3 == 2:
                readback.push(_report_values(metric.compute(), per_class), step=step)
                metric.reset()
            reading = readback.latest()
            if reading is not None and (not shown or shown[-1] is not reading):
                shown.append(reading)
    final = readback.wait()
    assert final.step == 29
    for reading in [*shown, final]:
        reference = make("cpu")
        for loss, logits, target in batches[reading.step - 2:reading.step + 1]:
            reference.update(loss.cpu(), logits.cpu(), target.cpu())
        want = {k: float(v) for k, v in _report_values(reference.compute(), per_class).items()}
        assert reading.values.keys() == want.keys()
        assert [k for k in want if k.endswith("invalid_labels")] == (
            ["train/a_invalid_labels", "train/b_invalid_labels"] if route == "collection" else ["invalid_labels"])
        assert all(reading.values[k] == 0.0 for k in want if k.endswith("invalid_labels"))
        assert reading.values == pytest.approx(want, rel=1e-6, abs=0), reading.step
    assert len(want) == (1 + 12 + 4 * classes + 1 if per_class else 2 * 14 if route == "collection" else 14)


# --- the report in a fixed number of operations (issue 43: a report launched about 165 kernels) ---

_VIEWS = {"aten.select.int", "aten.slice.Tensor", "aten.view.default", "aten.unsqueeze.default", "aten.expand.default",
          "aten.unbind.int", "aten.reshape.default", "aten.squeeze.default", "aten.alias.default"}


def _operations(fn):
    """The aten operations ``fn()`` dispatches that are not views (on CUDA, each a kernel or an allocation)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func) not in _VIEWS:
                seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


@pytest.mark.parametrize("kwargs, expected", [({}, 46), ({"per_class": True}, 48), ({"top_k": (1, 5)}, 55),
                                              ({"zero_division": 1}, 50)])
def test_compute_makes_as_many_operations_with_5_classes_as_with_1000(kwargs, expected):
    counts = []
    for num_classes in (5, 1000):
        suite = FusedMetrics(num_classes, **kwargs)
        suite.update(torch.tensor(0.5), torch.randn(8, num_classes), torch.randint(0, num_classes, (8,)))
        counts.append(len(_operations(suite.compute)))
    assert counts == [expected, expected]  # one operation per score and average made 186; one sum per average 46


def _counts(preds, target, num_classes):
    """Per-class tp, fp, tn, fn of label predictions, counted with bincount (not torchmetrics' code)."""
    tp = torch.bincount(target[preds == target], minlength=num_classes)
    fp = torch.bincount(preds, minlength=num_classes) - tp
    fn = torch.bincount(target, minlength=num_classes) - tp
    return {"tp": tp, "fp": fp, "tn": len(target) - tp - fp - fn, "fn": fn}


@pytest.mark.parametrize("num_classes", [37, 40000])
def test_averages_equal_torchmetrics_bit_for_bit_on_two_cpu_threads(num_classes):
    """Above 32768 values a CPU sum splits among threads; each average is summed on its own, as torchmetrics'.

    torchmetrics' multiclass update for macro and weighted averages counts with a bincount of num_classes**2 bins
    (``functional/classification/stat_scores.py``, ``_multiclass_stat_scores_update``; 12.8 GB at 40000 classes), so
    at 40000 the reference metrics get their per-class counts from :func:`_counts` and only run their own
    ``compute()``; at 37 they run their own update too, and those counts must equal :func:`_counts`'."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        suite = FusedMetrics(num_classes)
        reference = {(name, average): cls(num_classes, average=average)
                     for name, cls in (("precision", MulticlassPrecision), ("f1", MulticlassF1Score))
                     for average in ("macro", "weighted")}
        gen = torch.Generator().manual_seed(num_classes)
        target = torch.randint(0, num_classes, (4096,), generator=gen)
        # predicted labels, right 60 % of the time: with uniform guesses at 40000 classes almost no class has a
        # true positive, every precision is 0, and the order of the sum could not show (here it does: summed on
        # one thread, these averages differ from the two-thread sums in the last bit)
        right = torch.rand(4096, generator=gen) < 0.6
        preds = torch.where(right, target, torch.randint(0, num_classes, (4096,), generator=gen))
        suite.update(torch.tensor(1.0), preds, target)
        counts = _counts(preds, target, num_classes)
        for metric in reference.values():
            if num_classes < 1000:
                metric.update(preds, target)
                for state, expected in counts.items():
                    assert torch.equal(getattr(metric, state), expected), state
            else:
                for state, value in counts.items():
                    setattr(metric, state, value.clone())
                metric._update_count = 1  # as one update() would leave it, so compute() does not warn
        got = suite.compute()
        for (name, average), metric in reference.items():
            assert torch.equal(got[f"{name}_{average}"], metric.compute()), (name, average)
    finally:
        torch.set_num_threads(threads)


def test_reset_zeroes_every_state_in_one_operation_and_keeps_its_memory():
    suite = FusedMetrics(4, top_k=2)
    suite.update(torch.tensor(0.5), torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 9, 1]))
    before = {name: getattr(suite, name) for name in suite._defaults}
    assert _operations(suite.reset) == ["aten._foreach_zero_.default"]
    for name, tensor in before.items():
        assert getattr(suite, name) is tensor and not tensor.any(), name
    assert not suite.update_called and suite._computed is None


def test_values_of_a_compute_stay_as_they_were_after_reset_and_later_updates():
    suite = FusedMetrics(3, per_class=True, top_k=2)
    suite.update(torch.tensor(2.0), torch.tensor([[3.0, 1, 0], [0, 3, 1], [1, 0, 3]]), torch.tensor([0, 2, 7]))
    got = suite.compute()
    kept = {key: value.clone() for key, value in got.items()}
    assert int(got["invalid_labels"]) == 1 and torch.isnan(got["accuracy_micro"])
    suite.reset()
    suite.update(torch.tensor(1.0), torch.tensor([[3.0, 0, 0], [0, 3, 0]]), torch.tensor([0, 1]))
    for key, value in kept.items():
        assert torch.equal(got[key], value) or (torch.isnan(got[key]).all() and torch.isnan(value).all()), key
    assert int(suite.compute()["invalid_labels"]) == 0


def test_compute_keeps_torchmetrics_warning_and_cache():
    suite = FusedMetrics(3)
    with pytest.warns(UserWarning, match="called before the ``update`` method"):
        suite.compute()
    suite.reset()
    suite.update(torch.tensor(1.0), torch.tensor([0, 1]), torch.tensor([0, 2]))
    first = suite.compute()
    assert suite.compute() is first  # cached until the next update
    suite.update(torch.tensor(1.0), torch.tensor([2]), torch.tensor([2]))
    assert suite.compute() is not first
    assert suite.compute()["accuracy_micro"].item() == torch.tensor(2 / 3).item()


def test_a_float64_default_dtype_keeps_the_loss_in_float64_and_the_scores_equal():
    batches = [(torch.tensor(0.25), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2])),
               (torch.tensor(0.5), torch.tensor([2, 2]), torch.tensor([2, 0]))]
    want = FusedMetrics(3, per_class=True)
    for b in batches:
        want.update(*b)
    want = want.compute()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        suite = FusedMetrics(3, per_class=True)
        for loss, preds, target in batches:
            suite.update(loss.double(), preds, target)
        got = suite.compute()
    finally:
        torch.set_default_dtype(previous)
    assert list(got) == list(want)
    assert got["loss"].dtype == torch.float64 and float(got["loss"]) == 0.375
    for key in want:
        if key != "loss":
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key


@gpu
@pytest.mark.parametrize("num_classes", [3, 37, 1000, 32000])
def test_compute_on_the_gpu_equals_torchmetrics_bit_for_bit_and_launches_at_most_60_kernels(num_classes):
    """Every score equals torchmetrics' bit for bit. One sum of a (2, 4, C) table of the averages' terms would not:
    CUDA sizes a reduction's block by its number of outputs (``setReduceConfig`` in ATen's
    ``native/cuda/Reduce.cuh``), so each average is summed on its own, from a row aligned as a new tensor."""
    from mentor.measure import update_cost

    suite = FusedMetrics(num_classes, per_class=True).cuda()
    reference = {(cls.__name__, average): cls(num_classes, average=average).cuda()
                 for cls in (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score)
                 for average in ("micro", "macro", "weighted", "none")}
    gen = torch.Generator(device="cuda").manual_seed(num_classes)
    for _ in range(3):
        logits = torch.randn(256, num_classes, device="cuda", generator=gen)
        target = torch.randint(0, max(num_classes // 2, 2), (256,), device="cuda", generator=gen)
        suite.update(torch.tensor(1.0, device="cuda"), logits, target)
        for metric in reference.values():
            metric.update(logits, target)
    got = suite.compute()
    names = {"MulticlassAccuracy": "accuracy", "MulticlassPrecision": "precision", "MulticlassRecall": "recall",
             "MulticlassF1Score": "f1"}
    for (cls, average), metric in reference.items():
        key = f"{names[cls]}_{'per_class' if average == 'none' else average}"
        want = metric.compute()
        assert torch.equal(got[key], want), (cls, average)

    def report():
        suite._computed = None
        suite.compute()

    cost = update_cost("report", report, repeats=5)
    assert cost.syncs == 0 and cost.kernels is not None and cost.kernels <= 60, cost
