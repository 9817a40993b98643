"""mentor.lab.updates: the one registry of the metric updates the book measures (UPDATES), their inputs and
book_updates; each builder on hand-made inputs with exact values, every builder on the CPU, the FusedMetrics
ignore case against torchmetrics, and releases.measure measuring exactly these updates."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import torchmetrics
from torchmetrics import MeanMetric, Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

import mentor.lab.metric_sets
import mentor.suite
import mentor.sync_free
from mentor.lab import updates
from mentor.lab.metric_sets import LossAndScores
from mentor.lab.releases import measure
from mentor.lab.updates import UPDATES, book_updates, update_inputs

NAMES = [
    "MeanMetric(loss)", "MeanMetric, w=1.0", "MeanMetric, w=tensor", "MeanMetric, disable", "NoNanCheckMeanMetric",
    "Accuracy (micro)", "Precision (micro)", "Precision, ignore_idx", "Precision (macro)", "ScatterPrecision",
    "naive set", "optimized set", "macro set", "macro sync-free set", "macro, one group", "FusedMetrics",
    "FusedMetrics, ignore"]
"""The names of the book's tables, in the order its tables list them."""


def _closed(fn) -> dict:
    """What an update's lambda closes over, by the names it uses."""
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))


def _metrics(value: Any) -> list[Metric]:
    """The torchmetrics metrics inside a closed-over value: a metric, a MetricCollection or a LossAndScores."""
    if isinstance(value, LossAndScores):
        return [value.loss, *value.scores.values()]
    if isinstance(value, MetricCollection):
        return list(value.values())
    if isinstance(value, Metric):
        return [value]
    return []


def _holder(fn) -> Any:
    """The one object an update updates (a metric, a collection or a metric set)."""
    [holder] = [v for v in _closed(fn).values() if _metrics(v)]
    return holder


# ----------------------------------------------------------------------------------------------------------
# The registry, its inputs and book_updates


def test_the_updates_are_the_books_names_in_order() -> None:
    assert list(UPDATES) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_builder_builds_and_updates_on_the_cpu(name: str) -> None:
    """Two updates on 16 samples of 5 classes: every metric inside counts both, and computes finite values."""
    update = UPDATES[name](update_inputs(torch.device("cpu"), 16, 5, seed=0), torch.device("cpu"), 5)
    assert update() is None
    update()
    holder = _holder(update)
    assert [m.update_count for m in _metrics(holder)] == [2] * len(_metrics(holder))
    values = holder.compute()
    values = values if isinstance(values, dict) else {"value": values}
    assert values and all(bool(torch.isfinite(v).all()) for v in values.values()), values


def test_book_updates_build_each_update_of_the_registry_in_order_on_one_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """book_updates calls every builder of UPDATES, in order, with update_inputs(device, 32, 1000, 0) by default
    (one batch for all) and the number of classes, and returns what each built under its name."""
    seen: list[Any] = []

    def probe(name: str) -> Any:
        def build(x: dict, device: torch.device, c: int) -> Any:
            seen.append((name, x, device, c))
            return name.upper()
        return build

    monkeypatch.setattr(updates, "UPDATES", {name: probe(name) for name in ("b", "a")})
    assert book_updates("cpu") == {"b": "B", "a": "A"}
    assert [(name, device, c) for name, _, device, c in seen] == [("b", torch.device("cpu"), 1000),
                                                                  ("a", torch.device("cpu"), 1000)]
    assert seen[0][1] is seen[1][1]  # one batch for every update
    expected = update_inputs(torch.device("cpu"), 32, 1000, 0)
    assert {k: torch.equal(v, expected[k]) for k, v in seen[0][1].items()} == dict.fromkeys(expected, True)
    seen.clear()
    book_updates("cpu", 4, 3, seed=9)
    again = update_inputs(torch.device("cpu"), 4, 3, 9)
    assert [c for _, _, _, c in seen] == [3, 3]
    assert {k: torch.equal(v, again[k]) for k, v in seen[0][1].items()} == dict.fromkeys(again, True)
    seen.clear()
    book_updates("meta", 4, 3)
    assert [(device, c) for _, _, device, c in seen] == [(torch.device("meta"), 3)] * 2
    assert {v.device.type for v in seen[0][1].values()} == {"meta"}


