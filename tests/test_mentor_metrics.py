"""CPU tests of mentor.metrics: the sync-free variants against torchmetrics, the metric sets, TensorBoard I/O."""

import itertools
import math
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.testing import assert_close
from torchmetrics import Accuracy, MaxMetric, MeanMetric, MinMetric, SumMetric
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
    MulticlassStatScores,
)

from mentor.metrics import (
    ARTICLE_SETS,
    METRIC_SETS,
    LossAndScores,
    host_scalar,
    log_to_tensorboard,
    metric_set,
    multiclass_counts,
    read_tensorboard,
    read_values,
    score_metrics,
    scatter_stat_scores,
    suppress_nan_check,
)
from exact import whole

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
    assert math.isnan(float(feed(suppress_nan_check(MeanMetric)(), [(torch.tensor([1.0, float("nan"), 3.0]), None)]).compute()))


def test_suppressed_class_identity():
    cls = suppress_nan_check(SumMetric)
    assert issubclass(cls, SumMetric)
    assert cls.__name__ == "NoNanCheckSumMetric"
    assert cls.__module__ == "mentor.metrics"
    assert suppress_nan_check(SumMetric) is cls
    assert isinstance(suppress_nan_check(SumMetric)(), cls)
    import mentor.metrics

    assert mentor.metrics.NoNanCheckSumMetric is cls


@pytest.mark.parametrize("factory, base, kwargs, update", [
    ("suppress_nan_check", MeanMetric, {}, lambda m: m.update(torch.tensor([1.0, 3.0]))),
    ("scatter_stat_scores", MulticlassPrecision, dict(num_classes=3),
     lambda m: m.update(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]))),
])
def test_made_classes_pickle_and_save(tmp_path, factory, base, kwargs, update):
    import pickle
    import subprocess
    import sys

    import mentor.metrics

    metric = getattr(mentor.metrics, factory)(base)(**kwargs)
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
    import mentor.metrics

    with pytest.raises(AttributeError, match="has no attribute 'NoNanCheckNothing'"):
        mentor.metrics.NoNanCheckNothing  # noqa: B018


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


@pytest.mark.parametrize("bad", [MeanMetric, Accuracy, int, MulticlassPrecision(num_classes=3), None])
def test_scatter_stat_scores_rejects_other_classes(bad):
    with pytest.raises(TypeError, match=r"multiclass stat-score metric class such as .*MulticlassPrecision"):
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


# ----------------------------------------------------------------------------------------------------------
# metric sets


@settings(max_examples=15, deadline=None, suppress_health_check=SLOW_OK)
@given(data=st.data())
def test_metric_sets_agree(data):
    from torchmetrics.functional.classification import (multiclass_accuracy, multiclass_f1_score,
                                                        multiclass_precision, multiclass_recall)

    num_classes = data.draw(st.integers(2, 20))
    steps = data.draw(st.integers(1, 4))
    seed = data.draw(st.integers(0, 2**32 - 1))
    g = torch.Generator().manual_seed(seed)
    stream = []
    for _ in range(steps):
        n = int(torch.randint(1, 9, (), generator=g))
        logits = torch.randn(n, num_classes, generator=g)
        target = torch.randint(0, num_classes, (n,), generator=g)
        stream.append((torch.nn.functional.cross_entropy(logits, target), logits, target))
    computed = {}
    for variant in METRIC_SETS:
        ms = metric_set(variant, num_classes=num_classes)
        for loss, logits, target in stream:
            ms.update(loss, logits, target)
        computed[variant] = ms.read()
    logits = torch.cat([s[1] for s in stream])
    target = torch.cat([s[2] for s in stream])
    mean_loss = float(torch.stack([s[0] for s in stream]).mean())
    for average, variants in (("micro", ARTICLE_SETS), ("macro", ("macro", "macro sync-free"))):
        expected = {"accuracy": multiclass_accuracy, "precision": multiclass_precision,
                    "recall": multiclass_recall, "f1_score": multiclass_f1_score}
        expected = {k: float(f(logits, target, num_classes, average=average)) for k, f in expected.items()}
        for variant in variants:
            values = computed[variant]
            assert list(values) == ["loss", "accuracy", "f1_score", "precision", "recall"], variant
            assert math.isclose(values["loss"], mean_loss, rel_tol=1e-5), variant
            for name, value in expected.items():
                assert math.isclose(values[name], value, rel_tol=1e-6, abs_tol=1e-7), (variant, name)
            assert values == computed[variants[0]], variant


