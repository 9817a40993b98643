"""Reading GPU values one step late, through pinned memory and CUDA events, so that the host never waits.

``loss.item()`` in a training loop makes the host wait until the GPU has computed the loss: the
queue of launched work drains, and the next step starts from an idle GPU. :class:`DeferredReadback`
asks for the copy instead of waiting for it. :meth:`~DeferredReadback.push` stacks the values into
one float64 tensor on the GPU, enqueues ``copy_(..., non_blocking=True)`` into a pinned host buffer
and records a CUDA event after it; :meth:`~DeferredReadback.latest` returns the newest push whose
event has completed (``Event.query()``, which does not wait), typically the previous step's.

The trap it avoids: a ``non_blocking`` device-to-host copy returns before the data has arrived, so
reading the host buffer right away gives whatever it held before (zeros, or an older step's value),
with no error. A value is only read here after its event reports that the copy is done, and it is
converted to Python floats at once, before a later push can reuse the buffer.

On CPU tensors there is nothing to wait for: a push is read at once.

Invalid labels are loud here. ``FusedMetrics.compute()`` reads nothing back: when labels outside the
classes reached it, its values are NaN and its ``"invalid_labels"`` count is not 0. When a pushed
mapping's count reads nonzero (any key with ``invalid_labels`` as a whole word, such as
``"train/invalid_labels"``: :func:`mentor.invalid.is_count_key`), :meth:`~DeferredReadback.latest` and
:meth:`~DeferredReadback.wait` raise :class:`mentor.invalid.InvalidLabelsError` with the count and the
step, at every call, until a newer push without invalid labels arrives: its NaN values are never
returned. A push with invalid labels that a newer one replaces before any call raised for it (two
pushes between calls on the CPU, or a newer copy that arrived first) raises once, at the next call.
A push whose buffer is reused before it was read (more than ``slots`` pushes between two calls, or
ahead of the GPU) is never read, its count neither. A reading that they do return keeps every pushed
value, the counts too (0.0 there): ``dict(reading.values)`` is what was pushed, and
:func:`mentor.invalid.check_report` returns the values without the counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from mentor.invalid import InvalidLabelsError, is_count_key


@dataclass(frozen=True, repr=False)
class Reading:
    """The values of one :meth:`DeferredReadback.push`, as Python floats, and the step they belong to.

    A reading cannot be changed: ``values`` is a read-only mapping over a dict of its own, copied
    from the mapping passed in. :meth:`DeferredReadback.latest` returns the same reading until a
    newer one arrives, so an edit of one caller's copy would otherwise show in every later call;
    ``dict(reading.values)`` is a copy to edit.

    Example:
        >>> reader = DeferredReadback()
        >>> reader.push({"loss": torch.tensor(0.5)}, step=7)
        >>> reading = reader.latest()
        >>> reading
        Reading(step=7, values={'loss': 0.5})
        >>> reading.values["loss"] = 1.0
        Traceback (most recent call last):
        ...
        TypeError: 'mappingproxy' object does not support item assignment
    """

    step: int
    values: Mapping[str, float]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))

    def __repr__(self) -> str:
        return f"Reading(step={self.step!r}, values={dict(self.values)!r})"

    def __reduce__(self) -> tuple[type, tuple[int, dict[str, float]]]:
        return Reading, (self.step, dict(self.values))  # a mappingproxy does not pickle


@dataclass
class _Slot:
    buffer: torch.Tensor | None = None
    event: Any = None
    keys: tuple[str, ...] = ()
    step: int = -1
    seq: int = -1
    counts: tuple[int, ...] = ()  # the positions of the invalid-label counts among keys


def _nonzero(keys: tuple[str, ...], values: list[float], counts: tuple[int, ...]) -> dict[str, float]:
    """The invalid-label counts (at positions ``counts``) that are not 0 (NaN is not 0), by key."""
    return {keys[i]: values[i] for i in counts if values[i] != 0}


def _defers(device: torch.device) -> bool:
    """Whether values on ``device`` are copied in the background (CUDA) rather than read at once (CPU)."""
    return device.type == "cuda"


def _pinned_buffer(size: int) -> torch.Tensor:
    return torch.empty(size, dtype=torch.float64, pin_memory=True)


def _record_event() -> Any:
    event = torch.cuda.Event()
    event.record()  # on the current stream, after the copy just enqueued there
    return event


@dataclass
class DeferredReadback:
    """Values of the GPU read back one step late, with no sync: push each step, show the latest that arrived.

    ``slots`` pinned buffers are used in turn; when the host runs more than ``slots`` pushes ahead
    of the GPU, the oldest pending push is overwritten (its values are never shown, never wrong).
    Push from one CUDA stream: the reuse of a buffer relies on the stream's order.

    Example (a progress bar that shows the loss of the newest step the GPU has finished)::

        readback = DeferredReadback()
        for step, (x, y) in enumerate(bar := tqdm(batches)):
            loss = train_step(x, y)
            readback.push({"loss": loss.detach()}, step=step)
            if (reading := readback.latest()) is not None:
                bar.set_postfix(loss=f"{reading.values['loss']:.3f}", step=reading.step)
        final = readback.wait()   # one sync, after the loop

    On CPU the values are read at once:

        >>> readback = DeferredReadback()
        >>> readback.push({"loss": torch.tensor(0.5), "seen": torch.tensor(128)}, step=3)
        >>> readback.latest()
        Reading(step=3, values={'loss': 0.5, 'seen': 128.0})

    A report whose invalid-label count is not 0 (``FusedMetrics.compute()``'s values are NaN then) raises
    when it is read, at every call, until a newer push without invalid labels arrives:

        >>> readback.push({"loss": torch.tensor(float("nan")), "invalid_labels": torch.tensor(2)}, step=4)
        >>> try:
        ...     readback.latest()
        ... except InvalidLabelsError as error:
        ...     print(error.count, error.step)
        2 4
        >>> readback.push({"loss": torch.tensor(0.25), "invalid_labels": torch.tensor(0)}, step=5)
        >>> readback.wait()
        Reading(step=5, values={'loss': 0.25, 'invalid_labels': 0.0})
    """

    slots: int = 4
    _ring: list[_Slot] = field(default_factory=list, init=False, repr=False)
    _pushes: int = field(default=0, init=False, repr=False)
    _last: Reading | None = field(default=None, init=False, repr=False)
    _last_seq: int = field(default=-1, init=False, repr=False)
    _invalid: dict[str, float] = field(default_factory=dict, init=False, repr=False)  # of _last, if not 0
    _told: bool = field(default=False, init=False, repr=False)  # whether _invalid was raised
    _missed: tuple[int, dict[str, float]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 2:
            raise ValueError(f"slots must be a whole number >= 2 (one buffer is read while the next is written), "
                             f"not {self.slots!r}.")
        self._ring = [_Slot() for _ in range(self.slots)]

    def push(self, values: Mapping[str, torch.Tensor], step: int | None = None) -> None:
        """Start copying ``values`` (one-element tensors, on one device) to the host; returns without waiting.

        ``step`` labels the reading: a Python int >= 0 (default: the number of earlier pushes). On the GPU
        this launches at most one cast per value, one stack and one copy, and records one event.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            hint = " (reading a tensor's value is a sync: pass the loop's own counter)" if isinstance(
                step, torch.Tensor) else ""
            raise ValueError(f"push's step must be a whole number >= 0, such as the loop's step=i, or None for the "
                             f"number of earlier pushes, not {step!r}{hint}.")
        keys, tensors = self._check(values)
        counts = tuple(i for i, key in enumerate(keys) if is_count_key(key))
        seq = self._pushes
        self._pushes += 1
        step = seq if step is None else step
        device = tensors[0].device
        same = all(t.dtype == tensors[0].dtype for t in tensors)
        flat = (torch.stack([t.detach().reshape(()) for t in tensors]).to(torch.float64) if same else
                torch.stack([t.detach().reshape(()).to(torch.float64) for t in tensors]))
        if not _defers(device):
            read = flat.tolist()
            self._keep(Reading(step, dict(zip(keys, read))), seq, _nonzero(keys, read, counts))
            return
        slot = self._ring[seq % self.slots]
        if slot.buffer is None or slot.buffer.numel() != len(keys):
            slot.buffer = _pinned_buffer(len(keys))
        slot.buffer.copy_(flat, non_blocking=True)
        slot.event, slot.keys, slot.step, slot.seq, slot.counts = _record_event(), keys, step, seq, counts

    def latest(self) -> Reading | None:
        """The newest push whose copy has arrived, or None before the first one arrives. Never waits.

        Raises :class:`~mentor.invalid.InvalidLabelsError` when that push's invalid-label count is not 0."""
        for slot in sorted(self._ring, key=lambda s: s.seq, reverse=True):
            if slot.seq <= self._last_seq:
                break
            if slot.event is not None and slot.event.query():
                self._take(slot)
                break
        return self._checked()

    def wait(self) -> Reading | None:
        """The newest push, waiting for its copy: a sync, for the end of training or an explicit report.

        Raises :class:`~mentor.invalid.InvalidLabelsError` when that push's invalid-label count is not 0."""
        newest = max(self._ring, key=lambda s: s.seq)
        if newest.seq > self._last_seq and newest.event is not None:
            newest.event.synchronize()
            self._take(newest)
        return self._checked()

    def _take(self, slot: _Slot) -> None:
        """Read ``slot``, the newest arrived push, and the counts of the older arrived pushes it skips."""
        skipped = []
        for older in sorted(self._ring, key=lambda s: s.seq):
            if (self._last_seq < older.seq < slot.seq and older.counts and older.event is not None
                    and older.event.query()):  # arrived, and never read: only its counts are looked at
                bad = _nonzero(older.keys, older.buffer.tolist(), older.counts)  # type: ignore[union-attr]
                if bad:
                    skipped.append((older.step, bad))
        values = slot.buffer.tolist()  # type: ignore[union-attr]
        self._keep(Reading(slot.step, dict(zip(slot.keys, values))), slot.seq, _nonzero(slot.keys, values, slot.counts),
                   skipped)

    def _keep(self, reading: Reading, seq: int, invalid: dict[str, float],
              skipped: Sequence[tuple[int, dict[str, float]]] = ()) -> None:
        """Make ``reading`` the newest; a push with invalid labels that it replaces unannounced is kept to raise."""
        if self._invalid and not self._told:
            self._missed = (self._last.step, self._invalid)  # type: ignore[union-attr]
        for missed in skipped:
            self._missed = missed
        self._last, self._last_seq, self._invalid, self._told = reading, seq, invalid, False

    def _checked(self) -> Reading | None:
        """The newest reading; InvalidLabelsError (a new one at each call) while it holds invalid labels, or once
        for a push with invalid labels that a newer one replaced before any call could raise for it."""
        if self._invalid:
            self._told, self._missed = True, None
            raise InvalidLabelsError(self._invalid, step=self._last.step)  # type: ignore[union-attr]
        if self._missed is not None:
            (step, counts), self._missed = self._missed, None
            raise InvalidLabelsError(counts, step=step)
        return self._last

    @staticmethod
    def _check(values: Mapping[str, torch.Tensor]) -> tuple[tuple[str, ...], list[torch.Tensor]]:
        if not isinstance(values, Mapping) or not values:
            raise TypeError(f"push takes a non-empty dict of name -> tensor, such as {{'loss': loss.detach()}}, "
                            f"not {type(values).__name__}.")
        keys, tensors = tuple(values), list(values.values())
        for key, tensor in zip(keys, tensors):
            if not isinstance(key, str):
                raise TypeError(f"push's keys name the values and must be strings, not {key!r}.")
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"push's value {key!r} is a {type(tensor).__name__}, not a tensor; pass the tensor "
                                "itself (a Python number has already been read back, with a sync).")
            if tensor.numel() != 1:
                raise ValueError(f"push's value {key!r} has shape {tuple(tensor.shape)}; pass one-element tensors "
                                 "(a loss, a metric's compute()), one entry per value.")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"push's values are on several devices ({', '.join(sorted(map(str, devices)))}); "
                             "push the values of one device at a time.")
        device = tensors[0].device
        if device.type not in ("cuda", "cpu"):
            raise ValueError(f"push reads CUDA or CPU tensors, not {device.type} ones.")
        return keys, tensors
