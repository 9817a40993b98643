"""Finding syncs with the PyTorch Profiler: per-step sync counts in a trace, the book's traced steps, audits.

The profiling session is the library's, :func:`mentor.measure.profiling_session` (imported here under its old
name): it records a Chrome trace over a ``torch.profiler.schedule``. :func:`record_steps` runs the book's loop
under it; :func:`step_syncs` counts the sync calls inside each ``ProfilerStep`` window and names the
``record_function`` range they fell in; :func:`audit` runs callables under :func:`mentor.syncs.sync_guard` and
tabulates their syncs; :func:`ranged_mean_metric` is a ``MeanMetric`` whose update stages are profiler ranges.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> with profiling_session(path, wait=0, warmup=0, active=1) as prof:
    ...     _ = torch.ones(2) + 1; prof.step()
    >>> [s.count for s in step_syncs(path)]
    [0]
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mentor.lab.trace import (
    DEFAULT_WAIT_THRESHOLD_US,
    Event,
    Trace,
    load_trace,
    step_windows,
    sync_events,
    wait_events,
)
from mentor.measure import profiling_session
from mentor.syncs import _SYNC_MESSAGE, DEBUG_MODE, SyncReport, count_syncs


@dataclass(frozen=True)
class StepSyncs:
    """The sync calls of one profiled step, each attributed to its innermost ``record_function`` range."""

    step: str
    calls: tuple[Event, ...]
    ranges: tuple[str, ...]
    """For each call, the enclosing ``record_function`` range, or ``"(none)"``."""
    ops: tuple[str, ...]
    """For each call, the innermost host op (``aten::...``) around it, or ``"(none)"``."""
    waits: tuple[Event, ...] = ()
    """Probable waits: other runtime/driver calls longer than the threshold (:func:`mentor.lab.trace.wait_events`); not in ``count``."""

    @property
    def count(self) -> int:
        """Number of sync calls in the step."""
        return len(self.calls)

    def by_range(self) -> Counter[str]:
        """Sync calls per ``record_function`` range."""
        return Counter(self.ranges)


def _innermost(candidates: list[Event], e: Event) -> str:
    best = None
    for c in candidates:
        if c.pid == e.pid and c.tid == e.tid and c.start <= e.start and e.end <= c.end + 1e-3:
            if best is None or c.dur <= best.dur:
                best = c
    return best.name if best is not None else "(none)"


def step_syncs(trace: Trace | str | Path, wait_threshold_us: float = DEFAULT_WAIT_THRESHOLD_US) -> list[StepSyncs]:
    """Count the sync calls inside each ``ProfilerStep`` window of a trace and attribute them.

    A sync call is a CUDA runtime or driver call named in :data:`mentor.lab.trace.SYNC_CALLS`; each
    is attributed to the innermost ``record_function`` range and host op on its thread. Other
    runtime/driver calls longer than ``wait_threshold_us`` microseconds are listed as probable
    ``waits`` (not counted; see :func:`mentor.lab.trace.wait_events`).

    What this count cannot see:

    - anything outside the ``ProfilerStep`` windows: the profiler schedule's wait and warm-up
      steps and the steps before it started are not recorded, whatever runs after the last
      ``prof.step()`` has no window, and code that :func:`record_steps` does not run at all
      (e.g. ``train``'s periodic report, which it leaves out) never appears;
    - calls made while the profiler is not recording, and calls that CUPTI does not report;
    - the kind of host memory of a ``cudaMemcpyAsync``: a copy into pageable memory blocks
      the host, one into pinned memory does not, and the call looks the same; only its
      duration (the ``waits``) hints at it;
    - which thread a call belongs to: a call counts for a window when it starts inside the
      window's time range, on any thread or process of the trace (the autograd thread's calls
      count for the step whose window they fall in, and so would those of a data-loading or
      logging thread);
    - whether a listed call really waited: a ``cudaStreamSynchronize`` on an idle stream
      returns at once and counts the same as a long one.

    A trace without any ``ProfilerStep`` window raises ``ValueError``.

    Example:
        >>> from mentor.lab.trace import Event, Trace
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 100, 1, 1),
        ...            Event("update", "user_annotation", 10, 20, 1, 1),
        ...            Event("cudaStreamSynchronize", "cuda_runtime", 12, 3, 1, 1),
        ...            Event("cudaMemcpyAsync", "cuda_runtime", 40, 300, 1, 1)])
        >>> s = step_syncs(t)[0]
        >>> s.count, dict(s.by_range()), [w.name for w in s.waits]
        (1, {'update': 1}, ['cudaMemcpyAsync'])
    """
    if isinstance(trace, (str, Path)):
        trace = load_trace(trace)
    windows = step_windows(trace)
    if not windows:
        where = f" '{trace.path}'" if trace.path else ""
        raise ValueError(f"the trace{where} has no ProfilerStep windows, so there are no steps to count syncs in; "
                         "record it with mentor.lab.profiling.profiling_session (or record_steps) and call "
                         "prof.step() once per training step.")
    annotations = [e for e in trace.by_cat("user_annotation") if not e.name.startswith("ProfilerStep#")]
    ops = trace.by_cat("cpu_op")
    out = []
    for window in windows:
        calls = tuple(sync_events(trace, window))
        out.append(StepSyncs(
            step=window.name,
            calls=calls,
            ranges=tuple(_innermost(annotations, c) for c in calls),
            ops=tuple(_innermost(ops, c) for c in calls),
            waits=tuple(wait_events(trace, window, wait_threshold_us)),
        ))
    return out


def record_steps(
    setup: Any,
    batches: Any,
    trace_path: str | Path,
    on_step: Callable[[Any], None] | None = None,
    *,
    warmup: int = 2,
    active: int = 3,
) -> Path:
    """Train ``warmup + active`` steps under :func:`~mentor.measure.profiling_session` and write the trace of the last ``active``.

    Runs two untimed steps first, so that the metric states and kernels are warm.

    Example:
        >>> import tempfile, os
        >>> from mentor.lab.train import build_setup
        >>> from mentor.lab.data import device_batches
        >>> path = record_steps(build_setup(num_classes=10), device_batches(2, 32, 10),
        ...                     os.path.join(tempfile.mkdtemp(), "t.json.gz"), active=1)
        >>> len(step_windows(load_trace(path)))
        1
    """
    from mentor.lab.train import train

    train(setup, batches, steps=2, on_step=on_step)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profiling_session(trace_path, wait=0, warmup=warmup, active=active) as prof:
            train(setup, batches, steps=warmup + active, on_step=on_step, profiler=prof)
    return Path(trace_path)


def audit(cases: dict[str, Callable[[], Any]]) -> str:
    """Run each callable once under :func:`mentor.syncs.sync_guard` and tabulate its syncs and where they happen.

    Each callable is run once untimed first, so that first-call allocations do not count. The
    table is :func:`audit_table` of the reports.

    Example (needs CUDA):
        >>> print(audit({"item": lambda: x.item()}))           # doctest: +SKIP
        item                                                                 1 sync
          1x mentor_demo.py:3
             x.item()
    """
    if not isinstance(cases, dict) or not all(callable(f) for f in cases.values()):
        raise TypeError("audit takes a dict of {label: callable with no arguments}.")
    if not torch.cuda.is_available():
        raise RuntimeError("audit counts CUDA host-device syncs and torch sees no CUDA device here; "
                           "run it on a GPU machine (mentor.lab.env.needs_cuda tells you when to skip).")
    reports = {}
    for label, fn in cases.items():
        fn()
        torch.cuda.synchronize()
        reports[label] = count_syncs(fn)
    return audit_table(reports)


AUDIT_WIDTH = 80


def audit_table(reports: dict[str, SyncReport], width: int = AUDIT_WIDTH) -> str:
    """One block per case: its label and sync count, then each triggering ``file:line`` with its count
    and, indented below it, the source line (cut with "…" at ``width`` columns).

    A site that torch's sync debug mode did not report carries its kind in brackets, e.g.
    ``[torch.cuda.synchronize]``.

    Example:
        >>> from mentor.syncs import SyncSite
        >>> site = SyncSite("/x/site-packages/torchmetrics/aggregation.py", 93, "update", ())
        >>> print(audit_table({"update(loss)": SyncReport([site, site]), "nothing": SyncReport()}, width=40))
        update(loss)                     2 syncs
          2x torchmetrics/aggregation.py:93
        nothing                          0 syncs
    """
    if not isinstance(width, int) or width < 30:
        raise ValueError(f"width is the table's width in columns, an int of at least 30, not {width!r}.")
    lines = []
    for label, report in reports.items():
        count = f"{report.count} sync" + ("" if report.count == 1 else "s")
        lines.append(f"{label:<{width - len(count) - 1}} {count}")
        for (where, code, kind), n in Counter((s.where, s.code, s.kind) for s in report.sites).items():
            lines.append(f"  {n}x {where}" + ("" if kind == DEBUG_MODE else f"  [{kind}]"))
            if code:
                code = "     " + code
                lines.append(code if len(code) <= width else code[:width - 1] + "…")
    return "\n".join(lines)


def debug_mode_count(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """How many syncs torch's own ``set_sync_debug_mode("warn")`` flags in one call of ``fn``, with no wrappers.

    This is the probe without :func:`mentor.syncs.sync_guard`'s additions, to show what torch alone sees.
    The previous mode is restored.

    Example (needs CUDA):
        >>> debug_mode_count(lambda: torch.cuda.synchronize())    # doctest: +SKIP
        0
    """
    if not callable(fn):
        raise TypeError(f"debug_mode_count takes a callable, not {type(fn).__name__}.")
    if not torch.cuda.is_available():
        raise RuntimeError("debug_mode_count counts CUDA syncs and torch sees no CUDA device; run it on a GPU.")
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        seen.clear()  # torch may report a sync from inside set_sync_debug_mode itself
        try:
            fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    return sum(1 for w in seen if _SYNC_MESSAGE.search(str(w.message)))


def ranged_mean_metric() -> type:
    """``MeanMetric`` whose update runs each of its stages inside a ``record_function`` range.

    The stages follow torchmetrics' own ``MeanMetric.update`` and ``_cast_and_nan_check_input``
    (releases 1.6.2 and later) line by line, so a profiler trace, read with :func:`step_syncs`,
    names the stage in which each sync happens. Values equal ``MeanMetric``'s.

    Example:
        >>> m = ranged_mean_metric()()
        >>> m.update(torch.tensor([1.0, 2.0]))
        >>> float(m.compute())
        1.5
    """
    from torch.profiler import record_function
    from torchmetrics import MeanMetric

    class RangedMeanMetric(MeanMetric):
        """MeanMetric with ``record_function`` ranges around the stages of ``update``."""

        def update(self, value: Any, weight: Any = None) -> None:
            with record_function("mean: value to tensor"):
                if not isinstance(value, torch.Tensor):
                    value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
            with record_function("mean: weight to tensor"):
                if weight is None:
                    weight = torch.ones_like(value)
                elif not isinstance(weight, torch.Tensor):
                    weight = torch.as_tensor(weight, dtype=self.dtype, device=self.device)
            with record_function("mean: broadcast weight"):
                weight = torch.broadcast_to(weight, value.shape)
            value, weight = self._cast_and_nan_check_input(value, weight)
            if value.numel() == 0:
                return
            with record_function("mean: accumulate"):
                self.mean_value += (value * weight).sum()
                self.weight += weight.sum()

        def _cast_and_nan_check_input(self, x: Any, weight: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
            if self.nan_strategy == "disable":
                return super()._cast_and_nan_check_input(x, weight)
            with record_function("nan check: isnan"):
                nans = torch.isnan(x)
                nans_weight = torch.isnan(weight) if weight is not None else torch.zeros_like(nans).bool()
                if weight is None:
                    weight = torch.ones_like(x)
            with record_function("nan check: any()"):
                found = bool(nans.any()) or bool(nans_weight.any())
            if found:
                with record_function("nan check: apply policy"):
                    return super()._cast_and_nan_check_input(x, weight)
            with record_function("nan check: cast"):
                return x.to(self.dtype), weight.to(self.dtype)

    return RangedMeanMetric