def test_metric_set_variants():
    assert set(ARTICLE_SETS) < set(METRIC_SETS) and {"macro", "macro sync-free"} <= set(METRIC_SETS)
    sets = {v: metric_set(v, num_classes=10) for v in METRIC_SETS}
    for variant, ms in sets.items():
        assert isinstance(ms, LossAndScores)
        assert list(ms.scores) == ["accuracy", "f1_score", "precision", "recall"]
        assert ms.description == METRIC_SETS[variant]
        assert ms.forward is False and ms.scores._enable_compute_groups is False
    assert type(sets["naive"].loss) is MeanMetric and sets["naive"].loss_weight is None
    assert type(sets["optimized"].loss).__name__ == "NoNanCheckMeanMetric"
    assert sets["optimized"].loss_weight == "tensor"
    # the article's two intermediate sets: a Python float weight (1.6.1's default) and its first fix
    assert (sets["float weight"].loss_weight, sets["tensor weight"].loss_weight) == ("float", "tensor")
    assert type(sets["float weight"].loss) is MeanMetric
    assert type(sets["tensor weight"].loss) is MeanMetric
    assert sets["built-in"].loss.nan_strategy == "disable"
    # torchmetrics ignores weights with nan_strategy="disable" (see above): the built-in set must not rely on them
    assert sets["built-in"].loss_weight is None
    for variant in ARTICLE_SETS:
        assert {m.average for m in sets[variant].scores.values()} == {"micro"}, variant
    assert [type(m).__name__ for m in sets["macro"].scores.values()] == [
        "MulticlassAccuracy", "MulticlassF1Score", "MulticlassPrecision", "MulticlassRecall"]
    assert [type(m).__name__ for m in sets["macro sync-free"].scores.values()] == [
        "ScatterMulticlassAccuracy", "ScatterMulticlassF1Score", "ScatterMulticlassPrecision",
        "ScatterMulticlassRecall"]
    for variant in ("macro", "macro sync-free"):
        assert {m.average for m in sets[variant].scores.values()} == {"macro"}, variant
        assert type(sets[variant].loss).__name__ == "NoNanCheckMeanMetric" and sets[variant].loss_weight == "tensor"


def test_metric_set_passes_compute_groups_and_forward():
    grouped = metric_set("macro", num_classes=5, compute_groups=[["accuracy", "precision", "recall", "f1_score"]])
    assert grouped.scores.compute_groups == {0: ["accuracy", "precision", "recall", "f1_score"]}
    logits, target = torch.randn(6, 5, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 3, 4, 0])
    grouped.update(torch.tensor(1.0), logits, target)
    # one group: only its first member is updated, the others share its states
    members = grouped.scores._modules
    assert members["recall"].tp is members["accuracy"].tp and members["f1_score"].fn is members["accuracy"].fn
    auto = metric_set("macro", num_classes=5, compute_groups=True, forward=True)
    auto.update(torch.tensor(1.0), logits, target)
    assert auto.forward is True
    assert auto.scores.compute_groups == {0: ["accuracy"], 1: ["f1_score"], 2: ["precision"], 3: ["recall"]}
    plain = metric_set("macro", num_classes=5)
    plain.update(torch.tensor(1.0), logits, target)
    assert auto.read() == plain.read() == grouped.read()
    with pytest.raises(ValueError, match="forward must be True or False, got 'yes'"):
        metric_set("macro", forward="yes")


@pytest.mark.parametrize("loss_weight,expected", [(None, "absent"), ("tensor", torch.Tensor), ("float", float)])
def test_loss_and_scores_feeds_the_loss_weight(loss_weight, expected):
    seen = {}

    class Spy(MeanMetric):
        def update(self, value, weight=None):
            seen["value"], seen["weight"] = value, weight
            super().update(value, weight=weight) if weight is not None else super().update(value)

    ms = LossAndScores(Spy(), MetricCollection({"acc": MulticlassAccuracy(3, average="micro")}),
                       loss_weight=loss_weight)
    ms.update(torch.tensor(0.7), torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]), torch.tensor([0, 2]))
    if expected == "absent":
        assert seen["weight"] is None
    else:
        assert isinstance(seen["weight"], expected) and float(seen["weight"]) == 1.0
    assert ms.read() == {"loss": pytest.approx(0.7, rel=1e-6), "acc": 0.5}


