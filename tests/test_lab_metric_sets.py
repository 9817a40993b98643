"""mentor.lab.metric_sets: the metric sets against torchmetrics' functions, LossAndScores, read_values, score_metrics
and the ways of holding the macro classifiers; on a CUDA device, the syncs of an update and of a read."""

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

from exact import whole
from marks import gpu
from mentor.lab.metric_sets import (
    ARTICLE_SETS,
    COLLECTION_WAYS,
    METRIC_SETS,
    LossAndScores,
    collection_way,
    metric_set,
    read_values,
    score_metrics,
)
from mentor.syncs import count_syncs

# slow CPUs and the NumPy/Tensor strategies: judge the examples, not the time it takes to draw them
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


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


def test_metric_set_rejects_bad_input():
    with pytest.raises(ValueError, match=r"Unknown metric set 'x': pass one of " + re.escape(str(list(METRIC_SETS)))):
        metric_set("x")
    for bad in (1, True, 2.0):
        with pytest.raises(ValueError, match=f"num_classes must be an int >= 2, got {bad!r}"):
            metric_set("naive", num_classes=bad)


def test_collection_way_and_metric_set_put_every_metric_on_the_device():
    for way in COLLECTION_WAYS:
        held = collection_way(way, 3, device="meta").metrics
        assert {m.tp.device.type for m in held.values()} == {"meta"}, way
    ms = metric_set("naive", num_classes=3, device="meta")
    assert {m.tp.device.type for m in ms.scores.values()} == {"meta"}
    assert ms.loss.mean_value.device.type == "meta"


@gpu
def test_optimized_set_is_sync_free():
    ms = metric_set("optimized", num_classes=1000, device="cuda")
    logits = torch.randn(32, 1000, device="cuda")
    target = torch.randint(0, 1000, (32,), device="cuda")
    loss = torch.nn.functional.cross_entropy(logits, target)
    ms.update(loss, logits, target)
    torch.cuda.synchronize()
    assert count_syncs(ms.update, loss, logits, target).count == 0


@gpu
@pytest.mark.parametrize("variant, syncs", [("macro sync-free", 0), ("optimized", 0)])
def test_sync_free_metric_sets_make_no_sync_per_update(variant, syncs):
    ms = metric_set(variant, num_classes=1000, device="cuda")
    logits = torch.randn(64, 1000, device="cuda")
    target = torch.randint(0, 1000, (64,), device="cuda")
    loss = torch.rand((), device="cuda")
    ms.update(loss, logits, target)
    report = count_syncs(ms.update, loss, logits, target)
    assert report.count == syncs, report.table()


@gpu
def test_read_reads_the_values_back_in_one_copy():
    ms = metric_set("macro sync-free", num_classes=10, device="cuda")
    ms.update(torch.tensor(1.0, device="cuda"), torch.eye(10, device="cuda"), torch.arange(10, device="cuda"))
    values = ms.compute()
    report = count_syncs(read_values, values)
    assert report.count == 1, report.table()
    assert ms.read() == {"loss": 1.0, "accuracy": 1.0, "f1_score": 1.0, "precision": 1.0, "recall": 1.0}


# ----------------------------------------------------------------------------------------------------------
# LossAndScores


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


def test_loss_and_scores_refuses_a_dict_of_scores_with_the_whole_message():
    message = ("scores must be a torchmetrics MetricCollection (wrap your metrics: "
               "MetricCollection({'accuracy': ...})), not dict.")
    with pytest.raises(TypeError, match=whole(message)):
        LossAndScores(MeanMetric(), {"acc": MulticlassAccuracy(3)})


# ----------------------------------------------------------------------------------------------------------
# read_values


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


# ----------------------------------------------------------------------------------------------------------
# score_metrics and collection_way


def test_score_metrics_averages_and_rejects_bad_average():
    m = score_metrics(4, "weighted")
    assert {x.average for x in m.values()} == {"weighted"} and list(m) == ["accuracy", "precision", "recall",
                                                                         "f1_score"]
    with pytest.raises(ValueError, match="average must be 'micro', 'macro' or 'weighted', got 'none'"):
        score_metrics(4, "none")


def test_score_metrics_defaults_to_micro_torchmetrics_classes():
    m = score_metrics(4)
    assert [type(x) for x in m.values()] == [MulticlassAccuracy, MulticlassPrecision, MulticlassRecall,
                                             MulticlassF1Score]
    assert {x.average for x in m.values()} == {"micro"}
    assert {x.average for x in score_metrics(4, "micro", sync_free=True).values()} == {"micro"}


def test_collection_ways_compute_the_same_values_and_group_as_documented():
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
    step = collection_way("explicit groups", 3)
    assert step.metrics["accuracy"].tp.device.type == "cpu"
