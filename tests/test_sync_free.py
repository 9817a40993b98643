"""mentor.sync_free: suppress_nan_check and scatter_stat_scores against torchmetrics (random inputs), the classes they
make (names, pickling, docstrings), multiclass_counts and host_scalar; on a CUDA device, the syncs they save."""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.testing import assert_close
from torchmetrics import Accuracy, MaxMetric, MeanMetric, MinMetric, Precision, SumMetric
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
    MulticlassStatScores,
)

import mentor.sync_free
from exact import whole
from marks import gpu, warm
from mentor.sync_free import host_scalar, multiclass_counts, scatter_stat_scores, suppress_nan_check
from mentor.syncs import count_syncs
import ranks
from ranks import Attempts, short_gloo_group


AGGREGATORS = [MeanMetric, SumMetric, MaxMetric, MinMetric]

# slow CPUs and the NumPy/Tensor strategies: judge the examples, not the time it takes to draw them
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

EXACT = dict(rtol=0.0, atol=0.0, equal_nan=True)  # same arithmetic on the same tensors: bit-identical


# ----------------------------------------------------------------------------------------------------------
# Random inputs for the aggregation metrics


finite32 = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def values(draw, nan: bool = False):
    """A Python float, or a float32 / float64 / int64 tensor of random shape. With ``nan``: contains a NaN."""
    kind = draw(st.sampled_from(["float", "float32", "float64", "int64"] if not nan else ["float", "float32"]))
    if kind == "float":
        return float("nan") if nan else draw(finite32)
    shape = draw(shapes if not nan else hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
    if kind == "int64":
        arr = draw(hnp.arrays(np.int64, shape, elements=st.integers(-1000, 1000)))
    else:
        arr = draw(hnp.arrays(np.dtype(kind), shape, elements=finite32))
    t = torch.from_numpy(np.array(arr))
    if nan:
        t.view(-1)[draw(st.integers(0, t.numel() - 1))] = float("nan")
    return t


@st.composite
def weights_for(draw, value):
    """None, a Python float or a tensor broadcastable to ``value``'s shape (non-negative)."""
    kind = draw(st.sampled_from(["none", "float", "tensor"]))
    if kind == "none":
        return None
    w = st.floats(0.0, 10.0, width=32)
    if kind == "float":
        return draw(w)
    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
    k = draw(st.integers(0, len(shape)))
    wshape = tuple(draw(st.sampled_from([s, 1])) for s in shape[len(shape) - k:])
    return torch.from_numpy(np.array(draw(hnp.arrays(np.float32, wshape, elements=w))))


@st.composite
def updates(draw, weighted: bool, nan: bool = False):
    """A list of (value, weight) updates; with ``nan`` one of them contains a NaN."""
    n = draw(st.integers(1, 5))
    out = []
    nan_at = draw(st.integers(0, n - 1)) if nan else -1
    for i in range(n):
        v = draw(values(nan=i == nan_at))
        out.append((v, draw(weights_for(v)) if weighted else None))
    return out


def clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def feed(metric, stream):
    for v, w in stream:
        if w is None:
            metric.update(clone(v))
        else:
            metric.update(clone(v), weight=clone(w))
    return metric


# ----------------------------------------------------------------------------------------------------------
# suppress_nan_check


@pytest.mark.parametrize("cls", AGGREGATORS)
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_suppressed_equals_default_without_nan(cls, data):
    stream = data.draw(updates(weighted=cls is MeanMetric))
    reference = feed(cls(nan_strategy="error"), stream)  # no NaN here: the check passes
    fast = feed(suppress_nan_check(cls)(), stream)
    assert_close(fast.compute(), reference.compute(), **EXACT)
    # the default policy (no explicit nan_strategy) gives the same on NaN-free input
    assert_close(feed(cls(), stream).compute(), reference.compute(), **EXACT)


@pytest.mark.parametrize("cls", AGGREGATORS)
@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_nan_raises_in_default_and_propagates_in_suppressed(cls, data):
    stream = data.draw(updates(weighted=cls is MeanMetric, nan=True))
    with pytest.raises(RuntimeError, match="Encountered `nan` values in tensor"):
        feed(cls(nan_strategy="error"), stream)
    result = feed(suppress_nan_check(cls)(), stream).compute()
    assert torch.isnan(result), result


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_nan_weight_raises_in_default_and_propagates_in_suppressed(data):
    stream = data.draw(updates(weighted=False))
    v = torch.tensor([1.0, 2.0])
    stream.insert(data.draw(st.integers(0, len(stream))), (v, torch.tensor([1.0, float("nan")])))
    with pytest.raises(RuntimeError, match="Encountered `nan` values in tensor"):
        feed(MeanMetric(nan_strategy="error"), stream)
    assert torch.isnan(feed(suppress_nan_check(MeanMetric)(), stream).compute())


def test_suppressed_mean_keeps_weights():
    m = suppress_nan_check(MeanMetric)()
    m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([1.0, 3.0]))
    assert float(m.compute()) == (1 * 1 + 3 * 3) / (1 + 3)


