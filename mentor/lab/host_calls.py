"""Which CUDA API calls took the host time of a ``record_function`` range, call name by call name.

:func:`mentor.lab.trace.host_time` splits a range into waits, launches, other CUDA API calls and the rest.
When a range holds the host far longer than its own work explains (chapter 9: a metric update that makes no
sync held the host for milliseconds at a GPU-bound step), the next question is which calls took that time.
:func:`api_calls` sums, per call name, the CUDA runtime and driver calls that start inside the ranges on
their thread, and keeps the longest single call of each name.

What it cannot see: why a call took long. A kernel launch that blocked because the launch queue was full,
and one that was slow for another reason, differ here only in their durations. The profiler itself slows
every operator on the host, so the sums are those of a profiled run.

Example:
    >>> from mentor.lab.trace import Event, Trace
    >>> t = Trace([Event("metrics", "user_annotation", 0, 100, 1, 1),
    ...            Event("cudaLaunchKernel", "cuda_runtime", 10, 60, 1, 1),
    ...            Event("cudaLaunchKernel", "cuda_runtime", 75, 4, 1, 1)])
    >>> print(api_calls_table(api_calls(t, "metrics")))
    call                         per range   µs per range   longest µs
    cudaLaunchKernel                   2.0           64.0         60.0
"""

from __future__ import annotations

from dataclasses import dataclass

from mentor.lab.trace import GPU_CATEGORIES, HOST_API_CATEGORIES, Trace


@dataclass(frozen=True)
class CallTime:
    """One CUDA API call name inside the ranges of one label: calls and microseconds per range, and the longest
    single call.

    Example:
        >>> CallTime("cudaLaunchKernel", 2.0, 64.0, 60.0).us
        64.0
    """

    name: str
    calls: float
    """Calls of this name per range."""
    us: float
    """Microseconds spent in calls of this name per range."""
    longest_us: float
    """The longest single call of this name in any of the ranges."""


def api_calls(trace: Trace, range_name: str) -> list[CallTime]:
    """Per CUDA runtime or driver call name, the calls and the time inside every range named ``range_name``
    (averaged over the ranges), most time first; ties keep the names' alphabetical order.

    Example:
        >>> from mentor.lab.trace import Event, Trace
        >>> t = Trace([Event("update", "user_annotation", 0, 50, 1, 1),
        ...            Event("update", "user_annotation", 100, 50, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 5, 10, 1, 1),
        ...            Event("cudaMemsetAsync", "cuda_runtime", 20, 2, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 110, 30, 1, 1),
        ...            Event("cudaLaunchKernel", "cuda_runtime", 112, 9, 1, 2)])  # another thread
        >>> [(c.name, c.calls, c.us, c.longest_us) for c in api_calls(t, "update")]
        [('cudaLaunchKernel', 1.0, 20.0, 30.0), ('cudaMemsetAsync', 0.5, 1.0, 2.0)]
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a mentor.lab.trace.Trace (from load_trace), not {type(trace).__name__}.")
    ranges = [e for e in trace.events if e.name == range_name and e.cat not in GPU_CATEGORIES
              and not e.cat.startswith("gpu_")]
    if not ranges:
        raise ValueError(f"the trace has no range named {range_name!r}; wrap the code in "
                         f"torch.profiler.record_function({range_name!r}) while the profiler records.")
    api = trace.by_cat(*HOST_API_CATEGORIES)
    calls: dict[str, int] = {}
    total: dict[str, float] = {}
    longest: dict[str, float] = {}
    for r in ranges:
        for e in api:
            if e.tid != r.tid or e.pid != r.pid or not r.start <= e.start < r.end:
                continue
            calls[e.name] = calls.get(e.name, 0) + 1
            total[e.name] = total.get(e.name, 0.0) + float(e.dur)
            longest[e.name] = max(longest.get(e.name, 0.0), float(e.dur))
    n = len(ranges)
    rows = [CallTime(name, calls[name] / n, total[name] / n, longest[name]) for name in sorted(calls)]
    return sorted(rows, key=lambda c: -c.us)


def api_calls_table(rows: list[CallTime], top: int = 5) -> str:
    """The first ``top`` rows of :func:`api_calls`, one line each.

    Example:
        >>> print(api_calls_table([CallTime("cudaLaunchKernel", 74.0, 8812.5, 1510.25)]))
        call                         per range   µs per range   longest µs
        cudaLaunchKernel                  74.0         8812.5       1510.2
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an int >= 1 (how many call names to show), got {top!r}.")
    lines = [f"{'call':<28}{'per range':>10}{'µs per range':>15}{'longest µs':>13}"]
    for c in rows[:top]:
        name = c.name if len(c.name) <= 27 else c.name[:26] + "…"
        lines.append(f"{name:<28}{c.calls:>10.1f}{c.us:>15.1f}{c.longest_us:>13.1f}")
    return "\n".join(lines)
