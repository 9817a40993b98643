"""What one metric update costs: its syncs, the GPU work it launches, and its host time with the GPU kept busy.

:func:`update_cost` measures one callable (a metric update on fixed inputs) three ways:

- **syncs** per call, counted by :func:`mentor.syncs.count_syncs`;
- **kernels** (and copies or memsets) per call, counted by ``torch.profiler`` on the GPU;
- **host microseconds** per call while the GPU's queue is full: a ``torch.cuda._sleep`` kernel
  is queued first, so the host never waits for the GPU and what is timed is the Python code,
  the dispatcher and the kernel launches. The sleep is checked to be still running when the
  timed calls end (a CUDA event queued after it has not completed); otherwise the measurement
  is repeated with a longer sleep. A call that syncs cannot be timed that way (its first sync
  would wait for the sleep): it is timed with an idle GPU instead, so each of its syncs waits
  for its own kernels only, and ``queue`` says ``"idle"``. In a training loop such a sync waits
  for the whole queued step, which costs far more; see the step-time comparisons for that.

The calling thread is pinned to one CPU core (the lowest it may run on) while it measures, and its
affinity restored after, so that every repeat runs on the same core; ``core`` records which (``None``
where the platform has no ``os.sched_setaffinity``).

Few calls are timed in a row (``launches_per_repeat`` GPU operations at most), so that the
launch queue (about a thousand pending launches) never fills and blocks the host.

Example:
    >>> import torch
    >>> cost = update_cost("add", lambda: torch.ones(3).add_(1), repeats=3)
    >>> cost.name, cost.syncs, cost.kernels, cost.queue
    ('add', 0, None, 'n/a (CPU)')
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

LAUNCHES_PER_REPEAT = 200
"""At most this many GPU operations are queued behind the sleep per timed repeat."""

_GPU_EVENT_NAMES_COPY = ("Memcpy", "Memset")


@dataclass(frozen=True)
class UpdateCost:
    """The cost of one call of a metric update (see the module docstring for how each number is measured).

    Example:
        >>> c = UpdateCost("m", 0, 5, 0, [10.0, 12.0, 11.0], "full")
        >>> c.host_us, c.host_interval
        (11.0, (10.0, 12.0))
    """

    name: str
    syncs: int
    kernels: int | None
    """CUDA kernels per call; ``None`` on the CPU."""
    copies: int | None
    """Copies and memsets on the GPU per call; ``None`` on the CPU."""
    repeats_us: list[float]
    """Host microseconds per call, one value per timed repeat."""
    queue: str
    """``"full"`` (timed behind a sleep kernel), ``"idle"`` (the call syncs) or ``"n/a (CPU)"``."""
    core: int | None = None
    """The CPU core the measuring thread was pinned to; ``None`` where it could not be pinned."""

    @property
    def host_us(self) -> float:
        """The median over repeats of the host microseconds per call."""
        return float(statistics.median(self.repeats_us))

    @property
    def host_interval(self) -> tuple[float, float]:
        """A 95 % bootstrap interval of that median over the repeats (4000 resamples, seed 0)."""
        values = np.asarray(self.repeats_us, dtype=float)
        if len(values) < 2:
            return float(values[0]), float(values[0])
        rng = np.random.default_rng(0)
        medians = np.median(values[rng.integers(0, len(values), size=(4000, len(values)))], axis=1)
        return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


@contextlib.contextmanager
def one_core() -> Iterator[int | None]:
    """Pin the calling thread to the lowest CPU core it may run on; restore its affinity on exit.

    Yields the core, or ``None`` where ``os.sched_setaffinity`` does not exist (macOS, Windows).

    Example:
        >>> with one_core() as core:
        ...     pinned = core is None or os.sched_getaffinity(0) == {core}
        >>> pinned
        True
    """
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    allowed = os.sched_getaffinity(0)
    core = min(allowed)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, allowed)


def _gpu_ops(fn: Callable[[], Any], calls: int) -> tuple[int, int]:
    """Kernels and copies/memsets per call, from a profile of ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = copies = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if e.name.startswith(_GPU_EVENT_NAMES_COPY):
            copies += 1
        else:
            kernels += 1
    return round(kernels / calls), round(copies / calls)