def test_default_mean_policy_drops_nan_with_a_warning_suppressed_gives_nan():
    # torchmetrics 1.9.0: MeanMetric() defaults to nan_strategy="warn" (drop NaNs, warn);
    # the suppressed subclass has no policy at all: the NaN reaches the sum.
    with pytest.warns(UserWarning, match="nan"):
        default = feed(MeanMetric(), [(torch.tensor([1.0, float("nan"), 3.0]), None)]).compute()
    assert float(default) == 2.0
    suppressed = feed(suppress_nan_check(MeanMetric)(), [(torch.tensor([1.0, float("nan"), 3.0]), None)]).compute()
    assert math.isnan(float(suppressed))


def test_suppressed_mean_emits_no_warning():
    # the NaN-free path of the suppressed metric emits no warning (nothing is checked, nothing is dropped)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        feed(suppress_nan_check(MeanMetric)(), [(torch.tensor([1.0]), None)]).compute()


def test_suppressed_class_identity():
    cls = suppress_nan_check(SumMetric)
    assert issubclass(cls, SumMetric)
    assert cls.__name__ == "NoNanCheckSumMetric"
    assert cls.__module__ == "mentor.sync_free"
    assert suppress_nan_check(SumMetric) is cls
    assert isinstance(suppress_nan_check(SumMetric)(), cls)
    assert mentor.sync_free.NoNanCheckSumMetric is cls


@pytest.mark.parametrize("args, kwargs", [((), dict(nan_strategy="error")), (("ignore",), {}),
                                          ((), dict(nan_strategy="disable"))])
def test_suppressed_class_refuses_a_nan_strategy(args, kwargs):
    with pytest.raises(TypeError, match="NoNanCheckMeanMetric skips the NaN check, so a nan_strategy has no effect"):
        suppress_nan_check(MeanMetric)(*args, **kwargs)
    assert suppress_nan_check(MeanMetric)(sync_on_compute=False).sync_on_compute is False


@pytest.mark.parametrize("bad", [int, Accuracy, MulticlassPrecision, MeanMetric(), "MeanMetric", None])
def test_suppress_nan_check_rejects_non_aggregators(bad):
    with pytest.raises(TypeError, match=r"subclass of torchmetrics.aggregation.BaseAggregator such as MeanMetric"):
        suppress_nan_check(bad)


