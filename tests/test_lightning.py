"""mentor.lightning.LogEvery in a real Lightning Trainer on the CPU: what it logs, at which step, with which
values (against the suite updated by hand on the same batches), its error when a report with invalid labels
arrives (nothing NaN logged), and its refusals. The CUDA tests check that the callback's batches make no sync,
the report batches included, and that an invalid report raises there too."""

from __future__ import annotations

import logging

import pytest

L = pytest.importorskip("lightning", reason="mentor.lightning needs lightning (requirements.txt); the GPU image lacks it")
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from marks import gpu
from mentor.invalid import InvalidLabelsError
from mentor.lightning import LogEvery
from mentor.suite import FusedMetrics

NUM_CLASSES = 5


class Recorder(L.pytorch.loggers.Logger):
    """A logger that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.append((step, dict(metrics)))


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, NUM_CLASSES)
        self.suite = FusedMetrics(NUM_CLASSES)
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        self.suite.update(loss.detach(), logits.detach(), y)
        self.seen.append((loss.detach().clone(), logits.detach().clone(), y.clone()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def batches(n: int, device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 8, generator=g).to(device), torch.randint(0, NUM_CLASSES, (6,), generator=g).to(device))
            for _ in range(n)]


def fit(module: L.LightningModule, callback: LogEvery, n: int, accelerator: str = "cpu") -> Recorder:
    recorder = Recorder()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    trainer = L.Trainer(accelerator=accelerator, devices=1, max_steps=n, max_epochs=1, logger=recorder,
                        callbacks=[callback], enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, log_every_n_steps=1)
    data = batches(n)
    dataset = torch.utils.data.TensorDataset(torch.cat([x for x, _ in data]), torch.cat([y for _, y in data]))
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(dataset, batch_size=6))
    return recorder


def expected(seen, start: int, stop: int) -> dict[str, float]:
    reference = FusedMetrics(NUM_CLASSES)
    for loss, logits, labels in seen[start:stop]:
        reference.update(loss.cpu(), logits.cpu(), labels.cpu())
    return {f"train/{k}": float(v) for k, v in reference.compute().items()}


def test_reports_every_n_batches_and_the_rest_at_the_end_with_the_values_of_those_batches() -> None:
    module = Classifier()
    recorder = fit(module, LogEvery(module.suite, every=3), n=7)
    assert [step for step, _ in recorder.logged] == [3, 6, 7]
    for (_, values), (start, stop) in zip(recorder.logged, [(0, 3), (3, 6), (6, 7)]):
        want = expected(module.seen, start, stop)
        assert values.keys() == want.keys()
        for key in want:
            assert values[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
        assert values["train/invalid_labels"] == 0.0  # a good report's count is logged with its scores
    assert int(module.suite.loss_count) == 0  # reset after the last report


def test_no_report_at_the_end_when_the_last_batch_reported() -> None:
    module = Classifier()
    recorder = fit(module, LogEvery(module.suite, every=2, prefix="fit/"), n=4)
    assert [step for step, _ in recorder.logged] == [2, 4]
    assert all(key.startswith("fit/") for _, values in recorder.logged for key in values)


def test_a_single_metric_is_logged_under_its_class_name() -> None:
    class Losses(Classifier):
        def __init__(self) -> None:
            super().__init__()
            self.mean = MeanMetric()

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.mean.update(loss.detach())
            return loss

    module = Losses()
    recorder = fit(module, LogEvery(module.mean, every=2), n=2)
    (step, values), = recorder.logged
    assert step == 2 and list(values) == ["train/MeanMetric"]
    assert values["train/MeanMetric"] == pytest.approx(float(torch.stack([s[0] for s in module.seen]).mean()))


def test_values_that_are_not_single_numbers_are_refused_by_name() -> None:
    class PerClass(MeanMetric):
        def compute(self):
            return {"per_class": torch.zeros(3)}

    module = Classifier()
    with pytest.raises(ValueError, match=r"compute\(\) gave \['per_class'\] as tensors of another size"):
        fit(module, LogEvery(PerClass(), every=1), n=1)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"metric": "acc"}, TypeError, "metric must be a torchmetrics Metric or MetricCollection"),
    ({"every": 0}, ValueError, r"every must be an int >= 1 .*got 0"),
    ({"every": True}, ValueError, r"every must be an int >= 1 .*got True"),
    ({"every": 2.0}, ValueError, r"every must be an int >= 1 .*got 2.0"),
    ({"prefix": None}, TypeError, "prefix must be a string"),
])
def test_bad_arguments_are_named(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        LogEvery(**({"metric": MeanMetric()} | kwargs))


class Mislabeled(Classifier):
    """Its suite gets one label outside the classes at the batches in ``bad`` (the loss uses the true labels)."""

    def __init__(self, bad: set[int], metric=None) -> None:
        super().__init__()
        self.bad, self.metric = bad, metric if metric is not None else self.suite

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        labels = y.clone()
        if batch_idx in self.bad:
            labels[0] = NUM_CLASSES + 2
        self.metric.update(loss.detach(), logits.detach(), labels)
        return loss


def test_a_report_with_invalid_labels_raises_with_its_count_and_step_and_logs_nothing() -> None:
    module = Mislabeled(bad={3})  # the 4th batch: in the report of global step 4
    with pytest.raises(InvalidLabelsError) as caught:
        fit(module, LogEvery(module.suite, every=2), n=6)
    assert (caught.value.count, caught.value.step, caught.value.counts) == (1, 4, {"invalid_labels": 1})
    recorder = module.trainer.loggers[0]
    assert [step for step, _ in recorder.logged] == [2]  # the report before; nothing of step 4, nothing after
    assert recorder.logged[0][1]["train/invalid_labels"] == 0.0
    assert not [k for _, values in recorder.logged for k, v in values.items() if v != v]  # no NaN anywhere


@pytest.mark.parametrize("prefix, postfix", [("fused/", None), (None, "_val")])
def test_a_collection_of_two_suites_raises_for_the_one_with_invalid_labels(prefix, postfix) -> None:
    """MetricCollection names the values of two suites "a_..." and "b_..." (their keys collide), with its prefix or
    postfix; the count of either counts. Only "b" sees the invalid label."""
    from torchmetrics import MetricCollection

    class Two(Mislabeled):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)  # updates "b" (self.metric), with the invalid label
            x, y = batch
            self.collection["a"].update(loss.detach(), self.model(x).detach(), y)
            return loss

    collection = MetricCollection({"a": FusedMetrics(NUM_CLASSES), "b": FusedMetrics(NUM_CLASSES, ignore_index=-1)},
                                  prefix=prefix, postfix=postfix, compute_groups=False)
    module = Two(bad={1}, metric=collection["b"])
    module.collection = collection
    with pytest.raises(InvalidLabelsError) as caught:
        fit(module, LogEvery(collection, every=2), n=4)
    key = f"{prefix or ''}b_invalid_labels{postfix or ''}"
    assert (caught.value.count, caught.value.step, caught.value.counts) == (1, 2, {key: 1})
    assert module.trainer.loggers[0].logged == []


@gpu
def test_on_cuda_no_batch_syncs_the_report_batches_included() -> None:
    """A strict guard around every batch's callback: a batch that does not report makes no sync, and neither does a
    report batch (FusedMetrics.compute reads nothing back; the copy of the values waits for nothing)."""
    from mentor.syncs import sync_guard

    module = Classifier().cuda()
    callback = LogEvery(module.suite, every=2)

    class Trainer:
        global_step = 0
        loggers = [Recorder()]

    trainer = Trainer()
    data = batches(8, "cuda")
    module.training_step(data[0], 0)  # the first update allocates and builds the kernel's launcher
    module.suite.reset()
    torch.cuda.synchronize()
    for step, (x, y) in enumerate(data, start=1):
        module.training_step((x, y), step)
        trainer.global_step = step
        with sync_guard(strict=True):
            callback.on_train_batch_end(trainer, module, None, (x, y), step)
    callback.on_train_end(trainer, module)
    logged = trainer.loggers[0].logged
    assert [s for s, _ in logged][-1] == 8
    want = expected(module.seen[1:], 6, 8)  # seen[0] is the warm-up batch
    assert logged[-1][1].keys() == want.keys()
    assert logged[-1][1] == pytest.approx(want, rel=1e-6, abs=1e-9)


@gpu
def test_on_cuda_a_report_with_invalid_labels_raises_when_its_copy_arrives() -> None:
    from mentor.syncs import sync_guard

    module = Mislabeled(bad={3}).cuda()
    callback = LogEvery(module.suite, every=2)

    class Trainer:
        global_step = 0
        loggers = [Recorder()]

    trainer = Trainer()
    for step, (x, y) in enumerate(batches(4, "cuda"), start=1):
        module.training_step((x, y), step - 1)
        trainer.global_step = step
        # outside the guard: the GPU has finished the earlier batches, so the copy of step 2 has arrived by the
        # callback of step 3 and is logged there (without it, steps 2 and 4 could arrive together at step 4,
        # which would show step 4 and never log step 2)
        torch.cuda.synchronize()
        with sync_guard(strict=True):
            try:
                callback.on_train_batch_end(trainer, module, None, (x, y), step - 1)
            except InvalidLabelsError as error:  # only if the copy of step 4 arrived at once
                assert (error.count, error.step) == (1, 4)
                break
    with pytest.raises(InvalidLabelsError) as caught:
        callback.on_train_end(trainer, module)  # waits for the last copy: step 4's report, NaN
    assert (caught.value.count, caught.value.step) == (1, 4)
    assert [s for s, _ in trainer.loggers[0].logged] == [2]
    assert trainer.loggers[0].logged[0][1]["train/invalid_labels"] == 0.0


def test_the_readmes_lightning_snippet_runs_as_printed(tmp_path, monkeypatch) -> None:
    """The README's snippet, with a small model for the reader's: its module trains, and its callback logs."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "mentor.lightning" in b]
    monkeypatch.chdir(tmp_path)  # Trainer() makes its default log folder here
    names = {"model": torch.nn.Linear(8, NUM_CLASSES)}
    exec(compile(code.replace("num_classes=1000", f"num_classes={NUM_CLASSES}"), "README.md", "exec"), names)
    module, trainer = names["module"], names["trainer"]
    assert any(isinstance(c, LogEvery) and c.metric is module.suite for c in trainer.callbacks)
    recorder = fit(module, LogEvery(module.suite, every=2), n=4)
    assert [step for step, _ in recorder.logged] == [2, 4]
    assert set(recorder.logged[0][1]) >= {"train/loss", "train/accuracy_micro", "train/f1_macro"}