def test_book_updates_cover_the_books_metrics_and_each_one_updates():
    """Exactly the registry's names, in its order; each update closes over the metric it updates."""
    cases = book_updates("cpu", batch_size=16, num_classes=5)
    assert list(cases) == list(UPDATES) == NAMES
    for name, fn in cases.items():
        fn()
        metrics = _metrics(_holder(fn))
        assert metrics and all(m.update_count == 1 for m in metrics), name
    suite_ignore = _holder(cases["FusedMetrics, ignore"])
    assert type(suite_ignore).__name__ == "FusedMetrics"
    assert int(suite_ignore.loss_count) == 1 and int(suite_ignore.tp.sum() + suite_ignore.fn.sum()) == 14  # 2 of 16


def _batch(cases: dict) -> dict:
    """The batch the cases share (one for all): logits, target, padded (target with padding) and loss."""
    batches = [_closed(fn)["x"] for fn in cases.values()]
    assert all(batch is batches[0] for batch in batches)
    return batches[0]


def test_book_updates_default_to_32_samples_of_1000_classes_drawn_with_seed_0():
    batch = _batch(book_updates("cpu"))
    assert batch["logits"].shape == (32, 1000) and batch["target"].shape == (32,) and batch["loss"].shape == ()
    again = _batch(book_updates("cpu", 32, 1000, seed=0))
    assert all(torch.equal(batch[k], again[k]) for k in ("logits", "target", "padded", "loss"))


def test_book_updates_draw_one_batch_per_seed_whatever_the_global_rng():
    torch.manual_seed(1)
    first = _batch(book_updates("cpu", 64, 2, seed=3))
    torch.manual_seed(2)
    second = _batch(book_updates("cpu", 64, 2, seed=3))
    other = _batch(book_updates("cpu", 64, 2, seed=4))
    for k in ("logits", "target", "loss"):
        assert torch.equal(first[k], second[k]), k
        assert not torch.equal(first[k], other[k]), k
    # labels are 0 .. num_classes - 1: with 2 classes and 64 draws both occur (all equal has chance 2**-63)
    assert set(first["target"].tolist()) == {0, 1}
    every_eighth = torch.arange(64) % 8 == 0
    assert torch.equal(first["padded"], torch.where(every_eighth, -100, first["target"]))


def test_book_updates_put_every_metric_and_tensor_on_the_device():
    # "meta" is a device other than the CPU that needs no GPU; nothing is updated, only placed
    def devices(value) -> list:
        if isinstance(value, (str, float)):  # the name of the labels to pass, or a weight of 1.0
            return []
        if isinstance(value, torch.Tensor):
            return [value.device.type]
        if isinstance(value, Metric):
            return [value.device.type] + [s.device.type for s in value.metric_state.values()]
        if isinstance(value, dict):  # the batch, or a MetricCollection's metrics
            return [d for v in value.values() for d in devices(v)]
        if hasattr(value, "scores"):  # a LossAndScores
            return devices(value.loss) + devices(dict(value.scores.items()))
        return devices(dict(value.items()))  # a MetricCollection

    cases = book_updates("meta", 16, 5)
    for name, fn in cases.items():
        found = [d for v in _closed(fn).values() for d in devices(v)]
        assert found and set(found) == {"meta"}, name


def test_book_updates_pass_the_weights_they_are_named_for():
    cases = book_updates("cpu", 16, 5)
    seen = {}
    for name in ("MeanMetric(loss)", "MeanMetric, w=1.0", "MeanMetric, w=tensor", "MeanMetric, disable",
                 "NoNanCheckMeanMetric"):
        _holder(cases[name]).update = lambda *args, _name=name, **kwargs: seen.setdefault(_name, (args, kwargs))
        cases[name]()
    loss = _batch(cases)["loss"]
    assert seen["MeanMetric(loss)"] == ((loss,), {})
    args, kwargs = seen["MeanMetric, w=1.0"]
    assert args == (loss,) and kwargs == {"weight": 1.0} and type(kwargs["weight"]) is float
    for name in ("MeanMetric, w=tensor", "MeanMetric, disable", "NoNanCheckMeanMetric"):
        args, kwargs = seen[name]
        assert args == (loss,) and list(kwargs) == ["weight"], name
        assert isinstance(kwargs["weight"], torch.Tensor) and torch.equal(kwargs["weight"], torch.ones(())), name