@pytest.mark.parametrize("x, weight", [(0.1, None), (0.1, 2.5), (3, 0.5), (torch.tensor([0.1, 2.0]), 0.25),
                                       (torch.tensor([1, 2]), torch.tensor([0.5, 1.5], dtype=torch.float64))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_suppressed_cast_returns_what_the_base_hook_returns(x, weight, dtype):
    """On NaN-free input the hook converts like BaseAggregator's (Python numbers straight to the metric's dtype,
    so 0.1 in float64 is float64's 0.1, not float32's; Python float weights too), only without the check."""
    fast, plain = suppress_nan_check(MeanMetric)(), MeanMetric(nan_strategy="error")
    fast.set_dtype(dtype)
    plain.set_dtype(dtype)
    got = fast._cast_and_nan_check_input(x, weight)
    want = plain._cast_and_nan_check_input(x, weight)
    assert got[0].dtype == got[1].dtype == dtype
    assert_close(got, want, **EXACT)


def test_suppressed_cast_makes_numbers_on_the_metrics_device():
    # "meta" stands in for a GPU: a Python number becomes a tensor where the metric's states live
    fast = suppress_nan_check(MeanMetric)().to("meta")
    x, w = fast._cast_and_nan_check_input(0.5, 2.0)
    assert (x.device.type, w.device.type) == ("meta", "meta")
    from torchmetrics import CatMetric

    cat = suppress_nan_check(CatMetric)().to("meta")
    cat.update(1.0)
    assert cat.compute().device.type == "meta"


# ----------------------------------------------------------------------------------------------------------
# the made classes: names, pickling, docstrings


@pytest.mark.parametrize("factory, base, kwargs, update", [
    ("suppress_nan_check", MeanMetric, {}, lambda m: m.update(torch.tensor([1.0, 3.0]))),
    ("scatter_stat_scores", MulticlassPrecision, dict(num_classes=3),
     lambda m: m.update(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]))),
])
def test_made_classes_pickle_and_save(tmp_path, factory, base, kwargs, update):
    import pickle
    import subprocess
    import sys

    metric = getattr(mentor.sync_free, factory)(base)(**kwargs)
    update(metric)
    expected = float(metric.compute())
    copy = pickle.loads(pickle.dumps(metric))
    assert type(copy) is type(metric) and float(copy.compute()) == expected
    torch.save(metric, tmp_path / "m.pt")
    assert float(torch.load(tmp_path / "m.pt", weights_only=False).compute()) == expected
    # a fresh process finds the class by name before any factory ran
    code = ("import torch; m = torch.load(%r, weights_only=False); print(type(m).__qualname__, float(m.compute()))"
            % str(tmp_path / "m.pt"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [type(metric).__qualname__, repr(expected)]


def test_unknown_names_are_not_made_up():
    with pytest.raises(AttributeError, match="has no attribute 'NoNanCheckNothing'"):
        mentor.sync_free.NoNanCheckNothing  # noqa: B018


def test_module_getattr_makes_the_classes_by_name():
    """What unpickling in a fresh process calls: the module's ``__getattr__``, called here directly (in this
    process the classes may already be module globals, which attribute access would find first)."""
    from torchmetrics import CatMetric

    assert mentor.sync_free.__getattr__("NoNanCheckCatMetric") is suppress_nan_check(CatMetric)
    assert mentor.sync_free.__getattr__("ScatterMulticlassF1Score") is scatter_stat_scores(MulticlassF1Score)
    # a prefix with a base from the other module, an unknown base, no prefix at all
    for name in ("ScatterMeanMetric", "NoNanCheckNothing", "MeanMetric"):
        with pytest.raises(AttributeError, match=whole(f"module 'mentor.sync_free' has no attribute {name!r}")):
            mentor.sync_free.__getattr__(name)


def test_made_classes_carry_their_docstrings():
    assert suppress_nan_check(SumMetric).__doc__ == "SumMetric without the NaN check."
    assert scatter_stat_scores(MulticlassRecall).__doc__ == (
        "MulticlassRecall counting with scatter_add_, without a sync.")
    assert suppress_nan_check(SumMetric).__qualname__ == "NoNanCheckSumMetric"


def test_a_second_base_of_the_same_name_is_refused():
    """Two bases named MeanMetric would both need mentor.sync_free.NoNanCheckMeanMetric: pickling needs one name
    each."""
    made = suppress_nan_check(MeanMetric)  # mentor.sync_free.NoNanCheckMeanMetric now exists
    other = type("MeanMetric", (MeanMetric,), {"__module__": "elsewhere"})
    message = ("mentor.sync_free.NoNanCheckMeanMetric already exists for another class named MeanMetric "
               "(torchmetrics.aggregation); give elsewhere.MeanMetric another name so that both can be pickled.")
    with pytest.raises(TypeError, match=whole(message)):
        suppress_nan_check(other)
    assert mentor.sync_free.NoNanCheckMeanMetric is made and suppress_nan_check(MeanMetric) is made


# ----------------------------------------------------------------------------------------------------------
# torchmetrics' own nan_strategy="disable": documents a torchmetrics behaviour, not a mentor bug.


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(
    v=hnp.arrays(np.float32, st.integers(2, 8), elements=st.floats(-100, 100, width=32)),
    data=st.data(),
)
def test_torchmetrics_disable_ignores_weights(v, data):
    """DOCUMENTS TORCHMETRICS 1.9.0 (not xfail): MeanMetric(nan_strategy="disable") drops the given weights.

    Its BaseAggregator._cast_and_nan_check_input replaces ``weight`` with ``ones_like(x)`` when
    nan_strategy == "disable", so the "weighted" mean is the plain mean. If torchmetrics fixes
    this, this test fails: then the "built-in" metric set may be used with weights, and the book's
    remark about it must change.
    """
    w = data.draw(hnp.arrays(np.float32, v.shape, elements=st.floats(0.5, 10, width=32)))
    assume(len(set(w.tolist())) > 1)  # non-uniform weights
    values, weights = torch.from_numpy(v), torch.from_numpy(w)
    weighted = float((values * weights).sum() / weights.sum())
    plain = float(values.mean())
    assume(abs(weighted - plain) > 1e-3 * (1 + abs(plain)))  # weights that change the mean
    default = feed(MeanMetric(), [(values, weights)]).compute()
    disabled = feed(MeanMetric(nan_strategy="disable"), [(values, weights)]).compute()
    assert_close(default, torch.tensor(weighted), rtol=1e-4, atol=1e-4)
    assert_close(disabled, torch.tensor(plain), rtol=1e-4, atol=1e-4)   # the weights were ignored
    assert not torch.allclose(disabled, default, rtol=1e-4, atol=1e-4)
    # mentor's subclass keeps them
    assert_close(feed(suppress_nan_check(MeanMetric)(), [(values, weights)]).compute(), default, **EXACT)


# ----------------------------------------------------------------------------------------------------------
# scatter_stat_scores and multiclass_counts


STAT_CLASSES = [MulticlassPrecision, MulticlassRecall, MulticlassF1Score, MulticlassAccuracy, MulticlassStatScores]

AVERAGES = ["macro", "weighted", "none", "micro"]


@st.composite
def classification_batch(draw, num_classes: int, logits: bool, extra_dim: int):
    n = draw(st.integers(1, 24))
    tail = (extra_dim,) if extra_dim else ()
    labels = st.integers(0, num_classes - 1)
    target = torch.tensor(draw(hnp.arrays(np.int64, (n, *tail), elements=labels)))
    if logits:
        preds = torch.tensor(draw(hnp.arrays(np.float32, (n, num_classes, *tail),
                                             elements=st.floats(-5, 5, width=32))))
    else:
        preds = torch.tensor(draw(hnp.arrays(np.int64, (n, *tail), elements=labels)))
    return preds, target


@pytest.mark.parametrize("average", AVERAGES)
@pytest.mark.parametrize("cls", STAT_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=15, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_scatter_equals_torchmetrics(cls, average, data):
    num_classes = data.draw(st.integers(2, 50), label="num_classes")
    logits = data.draw(st.booleans(), label="logits")
    extra_dim = data.draw(st.sampled_from([0, 0, 3]), label="extra_dim")
    plain = cls(num_classes=num_classes, average=average)
    fast = scatter_stat_scores(cls)(num_classes=num_classes, average=average)
    for _ in range(data.draw(st.integers(1, 4), label="updates")):
        preds, target = data.draw(classification_batch(num_classes, logits, extra_dim))
        plain.update(preds, target)
        fast.update(preds, target)
    assert_close(fast.compute(), plain.compute(), equal_nan=True)


@pytest.mark.parametrize("average", AVERAGES)
@pytest.mark.parametrize("cls", STAT_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=15, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_scatter_equals_torchmetrics_with_ignore_index(cls, average, data):
    num_classes = data.draw(st.integers(2, 30), label="num_classes")
    ignore_index = data.draw(st.sampled_from([-100, 0, num_classes - 1, 255]), label="ignore_index")
    plain = cls(num_classes=num_classes, average=average, ignore_index=ignore_index)
    fast = scatter_stat_scores(cls)(num_classes=num_classes, average=average, ignore_index=ignore_index)
    for _ in range(data.draw(st.integers(1, 3), label="updates")):
        preds, target = data.draw(classification_batch(num_classes, data.draw(st.booleans()), 0))
        ignored = torch.tensor(data.draw(hnp.arrays(np.bool_, target.shape)))
        target = torch.where(ignored, torch.full_like(target, ignore_index), target)
        plain.update(preds, target)
        fast.update(preds, target)
    assert_close(fast.compute(), plain.compute(), equal_nan=True)


@pytest.mark.parametrize("average", AVERAGES)
def test_scatter_counts_bad_labels_and_raises_at_compute(average):
    fast = scatter_stat_scores(MulticlassRecall)(num_classes=3, average=average, validate_args=False)
    fast.update(torch.tensor([0, 1, 2, 2, 1]), torch.tensor([0, 1, 3, -1, 1]))  # two targets out of range
    fast.update(torch.tensor([7, 0]), torch.tensor([0, 0]))  # one prediction out of range
    assert int(fast.invalid_labels) == 3
    with pytest.raises(ValueError, match=r"^3 prediction\(s\) or target\(s\) outside 0..2 reached "
                                         r"ScatterMulticlassRecall since its last reset"):
        fast.compute()
    # the valid positions were counted as torchmetrics counts them
    plain = MulticlassRecall(num_classes=3, average=average)
    plain.update(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 1, 0]))
    fast.invalid_labels.zero_()
    assert_close(fast.compute(), plain.compute(), equal_nan=True)
    fast.reset()
    assert int(fast.invalid_labels) == 0


@pytest.mark.parametrize("kwargs", [dict(top_k=2), dict(multidim_average="samplewise")])
def test_scatter_falls_back_for_other_settings(kwargs):
    g = torch.Generator().manual_seed(0)
    plain = MulticlassPrecision(num_classes=5, **kwargs)
    fast = scatter_stat_scores(MulticlassPrecision)(num_classes=5, **kwargs)
    for _ in range(3):
        target = torch.randint(0, 5, (16, 4), generator=g)
        preds = torch.randn(16, 5, 4, generator=g)
        plain.update(preds, target)
        fast.update(preds, target)
    assert_close(fast.compute(), plain.compute(), equal_nan=True)


def test_scatter_does_not_use_bincount(monkeypatch):
    """The fast path really runs: with torchmetrics' bincount disabled, the plain metric fails and ours doesn't."""
    import importlib

    # the package re-exports a function called stat_scores: import the module by its full name
    tm_stat_scores = importlib.import_module("torchmetrics.functional.classification.stat_scores")

    def no_bincount(*args, **kwargs):
        raise AssertionError("bincount called")

    monkeypatch.setattr(tm_stat_scores, "_bincount", no_bincount)
    preds, target = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])
    with pytest.raises(AssertionError, match="bincount called"):
        MulticlassPrecision(num_classes=3).update(preds, target)
    fast = scatter_stat_scores(MulticlassPrecision)(num_classes=3)
    fast.update(preds, target)
    # precision per class: 1/1, 1/1, 1/2 -> macro 5/6
    assert_close(fast.compute(), torch.tensor(5 / 6))