def test_loss_and_scores_rejects_bad_input():
    scores = MetricCollection({"acc": MulticlassAccuracy(3)})
    with pytest.raises(ValueError, match=r"loss_weight must be None, 'tensor' or 'float', got True"):
        LossAndScores(MeanMetric(), scores, loss_weight=True)  # the old bool API
    with pytest.raises(TypeError, match="loss must be a torchmetrics Metric such as MeanMetric"):
        LossAndScores(torch.tensor(1.0), scores)
    with pytest.raises(TypeError, match=r"scores must be a torchmetrics MetricCollection .* not dict"):
        LossAndScores(MeanMetric(), {"acc": MulticlassAccuracy(3)})
    with pytest.raises(ValueError, match="scores has a metric named 'loss'"):
        LossAndScores(MeanMetric(), MetricCollection({"loss": MeanMetric()}))


def test_metric_set_report_resets_and_remembers():
    ms = metric_set("optimized", num_classes=3)
    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    ms.update(torch.tensor(1.0), logits, torch.tensor([0, 1]))       # both right
    first = ms.report(2)
    assert first == {"step": 2, "loss": 1.0, "accuracy": 1.0, "f1_score": 1.0, "precision": 1.0, "recall": 1.0}
    ms.update(torch.tensor(3.0), logits, torch.tensor([1, 0]))       # both wrong
    second = ms.report(4)
    assert second["loss"] == 3.0 and second["accuracy"] == 0.0   # the first update was reset
    assert ms.history == [first, second]


def test_read_values_reads_once_and_keeps_shapes(monkeypatch):
    calls = []
    original = torch.Tensor.tolist

    def spy(self):
        calls.append(tuple(self.shape))
        return original(self)

    monkeypatch.setattr(torch.Tensor, "tolist", spy)
    out = read_values({"a": torch.tensor(0.25), "b": torch.tensor([1, 2, 3]), "c": torch.tensor(2.5)})
    assert out == {"a": 0.25, "b": [1.0, 2.0, 3.0], "c": 2.5}
    assert calls == [(5,)]  # one read-back of all five numbers
    assert read_values({}) == {}


def test_read_values_rejects_bad_input():
    with pytest.raises(TypeError, match=r"read_values takes tensors, got \{'a': 'float'\}"):
        read_values({"a": 0.5})
    meta = torch.tensor(1.0, device="meta")
    with pytest.raises(ValueError, match=r"the values live on \['cpu', 'meta'\]: move the metrics to one device"):
        read_values({"a": torch.tensor(1.0), "b": meta})


def test_score_metrics_averages_and_rejects_bad_average():
    m = score_metrics(4, "weighted")
    assert {x.average for x in m.values()} == {"weighted"} and list(m) == ["accuracy", "precision", "recall",
                                                                         "f1_score"]
    with pytest.raises(ValueError, match="average must be 'micro', 'macro' or 'weighted', got 'none'"):
        score_metrics(4, "none")


def test_metric_set_rejects_bad_input():
    with pytest.raises(ValueError, match=r"Unknown metric set 'x': pass one of " + re.escape(str(list(METRIC_SETS)))):
        metric_set("x")
    for bad in (1, True, 2.0):
        with pytest.raises(ValueError, match=f"num_classes must be an int >= 2, got {bad!r}"):
            metric_set("naive", num_classes=bad)


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
# TensorBoard


