"""Which regime an operating point is in, measured: how much of its time the GPU idles, and what an update costs
the host against the step.

:func:`gpu_idle_share` reads a profiler trace of several steps and returns the share of the time from the first
GPU work of the first step to the last GPU work of the last step during which no kernel, copy or memset ran.
Unlike :func:`mentor.lab.trace.gpu_idle_fraction`, which looks inside each step's own GPU span, it counts the
gaps *between* steps too: in a loop that the host limits, the GPU finishes a step's work and then waits for
the next step's launches, and that wait lies between the spans. :func:`measure_regime` records such a trace of
the loop without metrics at an operating point (:func:`mentor.lab.profiling.record_steps`).

Limits: the profiler slows the host (it records every operator and launch), so the GPU of a traced loop is
expected to idle more than that of the same loop untraced; the share measured here is not a measurement of the
untraced loop.
It says nothing about a loop with metrics; the update's host time against the step (``hook_share``) is the
other column, read from a block comparison (``settings["hook_ms"]`` of
:func:`mentor.lab.blocks.compare_blocks`). The threshold that names a point "host-bound"
(:data:`HOST_BOUND_IDLE`) is a convention of this module, not a measured boundary.

Example:
    >>> print(regime_table([Regime("fp32 b128", 24.7, 0.01, 0.0067), Regime("bf16 b32", 9.5, 0.42, None)]))
    point        step ms  GPU idle  update / step  regime
    fp32 b128      24.70     1.0 %         0.67 %  GPU-bound
    bf16 b32        9.50    42.0 %              -  host-bound
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mentor.lab.trace import Trace, gpu_busy_intervals, gpu_step_spans, load_trace, step_windows

HOST_BOUND_IDLE = 0.10
"""A point whose GPU idles more than this share of the time is called host-bound (a convention, see above)."""


@dataclass(frozen=True)
class Regime:
    """One operating point's measured regime.

    Example:
        >>> Regime("bf16 b32", 9.5, 0.42, 0.015).bound, Regime("fp32 b128", 24.7, 0.01, None).bound
        ('host-bound', 'GPU-bound')
    """

    point: str
    step_ms: float
    """The loop's mean step time over the traced steps, from the first to the last GPU work (ms)."""
    gpu_idle: float
    """:func:`gpu_idle_share` of the traced loop without metrics."""
    hook_share: float | None = None
    """An update's host time in the loop over the step time without metrics (a fraction), or None."""

    @property
    def bound(self) -> str:
        """``"host-bound"`` when ``gpu_idle`` exceeds :data:`HOST_BOUND_IDLE`, else ``"GPU-bound"``."""
        return "host-bound" if self.gpu_idle > HOST_BOUND_IDLE else "GPU-bound"


def gpu_idle_share(trace: Trace) -> float:
    """The share of time, from the first step's first GPU work to the last step's last, that the GPU ran nothing.

    Example (two steps, each with 5 µs of kernel, 10 µs apart):
        >>> from mentor.lab.trace import Event
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
                         "steps are what it measures; record more (record_steps(..., active=5)).")
    start, end = min(s for s, _ in spans), max(t for _, t in spans)
    busy = sum(t - s for s, t in gpu_busy_intervals(trace, start, end))
    return (end - start - busy) / (end - start)


def measure_regime(point: object, profile: object, *, steps: int = 5, hook_ms: float | None = None,
                   trace_path: str | Path | None = None) -> Regime:
    """Trace ``steps`` steps of the loop without metrics at ``point`` and return its :class:`Regime`.

    ``hook_ms`` (an update's host time per step in the loop, e.g. ``comparison.settings["hook_ms"][name]``)
    gives ``hook_share`` against the traced step time. The trace goes to ``trace_path`` (a temporary file
    when None). Needs a CUDA profile: the regime is the GPU's.

    Example:
        >>> from mentor.lab.configs import OperatingPoint
        >>> from mentor.lab.env import get_profile
        >>> measure_regime(OperatingPoint("tiny", 2, 32), get_profile("smoke"))
        Traceback (most recent call last):
        ...
        ValueError: measure_regime needs a CUDA profile (the regime is read from the GPU's work in a trace); got one on cpu.
    """
    from mentor.lab.configs import OperatingPoint, point_setup
    from mentor.lab.env import Profile
    from mentor.lab.profiling import record_steps

    if not isinstance(point, OperatingPoint):
        raise TypeError(f"point must be a mentor.lab.configs.OperatingPoint, not {type(point).__name__}.")
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a mentor.lab.env.Profile (get_profile()), not {type(profile).__name__}.")
    if not profile.is_cuda:
        raise ValueError("measure_regime needs a CUDA profile (the regime is read from the GPU's work in a trace); "
                         f"got one on {profile.device}.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2 (the gaps between steps are measured), got {steps!r}.")
    setup, batches = point_setup(point, profile)
    path = Path(trace_path) if trace_path is not None else Path(tempfile.mkdtemp()) / "regime.json.gz"
    trace = load_trace(record_steps(setup, batches, path, active=steps))
    spans = gpu_step_spans(trace)
    step_ms = (max(t for _, t in spans) - min(s for s, _ in spans)) / len(step_windows(trace)) / 1000.0
    return Regime(point.name, step_ms, gpu_idle_share(trace), None if hook_ms is None else hook_ms / step_ms)


def regime_table(regimes: Sequence[Regime]) -> str:
    """One line per point: step time, GPU idle share, the update's host share of the step, and the regime.

    Example:
        >>> print(regime_table([Regime("p", 2.0, 0.5, None)]).splitlines()[1])
        p               2.00    50.0 %              -  host-bound
    """
    lines = [f"{'point':<12}{'step ms':>8}{'GPU idle':>10}{'update / step':>15}  regime"]
    for r in regimes:
        share = "-" if r.hook_share is None else f"{100 * r.hook_share:.2f} %"
        lines.append(f"{r.point:<12}{r.step_ms:>8.2f}{100 * r.gpu_idle:>8.1f} %{share:>15}  {r.bound}")
    return "\n".join(lines)
