"""Measuring your own loop: which regime it is in, and what one metric update costs it.

- :func:`profiling_session` records a Chrome trace of a few steps of your loop (``torch.profiler`` with a
  schedule); :func:`load_trace` reads it back as a :class:`Trace` of :class:`Event` objects.
- :func:`gpu_idle_share` of a trace of your loop *without* metrics says which regime the loop is in: the share
  of the time the GPU ran nothing, gaps between steps included. Above :data:`HOST_BOUND_IDLE` the host limits
  the step (this book's convention); below it the GPU does.
- :func:`update_cost` measures one metric update on fixed inputs: its syncs, the kernels and copies it puts on
  the GPU, and its host microseconds with the GPU kept busy, as an :class:`UpdateCost`.

Like the rest of the library, this module needs torch and torchmetrics only. The syncs and the GPU's work are
CUDA's: on a machine without CUDA a trace has no GPU work (:func:`gpu_idle_share` says so) and
:func:`update_cost` returns host time only (see its docstring).

Example (a trace of two steps on whatever device torch has):
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "loop.json.gz")
    >>> with profiling_session(path, wait=0, warmup=1, active=2) as prof:
    ...     for _ in range(3):
    ...         _ = torch.ones(64, 64) @ torch.ones(64, 64)
    ...         prof.step()
    >>> sorted({e.name for e in load_trace(path).events if e.name.startswith("ProfilerStep#")})
    ['ProfilerStep#1', 'ProfilerStep#2']
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np  # a dependency of torchmetrics (its METADATA: Requires-Dist: numpy>1.20.0)
import torch

from mentor._chrome_trace import Event, Trace, _idle_share, gpu_step_spans, load_trace

__all__ = ["HOST_BOUND_IDLE", "LAUNCHES_PER_REPEAT", "Event", "Trace", "UpdateCost", "gpu_idle_share", "load_trace",
           "one_core", "profiling_session", "update_cost"]

# ----------------------------------------------------------------------------------------------------------
# A profiler session


@contextlib.contextmanager
def profiling_session(
    trace_path: str | Path,
    *,
    wait: int = 1,
    warmup: int = 2,
    active: int = 3,
    with_stack: bool = False,
    record_shapes: bool = False,
) -> Iterator[torch.profiler.profile]:
    """A ``torch.profiler`` session over ``wait + warmup + active`` steps that writes a Chrome trace.

    Call ``prof.step()`` once per training step; the last ``active`` steps are recorded (on CUDA, the GPU's work
    too). The trace goes to ``trace_path``; a name ending in ``.gz`` is gzipped. Perfetto UI (ui.perfetto.dev)
    and chrome://tracing open both, :func:`load_trace` reads them. A block that ends before the schedule
    reaches its active steps writes no trace and raises ``RuntimeError`` saying how many ``prof.step()`` calls
    it saw (unless the block raised an error of its own, which passes on).

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
        >>> with profiling_session(path, wait=0, warmup=0, active=1) as prof:
        ...     _ = torch.ones(2) + 1; prof.step()
        >>> os.path.exists(path)
        True
    """
    for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}.")
    path = Path(trace_path)
    if path.suffix not in (".json", ".gz") or (path.suffix == ".gz" and not path.name.endswith(".json.gz")):
        raise ValueError(f"trace_path must end in .json or .json.gz, got '{path.name}'.")
    path.parent.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    written: list[bool] = []

    def ready(p: torch.profiler.profile) -> None:
        p.export_chrome_trace(str(path))
        _name_trace(path)
        written.append(True)

    prof = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=ready,
        with_stack=with_stack,
        record_shapes=record_shapes,
    )
    with prof:
        yield prof  # an exception of the body propagates from here: it is not masked by the check below
    if not written:
        needed = wait + warmup + active
        raise RuntimeError(
            f"profiling_session recorded nothing and wrote no trace to '{path}': the block called prof.step() "
            f"{prof.step_num} time(s), but the schedule needs {needed} steps (wait {wait} + warmup {warmup} + "
            f"active {active}) and records only from step {wait + warmup + 1} on. Call prof.step() once per "
            f"training step and run at least {needed} steps, or shorten the schedule."
        )


def _name_trace(path: Path) -> None:
    """Set the written trace's ``traceName`` to the file's own name, not a path on the machine that ran it.

    ``profile.export_chrome_trace`` (``torch/profiler/profiler.py``) writes a ``.json.gz`` trace to a temporary
    ``.json`` file first and gzips that, so the profiler records the temporary file's path (``/tmp/tmp....json``)
    as the trace's name; a ``.json`` trace records the path as given.
    """
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    trace["traceName"] = path.name
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(trace, f)


# ----------------------------------------------------------------------------------------------------------
# Which regime a loop is in

HOST_BOUND_IDLE = 0.10
"""A loop whose GPU idles more than this share of the traced time is called host-bound: this book's convention
(chapter 9), not a measured boundary."""


def gpu_idle_share(trace: Trace) -> float:
    """The share of time, from the first step's first GPU work to the last step's last, that the GPU ran nothing.

    ``trace`` is a :func:`load_trace` of at least two ``ProfilerStep`` windows recorded on CUDA (as
    :func:`profiling_session` records them). Each step's GPU work is the work its host window launched
    (linked by correlation id, on any thread); busy time is the union of every kernel, copy and memset between
    the first and the last of it. Unlike an idle share inside each step's own GPU span, this counts the gaps
    *between* steps too: in a loop that the host limits, the GPU finishes a step's work and then waits for the
    next step's launches, and that wait lies between the spans.

    Limits: the profiler slows the host (it records every operator and launch), so the GPU of a traced loop is
    expected to idle more than that of the same loop untraced; the share is not a measurement of the untraced
    loop. It says nothing about what metrics add: trace the loop without them. A trace without CUDA work (a CPU
    run) raises ``ValueError`` naming the first step that launched none.

    Example (two steps, each with 5 µs of kernel, 10 µs apart):
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 2, 1, 1, 1, correlation=1),
        ...            Event("ProfilerStep#2", "user_annotation", 10, 10, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 12, 1, 1, 1, correlation=2),
        ...            Event("k1", "kernel", 20, 5, 0, 7, correlation=1),
        ...            Event("k2", "kernel", 30, 5, 0, 7, correlation=2)])
        >>> round(gpu_idle_share(t), 4)
        0.3333
    """
    spans = gpu_step_spans(trace)  # raises, naming the step, when a step launched no GPU work
    if len(spans) < 2:
        raise ValueError(f"gpu_idle_share needs a trace of at least 2 steps, got {len(spans)}: the gaps between "
                         "steps are what it measures; record more (profiling_session(..., active=5)).")
    start, end = min(s for s, _ in spans), max(t for _, t in spans)
    return _idle_share(trace, start, end, f"the GPU work of the {len(spans)} traced steps spans no time")

# ----------------------------------------------------------------------------------------------------------
# What one update costs

LAUNCHES_PER_REPEAT = 200
"""At most this many GPU operations are queued behind the sleep per timed repeat."""

_GPU_EVENT_NAMES_COPY = ("Memcpy", "Memset")


@dataclass(frozen=True)
class UpdateCost:
    """The cost of one call of a metric update, as :func:`update_cost` measures it.

    Example:
        >>> c = UpdateCost("m", 0, 5, 0, [10.0, 12.0, 11.0], "full")
        >>> c.host_us, c.host_interval
        (11.0, (10.0, 12.0))
    """

    name: str
    syncs: int
    """Host-device syncs per call (:func:`mentor.syncs.count_syncs`); 0 without CUDA, where there is no device to
    wait for."""
    kernels: int | None
    """CUDA kernels per call; ``None`` without CUDA (nothing to count them on)."""
    copies: int | None
    """Copies and memsets on the GPU per call; ``None`` without CUDA."""
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
    """Syncs, GPU operations and host microseconds of one call of ``fn``, a metric update on fixed inputs.

    ``fn`` takes no arguments: close over the metric and its inputs. It runs ``warmup`` times first, untimed, so
    that states are allocated and kernels loaded. Then, with CUDA:

    - **syncs** per call are counted by :func:`mentor.syncs.count_syncs`;
    - **kernels** (and **copies** or memsets) per call by ``torch.profiler`` over three calls;
    - **host microseconds** per call are timed while the GPU's queue is full: a ``torch.cuda._sleep`` kernel is
      queued first, so the host never waits for the GPU and what is timed is the Python code, the dispatcher
      and the kernel launches. The sleep is checked to be still running when the timed calls end (a CUDA event
      queued after it has not completed); otherwise the repeat is measured again with a sleep twice as long
      (``RuntimeError`` past 10 s). A call that syncs cannot be timed that way (its first sync would wait for
      the sleep): it is timed with an idle GPU instead, so each of its syncs waits for its own kernels only, and
      ``queue`` says ``"idle"``. In a training loop such a sync waits for the whole queued step, which costs far
      more: measure the loop for that.

    Few calls are timed in a row (:data:`LAUNCHES_PER_REPEAT` GPU operations at most, 20 calls at most), so that
    the launch queue (about a thousand pending launches) never fills and blocks the host.

    Without CUDA only the host time is measured, each call timed alone: ``kernels`` and ``copies`` are ``None``,
    ``syncs`` is 0 (a CPU update has no device to wait for) and ``queue`` is ``"n/a (CPU)"``; count syncs and
    kernels on the GPU machine.

    The calling thread is pinned to one CPU core (the lowest it may run on, :func:`one_core`) while it measures,
    so that every repeat runs on the same core; ``core`` records which. What the numbers cannot tell: the host
    time is that of an isolated update; in a loop the same update may hold the host longer or shorter (caches,
    the loop's own launches), so check an estimate made from it with a measurement of the loop.

    Example:
        >>> cost = update_cost("add", lambda: torch.ones(3).add_(1), repeats=3)
        >>> cost.name, cost.syncs, len(cost.repeats_us)
        ('add', 0, 3)
        >>> (cost.kernels is None) == (not torch.cuda.is_available())  # None without CUDA
        True
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str that labels the update (e.g. \"my metrics\"), not {type(name).__name__}.")
    if not callable(fn):
        raise TypeError(f"fn must be a function of no arguments (e.g. lambda: metric.update(x)), not {fn!r}.")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0 (untimed calls before measuring), got {warmup!r}.")
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