def test_book_updates_ignore_cases_leave_out_the_padding():
    cases = book_updates("cpu", 16, 5)
    for fn in cases.values():
        fn()
    precision = _holder(cases["Precision, ignore_idx"])
    # micro: one prediction per counted sample, and 2 of the 16 are padding
    assert (precision.ignore_index, int(precision.tp.sum() + precision.fp.sum())) == (-100, 14)
    suite = _holder(cases["FusedMetrics, ignore"])
    assert int(suite.invalid_labels) == 0  # -100 is skipped, not counted as a label outside 0..4
    plain = _holder(cases["FusedMetrics"])
    assert plain.ignore_index is None and int(plain.invalid_labels) == 0


def test_book_updates_one_group_holds_four_macro_scores_grouped_from_the_start():
    grouped = _holder(book_updates("cpu", 16, 5)["macro, one group"])
    assert grouped.compute_groups == {0: ["accuracy", "precision", "recall", "f1_score"]}  # before any update
    assert {name: m.average for name, m in grouped.items()} == {
        "accuracy": "macro", "precision": "macro", "recall": "macro", "f1_score": "macro"}


# ----------------------------------------------------------------------------------------------------------
# update_inputs


def test_inputs_come_from_the_seed_alone_with_every_eighth_label_padded() -> None:
    """logits, target (labels 0..c-1) and loss are drawn in that order from a generator seeded with ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)  # the global generator must not matter
        x = update_inputs(CPU, 17, 5, seed=7)
    gen = torch.Generator().manual_seed(7)
    assert torch.equal(x["logits"], torch.randn(17, 5, generator=gen))
    assert torch.equal(x["target"], torch.randint(0, 5, (17,), generator=gen))
    assert torch.equal(x["loss"], torch.rand((), generator=gen))
    assert torch.equal(x["padded"], torch.where(torch.arange(17) % 8 == 0, -100, x["target"]))
    assert x["padded"].tolist().count(-100) == 3  # rows 0, 8, 16
    assert {k: v.device for k, v in update_inputs(META, 4, 3, seed=0).items()} == dict.fromkeys(x, META)


# ----------------------------------------------------------------------------------------------------------
# Each builder on hand-made inputs


# The builders are called here at test time (not through UPDATES, whose entries were made at import), with
# hand-made inputs: three classes, predictions 0, 1, 2, 2 (argmax of the logits) for labels 0, 1, 1, 2.
# Micro accuracy and precision are 3/4. Per class, precision is 1, 1, 1/2 (macro 5/6), recall 1, 1/2, 1
# (macro 5/6) and F1 1, 2/3, 2/3 (macro 7/9). With the first label padded to -100 and ignored, the
# predictions 1, 2, 2 for labels 1, 1, 2 have micro precision 2/3.
# Each builder is also called with the meta device (no update there): its metric must end up on that device.
CPU, META = torch.device("cpu"), torch.device("meta")


def _hand_inputs() -> dict[str, torch.Tensor]:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [0.0, 1.0, 2.0]])
    return {"logits": logits, "target": torch.tensor([0, 1, 1, 2]), "padded": torch.tensor([-100, 1, 1, 2]),
            "loss": torch.tensor(0.25)}


def _recording(make: Any, made: list[Any]) -> Any:
    """``make`` that also appends ``(args, kwargs, what it returned)`` to ``made``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        made.append((args, kwargs, make(*args, **kwargs)))
        return made[-1][2]
    return call


def _spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Any]:
    made: list[Any] = []
    monkeypatch.setattr(owner, name, _recording(getattr(owner, name), made))
    return made


class _RecordedMean(MeanMetric):
    """MeanMetric that keeps its instances and the arguments of each update (suppress_nan_check can derive from it)."""

    made: list["_RecordedMean"] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        _RecordedMean.made.append(self)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))
        super().update(*args, **kwargs)


@pytest.fixture
def recorded_mean(monkeypatch: pytest.MonkeyPatch) -> list[_RecordedMean]:
    _RecordedMean.made.clear()
    monkeypatch.setattr(torchmetrics, "MeanMetric", _RecordedMean)
    return _RecordedMean.made


@pytest.mark.parametrize("options", [{}, {"weight": 1.0}, {"weight": "tensor"},
                                     {"nan_strategy": "disable", "weight": "tensor"}])
