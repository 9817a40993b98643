"""Reading torch.profiler's Chrome-trace JSON: step windows, sync events, probable waits, where host time goes, GPU step spans, GPU idle time and a timeline figure."""

from __future__ import annotations

import gzip
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYNC_CALLS: tuple[str, ...] = (
    # CUDA runtime
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaThreadSynchronize",  # the deprecated name of cudaDeviceSynchronize
    "cudaEventSynchronize",
    "cudaMemcpy",  # the blocking copy (cudaMemcpyAsync is not, unless it involves pageable host memory)
    "cudaMemcpy2D",
    "cudaMemcpyFromSymbol",
    "cudaFree",  # see below
    # CUDA driver API (what the runtime calls above become, and what Triton, CuPy, ... call directly)
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cuMemcpy",
    "cuMemcpyDtoH",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD",
    "cuMemcpyHtoD_v2",
    "cuMemFree",
    "cuMemFree_v2",
)
"""CUDA runtime and driver calls during which the host waits for the device.

The stream, context/device and event synchronizations wait by definition. The synchronous copies
follow CUDA's "API synchronization behavior" page: a copy from the device to host memory returns
only once the copy has completed, a copy from pageable host memory to the device performs a stream
sync first, one from pinned memory is synchronous with respect to the host (device-to-device
copies are not host-synchronous: a ``cudaMemcpy`` between two device buffers is counted anyway,
the trace does not say the direction). ``cudaFree``/``cuMemFree`` are not described as
synchronizing in their API reference entries; NVIDIA's stream-ordered allocator material explains
that ``cudaFree`` waits for the work still using the memory, i.e. synchronizes the device, before
it frees. torch's caching allocator calls it from ``torch.cuda.empty_cache()`` and when it frees
cached blocks to retry a failed allocation.
"""

GPU_CATEGORIES: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset")
"""Event categories that occupy the GPU."""

HOST_API_CATEGORIES: tuple[str, ...] = ("cuda_runtime", "cuda_driver")
"""Event categories of the host's CUDA runtime and driver API calls."""

DEFAULT_WAIT_THRESHOLD_US: float = 100.0
"""Default duration above which a runtime/driver call not in ``SYNC_CALLS`` counts as a probable wait.

In the committed H200 traces (tests/data) kernel launches under the profiler take up to about
90 us and ``cudaFuncSetAttribute`` up to about 65 us without any waiting, so 50 us would flag them.
"""


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
    """The complete events of one Chrome-trace file, sorted by start time."""

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


def sync_events(trace: Trace, window: Event | None = None) -> list[Event]:
    """Runtime and driver calls in which the host waits for the GPU (``SYNC_CALLS``), optionally inside ``window``.

    A call is inside a window when it *starts* in ``[window.start, window.end)``; the test is on
    time alone, so calls of every process and thread of the trace count (the autograd engine's
    backward thread launches part of each step's work, and its calls count too). See
    :func:`mentor.lab.profiling.step_syncs` for what such a count cannot see.

    Example:
        >>> t = Trace([Event("cudaStreamSynchronize", "cuda_runtime", 5, 1, 1, 1)])
        >>> len(sync_events(t))
        1
    """
    _check_trace(trace)
    found = [e for e in trace.events if e.name in SYNC_CALLS and e.cat in HOST_API_CATEGORIES]
    if window is not None:
        found = [e for e in found if window.start <= e.start < window.end]
    return found


def _check_threshold(threshold_us: object) -> float:
    if isinstance(threshold_us, bool) or not isinstance(threshold_us, (int, float)) or not threshold_us > 0:
        raise ValueError(f"wait_threshold_us must be a positive number of microseconds (e.g. "
                         f"{DEFAULT_WAIT_THRESHOLD_US:g}), got {threshold_us!r}.")
    return float(threshold_us)


