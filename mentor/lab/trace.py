"""Reading torch.profiler's Chrome-trace JSON for the book: sync events, probable waits, where host time goes and
each step's GPU idle time.

Loading a trace, its step windows, each step's GPU span and the GPU's busy intervals are the library's
(:mod:`mentor.measure`, which exports :func:`~mentor.measure.load_trace`, :class:`~mentor.measure.Trace` and
:class:`~mentor.measure.Event`); they are imported here under their old names, so ``from mentor.lab.trace import
load_trace`` keeps working.

Example:
    >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
    ...            Event("cudaStreamSynchronize", "cuda_runtime", 5, 1, 1, 1)])
    >>> [e.name for e in sync_events(t, step_windows(t)[0])]
    ['cudaStreamSynchronize']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mentor._chrome_trace import (  # noqa: F401 - re-exported: the lab's plots and the notebooks import them here
    _NO_WINDOWS,
    GPU_CATEGORIES,
    HOST_API_CATEGORIES,
    _check_trace,
    _gpu_spans,
    _idle_share,
    gpu_busy_intervals,
    gpu_step_spans,
    step_windows,
)
from mentor.measure import Event, Trace, load_trace  # noqa: F401 - re-exported under their old names

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

DEFAULT_WAIT_THRESHOLD_US: float = 100.0
"""Default duration above which a runtime/driver call not in ``SYNC_CALLS`` counts as a probable wait.

In the committed H200 traces (tests/data) kernel launches under the profiler take up to about
90 us and ``cudaFuncSetAttribute`` up to about 65 us without any waiting, so 50 us would flag them.
"""


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
    return [_idle_share(trace, start, end, f"the GPU span of {w.name} has zero length")
            for w, (start, end) in zip(step_windows(trace), gpu_step_spans(trace))]
