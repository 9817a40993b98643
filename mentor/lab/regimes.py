"""Which regime an operating point is in, measured: how much of its time the GPU idles, and what an update costs
the host against the step.

The GPU's idle share of a traced loop is the library's, :func:`mentor.measure.gpu_idle_share`, with its threshold
:data:`mentor.measure.HOST_BOUND_IDLE` (both imported here under their old names). :func:`measure_regime` records
a trace of the book's loop without metrics at an operating point (:func:`mentor.lab.profiling.record_steps`) and
reads that share from it; :func:`regime_table` puts the points side by side.

Limits: the profiler slows the host (it records every operator and launch), so the GPU of a traced loop is
expected to idle more than that of the same loop untraced; the share measured here is not a measurement of the
untraced loop.
It says nothing about a loop with metrics; the update's host time against the step (``hook_share``) is the
other column, read from a block comparison (``settings["hook_ms"]`` of
:func:`mentor.lab.blocks.compare_blocks`). The threshold that names a point "host-bound"
(:data:`~mentor.measure.HOST_BOUND_IDLE`) is a convention of this book, not a measured boundary.

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

from mentor.lab.trace import gpu_step_spans, load_trace, step_windows
from mentor.measure import HOST_BOUND_IDLE, gpu_idle_share


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
    """:func:`~mentor.measure.gpu_idle_share` of the traced loop without metrics."""
    hook_share: float | None = None
    """An update's host time in the loop over the step time without metrics (a fraction), or None."""

    @property
    def bound(self) -> str:
        """``"host-bound"`` when ``gpu_idle`` exceeds :data:`~mentor.measure.HOST_BOUND_IDLE`, else ``"GPU-bound"``."""
        return "host-bound" if self.gpu_idle > HOST_BOUND_IDLE else "GPU-bound"


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
