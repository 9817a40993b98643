"""Reading ``torch.profiler``'s Chrome-trace JSON: its complete events, the ``ProfilerStep`` windows, the GPU work
each step launched and the time the GPU was busy.

The part of trace reading that :func:`mentor.measure.gpu_idle_share` needs; :mod:`mentor.measure` exports
:func:`load_trace`, :class:`Trace` and :class:`Event` (import them from there), and ``mentor.lab.trace`` builds the
book's other readings (sync calls, probable waits, host time) on these.

Example:
    >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
    ...            Event("cudaLaunchKernel", "cuda_runtime", 2, 1, 1, 1, correlation=1),
    ...            Event("k1", "kernel", 20, 5, 0, 7, correlation=1)])
    >>> [w.name for w in step_windows(t)], gpu_step_spans(t)
    (['ProfilerStep#1'], [(20, 25)])
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_CATEGORIES: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset")
"""Event categories that occupy the GPU."""

HOST_API_CATEGORIES: tuple[str, ...] = ("cuda_runtime", "cuda_driver")
"""Event categories of the host's CUDA runtime and driver API calls."""


@dataclass(frozen=True)
class Event:
    """One complete event ("ph": "X") of a trace; times in microseconds.

    ``correlation`` is the CUPTI correlation id (``args.correlation``) that links a runtime or
    driver call on the host to the kernel, copy or memset it launched on the GPU; ``None`` for
    events that have none.

    Example:
        >>> Event("k", "kernel", 20.0, 5.0, 0, 7, correlation=1).end
        25.0
    """

    name: str
    cat: str
    start: float
    dur: float
    pid: Any
    tid: Any
    correlation: int | None = None

    @property
    def end(self) -> float:
        """Start plus duration."""
        return self.start + self.dur


@dataclass
class Trace:
    """The complete events of one Chrome-trace file, sorted by start time (:func:`load_trace` makes one).

    Example:
        >>> t = Trace([Event("k", "kernel", 2, 4, 0, 7), Event("aten::add", "cpu_op", 1, 3, 1, 1)])
        >>> [e.name for e in t.by_cat("kernel", "gpu_memcpy")]
        ['k']
    """

    events: list[Event]
    path: str = ""

    def by_cat(self, *cats: str) -> list[Event]:
        """Events of the given categories."""
        return [e for e in self.events if e.cat in cats]


def _correlation(item: dict) -> int | None:
    args = item.get("args")
    value = args.get("correlation") if isinstance(args, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


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
    gzipped = path.suffix == ".gz"
    try:
        if gzipped:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                raw = json.load(f)
        else:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"'{path}' is not Chrome-trace JSON ({err}); {_PASS_A_TRACE}") from None
    except gzip.BadGzipFile as err:
        raise ValueError(f"'{path}' is named .gz but is not gzip data ({err}); gzip it, rename a plain JSON "
                         f"trace to .json, or {_PASS_A_TRACE}") from None
    except (EOFError, zlib.error) as err:
        raise ValueError(f"'{path}' is a truncated or damaged gzip file ({type(err).__name__}: {err}); "
                         f"record the trace again or {_PASS_A_TRACE}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"'{path}' is not UTF-8 text ({err}); {_PASS_A_TRACE}") from None
    items = raw.get("traceEvents") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise ValueError(f"'{path}' has no 'traceEvents' list: is it a torch.profiler Chrome trace?")
    events = [
        Event(str(e.get("name", "")), str(e.get("cat", "")), _time(path, index, e, "ts"),
              _time(path, index, e, "dur"), e.get("pid"), e.get("tid"), _correlation(e))
        for index, e in enumerate(items)
        if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e
    ]
    events.sort(key=lambda e: (e.start, -e.dur))
    return Trace(events=events, path=str(path))


_PASS_A_TRACE = "pass a .json or .json.gz file written by torch.profiler (export_chrome_trace)."


def _time(path: Path, index: int, item: dict, key: str) -> float:
    """``item[key]`` ("ts" or "dur", default 0 for "dur") as a float, or ValueError naming the file and event."""
    value = item.get(key, 0.0)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or (key == "dur" and value < 0):
        what = "a finite number >= 0" if key == "dur" else "a finite number"
        raise ValueError(f"'{path}': event {index} ({str(item.get('name', ''))!r}) has {key}={value!r}, but "
                         f"{key} must be {what} of microseconds; {_PASS_A_TRACE}")
    return float(value)


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


def gpu_busy_intervals(trace: Trace, start: float, end: float) -> list[tuple[float, float]]:
    """Merged intervals within ``[start, end)`` during which some kernel, copy or memset ran.

    Example:
        >>> t = Trace([Event("k", "kernel", 2, 4, 0, 7), Event("m", "gpu_memcpy", 5, 3, 0, 8)])
        >>> gpu_busy_intervals(t, 0, 10)
        [(2, 8)]
        >>> gpu_busy_intervals(t, 10, 0)
        Traceback (most recent call last):
        ...
        ValueError: gpu_busy_intervals needs start <= end, got start=10 and end=0; pass the earlier time first.
    """
    _check_trace(trace)
    if start > end:
        raise ValueError(f"gpu_busy_intervals needs start <= end, got start={start!r} and end={end!r}; "
                         "pass the earlier time first.")
    clipped = ((max(e.start, start), min(e.end, end)) for e in trace.by_cat(*GPU_CATEGORIES))
    spans = sorted((s, t) for s, t in clipped if s < t)
    merged: list[tuple[float, float]] = []
    for s, t in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], t))
        else:
            merged.append((s, t))
    return merged