def test_mean_cases_pass_the_loss_with_the_weight_they_name(recorded_mean: list[_RecordedMean],
                                                            options: dict[str, Any]) -> None:
    """No weight argument, the float 1.0, or ``torch.ones_like(loss)``; the other options go to MeanMetric."""
    x = _hand_inputs()
    updates._mean(**options)(x, CPU, 3)()
    [m] = recorded_mean
    assert m.nan_strategy == options.get("nan_strategy", "warn")
    [(args, kwargs)] = m.calls
    assert len(args) == 1 and args[0] is x["loss"]
    assert list(kwargs) == (["weight"] if "weight" in options else [])
    if options.get("weight") == 1.0:
        assert type(kwargs["weight"]) is float and kwargs["weight"] == 1.0
    elif "weight" in options:
        assert isinstance(kwargs["weight"], torch.Tensor) and torch.equal(kwargs["weight"], torch.ones(()))
    assert float(m.compute()) == 0.25
    updates._mean(**options)(x, META, 3)
    assert recorded_mean[-1].device == META


def test_no_nan_check_case_passes_a_tensor_weight_of_ones(recorded_mean: list[_RecordedMean]) -> None:
    x = _hand_inputs()
    updates._no_nan_check(x, CPU, 3)()
    [m] = recorded_mean
    assert type(m).__name__ == "NoNanCheck_RecordedMean"
    [(args, kwargs)] = m.calls
    assert len(args) == 1 and args[0] is x["loss"] and list(kwargs) == ["weight"]
    assert isinstance(kwargs["weight"], torch.Tensor) and torch.equal(kwargs["weight"], torch.ones(()))
    assert float(m.compute()) == 0.25
    updates._no_nan_check(x, META, 3)
    assert recorded_mean[-1].device == META


@pytest.mark.parametrize("name, options, average, ignore_index, value", [
    ("Accuracy", {}, "micro", None, 3 / 4),
    ("Precision", {}, "micro", None, 3 / 4),
    ("Precision", {"target": "padded", "ignore_index": -100}, "micro", -100, 2 / 3),
    ("Precision", {"average": "macro"}, "macro", None, 5 / 6),
])
def test_classifier_cases_update_a_multiclass_metric_with_the_logits_and_labels(
        monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, Any], average: str,
        ignore_index: int | None, value: float) -> None:
    made = _spy(monkeypatch, torchmetrics, name)
    updates._classifier(name, **options)(_hand_inputs(), CPU, 3)()
    [(_, _, m)] = made
    assert type(m).__name__ == f"Multiclass{name}"
    assert (m.num_classes, m.average, m.ignore_index) == (3, average, ignore_index)
    assert float(m.compute()) == pytest.approx(value)
    updates._classifier(name, **options)(_hand_inputs(), META, 3)
    assert made[-1][2].device == META


def test_scatter_case_updates_a_scatter_macro_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = mentor.sync_free.scatter_stat_scores
    monkeypatch.setattr(mentor.sync_free, "scatter_stat_scores", lambda cls: _recording(real(cls), made))
    updates._scatter(_hand_inputs(), CPU, 3)()
    [(_, _, m)] = made
    assert type(m).__name__ == "ScatterMulticlassPrecision" and (m.num_classes, m.average) == (3, "macro")
    assert float(m.compute()) == pytest.approx(5 / 6)
    updates._scatter(_hand_inputs(), META, 3)
    assert made[-1][2].device == META


@pytest.mark.parametrize("variant, scores", [
    ("naive", {"accuracy": 3 / 4, "f1_score": 3 / 4, "precision": 3 / 4, "recall": 3 / 4}),
    ("optimized", {"accuracy": 3 / 4, "f1_score": 3 / 4, "precision": 3 / 4, "recall": 3 / 4}),
    ("macro", {"accuracy": 5 / 6, "f1_score": 7 / 9, "precision": 5 / 6, "recall": 5 / 6}),
    ("macro sync-free", {"accuracy": 5 / 6, "f1_score": 7 / 9, "precision": 5 / 6, "recall": 5 / 6}),
])
def test_set_cases_update_the_named_metric_set_on_the_device(monkeypatch: pytest.MonkeyPatch, variant: str,
                                                             scores: dict[str, float]) -> None:
    signature = inspect.signature(mentor.lab.metric_sets.metric_set)
    made = _spy(monkeypatch, mentor.lab.metric_sets, "metric_set")
    updates._set(variant)(_hand_inputs(), CPU, 3)()
    [(args, kwargs, s)] = made
    assert signature.bind(*args, **kwargs).arguments == {"variant": variant, "num_classes": 3, "device": CPU}
    assert s.read() == pytest.approx({"loss": 0.25, **scores})
    updates._set(variant)(_hand_inputs(), META, 3)
    assert signature.bind(*made[-1][0], **made[-1][1]).arguments["device"] == META