def _sleep_cycles_per_ms() -> float:
    """Clock cycles that ``torch.cuda._sleep`` spins per millisecond on this GPU (measured with events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    torch.cuda._sleep(1000)  # load the kernel
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


def _time_behind_sleep(fn: Callable[[], Any], calls: int, cycles_per_ms: float, sleep_ms: float) -> float | None:
    """Host µs per call for ``calls`` calls queued behind a sleep; ``None`` when the sleep ended too soon."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(cycles_per_ms * sleep_ms))
    asleep = torch.cuda.Event()
    asleep.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    still_busy = not asleep.query()
    torch.cuda.synchronize()
    return elapsed / calls * 1e6 if still_busy else None


def update_cost(name: str, fn: Callable[[], Any], *, repeats: int = 21, warmup: int = 3) -> UpdateCost:
    """Syncs, GPU operations and host microseconds of one call of ``fn`` (see the module docstring).

    ``fn`` takes no arguments: close over the metric and its inputs. It runs ``warmup`` times
    first, untimed, so that states are allocated and kernels loaded.

    Example:
        >>> from torchmetrics import MeanMetric
        >>> m, x = MeanMetric(), torch.tensor(1.0)
        >>> update_cost("mean", lambda: m.update(x), repeats=3).kernels is None  # no GPU here
        True
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function of no arguments (e.g. lambda: metric.update(x)), not {fn!r}.")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}.")
    with one_core() as core:
        return dataclasses.replace(_measure(name, fn, repeats, warmup), core=core)


def _measure(name: str, fn: Callable[[], Any], repeats: int, warmup: int) -> UpdateCost:
    """:func:`update_cost`'s measurement, on the core it pinned."""
    from mentor import syncs as sync_counter

    for _ in range(warmup):
        fn()
    syncs = sync_counter.count_syncs(fn).count if torch.cuda.is_available() else 0
    if not torch.cuda.is_available():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return UpdateCost(name, syncs, None, None, times, "n/a (CPU)")
    kernels, copies = _gpu_ops(fn, 3)
    calls = max(1, min(20, LAUNCHES_PER_REPEAT // max(1, kernels + copies)))
    times = []
    if syncs:
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls * 1e6)
        return UpdateCost(name, syncs, kernels, copies, times, "idle")
    cycles_per_ms = _sleep_cycles_per_ms()
    sleep_ms = 5.0
    while len(times) < repeats:
        us = _time_behind_sleep(fn, calls, cycles_per_ms, sleep_ms)
        if us is None:
            sleep_ms *= 2
            if sleep_ms > 10_000:
                raise RuntimeError(f"{name}: the GPU finished a {sleep_ms / 2:g} ms sleep before {calls} calls "
                                   "were queued; does fn wait for the GPU some other way?")
            continue
        times.append(us)
    return UpdateCost(name, syncs, kernels, copies, times, "full")


def update_costs(cases: dict[str, Callable[[], Any]], repeats: int = 21) -> list[UpdateCost]:
    """:func:`update_cost` of each case, in order.

    Example:
        >>> [c.name for c in update_costs({"a": lambda: None, "b": lambda: None}, repeats=2)]
        ['a', 'b']
    """
    return [update_cost(name, fn, repeats=repeats) for name, fn in cases.items()]


def cost_table(costs: list[UpdateCost], width: int = 80) -> str:
    """One line per update: syncs, kernels, copies, host µs (median and 95 % interval) and the GPU's queue.

    Example:
        >>> print(cost_table([UpdateCost("mean", 2, 4, 1, [30.0, 31.0, 29.0], "idle")]))
        update                syncs kernels copies  host us [95 % interval]  queue
        mean                      2       4      1     30.0 [29.0, 31.0]     idle
    """
    name_width = width - 58  # the other columns take 49, the longest queue note 9
    lines = [f"{'update':<{name_width}}{'syncs':>5}{'kernels':>8}{'copies':>7}  {'host us [95 % interval]':<25}queue"]
    for c in costs:
        lo, hi = c.host_interval
        name = c.name if len(c.name) <= name_width - 1 else c.name[:name_width - 2] + "…"
        kernels = "-" if c.kernels is None else str(c.kernels)
        copies = "-" if c.copies is None else str(c.copies)
        host = f"{c.host_us:7.1f} [{lo:.1f}, {hi:.1f}]"
        lines.append(f"{name:<{name_width}}{c.syncs:>5}{kernels:>8}{copies:>7}  {host:<25}{c.queue}".rstrip())
    return "\n".join(lines)