def _gpu_spans(trace: Trace, windows: list[Event]) -> list[tuple[float, float] | None]:
    """For each window, (first GPU start, last GPU end) of the work launched in it, or None."""
    launched_at = {e.correlation: e.start for e in trace.by_cat(*HOST_API_CATEGORIES) if e.correlation is not None}
    gpu = [(launched_at[e.correlation], e) for e in trace.by_cat(*GPU_CATEGORIES)
           if e.correlation is not None and e.correlation in launched_at]
    out: list[tuple[float, float] | None] = []
    for w in windows:
        mine = [e for t, e in gpu if w.start <= t < w.end]
        out.append((min(e.start for e in mine), max(e.end for e in mine)) if mine else None)
    return out


def gpu_step_spans(trace: Trace) -> list[tuple[float, float]]:
    """For each ``ProfilerStep`` window, the time span of the GPU work that the step launched.

    A kernel, copy or memset belongs to a step when the runtime/driver call that launched it
    (the host event with the same ``correlation`` id) starts inside the step's host window, on
    any thread. The span runs from the earliest start to the latest end of those GPU events.
    When the host runs ahead of the GPU the span ends after the host window does. (The
    profiler's own GPU-side ``ProfilerStep`` annotation, category ``gpu_user_annotation``,
    covers only work linked to the step's range on the main thread, so it leaves out the
    kernels that autograd's backward thread launched; these spans include them.)

    A step that launched no correlated GPU work (a CPU-only trace, or one recorded without
    ``args.correlation``) raises ``ValueError`` naming the step: there is no span to return.

    Example:
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 2, 1, 1, 1, correlation=1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 8, 1, 1, 1, correlation=2),
        ...            Event("k1", "kernel", 20, 5, 0, 7, correlation=1),
        ...            Event("k2", "kernel", 27, 3, 0, 7, correlation=2)])
        >>> gpu_step_spans(t)
        [(20, 30)]
    """
    windows = step_windows(trace)
    if not windows:
        raise ValueError(_NO_WINDOWS)
    spans = _gpu_spans(trace, windows)
    for w, span in zip(windows, spans):
        if span is None:
            raise ValueError(
                f"{w.name} (host window at {w.start:g} us) launched no GPU work that the trace links to it "
                "by correlation id; record the trace on a CUDA device with ProfilerActivity.CUDA "
                "(mentor.measure.profiling_session does) so that kernels carry args.correlation."
            )
    return spans  # type: ignore[return-value]



def _idle_share(trace: Trace, start: float, end: float, what: str) -> float:
    """The share of ``[start, end)`` during which no kernel, copy or memset ran; ``what`` names that span in the
    ``ValueError`` of a span of zero length (which would otherwise read as "fully busy")."""
    if end <= start:
        raise ValueError(f"{what} ({start:g} to {end:g} us): there is no time to measure an idle share in; pass a "
                         "trace recorded on a CUDA device whose steps run GPU work of nonzero duration.")
    busy = sum(t - s for s, t in gpu_busy_intervals(trace, start, end))
    return (end - start - busy) / (end - start)

_NO_WINDOWS = ("the trace has no ProfilerStep windows: record it with a torch.profiler schedule "
               "and call prof.step() once per training step.")


def _check_trace(trace: object) -> None:
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a mentor.measure.Trace from load_trace(path), not {type(trace).__name__}.")