def test_tensorboard_round_trip(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    log_to_tensorboard(writer, {"step": 2.0, "accuracy": 0.5, "avg_loss": 1 / 3}, step=2)
    log_to_tensorboard(writer, {"accuracy": 0.75, "avg_loss": 0.125}, step=4)
    log_to_tensorboard(writer, {"accuracy": 1.0}, step=6, prefix="val/")
    writer.close()
    got = read_tensorboard(tmp_path)
    # TensorBoard stores scalars as float32: compare with the float32 rounding of what was written.
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert got == {
        "train/accuracy": [(2, 0.5), (4, 0.75)],
        "train/avg_loss": [(2, f32(1 / 3)), (4, 0.125)],
        "val/accuracy": [(6, 1.0)],
    }


def test_read_tensorboard_merges_subdirectories(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for name, value in (("a", 1.0), ("b", 2.0)):
        w = SummaryWriter(str(tmp_path / name))
        log_to_tensorboard(w, {"x": value}, step=1 if name == "a" else 0)
        w.close()
    assert read_tensorboard(tmp_path) == {"train/x": [(0, 2.0), (1, 1.0)]}


def test_log_to_tensorboard_rejects_non_writer():
    with pytest.raises(TypeError, match=r"writer must be a SummaryWriter \(with add_scalar\), not dict"):
        log_to_tensorboard({}, {"a": 1.0}, step=0)


def test_read_tensorboard_missing_or_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files under .*pass the logdir"):
        read_tensorboard(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files"):
        read_tensorboard(tmp_path)  # exists but empty


def test_suppressed_mean_emits_no_warning():
    # the NaN-free path of the suppressed metric emits no warning (nothing is checked, nothing is dropped)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        feed(suppress_nan_check(MeanMetric)(), [(torch.tensor([1.0]), None)]).compute()


# ----------------------------------------------------------------------------------------------------------
# plot_scalars


@pytest.fixture
def close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def test_plot_scalars_one_axes_per_tag(close_figures):
    from mentor.metrics import plot_scalars

    scalars = {"train/b": [(1, 2.0), (2, 1.5)], "train/a": [(1, 0.5), (3, 0.25), (5, 0.125)]}
    axes = plot_scalars(scalars)
    assert len(axes) == 2
    # sorted by tag: a first; each axes shows its points
    assert [ax.get_title() for ax in axes] == ["train/a", "train/b"]
    x, y = axes[0].lines[0].get_data()
    assert list(x) == [1, 3, 5] and list(y) == [0.5, 0.25, 0.125]


def test_plot_scalars_lays_out_a_grid_of_ncols(close_figures):
    from mentor.metrics import plot_scalars

    scalars = {f"t{i}": [(1, float(i)), (2, float(i) + 1)] for i in range(5)}
    axes = plot_scalars(scalars)
    fig = axes[0].figure
    assert len(axes) == 5 and len(fig.axes) == 5  # the sixth cell of the 2 x 3 grid is removed
    assert [ax.get_subplotspec().rowspan.start for ax in axes] == [0, 0, 0, 1, 1]
    assert [ax.get_subplotspec().colspan.start for ax in axes] == [0, 1, 2, 0, 1]
    assert tuple(fig.get_size_inches()) == (3.2 * 3, 2.7 * 2)
    assert len(plot_scalars(scalars, ncols=5)[0].figure.axes) == 5
    with pytest.raises(ValueError, match="ncols must be an int >= 1, got 0"):
        plot_scalars(scalars, ncols=0)


def test_plot_scalars_rejects_empty(close_figures):
    from mentor.metrics import plot_scalars

    with pytest.raises(ValueError, match="no scalars to plot: log some with log_to_tensorboard first"):
        plot_scalars({})


def test_read_tensorboard_refuses_garbage_and_empty_event_files(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "events.out.tfevents.1.host").write_bytes(b"\x00not an event file" * 10)
    with pytest.raises(ValueError, match=r"under '.*garbage'.*pass a logdir written by|hold no scalars"):
        read_tensorboard(garbage)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "events.out.tfevents.2.host").write_bytes(b"")
    with pytest.raises(ValueError, match=r"under '.*empty' hold no scalars \(1 file\(s\) read\)"):
        read_tensorboard(empty)


def test_plot_scalars_needs_one_axes_per_tag(close_figures):
    import mentor.metrics as metrics_module

    import matplotlib.pyplot as plt

    _, axes = plt.subplots(1, 1, squeeze=False)
    with pytest.raises(ValueError, match=r"plot_scalars got 1 axes for 2 tags \['a', 'b'\]"):
        metrics_module.plot_scalars({"a": [(1, 1.0)], "b": [(1, 2.0)]}, axes=axes)


def test_collection_ways_compute_the_same_values_and_group_as_documented():
    from mentor.metrics import COLLECTION_WAYS, collection_way

    g = torch.Generator().manual_seed(3)
    steps = [(torch.randn(12, 6, generator=g), torch.randint(0, 6, (12,), generator=g)) for _ in range(3)]
    values = {}
    for sync_free in (False, True):
        for way in COLLECTION_WAYS:
            step = collection_way(way, 6, sync_free=sync_free)
            for preds, target in steps:
                step(preds, target)
            held = step.metrics
            computed = {k: m.compute() for k, m in held.items()} if isinstance(held, dict) else held.compute()
            values[(way, sync_free)] = {k: float(v) for k, v in sorted(computed.items())}
            if way == "automatic groups":
                assert held.compute_groups == {0: ["accuracy", "f1_score", "precision", "recall"]}
            if way == "no groups":
                assert held.compute_groups == {}
            if way == "forward()":  # forward never merges groups
                assert held.compute_groups == {0: ["accuracy"], 1: ["f1_score"], 2: ["precision"], 3: ["recall"]}
            if way == "explicit groups":
                assert held.compute_groups == {0: ["accuracy", "precision", "recall", "f1_score"]}
    reference = values[("separate metrics", False)]
    assert reference["precision"] != reference["recall"]  # macro: the four differ on this data
    for key, got in values.items():
        assert got == pytest.approx(reference, rel=1e-6, abs=1e-7), key
    with pytest.raises(ValueError, match=r"way must be one of \['separate metrics', .*\], got 'both'"):
        collection_way("both", 6)


def test_collection_way_defaults_to_the_cpu():
    from mentor.metrics import collection_way

    step = collection_way("explicit groups", 3)
    assert step.metrics["accuracy"].tp.device.type == "cpu"


# ----------------------------------------------------------------------------------------------------------
# pinned by the mutation run: the module's by-name lookup, the made classes' docstrings and name clashes,
# the devices and dtypes passed on, the edges of the label checks, the defaults, whole error messages


def test_module_getattr_makes_the_classes_by_name():
    """What unpickling in a fresh process calls: the module's ``__getattr__``, called here directly (in this
    process the classes may already be module globals, which attribute access would find first)."""
    import mentor.metrics
    from torchmetrics import CatMetric

    assert mentor.metrics.__getattr__("NoNanCheckCatMetric") is suppress_nan_check(CatMetric)
    assert mentor.metrics.__getattr__("ScatterMulticlassF1Score") is scatter_stat_scores(MulticlassF1Score)
    # a prefix with a base from the other module, an unknown base, no prefix at all
    for name in ("ScatterMeanMetric", "NoNanCheckNothing", "MeanMetric"):
        with pytest.raises(AttributeError, match=whole(f"module 'mentor.metrics' has no attribute {name!r}")):
            mentor.metrics.__getattr__(name)


def test_made_classes_carry_their_docstrings():
    assert suppress_nan_check(SumMetric).__doc__ == "SumMetric without the NaN check."
    assert scatter_stat_scores(MulticlassRecall).__doc__ == "MulticlassRecall counting with scatter_add_, without a sync."
    assert suppress_nan_check(SumMetric).__qualname__ == "NoNanCheckSumMetric"


def test_a_second_base_of_the_same_name_is_refused():
    """Two bases named MeanMetric would both need mentor.metrics.NoNanCheckMeanMetric: pickling needs one name each."""
    import mentor.metrics

    made = suppress_nan_check(MeanMetric)  # mentor.metrics.NoNanCheckMeanMetric now exists
    other = type("MeanMetric", (MeanMetric,), {"__module__": "elsewhere"})
    message = ("mentor.metrics.NoNanCheckMeanMetric already exists for another class named MeanMetric "
               "(torchmetrics.aggregation); give elsewhere.MeanMetric another name so that both can be pickled.")
    with pytest.raises(TypeError, match=whole(message)):
        suppress_nan_check(other)
    assert mentor.metrics.NoNanCheckMeanMetric is made and suppress_nan_check(MeanMetric) is made


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


def test_collection_way_and_metric_set_put_every_metric_on_the_device():
    from mentor.metrics import COLLECTION_WAYS, collection_way

    for way in COLLECTION_WAYS:
        held = collection_way(way, 3, device="meta").metrics
        assert {m.tp.device.type for m in held.values()} == {"meta"}, way
    ms = metric_set("naive", num_classes=3, device="meta")
    assert {m.tp.device.type for m in ms.scores.values()} == {"meta"}
    assert ms.loss.mean_value.device.type == "meta"


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


def test_score_metrics_defaults_to_micro_torchmetrics_classes():
    m = score_metrics(4)
    assert [type(x) for x in m.values()] == [MulticlassAccuracy, MulticlassPrecision, MulticlassRecall,
                                             MulticlassF1Score]
    assert {x.average for x in m.values()} == {"micro"}
    assert {x.average for x in score_metrics(4, "micro", sync_free=True).values()} == {"micro"}


@pytest.mark.parametrize("bad", [MeanMetric, None])
def test_scatter_stat_scores_refuses_other_classes_with_the_whole_message(bad):
    message = ("scatter_stat_scores takes a multiclass stat-score metric class such as "
               "torchmetrics.classification.MulticlassPrecision (a MulticlassStatScores subclass), "
               f"not {bad!r}. Accuracy(task='multiclass') is a factory: use MulticlassAccuracy.")
    with pytest.raises(TypeError, match=whole(message)):
        scatter_stat_scores(bad)


def test_loss_and_scores_refuses_a_dict_of_scores_with_the_whole_message():
    message = ("scores must be a torchmetrics MetricCollection (wrap your metrics: "
               "MetricCollection({'accuracy': ...})), not dict.")
    with pytest.raises(TypeError, match=whole(message)):
        LossAndScores(MeanMetric(), {"acc": MulticlassAccuracy(3)})


def test_read_tensorboard_reads_every_scalar(tmp_path):
    """TensorBoard's EventAccumulator keeps a sample of 10,000 scalars per tag by default; all are read back."""
    from torch.utils.tensorboard import SummaryWriter

    n = 10_001
    writer = SummaryWriter(str(tmp_path))
    for step in range(n):
        writer.add_scalar("train/x", float(step % 2), global_step=step)  # 0.0 and 1.0: exact in float32
    writer.close()
    assert read_tensorboard(tmp_path) == {"train/x": [(step, float(step % 2)) for step in range(n)]}


@pytest.mark.parametrize("bad", [True, 2.5, 0])
def test_plot_scalars_refuses_bad_ncols_with_the_whole_message(bad, close_figures):
    from mentor.metrics import plot_scalars

    with pytest.raises(ValueError, match=whole(f"ncols must be an int >= 1, got {bad!r}.")):
        plot_scalars({"a": [(1, 1.0)], "b": [(1, 2.0)]}, ncols=bad)


def test_plot_scalars_draws_on_given_axes_as_a_grid_or_a_list(close_figures):
    import matplotlib.pyplot as plt

    from mentor.metrics import plot_scalars

    scalars = {"b": [(1, 2.0), (2, 3.0)], "a": [(1, 1.0), (2, 0.5)]}
    _, grid = plt.subplots(2, 1, squeeze=False)  # a 2-D array of Axes: read through .flat
    _, (left, right) = plt.subplots(1, 2)
    for given, expected in ((grid, [grid[0, 0], grid[1, 0]]), ([left, right], [left, right])):
        axes = plot_scalars(scalars, axes=given)
        assert axes == expected
        assert [ax.get_title() for ax in axes] == ["a", "b"]
        assert [list(ax.lines[0].get_ydata()) for ax in axes] == [[1.0, 0.5], [2.0, 3.0]]


def test_plot_scalars_panels_do_not_overlap(close_figures):
    """Titles, tick labels and the x label of one panel stay clear of the next panel's, inside the figure."""
    from mentor.metrics import plot_scalars

    scalars = {f"train/t{i}": [(1, 0.125 * i), (2, 0.5 + i)] for i in range(5)}
    axes = plot_scalars(scalars)
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in axes]
    figure_box = fig.bbox
    for box in boxes:
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1
        assert figure_box.y0 <= box.y0 and box.y1 <= figure_box.y1
    for i, j in itertools.combinations(range(len(boxes)), 2):
        assert not boxes[i].overlaps(boxes[j]), (axes[i].get_title(), axes[j].get_title())
