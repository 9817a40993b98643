"""The ways a training loop reads values back to the host, as :class:`mentor.lab.configs.Config` objects to compare.

Each pattern reads the step's loss (and checks it for NaN or infinity where its name says so) in one
common way: ``.item()`` for a progress bar, a ``print``, ``float()`` in a logger, a NaN check with
``if``, the same at each report (every N steps), one coalesced copy per report, or
:class:`mentor.readback.DeferredReadback`. :func:`read_configs` builds them for :func:`mentor.lab.blocks.compare_blocks`
(or :func:`mentor.lab.compare.compare`); each keeps what it read in ``Reads``, so that a test can check the values.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

READ_PATTERNS: dict[str, str] = {
    "no reads": "the loss stays on the device",
    "item() every step": "loss.item() after each step, as a progress bar does",
    "print every step": "print(f'loss {loss}') after each step: formatting a CUDA tensor reads it back",
    "float() in a logger": "logger.log({'loss': float(loss)}) after each step",
    "NaN check every step": "if not torch.isfinite(loss): raise ... after each step",
    "item() every N steps": "loss.item() and the NaN check at each report only (a NaN in between is missed)",
    "one copy every N steps": "the mean loss and a count of non-finite losses kept on the device, read in one "
                              "torch.stack(...).cpu() at each report",
    "deferred readback": "mentor.readback.DeferredReadback: the loss and a non-finite flag pushed each step, "
                         "the newest arrived values shown, NaN raised when it arrives",
}
"""The read patterns of :func:`read_configs`, by name, with what each does. The patterns named "every N steps" read
in the loop's report hook, which the comparison calls every N steps (``report_every``)."""


class NonFiniteLoss(FloatingPointError):
    """Raised by the NaN-checking patterns when the loss is NaN or infinite."""


@dataclass
class Reads:
    """What one pattern read: (step, value) pairs, in the order they reached the host."""

    values: list[tuple[int, float]] = field(default_factory=list)
    printed: io.StringIO = field(default_factory=io.StringIO)


def _check(step: int, finite: bool) -> None:
    if not finite:
        raise NonFiniteLoss(f"the loss of step {step} is NaN or infinite")


Hook = Callable[[Any], None]