def test_scatter_validates_like_torchmetrics():
    fast = scatter_stat_scores(MulticlassPrecision)(num_classes=3)
    with pytest.raises(ValueError, match="should have the same shape"):
        fast.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="Detected more unique values in `target` than expected"):
        fast.update(torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 5, 7]))


def test_scatter_float_labels_like_torchmetrics():
    preds, target = torch.tensor([0.0, 2.0, 1.0, 1.0]), torch.tensor([0, 1, 1, 2])
    plain = MulticlassPrecision(num_classes=3)
    fast = scatter_stat_scores(MulticlassPrecision)(num_classes=3)
    plain.update(preds, target)
    fast.update(preds, target)
    assert_close(fast.compute(), plain.compute())


@pytest.mark.parametrize("average", AVERAGES)
def test_scatter_keeps_the_states_of_torchmetrics(average):
    """Not only the values: the states have torchmetrics' shapes (micro: one count each), so they sync and merge
    like the plain metric's."""
    preds, target = torch.tensor([0, 1, 2, 3, 3]), torch.tensor([0, 2, 2, 3, 1])
    plain = MulticlassStatScores(num_classes=4, average=average)
    fast = scatter_stat_scores(MulticlassStatScores)(num_classes=4, average=average)
    for m in (plain, fast):
        m.update(preds, target)
    for state in ("tp", "fp", "tn", "fn"):
        assert_close(getattr(fast, state), getattr(plain, state), **EXACT)
    if average == "micro":
        # three hits, two misses (each a false positive for one class and a false negative for another),
        # and 4 classes x 5 positions = 20 decisions in all: 20 - 3 - 2 - 2 = 13 true negatives
        assert (fast.tp.tolist(), fast.fp.tolist(), fast.fn.tolist(), fast.tn.tolist()) == ([3], [2], [2], [13])


