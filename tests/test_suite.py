"""mentor.suite.FusedMetrics: equal to torchmetrics for every average (hypothesis), invalid labels, pickling, two
gloo ranks equal to one process, and no graph break under torch.compile's tracer; on CUDA (``@gpu``, run with
`pytest -m gpu`): no sync per update, equal to torchmetrics on the GPU, torch.compile (inductor, and CUDA graphs)
with no graph break and no recompile."""

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
from mentor.lab.ddp import launch
from mentor.suite import AVERAGES, SCORES, FusedMetrics, scores
from mentor.syncs import count_syncs
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


def test_out_of_range_labels_are_counted_and_reported_at_compute():
    suite = FusedMetrics(3, ignore_index=-100)
    suite.update(torch.tensor(1.0), torch.tensor([0, 5, 1, 2]), torch.tensor([0, 1, -100, 7]))
    suite.update(torch.tensor(1.0), torch.tensor([-1, 1]), torch.tensor([0, 1]))
    assert suite.invalid_labels.item() == 3  # pred 5, target 7, pred -1; the ignored position is not counted
    assert suite.tp.tolist() == [1, 1, 0] and suite.fp.tolist() == [0, 0, 0] and suite.fn.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"^3 prediction\(s\) or target\(s\) outside 0\.\.2 reached FusedMetrics"):
        suite.compute()
    suite.reset()
    suite.update(torch.tensor(1.0), torch.tensor([0]), torch.tensor([0]))
    assert suite.compute()["accuracy_micro"].item() == 1.0


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


def test_two_gloo_ranks_equal_one_process_over_all_the_data():
    steps, _ = _shards(7, 2)
    single = FusedMetrics(5, per_class=True)
    for loss, preds, target in steps:
        single.update(loss, preds, target)
    want = {key: value.reshape(-1).tolist() for key, value in single.compute().items()}
    results = launch(suite_on_a_shard, 2, 7, backend="gloo", timeout=120)
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
    (BAD, ValueError, "1 prediction(s) or target(s) outside 0..2 reached FusedMetrics since its last reset and were "
                      "left out of the counts; fix the labels, or pass ignore_index=<the padding label> (now None) "
                      "to skip them."),
    ((torch.tensor(1.0), torch.zeros(2, 4), torch.tensor([0, 1])), ValueError,
     "logits must have shape (N, num_classes) = (2, 3), got (2, 4)."),
], ids=["invalid label", "bad shape"])
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


def calls_that_raise_on_two_ranks(rank: int, world_size: int) -> dict[str, object]:
    """Worker: (1) rank 0's forward raises for an invalid label, then both ranks compute; (2) rank 0 updates with
    an invalid label, both ranks compute (both raise), update again and compute, then reset and compute."""
    group = short_gloo_group()  # a gather that the other rank never joins fails after 20 s, not 30 minutes
    out = attempt = Attempts()  # the errors of the calls that raise, under their keys, beside the other results

    suite = FusedMetrics(3, per_class=True, process_group=group)
    for batch in GOOD[rank::2]:
        suite.update(*batch)
    if rank == 0:
        attempt("forward", lambda: suite(*BAD))
    out["flags after forward"] = {k: v for k, v in flags(suite).items() if not isinstance(v, tuple)}
    out["after forward"] = attempt("compute after forward", lambda: values_of(suite))

    suite = FusedMetrics(3, per_class=True, process_group=group)
    suite.update(*GOOD[rank])
    if rank == 0:
        suite.update(*BAD)
    local = {name: getattr(suite, name).clone() for name in suite._defaults}
    attempt("compute", suite.compute)
    out["synced after the error"] = suite._is_synced
    out["local states kept"] = all(torch.equal(getattr(suite, n), t) for n, t in local.items())
    suite.update(*GOOD[rank])
    attempt("next compute", suite.compute)
    suite.reset()
    suite.update(*GOOD[rank])
    out["after reset"] = attempt("compute after reset", lambda: values_of(suite))
    return out


def test_on_two_gloo_ranks_calls_that_raise_leave_the_ranks_in_step():
    """(1) After rank 0's failed forward, both ranks' compute() gathers: the global values of the good batches, on
    both. (2) compute() syncs before it reads the invalid-label count, so the count is global and both ranks raise
    (neither waits for the other); each is then unsynced with its own states, so the next compute() syncs again and
    raises the same error (torchmetrics left them synced: "already been synced"); after reset() it computes."""
    single = FusedMetrics(3, per_class=True)
    for batch in GOOD:
        single.update(*batch)
    want = values_of(single)
    invalid = ("ValueError: 1 prediction(s) or target(s) outside 0..2 reached FusedMetrics since its last reset and "
               "were left out of the counts; fix the labels, or pass ignore_index=<the padding label> (now None) to "
               "skip them.")
    results = launch(calls_that_raise_on_two_ranks, 2, backend="gloo", timeout=120)
    assert [r.error for r in results] == [None, None]
    for r in results:
        got = r.value
        assert got.get("forward") == (invalid if r.rank == 0 else None), r.rank
        assert got["flags after forward"] == {"_update_count": 1, "_to_sync": True, "_should_unsync": True,
                                              "_enable_grad": False, "compute_on_cpu": False, "_is_synced": False}
        assert "compute after forward" not in got, (r.rank, got.get("compute after forward"))
        assert got["after forward"] == want, r.rank
        assert (got["compute"], got["synced after the error"], got["local states kept"]) == (invalid, False, True)
        assert got["next compute"] == invalid, r.rank
        assert "compute after reset" not in got, (r.rank, got.get("compute after reset"))
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "compute called before update" warning
        assert suite.compute()["loss"].item() == 2.0


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
    # per report: the invalid-label count and the single stacked copy of every value
    assert (cmp["fused suite"].syncs_per_step, cmp["fused suite"].report_syncs) == (0.0, 2)