def wait_events(trace: Trace, window: Event | None = None,
                threshold_us: float = DEFAULT_WAIT_THRESHOLD_US) -> list[Event]:
    """Probable waits: runtime/driver calls not in ``SYNC_CALLS`` that took longer than ``threshold_us``.

    A ``cudaMemcpyAsync`` from the device into pageable host memory "might be synchronous with
    respect to host" (CUDA's API synchronization behavior page); the trace does not say whether
    the host buffer was pageable, so such a copy shows only by its duration. A kernel launch also
    blocks when the launch queue is full. A long call whose next runtime/driver call on the same
    thread is a counted sync (``cudaMemcpyAsync`` + ``cudaStreamSynchronize``, as torch's blocking
    copies do) is left out: its wait belongs to that sync. Short waits (an almost idle GPU) are
    missed, and a slow call that did not wait (first-time module loading, say) is reported.
    ``window`` selects calls by start time as in :func:`sync_events`.

    Example:
        >>> t = Trace([Event("cudaMemcpyAsync", "cuda_runtime", 5, 900, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 910, 8, 1, 1)])
        >>> [e.name for e in wait_events(t)]
        ['cudaMemcpyAsync']
    """
    _check_trace(trace)
    threshold = _check_threshold(threshold_us)
    api = trace.by_cat(*HOST_API_CATEGORIES)
    next_on_thread: dict[int, Event] = {}
    last: dict[tuple[Any, Any], Event] = {}
    for e in api:  # sorted by start
        key = (e.pid, e.tid)
        if key in last:
            next_on_thread[id(last[key])] = e
        last[key] = e
    found = []
    for e in api:
        if e.name in SYNC_CALLS or e.dur <= threshold:
            continue
        follower = next_on_thread.get(id(e))
        if follower is not None and follower.name in SYNC_CALLS:
            continue
        if window is None or window.start <= e.start < window.end:
            found.append(e)
    return found


LAUNCH_CALLS: tuple[str, ...] = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
"""Runtime and driver calls that launch a kernel."""


@dataclass(frozen=True)
class HostTime:
    """Where the host spent the time of one kind of range (per range, averaged), in microseconds.

    ``waits`` are the calls of :func:`sync_events` and :func:`wait_events` that start inside the
    range on its thread, ``launches`` the kernel launches (``LAUNCH_CALLS``), ``other_api`` the rest
    of the CUDA runtime and driver calls; what remains of the range is Python, the dispatcher and
    the operators' host code. Under the profiler every operator costs extra host time, so read the
    shares, not the absolute values, as those of an unprofiled run.

    Example:
        >>> h = HostTime("metrics", 2, 100.0, 30.0, 20.0, 5.0, 4.0)
        >>> h.rest_us
        45.0
    """

    name: str
    ranges: int
    total_us: float
    wait_us: float
    launch_us: float
    other_api_us: float
    launches: float
    """Kernel launches per range."""

    @property
    def rest_us(self) -> float:
        """Python, dispatcher and operator host code: the range minus its waits and CUDA API calls."""
        return self.total_us - self.wait_us - self.launch_us - self.other_api_us


def host_time(trace: Trace, range_name: str, threshold_us: float = DEFAULT_WAIT_THRESHOLD_US) -> HostTime:
    """Split the host time of every range named ``range_name`` (a ``record_function`` label) into waits, kernel
    launches, other CUDA API calls and the rest, averaged over the ranges (see :class:`HostTime`).

    Example:
        >>> t = Trace([Event("metrics", "user_annotation", 0, 100, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 10, 5, 1, 1),
        ...            Event("cudaStreamSynchronize", "cuda_runtime", 20, 40, 1, 1),
        ...            Event("cudaMemsetAsync", "cuda_runtime", 70, 3, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 80, 5, 1, 2)])  # another thread
        >>> h = host_time(t, "metrics")
        >>> h.total_us, h.wait_us, h.launch_us, h.other_api_us, h.rest_us, h.launches
        (100.0, 40.0, 5.0, 3.0, 52.0, 1.0)
    """
    _check_trace(trace)
    ranges = [e for e in trace.events if e.name == range_name and e.cat not in GPU_CATEGORIES
              and not e.cat.startswith("gpu_")]
    if not ranges:
        raise ValueError(f"the trace has no range named {range_name!r}; wrap the code in "
                         f"torch.profiler.record_function({range_name!r}) while the profiler records.")
    waits = {id(e) for e in sync_events(trace)} | {id(e) for e in wait_events(trace, threshold_us=threshold_us)}
    api = trace.by_cat(*HOST_API_CATEGORIES)
    total = wait = launch = other = launches = 0.0
    for r in ranges:
        total += r.dur
        for e in api:
            if e.tid != r.tid or e.pid != r.pid or not r.start <= e.start < r.end:
                continue
            if id(e) in waits:
                wait += e.dur
            elif e.name in LAUNCH_CALLS:
                launch += e.dur
                launches += 1
            else:
                other += e.dur
    n = len(ranges)
    return HostTime(range_name, n, total / n, wait / n, launch / n, other / n, launches / n)