# A call that raises leaves the metric as it was (forward), or unsynced (compute under DDP).

GOOD_LABELS = [(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])),
               (torch.tensor([[2.0, 0.5, 0.0], [0.0, 0.5, 3.0]]), torch.tensor([0, 2]))]
BAD_LABELS = (torch.tensor([0, 7]), torch.tensor([0, 1]))  # prediction 7 of 3 classes
INVALID = ("1 prediction(s) or target(s) outside 0..2 reached ScatterMulticlassPrecision since its last reset and "
           "were left out of the counts; fix the labels, or pass ignore_index=<the padding label> (now None) to skip "
           "them.")


def scatter_precision(**kwargs):
    return scatter_stat_scores(MulticlassPrecision)(num_classes=3, average="macro", validate_args=False, **kwargs)


def test_scatter_forward_that_raises_leaves_the_metric_as_it_was():
    """torchmetrics' forward resets the metric before it updates and computes the batch alone: it raised there and
    kept only the failed batch, with _to_sync False (the next compute would not sync under DDP)."""
    fast = scatter_precision()
    for batch in GOOD_LABELS:
        fast.update(*batch)
    states = {name: getattr(fast, name).tolist() for name in fast._defaults}
    before = {name: getattr(fast, name) for name in ("_update_count", "_to_sync", "_should_unsync", "_enable_grad",
                                                     "compute_on_cpu", "_is_synced")}
    with pytest.raises(ValueError, match=whole(INVALID)):
        fast(*BAD_LABELS)
    assert {name: getattr(fast, name) for name in before} == before
    assert {name: getattr(fast, name).tolist() for name in states} == states
    # class 0: 2 of 2 predictions right, class 1: 1 of 1, class 2: 2 of 3
    assert fast.compute().item() == float(torch.tensor((1 + 1 + 2 / 3) / 3, dtype=torch.float32))