def pattern_hooks(name: str, reads: Reads | None = None) -> tuple[Hook | None, Hook | None, Reads]:
    """The ``on_step`` and ``on_report`` hooks of read pattern ``name`` (a key of :data:`READ_PATTERNS`), and its
    ``Reads``.

    ``on_step`` takes a :class:`mentor.lab.train.Step`; ``on_report`` takes the step count, as the training loops
    of :mod:`mentor.lab.train` and :mod:`mentor.lab.blocks` call them. Either is ``None`` where the pattern has no
    work there: ``"no reads"`` has neither, the every-step patterns and the deferred readback no report, and the
    patterns that read every N steps do their read in the report.

    Example:
        >>> from types import SimpleNamespace
        >>> on_step, on_report, reads = pattern_hooks("item() every N steps")
        >>> for i, loss in enumerate([0.5, 0.25, 0.125, 1.0]):
        ...     on_step(SimpleNamespace(index=i, loss=torch.tensor(loss)))
        ...     if (i + 1) % 2 == 0:
        ...         on_report(i + 1)
        >>> reads.values
        [(1, 0.25), (3, 1.0)]
    """
    from mentor.readback import DeferredReadback

    if name not in READ_PATTERNS:
        raise ValueError(f"unknown read pattern {name!r}: pass one of {list(READ_PATTERNS)}.")
    reads = Reads() if reads is None else reads
    if name == "no reads":
        return None, None, reads
    if name == "item() every step":
        return (lambda s: reads.values.append((s.index, s.loss.item()))), None, reads
    if name == "print every step":
        return (lambda s: print(f"step {s.index}: loss {s.loss}", file=reads.printed)), None, reads
    if name == "float() in a logger":
        return (lambda s: reads.values.append((s.index, float(s.loss.detach())))), None, reads
    if name == "NaN check every step":
        return (lambda s: _check(s.index, bool(torch.isfinite(s.loss)))), None, reads
    if name == "item() every N steps":
        last: list[Any] = []  # the newest step's index and loss, kept on the device until the report

        def keep(s: Any) -> None:
            last[:] = [s.index, s.loss]

        def sample(count: int) -> None:
            if not last or (reads.values and reads.values[-1][0] == last[0]):
                return  # no step since the last report: nothing new to read
            index, loss = last
            value = loss.item()
            _check(index, value == value and abs(value) != float("inf"))
            reads.values.append((index, value))
        return keep, sample, reads
    if name == "one copy every N steps":
        sums: dict[str, Any] = {}

        def accumulate(s: Any) -> None:
            loss = s.loss.detach().float()
            if not sums:
                sums.update(loss=torch.zeros_like(loss), bad=torch.zeros_like(loss), steps=0)
            sums["loss"] += loss
            sums["bad"] += (~torch.isfinite(loss)).float()
            sums["steps"] += 1
            sums["index"] = s.index

        def copy(count: int) -> None:
            if not sums or not sums["steps"]:
                return
            mean, bad = torch.stack([sums["loss"] / sums["steps"], sums["bad"]]).cpu().tolist()
            sums["loss"].zero_()
            sums["bad"].zero_()
            sums["steps"] = 0
            _check(sums["index"], bad == 0)
            reads.values.append((sums["index"], mean))
        return accumulate, copy, reads
    readback = DeferredReadback()

    def deferred(s: Any) -> None:
        loss = s.loss.detach()
        readback.push({"loss": loss, "finite": torch.isfinite(loss)}, step=s.index)
        reading = readback.latest()
        if reading is not None and (not reads.values or reads.values[-1][0] != reading.step):
            _check(reading.step, reading.values["finite"] == 1.0)
            reads.values.append((reading.step, reading.values["loss"]))
    return deferred, None, reads


def read_configs(names: tuple[str, ...] | list[str] = tuple(READ_PATTERNS)) -> list[Any]:
    """:class:`mentor.lab.configs.Config` objects for the read patterns ``names`` (the first is the baseline).

    Each ``make()`` returns the pattern's ``(on_step, on_report)``; the comparison's ``report_every`` sets the N of
    the patterns that read every N steps.

    Example:
        >>> [c.name for c in read_configs(["no reads", "deferred readback"])]
        ['no reads', 'deferred readback']
    """
    from mentor.lab.configs import Config

    configs = []
    for name in names:
        pattern_hooks(name)  # refuse a bad name now, not in the first run

        def make(name: str = name) -> tuple[Hook | None, Hook | None]:
            on_step, on_report, _ = pattern_hooks(name)
            return on_step, on_report

        configs.append(Config(name, make, READ_PATTERNS[name]))
    return configs


def stale_read_demo(delay_cycles: int = 100_000_000) -> dict[str, Any]:
    """Read a pinned buffer right after a ``non_blocking`` device-to-host copy, and again after its event.

    A GPU sleep of ``delay_cycles`` clock cycles (``torch.cuda._sleep``, about 50 ms at 2 GHz) runs
    before the copy, so the early read happens before the data arrives. Returns the buffer's value
    before the copy was queued, the early read, whether the event had completed at that moment, and
    the read after ``event.synchronize()``. Needs CUDA.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("stale_read_demo shows a CUDA copy in flight; torch sees no CUDA device here.")
    host = torch.full((1,), -1.0, dtype=torch.float64, pin_memory=True)
    value = torch.full((1,), 42.0, dtype=torch.float64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(delay_cycles)
    host.copy_(value, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    early, done = host.item(), event.query()
    event.synchronize()
    return {"before": -1.0, "early": early, "event_done_early": done, "after": host.item()}