def test_suite_case_updates_fused_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _spy(monkeypatch, mentor.suite, "FusedMetrics")
    updates._suite(_hand_inputs(), CPU, 3)()
    [(_, _, s)] = made
    assert s.num_classes == 3
    values = {k: float(v) for k, v in s.compute().items()}
    assert {k: values[k] for k in ("loss", "accuracy_micro", "precision_macro", "f1_macro")} == pytest.approx(
        {"loss": 0.25, "accuracy_micro": 3 / 4, "precision_macro": 5 / 6, "f1_macro": 7 / 9})
    updates._suite(_hand_inputs(), META, 3)
    assert made[-1][2].device == META


# ----------------------------------------------------------------------------------------------------------
# The FusedMetrics case that ignores the padding, against a reference


def test_suite_ignoring_case_leaves_out_the_padded_labels_by_hand() -> None:
    """On the hand-made inputs with the first label padded: predictions 1, 2, 2 for labels 1, 1, 2 are counted.
    Class 0 is absent; class 1 has precision 1, recall 1/2 and F1 2/3, class 2 precision 1/2, recall 1, F1 2/3."""
    update = UPDATES["FusedMetrics, ignore"](_hand_inputs(), CPU, 3)
    update()
    suite = _holder(update)
    assert (type(suite).__name__, suite.num_classes, suite.ignore_index) == ("FusedMetrics", 3, -100)
    assert (suite.tp.tolist(), suite.fp.tolist(), suite.fn.tolist(), int(suite.invalid_labels)) == (
        [0, 1, 1], [0, 0, 1], [0, 1, 0], 0)
    values = {k: float(v) for k, v in suite.compute().items()}
    assert values == pytest.approx({
        "loss": 0.25,
        "accuracy_micro": 2 / 3, "precision_micro": 2 / 3, "recall_micro": 2 / 3, "f1_micro": 2 / 3,
        "accuracy_macro": 3 / 4, "precision_macro": 3 / 4, "recall_macro": 3 / 4, "f1_macro": 2 / 3,
        "accuracy_weighted": 2 / 3, "precision_weighted": 5 / 6, "recall_weighted": 2 / 3, "f1_weighted": 2 / 3,
        "invalid_labels": 0}, rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_suite_ignoring_case_equals_torchmetrics_with_ignore_index(seed: int) -> None:
    """Two updates on 64 samples of 7 classes (8 of them padded): every score and average equals torchmetrics'
    Multiclass* metrics with ignore_index=-100 on the same logits and padded labels, the loss MeanMetric's."""
    x = update_inputs(CPU, 64, 7, seed)
    update = UPDATES["FusedMetrics, ignore"](x, CPU, 7)
    update()
    update()
    got = _holder(update).compute()
    mean = MeanMetric()
    mean.update(x["loss"])
    mean.update(x["loss"])
    want = {"loss": mean.compute(), "invalid_labels": torch.tensor(0)}  # the suite's count of labels out of range
    for name, cls in {"accuracy": MulticlassAccuracy, "precision": MulticlassPrecision, "recall": MulticlassRecall,
                      "f1": MulticlassF1Score}.items():
        for average in ("micro", "macro", "weighted"):
            metric = cls(7, average=average, ignore_index=-100)
            metric.update(x["logits"], x["padded"])
            metric.update(x["logits"], x["padded"])
            want[f"{name}_{average}"] = metric.compute()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), (key, got[key], value)
    assert int((x["padded"] == -100).sum()) == 8


# ----------------------------------------------------------------------------------------------------------
# releases.measure measures exactly these updates


def test_measure_builds_every_case_on_the_installed_release_and_counts_nothing_without_cuda():
    r = measure("cpu", batch_size=4, num_classes=5, calls=2)
    assert r.errors == {}
    assert list(r.syncs) == list(r.stream_syncs) == list(UPDATES)  # every update of the registry, in its order
    assert r.syncs == r.stream_syncs == {name: None for name in UPDATES}
    assert (r.device, r.calls) == ("cpu", 2)
    assert r.version == torchmetrics.__version__