def scatter_calls_that_raise_on_two_ranks(rank: int, world_size: int) -> dict[str, object]:
    """Worker: (1) rank 0's forward raises for an invalid label, then both ranks compute; (2) rank 0 updates with
    an invalid label, both ranks compute (both raise), update again and compute, then reset and compute."""
    group = short_gloo_group()  # a gather that the other rank never joins fails after 20 s, not 30 minutes
    out = attempt = Attempts()  # the errors of the calls that raise, under their keys, beside the other results

    fast = scatter_precision(process_group=group)
    fast.update(*GOOD_LABELS[rank])
    if rank == 0:
        attempt("forward", lambda: fast(*BAD_LABELS))
    out["after forward"] = attempt("compute after forward", lambda: fast.compute().item())

    fast = scatter_precision(process_group=group)
    fast.update(*GOOD_LABELS[rank])
    if rank == 0:
        fast.update(*BAD_LABELS)
    local = {name: getattr(fast, name).clone() for name in fast._defaults}
    attempt("compute", fast.compute)
    out["synced after the error"] = fast._is_synced
    out["local states kept"] = all(torch.equal(getattr(fast, n), t) for n, t in local.items())
    fast.update(*GOOD_LABELS[rank])
    attempt("next compute", fast.compute)
    fast.reset()
    fast.update(*GOOD_LABELS[rank])
    out["after reset"] = attempt("compute after reset", lambda: fast.compute().item())
    return out


SCATTER_CALLS_THAT_RAISE_ON_TWO_RANKS_KEY = ranks.on_two_ranks(scatter_calls_that_raise_on_two_ranks)


def test_scatter_calls_that_raise_on_two_gloo_ranks_leave_the_ranks_in_step():
    """As FusedMetrics (tests/test_suite.py): compute() syncs before it reads the invalid-label count, so both ranks
    raise together; each is then unsynced with its own states (torchmetrics left it synced, and the next compute
    failed with "already been synced"). After rank 0's failed forward both ranks gather the good batches' values."""

    plain = MulticlassPrecision(num_classes=3, average="macro")
    for batch in GOOD_LABELS:
        plain.update(*batch)
    want = plain.compute().item()
    results = ranks.results(SCATTER_CALLS_THAT_RAISE_ON_TWO_RANKS_KEY)
    assert [r.error for r in results] == [None, None]
    for r in results:
        got = r.value
        assert got.get("forward") == (f"ValueError: {INVALID}" if r.rank == 0 else None), r.rank
        assert "compute after forward" not in got, (r.rank, got.get("compute after forward"))
        assert got["after forward"] == want, r.rank
        assert (got["compute"], got["synced after the error"], got["local states kept"]) == (
            f"ValueError: {INVALID}", False, True)
        assert got["next compute"] == f"ValueError: {INVALID}", r.rank
        assert "compute after reset" not in got, (r.rank, got.get("compute after reset"))
        assert got["after reset"] == want, r.rank


