"""A torchmetrics metric in a PyTorch Lightning loop, reported every ``every`` batches without a wait.

Lightning's documented way, ``self.log(name, value, on_step=True, prog_bar=True)``, reads the value
back at every training batch. After each batch the loop calls ``_LoggerConnector.on_batch_end``
(``lightning/pytorch/loops/training_epoch_loop.py``), which builds the step's metrics. Every value
logged with ``prog_bar=True`` goes through ``convert_tensors_to_scalars`` there, which calls
``.item()`` (``lightning/pytorch/trainer/connectors/logger_connector/result.py``, in
``_ResultCollection.metrics``; lightning 2.6.6). Without ``prog_bar``, the values are read in
``log_metrics`` at every ``log_every_n_steps``-th batch.

:class:`LogEvery` leaves ``self.log`` out. The LightningModule updates a metric in ``training_step``
(``FusedMetrics`` does it in one kernel). Every ``every`` batches the callback does three things:

- computes the metric;
- starts copying its values to the host with :class:`mentor.readback.DeferredReadback`;
- resets the metric.

At a later batch, once the copy has arrived, it hands the values to every logger of the trainer
(``trainer.loggers``). The copy makes no batch wait. What ``compute()`` itself reads is the metric's:
``FusedMetrics.compute`` reads nothing back, and under DDP torchmetrics' sync adds its collectives, once
per report (chapter 12). A batch that does not report makes no sync here. At the end of training the
callback reports the batches since its last report and waits once for that copy.

Labels outside the classes make every value of ``FusedMetrics.compute()`` NaN and its
``"invalid_labels"`` count nonzero (:mod:`mentor.invalid`). When such a report arrives, the callback
raises :class:`mentor.invalid.InvalidLabelsError` (from :meth:`DeferredReadback.latest
<mentor.readback.DeferredReadback.latest>`, with the count and the report's step) and logs none of its
values, so no NaN score reaches a logger unannounced. The count of a good report is logged with the
other values, as ``prefix + "invalid_labels"`` = 0.0.



In a LightningModule (``import lightning as L``)::

    class Classifier(L.LightningModule):
        def __init__(self, model, num_classes):
            super().__init__()
            self.model = model
            self.suite = FusedMetrics(num_classes)  # moves to the module's device with it

        def training_step(self, batch, batch_idx):
            images, labels = batch
            logits = self.model(images)
            loss = F.cross_entropy(logits, labels)
            self.suite.update(loss.detach(), logits.detach(), labels)  # no read
            return loss

    module = Classifier(model, num_classes=1000)
    trainer = L.Trainer(callbacks=[LogEvery(module.suite, every=50)])

Example:
    >>> from mentor.suite import FusedMetrics
    >>> callback = LogEvery(FusedMetrics(num_classes=3), every=2)
    >>> callback.every, callback.prefix
    (2, 'train/')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torchmetrics import Metric, MetricCollection

from mentor.readback import DeferredReadback, Reading

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as error:  # pragma: no cover - lightning is in requirements.txt
    raise ImportError("mentor.lightning needs PyTorch Lightning: pip install lightning") from error


def _values(computed: Any, name: str) -> dict[str, torch.Tensor]:
    """What ``compute()`` returned, as names of one-element tensors."""
    if isinstance(computed, torch.Tensor):
        computed = {name: computed}
    if not isinstance(computed, Mapping):
        raise TypeError(f"LogEvery reports what compute() returns, a tensor or a dict of tensors; got "
                        f"{type(computed).__name__}.")
    bad = [k for k, v in computed.items() if not isinstance(v, torch.Tensor) or v.numel() != 1]
    if bad:
        raise ValueError(f"LogEvery logs single numbers, but compute() gave {bad} as tensors of another size: "
                         f"average them in the metric (e.g. average='macro') or log them yourself.")
    return {str(k): v for k, v in computed.items()}


class LogEvery(Callback):
    """Compute ``metric`` every ``every`` training batches, read its values back without a wait, log them to
    ``trainer.loggers`` under ``prefix`` when they arrive, and reset it.

    The LightningModule updates ``metric`` itself, in ``training_step``. Each logged value carries the
    ``trainer.global_step`` of the batch that computed it. A metric whose ``compute()`` gives one tensor is
    logged under its class name.

    Raises :class:`mentor.invalid.InvalidLabelsError` in the batch (or at the end of training) where a report
    arrives whose invalid-label count is not 0 (any key with ``invalid_labels`` as a whole word: a
    ``MetricCollection``'s prefixed keys count too); its NaN values are not logged. Under DDP every rank's
    report carries the same summed count, so every rank raises, each when its own copy arrives, which may
    be a batch later on one rank than on another.

    Example:
        >>> from torchmetrics import MeanMetric
        >>> LogEvery(MeanMetric(), every=50).prefix
        'train/'
        >>> LogEvery(MeanMetric(), every=0)
        Traceback (most recent call last):
        ...
        ValueError: every must be an int >= 1 (report every that many training batches), got 0.
    """

    def __init__(self, metric: Metric | MetricCollection, every: int = 50, prefix: str = "train/") -> None:
        if not isinstance(metric, (Metric, MetricCollection)):
            raise TypeError(f"metric must be a torchmetrics Metric or MetricCollection (the one your "
                            f"training_step updates), not {type(metric).__name__}.")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1 (report every that many training batches), got {every!r}.")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a string put before each logged name, not {type(prefix).__name__}.")
        self.metric, self.every, self.prefix = metric, every, prefix
        self._readback = DeferredReadback()
        self._batches = 0
        self._logged: Reading | None = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Count the batch; every ``every`` batches, compute, start the copy and reset; log what has arrived."""
        self._batches += 1
        if self._batches % self.every == 0:
            values = _values(self.metric.compute(), type(self.metric).__name__)
            self._readback.push(values, step=int(trainer.global_step))
            self.metric.reset()
        self._log(trainer, self._readback.latest())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Report the batches since the last report, if any, then wait for the last copy and log it."""
        if self._batches % self.every:
            self._readback.push(_values(self.metric.compute(), type(self.metric).__name__),
                                step=int(trainer.global_step))
            self.metric.reset()
        self._log(trainer, self._readback.wait())

    def _log(self, trainer: Any, reading: Reading | None) -> None:
        if reading is None or reading is self._logged:
            return
        self._logged = reading
        values = {self.prefix + name: value for name, value in reading.values.items()}
        for logger in trainer.loggers:
            logger.log_metrics(values, step=reading.step)
