"""mentor.lightning.LogEvery in a real Lightning Trainer on the CPU: what it logs, at which step, with which
values (against the suite updated by hand on the same batches), and its refusals. The CUDA test checks that the
callback's batches make no sync."""

from __future__ import annotations

import logging

import pytest

L = pytest.importorskip("lightning", reason="mentor.lightning needs lightning (requirements.txt); the GPU image lacks it")
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from marks import gpu
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


@gpu
def test_on_cuda_only_the_report_batches_sync_and_only_in_the_suites_compute() -> None:
    """A batch that does not report makes no sync (strict guard); a report batch syncs once, in FusedMetrics.compute,
    which reads back its count of invalid labels; the copy of the values waits for nothing."""
    from mentor.syncs import sync_guard

    module = Classifier().cuda()
    callback = LogEvery(module.suite, every=2)

    class Trainer:
        global_step = 0
        loggers = [Recorder()]

    trainer = Trainer()
    report_syncs = []
    for step, (x, y) in enumerate(batches(6, "cuda"), start=1):
        module.training_step((x, y), step)
        trainer.global_step = step
        if step % 2:
            with sync_guard(strict=True):
                callback.on_train_batch_end(trainer, module, None, (x, y), step)
        else:
            with sync_guard() as report:
                callback.on_train_batch_end(trainer, module, None, (x, y), step)
            report_syncs.append([site.where.split(":")[0] for site in report.sites])
    callback.on_train_end(trainer, module)
    assert report_syncs == [["mentor/suite.py"]] * 3
    assert [s for s, _ in trainer.loggers[0].logged][-1] == 6


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
