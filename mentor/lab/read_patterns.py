"""The ways a training loop reads values back to the host, as :class:`mentor.lab.configs.Config` objects to compare.

Each pattern reads the step's loss (and checks it for NaN or infinity where its name says so) in one
common way: ``.item()`` for a progress bar, a ``print``, ``float()`` in a logger, a NaN check with
``if``, the same every ``every`` steps, one coalesced copy per report, or
:class:`mentor.readback.DeferredReadback`. :func:`read_configs` builds them for
:func:`mentor.lab.compare.compare`; each keeps what it read in ``Reads``, so that a test can check the values.
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
    "item() every N steps": "loss.item() and the NaN check every `every` steps only (a NaN in between is missed)",
    "one copy every N steps": "the mean loss and a count of non-finite losses kept on the device, read in one "
                              "torch.stack(...).cpu() every `every` steps",
    "deferred readback": "mentor.readback.DeferredReadback: the loss and a non-finite flag pushed each step, "
                         "the newest arrived values shown, NaN raised when it arrives",
}
"""The read patterns of :func:`read_configs`, by name, with what each does per step."""


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


def pattern_hooks(name: str, every: int = 10, reads: Reads | None = None) -> tuple[Callable | None, Reads]:
    """The ``on_step`` hook of read pattern ``name`` (a key of :data:`READ_PATTERNS`), and its ``Reads``.

    The hook takes a :class:`mentor.lab.train.Step`; ``None`` for ``"no reads"``.

    Example:
        >>> from types import SimpleNamespace
        >>> hook, reads = pattern_hooks("item() every N steps", every=2)
        >>> for i, loss in enumerate([0.5, 0.25, 0.125, 1.0]):
        ...     hook(SimpleNamespace(index=i, loss=torch.tensor(loss)))
        >>> reads.values
        [(1, 0.25), (3, 1.0)]
    """
    from mentor.readback import DeferredReadback

    if name not in READ_PATTERNS:
        raise ValueError(f"unknown read pattern {name!r}: pass one of {list(READ_PATTERNS)}.")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a whole number of steps >= 1, not {every!r}.")
    reads = Reads() if reads is None else reads
    if name == "no reads":
        return None, reads
    if name == "item() every step":
        return (lambda s: reads.values.append((s.index, s.loss.item()))), reads
    if name == "print every step":
        return (lambda s: print(f"step {s.index}: loss {s.loss}", file=reads.printed)), reads
    if name == "float() in a logger":
        return (lambda s: reads.values.append((s.index, float(s.loss.detach())))), reads
    if name == "NaN check every step":
        return (lambda s: _check(s.index, bool(torch.isfinite(s.loss)))), reads
    if name == "item() every N steps":
        def every_n(s: Any) -> None:
            if (s.index + 1) % every == 0:
                value = s.loss.item()
                _check(s.index, value == value and abs(value) != float("inf"))
                reads.values.append((s.index, value))
        return every_n, reads
    if name == "one copy every N steps":
        sums: dict[str, torch.Tensor] = {}

        def coalesced(s: Any) -> None:
            loss = s.loss.detach().float()
            if not sums:
                sums.update(loss=torch.zeros_like(loss), bad=torch.zeros_like(loss))
            sums["loss"] += loss
            sums["bad"] += (~torch.isfinite(loss)).float()
            if (s.index + 1) % every == 0:
                mean, bad = torch.stack([sums["loss"] / every, sums["bad"]]).cpu().tolist()
                sums["loss"].zero_()
                sums["bad"].zero_()
                _check(s.index, bad == 0)
                reads.values.append((s.index, mean))
        return coalesced, reads
    readback = DeferredReadback()

    def deferred(s: Any) -> None:
        loss = s.loss.detach()
        readback.push({"loss": loss, "finite": torch.isfinite(loss)}, step=s.index)
        reading = readback.latest()
        if reading is not None and (not reads.values or reads.values[-1][0] != reading.step):
            _check(reading.step, reading.values["finite"] == 1.0)
            reads.values.append((reading.step, reading.values["loss"]))
    return deferred, reads


def read_configs(names: tuple[str, ...] | list[str] = tuple(READ_PATTERNS), every: int = 10) -> list[Any]:
    """:class:`mentor.lab.configs.Config` objects for the read patterns ``names`` (the first is the baseline).

    Example:
        >>> [c.name for c in read_configs(["no reads", "deferred readback"])]
        ['no reads', 'deferred readback']
    """
    from mentor.lab.configs import Config

    configs = []
    for name in names:
        pattern_hooks(name, every)  # refuse a bad name or every now, not in the first run

        def make(name: str = name) -> tuple[Callable | None, None]:
            return pattern_hooks(name, every)[0], None

        configs.append(Config(name, make, READ_PATTERNS[name].replace("`every`", str(every))))
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
