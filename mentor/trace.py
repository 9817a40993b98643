"""Reading torch.profiler's Chrome-trace JSON: step windows, sync events, GPU idle time and a timeline figure."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYNC_CALLS: tuple[str, ...] = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",  # the blocking copy (cudaMemcpyAsync is not)
)
"""CUDA runtime calls during which the host waits for the device."""

GPU_CATEGORIES: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset")
"""Event categories that occupy the GPU."""


@dataclass(frozen=True)
class Event:
    """One complete event ("ph": "X") of a trace; times in microseconds."""

    name: str
    cat: str
    start: float
    dur: float
    pid: Any
    tid: Any

    @property
    def end(self) -> float:
        """Start plus duration."""
        return self.start + self.dur


@dataclass
class Trace:
    """The complete events of one Chrome-trace file, sorted by start time."""

    events: list[Event]
    path: str = ""

    def by_cat(self, *cats: str) -> list[Event]:
        """Events of the given categories."""
        return [e for e in self.events if e.cat in cats]


def load_trace(path: str | Path) -> Trace:
    """Load a trace written by ``torch.profiler`` (``.json`` or ``.json.gz``).

    Example:
        >>> load_trace("missing.json")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no trace at 'missing.json'; pass the path of a .json or .json.gz file written by torch.profiler.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no trace at '{path}'; pass the path of a .json or .json.gz file written by torch.profiler."
        )
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"'{path}' is not Chrome-trace JSON ({err}).") from None
    items = raw.get("traceEvents") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise ValueError(f"'{path}' has no 'traceEvents' list: is it a torch.profiler Chrome trace?")
    events = [
        Event(str(e.get("name", "")), str(e.get("cat", "")), float(e["ts"]), float(e.get("dur", 0.0)),
              e.get("pid"), e.get("tid"))
        for e in items
        if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e
    ]
    events.sort(key=lambda e: (e.start, -e.dur))
    return Trace(events=events, path=str(path))


def step_windows(trace: Trace) -> list[Event]:
    """The ``ProfilerStep#N`` ranges on the host, in order.

    Example:
        >>> t = Trace([Event("ProfilerStep#3", "user_annotation", 0, 10, 1, 1)])
        >>> [w.name for w in step_windows(t)]
        ['ProfilerStep#3']
    """
    _check_trace(trace)
    return [e for e in trace.events if e.name.startswith("ProfilerStep#") and e.cat not in GPU_CATEGORIES
            and not e.cat.startswith("gpu_")]


def sync_events(trace: Trace, window: Event | None = None) -> list[Event]:
    """Runtime calls in which the host waits for the GPU (``SYNC_CALLS``), optionally inside ``window``.

    Example:
        >>> t = Trace([Event("cudaStreamSynchronize", "cuda_runtime", 5, 1, 1, 1)])
        >>> len(sync_events(t))
        1
    """
    _check_trace(trace)
    found = [e for e in trace.events if e.name in SYNC_CALLS and e.cat in ("cuda_runtime", "cuda_driver")]
    if window is not None:
        found = [e for e in found if window.start <= e.start < window.end]
    return found


def gpu_busy_intervals(trace: Trace, start: float, end: float) -> list[tuple[float, float]]:
    """Merged intervals within ``[start, end)`` during which some kernel, copy or memset ran."""
    spans = sorted((max(e.start, start), min(e.end, end)) for e in trace.by_cat(*GPU_CATEGORIES)
                   if e.end > start and e.start < end)
    merged: list[tuple[float, float]] = []
    for s, t in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], t))
        else:
            merged.append((s, t))
    return merged


def gpu_idle_fraction(trace: Trace) -> list[float]:
    """For each step window, the fraction of its time during which the GPU ran nothing.

    The window is the host's ``ProfilerStep`` range; in a steady state the GPU work of a step
    and of its neighbours overlap it by the same amount, so the fraction is that of the loop.

    Example:
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        ...            Event("k", "kernel", 2, 4, 0, 7)])
        >>> gpu_idle_fraction(t)
        [0.6]
    """
    out = []
    for w in step_windows(trace):
        busy = sum(t - s for s, t in gpu_busy_intervals(trace, w.start, w.end))
        out.append(1.0 - busy / w.dur if w.dur > 0 else 0.0)
    return out


def _check_trace(trace: object) -> None:
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a mentor.trace.Trace from load_trace(path), not {type(trace).__name__}.")


def plot_timeline(trace: Trace, steps: int = 2, ax: Any = None, annotations: bool = True) -> Any:
    """Draw the first ``steps`` profiled steps: host ops, ``record_function`` ranges, GPU work, syncs in red.

    Returns the matplotlib Axes.

    Example:
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1)])
        >>> ax = plot_timeline(t, steps=1)
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    _check_trace(trace)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    windows = step_windows(trace)[:steps]
    if not windows:
        raise ValueError("the trace has no ProfilerStep windows: record it with a torch.profiler schedule "
                         "and call prof.step() once per training step.")
    t0, t1 = windows[0].start, windows[-1].end
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.2))

    def inside(e: Event) -> bool:
        return e.end > t0 and e.start < t1

    rows = [
        ("steps", [w for w in windows], "#c7c7c7"),
        ("record_function", [e for e in trace.by_cat("user_annotation") if inside(e)
                             and not e.name.startswith("ProfilerStep#")], "#9467bd"),
        ("host ops", [e for e in trace.by_cat("cpu_op") if inside(e)], "#1f77b4"),
        ("CUDA runtime", [e for e in trace.by_cat("cuda_runtime", "cuda_driver") if inside(e)
                          and e.name not in SYNC_CALLS], "#7f7f7f"),
        ("GPU", [e for e in trace.by_cat(*GPU_CATEGORIES) if inside(e)], "#2ca02c"),
    ]
    syncs = [e for e in sync_events(trace) if inside(e)]
    labels = [r[0] for r in rows]
    for y, (_, evs, color) in enumerate(rows):
        bars = [((max(e.start, t0) - t0) / 1000, max(e.dur, 1.0) / 1000) for e in evs]
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolors="none", alpha=0.85)
    y_sync = labels.index("CUDA runtime")
    ax.broken_barh([((e.start - t0) / 1000, max(e.dur, 20.0) / 1000) for e in syncs],
                   (y_sync - 0.45, 0.9), facecolors="#d62728", edgecolors="#d62728")
    if annotations:
        for w in windows:
            ax.text((w.start - t0) / 1000 + 0.2, -0.05, w.name.replace("ProfilerStep", "step "),
                    fontsize=8, va="center")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1000)
    ax.set_xlabel("time since the first step began (ms)")
    ax.legend(handles=[Patch(color="#d62728", label=f"sync calls ({len(syncs)})"),
                       Patch(color="#2ca02c", label="GPU busy")], loc="upper right", fontsize=8)
    return ax