@pytest.mark.parametrize("bad", [MeanMetric, Accuracy, int, MulticlassPrecision(num_classes=3), None])
def test_scatter_stat_scores_rejects_other_classes(bad):
    with pytest.raises(TypeError, match=r"multiclass stat-score metric class such as .*MulticlassPrecision"):
        scatter_stat_scores(bad)


@pytest.mark.parametrize("bad", [MeanMetric, None])
def test_scatter_stat_scores_refuses_other_classes_with_the_whole_message(bad):
    message = ("scatter_stat_scores takes a multiclass stat-score metric class such as "
               "torchmetrics.classification.MulticlassPrecision (a MulticlassStatScores subclass), "
               f"not {bad!r}. Accuracy(task='multiclass') is a factory: use MulticlassAccuracy.")
    with pytest.raises(TypeError, match=whole(message)):
        scatter_stat_scores(bad)


def brute_force_counts(preds, target, num_classes):
    tp, fp, tn, fn = ([0] * num_classes for _ in range(4))
    for p, t in zip(preds, target):
        for c in range(num_classes):
            if p == c and t == c:
                tp[c] += 1
            elif p == c:
                fp[c] += 1
            elif t == c:
                fn[c] += 1
            else:
                tn[c] += 1
    return tp, fp, tn, fn


@settings(max_examples=200, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_multiclass_counts_brute_force(data):
    num_classes = data.draw(st.integers(1, 20))
    n = data.draw(st.integers(0, 50))
    labels = st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n)
    preds, target = data.draw(labels), data.draw(labels)
    got = multiclass_counts(torch.tensor(preds, dtype=torch.long), torch.tensor(target, dtype=torch.long),
                            num_classes)
    assert [t.tolist() for t in got] == list(brute_force_counts(preds, target, num_classes))
    assert all(t.dtype == torch.long and t.shape == (num_classes,) for t in got)


def test_multiclass_counts_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        multiclass_counts(torch.tensor([0, 1, 2]), torch.tensor([1]), 3)


def test_multiclass_counts_keep_the_device_of_the_labels():
    preds, target = torch.tensor([0, 1, 1]).to("meta"), torch.tensor([0, 1, 0]).to("meta")
    got = multiclass_counts(preds, target, 2, with_invalid=True)
    assert [t.device.type for t in got] == ["meta"] * 5


def test_multiclass_counts_leave_out_labels_equal_to_num_classes():
    # positions: prediction 3 (one past the last class), a hit on class 0, target 3
    tp, fp, tn, fn, invalid = multiclass_counts(torch.tensor([3, 0, 1]), torch.tensor([0, 0, 3]), 3,
                                                with_invalid=True)
    # only the hit is counted: class 0 is its true positive, classes 1 and 2 its true negatives
    assert (tp.tolist(), fp.tolist(), tn.tolist(), fn.tolist(), int(invalid)) == (
        [1, 0, 0], [0, 0, 0], [0, 1, 1], [0, 0, 0], 2)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_multiclass_counts_refuses_bad_num_classes_with_the_whole_message(bad):
    with pytest.raises(ValueError, match=whole(f"num_classes must be an int >= 1, got {bad!r}.")):
        multiclass_counts(torch.tensor([0]), torch.tensor([0]), bad)


# ----------------------------------------------------------------------------------------------------------
# host_scalar


@pytest.mark.parametrize("value, dtype", [
    (0.25, torch.float32), (3, torch.float32), (-1.5, torch.float32), (np.float16(0.5), torch.float32),
    (np.float32(0.1), torch.float32), (np.int8(-3), torch.float32), (np.float64(0.1), torch.float64),
    (np.longdouble(0.1), torch.float64),
])
def test_host_scalar_numbers(value, dtype):
    t = host_scalar(value)
    assert t.shape == () and t.dtype == dtype and t.device.type == "cpu"
    assert float(t) == float(torch.tensor(float(value), dtype=dtype))


