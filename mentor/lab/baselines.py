"""The fair baselines chapter 9 compares the fused suite against, in the same sweep.

The article's optimized set updates every classifier on its own at every step. A reader has three cheaper
ways to use torchmetrics as it is, and the suite should be measured against them too:

- :func:`grouped_config`: the optimized set in a ``MetricCollection`` with torchmetrics' default
  ``compute_groups=True`` (metrics with equal states share one update), with its no-NaN-check mean;
- :func:`every_n_config`: any configuration that updates only every ``n``-th step: a sample of the steps,
  so its values are estimates over ``1 / n`` of the data, not the same numbers;
- :func:`buffered_config`: the optimized set fed every step's loss, logits and labels into buffers on the
  device (three copies a step, no sync), and updated once every ``n`` steps with the ``n`` batches together,
  and at each report with what is buffered: the same values as an update at every step (micro scores are
  sums over samples, and the loss mean weighs each step's loss alike), in ``1 / n`` of the updates.

Example:
    >>> [c.name for c in fair_baselines(10, "cpu", n=10)]
    ['optimized, grouped', 'optimized, every 10', 'optimized, buffered 10']
"""

from __future__ import annotations

from typing import Any

import torch

from mentor.lab.configs import Config, Hooks, metrics_config
from mentor.lab.metric_sets import LossAndScores, metric_set
from mentor.lab.train import Step


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (update every n steps), got {n!r}.")
    return n


def grouped_config(num_classes: int, device: torch.device | str, name: str = "optimized, grouped") -> Config:
    """The article's optimized set with torchmetrics' default ``compute_groups=True``.

    Example:
        >>> grouped_config(10, "cpu").name
        'optimized, grouped'
    """
    config = metrics_config("optimized", num_classes, device, name, compute_groups=True)
    return Config(config.name, config.make, "the optimized set in a MetricCollection with torchmetrics' default "
                  "compute_groups=True (accuracy, precision, recall and F1 share one update)")


def every_n_config(config: Config, n: int, name: str | None = None) -> Config:
    """``config`` updating only at every ``n``-th step (the ``n``-th, ``2n``-th, ...); its reports unchanged.

    Example:
        >>> seen = []
        >>> counted = Config("counted", lambda: (lambda s: seen.append(s), None))
        >>> on_step, _ = every_n_config(counted, 3).make()
        >>> for k in range(7):
        ...     on_step(k)
        >>> seen
        [2, 5]
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a mentor.lab.configs.Config, not {type(config).__name__}.")
    n = _check_n(n)

    def make() -> Hooks:
        on_step, on_report = config.make()
        count = 0

        def every(step: Step) -> None:
            nonlocal count
            count += 1
            if count % n == 0 and on_step is not None:
                on_step(step)

        return every, on_report

    return Config(name or f"{config.name}, every {n}", make,
                  f"{config.name}, updated at one step in {n} only: a sample of the steps, not the same values")


class DeviceBuffer:
    """The last steps' loss, logits and labels, kept on their device until :meth:`flush` feeds them to ``metrics``.

    :meth:`push` copies one step's tensors into preallocated buffers (made at the first push, with the step's
    shapes and dtypes) and flushes when ``n`` steps are held; :meth:`flush` makes one ``metrics.update`` with
    every held step: the losses as one vector, the logits and labels of all their batches together. Nothing
    is read back. Every step must have the same shapes (a training loop with a fixed batch size).

    Example:
        >>> ms = metric_set("optimized", num_classes=3)
        >>> buffer = DeviceBuffer(ms, n=2)
        >>> buffer.push(torch.tensor(1.0), torch.eye(3)[:2], torch.tensor([0, 1]))
        >>> buffer.held, int(ms.loss.update_count)
        (1, 0)
        >>> buffer.push(torch.tensor(3.0), torch.eye(3)[:2], torch.tensor([0, 2]))
        >>> buffer.held, ms.read()["loss"], ms.read()["accuracy"]
        (0, 2.0, 0.75)
    """

    def __init__(self, metrics: LossAndScores, n: int) -> None:
        if not isinstance(metrics, LossAndScores):
            raise TypeError(f"metrics must be a mentor.lab.metric_sets.LossAndScores (metric_set(...)), "
                            f"not {type(metrics).__name__}.")
        self.metrics, self.n, self.held = metrics, _check_n(n), 0
        self._loss: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._target: torch.Tensor | None = None

    def push(self, loss: torch.Tensor, output: torch.Tensor, target: torch.Tensor) -> None:
        """Keep one step's ``loss`` (a scalar), ``output`` (logits) and ``target`` (labels); flush at ``n``."""
        if self._loss is None:
            self._loss = loss.new_empty((self.n, *loss.shape))
            self._output = output.new_empty((self.n, *output.shape))
            self._target = target.new_empty((self.n, *target.shape))
        if output.shape != self._output.shape[1:] or target.shape != self._target.shape[1:]:  # type: ignore[union-attr]
            raise ValueError(f"DeviceBuffer holds steps of logits {tuple(self._output.shape[1:])} and labels "
                             f"{tuple(self._target.shape[1:])}; got {tuple(output.shape)} and {tuple(target.shape)}. "
                             "Flush before the batch size changes, or use a new buffer.")
        self._loss[self.held].copy_(loss.detach())
        self._output[self.held].copy_(output.detach())  # type: ignore[index]
        self._target[self.held].copy_(target)  # type: ignore[index]
        self.held += 1
        if self.held == self.n:
            self.flush()

    def flush(self) -> None:
        """One update with every held step (none when nothing is held)."""
        if not self.held or self._loss is None or self._output is None or self._target is None:
            return
        k = self.held
        self.metrics.update(self._loss[:k], self._output[:k].flatten(0, 1), self._target[:k].flatten(0, 1))
        self.held = 0


def buffered_config(num_classes: int, device: torch.device | str, n: int, name: str | None = None) -> Config:
    """The optimized set fed through a :class:`DeviceBuffer` of ``n`` steps; each report flushes it first.

    Example:
        >>> on_step, on_report = buffered_config(10, "cpu", 5).make()
        >>> callable(on_step), callable(on_report)
        (True, True)
    """
    n = _check_n(n)

    def make() -> Hooks:
        ms = metric_set("optimized", num_classes=num_classes, device=device)
        buffer = DeviceBuffer(ms, n)

        def on_report(step: int) -> dict[str, Any]:
            buffer.flush()
            return ms.report(step)

        return (lambda s: buffer.push(s.loss, s.output, s.labels)), on_report

    return Config(name or f"optimized, buffered {n}", make,
                  f"the optimized set, its inputs buffered on the device and updated once every {n} steps "
                  "(and at each report): the same values in fewer updates")


def fair_baselines(num_classes: int, device: torch.device | str, n: int = 10) -> list[Config]:
    """The three baselines of this module: grouped, every ``n`` steps, buffered ``n`` steps.

    Example:
        >>> len(fair_baselines(10, "cpu"))
        3
    """
    optimized = metrics_config("optimized", num_classes, device)
    return [grouped_config(num_classes, device), every_n_config(optimized, n, f"optimized, every {n}"),
            buffered_config(num_classes, device, n)]