def host_time_table(rows: dict[str, HostTime]) -> str:
    """One line per label: µs per range on the host, split as in :class:`HostTime`, and the launches per range.

    Example:
        >>> print(host_time_table({"suite": HostTime("metrics", 5, 100.0, 0.0, 30.0, 5.0, 20.0)}))
        config               range us   waits  launches  other API    rest  kernels
        suite                   100.0     0.0      30.0        5.0    65.0     20.0
    """
    lines = [f"{'config':<20}{'range us':>9}{'waits':>8}{'launches':>10}{'other API':>11}{'rest':>8}{'kernels':>9}"]
    for label, h in rows.items():
        name = label if len(label) <= 19 else label[:18] + "…"
        lines.append(f"{name:<20}{h.total_us:>9.1f}{h.wait_us:>8.1f}{h.launch_us:>10.1f}{h.other_api_us:>11.1f}"
                     f"{h.rest_us:>8.1f}{h.launches:>9.1f}")
    return "\n".join(lines)


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
                "(profiling_session does) so that kernels carry args.correlation."
            )
    return spans  # type: ignore[return-value]


def gpu_idle_fraction(trace: Trace) -> list[float]:
    """For each step, the share of its GPU span (:func:`gpu_step_spans`) during which the GPU ran nothing.

    The span, not the host's ``ProfilerStep`` window, is the reference: when the host runs ahead
    (no syncs) the GPU work of a step runs after the host window has closed, so measuring in the
    host window mixes in the neighbouring steps' work. Busy time is the union of every kernel,
    copy and memset within the span, also work of other steps that overlaps it. The idle share
    is therefore the gaps *between* the first and the last GPU work of the step: what syncs and
    slow launches cost. Idle time before the first kernel of a step (while the host prepares it)
    is not inside any span and is not counted. A zero-length span raises ``ValueError`` rather
    than returning 0.0, which would read as "fully busy".

    Example:
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 2, 1, 1, 1, correlation=1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 8, 1, 1, 1, correlation=2),
        ...            Event("k1", "kernel", 20, 5, 0, 7, correlation=1),
        ...            Event("k2", "kernel", 27, 3, 0, 7, correlation=2)])
        >>> gpu_idle_fraction(t)
        [0.2]
    """
    out = []
    for w, (start, end) in zip(step_windows(trace), gpu_step_spans(trace)):
        if end <= start:
            raise ValueError(f"the GPU span of {w.name} has zero length ({start:g} to {end:g} us): "
                             "there is no time to measure an idle share in; pass a trace recorded on a CUDA "
                             "device whose steps run GPU work of nonzero duration.")
        busy = sum(t - s for s, t in gpu_busy_intervals(trace, start, end))
        out.append((end - start - busy) / (end - start))
    return out


_NO_WINDOWS = ("the trace has no ProfilerStep windows: record it with a torch.profiler schedule "
               "and call prof.step() once per training step.")


def _check_trace(trace: object) -> None:
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a mentor.lab.trace.Trace from load_trace(path), not {type(trace).__name__}.")