def test_host_scalar_keeps_float64():
    assert host_scalar(0.1, dtype=torch.float64).item() == 0.1  # exact: no round trip through float32
    assert host_scalar(0.1).item() == float(np.float32(0.1))
    src = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    t = host_scalar(src)
    assert t.shape == () and t.dtype == torch.float64 and not t.requires_grad and float(t) == 2.0
    assert host_scalar(torch.tensor(0.5, dtype=torch.float16)).dtype == torch.float32
    assert host_scalar(torch.tensor(0.1, dtype=torch.float64), dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("bad", ["a", None, True, np.bool_(True), [1.0]])
def test_host_scalar_rejects_non_numbers(bad):
    with pytest.raises(TypeError, match=f"host_scalar takes a Python or numpy number, not {type(bad).__name__}"):
        host_scalar(bad)


def test_host_scalar_refuses_device_tensors():
    # a tensor on another device would have to be read back (on CUDA: a sync); "meta" stands in here
    with pytest.raises(ValueError, match=r"this tensor is on meta: copying it to the host would wait"):
        host_scalar(torch.empty((), device="meta"))


def test_host_scalar_rejects_other_dtypes():
    with pytest.raises(ValueError, match="dtype must be torch.float32, torch.float64 or None, got torch.int64"):
        host_scalar(1.0, dtype=torch.int64)


def test_host_scalar_rejects_several_numbers():
    with pytest.raises(ValueError, match=r"host_scalar takes one number, got a tensor of shape \(2,\)"):
        host_scalar(torch.tensor([1.0, 2.0]))


# ----------------------------------------------------------------------------------------------------------
# on a CUDA device: the syncs that the variants and host_scalar save




@gpu
def test_optimized_mean_update_does_not_sync(loss):
    m = warm(suppress_nan_check(MeanMetric)().cuda(), loss, weight=torch.ones_like(loss))
    assert count_syncs(m.update, loss, weight=torch.ones_like(loss)).count == 0


@gpu
def test_float_update_of_gpu_metric_syncs_and_host_tensor_does_not():
    m = warm(MeanMetric().cuda(), 0.5)
    assert count_syncs(m.update, 0.5).count >= 1
    assert count_syncs(m.update, host_scalar(0.5)).count == 0


@gpu
def test_classifier_syncs_and_fast_paths():
    logits = torch.randn(64, 1000, device="cuda")
    target = torch.randint(0, 1000, (64,), device="cuda")
    # the task wrappers default to micro averaging: counts are plain sums, no sync
    micro = warm(Precision(task="multiclass", num_classes=1000).cuda(), logits, target)
    assert count_syncs(micro.update, logits, target).count == 0
    # macro averaging counts per class with torch.bincount, which reads min and max back
    macro = warm(MulticlassPrecision(num_classes=1000).cuda(), logits, target)
    report = count_syncs(macro.update, logits, target)
    assert report.count == 2
    assert all(s.function == "_bincount" for s in report.sites)
    fast = warm(scatter_stat_scores(MulticlassPrecision)(num_classes=1000).cuda(), logits, target)
    assert count_syncs(fast.update, logits, target).count == 0


@gpu
def test_scatter_stat_scores_with_ignore_index_is_sync_free_and_matches_torchmetrics():
    torch.manual_seed(0)
    logits = torch.randn(64, 10, device="cuda")
    target = torch.randint(0, 10, (64,), device="cuda")
    target[::4] = -100  # a quarter of the labels ignored, as a loss with ignore_index=-100 would
    fast = warm(scatter_stat_scores(MulticlassPrecision)(num_classes=10, ignore_index=-100).cuda(), logits, target)
    report = count_syncs(fast.update, logits, target)
    assert report.count == 0, report.table()
    reference = MulticlassPrecision(num_classes=10, ignore_index=-100).cuda()
    reference.update(logits, target)
    reference.update(logits, target)
    assert torch.equal(fast.compute(), reference.compute())


@gpu
def test_host_scalar_stays_on_the_host():
    t = host_scalar(0.25)
    assert t.device.type == "cpu" and t.dtype == torch.float32
    with pytest.raises(ValueError, match="this tensor is on cuda:0"):
        host_scalar(torch.ones((), device="cuda"))
