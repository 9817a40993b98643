"""Finding host-device syncs: a profiler session, per-step sync counts, ``sync_guard`` and ``count_syncs``."""

from __future__ import annotations

import linecache
import re
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mentor.trace import Event, Trace, load_trace, step_windows, sync_events


@contextmanager
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

    Call ``prof.step()`` once per training step (``mentor.train.train(profiler=prof)`` does).
    The trace goes to ``trace_path``; a name ending in ``.gz`` is gzipped. Perfetto UI
    (ui.perfetto.dev) and chrome://tracing open both.

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
    prof = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        with_stack=with_stack,
        record_shapes=record_shapes,
    )
    with prof:
        yield prof


@dataclass(frozen=True)
class StepSyncs:
    """The sync calls of one profiled step, each attributed to its innermost ``record_function`` range."""

    step: str
    calls: tuple[Event, ...]
    ranges: tuple[str, ...]
    """For each call, the enclosing ``record_function`` range, or ``"(none)"``."""
    ops: tuple[str, ...]
    """For each call, the innermost host op (``aten::...``) around it, or ``"(none)"``."""

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


def step_syncs(trace: Trace | str | Path) -> list[StepSyncs]:
    """Count the sync calls inside each ``ProfilerStep`` window of a trace and attribute them.

    Example:
        >>> from mentor.trace import Event, Trace
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 100, 1, 1),
        ...            Event("update", "user_annotation", 10, 20, 1, 1),
        ...            Event("cudaStreamSynchronize", "cuda_runtime", 12, 3, 1, 1)])
        >>> s = step_syncs(t)[0]
        >>> s.count, dict(s.by_range())
        (1, {'update': 1})
    """
    if isinstance(trace, (str, Path)):
        trace = load_trace(trace)
    annotations = [e for e in trace.by_cat("user_annotation") if not e.name.startswith("ProfilerStep#")]
    ops = trace.by_cat("cpu_op")
    out = []
    for window in step_windows(trace):
        calls = tuple(sync_events(trace, window))
        out.append(StepSyncs(
            step=window.name,
            calls=calls,
            ranges=tuple(_innermost(annotations, c) for c in calls),
            ops=tuple(_innermost(ops, c) for c in calls),
        ))
    return out


_SYNC_MESSAGE = re.compile(r"synchroniz", re.IGNORECASE)
_LIBRARY_PARTS = ("/torch/", "/torchmetrics/", "/mentor/profiling.py", "/warnings.py", "<frozen")


@dataclass(frozen=True)
class SyncSite:
    """Where one synchronizing call happened: the Python line that triggered it and its call stack."""

    file: str
    line: int
    function: str
    stack: tuple[tuple[str, int, str], ...]
    """Frames outermost first, as (file, line, function)."""

    @property
    def where(self) -> str:
        """``file:line`` with the file shortened to its package-relative path."""
        return f"{short_path(self.file)}:{self.line}"

    @property
    def code(self) -> str:
        """The source text of the triggering line."""
        return linecache.getline(self.file, self.line).strip()

    @property
    def caller(self) -> str:
        """``file:line`` of the innermost frame outside torch, torchmetrics and mentor.profiling."""
        for file, line, _ in reversed(self.stack):
            if not any(part in file for part in _LIBRARY_PARTS):
                return f"{short_path(file)}:{line}"
        return self.where


def short_path(path: str) -> str:
    """``.../site-packages/torchmetrics/aggregation.py`` -> ``torchmetrics/aggregation.py``.

    Example:
        >>> short_path("/x/lib/python3.11/site-packages/torchmetrics/aggregation.py")
        'torchmetrics/aggregation.py'
    """
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    parts = Path(path).parts
    for anchor in ("mentor", "book", "tests"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor):])
    return path


@dataclass
class SyncReport:
    """The synchronizing calls seen by :func:`sync_guard` or :func:`count_syncs`."""

    sites: list[SyncSite] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Number of synchronizing calls."""
        return len(self.sites)

    def by_line(self) -> Counter[str]:
        """Calls per ``file:line`` of the triggering Python line."""
        return Counter(s.where for s in self.sites)

    def table(self) -> str:
        """One line per triggering ``file:line``, with its count and the caller outside the libraries."""
        if not self.sites:
            return "no synchronizing calls"
        rows = Counter((s.where, s.function, s.caller) for s in self.sites)
        return "\n".join(f"{n:3d}x  {where}  in {fn}()  <- {caller}" for (where, fn, caller), n in rows.items())


class SyncError(RuntimeError):
    """Raised by ``sync_guard(strict=True)`` at the first synchronizing call."""


@contextmanager
def sync_guard(strict: bool = False) -> Iterator[SyncReport]:
    """Watch the CUDA calls that make the host wait for the GPU, inside the ``with`` block.

    Uses ``torch.cuda.set_sync_debug_mode``: each synchronizing call is recorded with the
    Python file:line that made it, or, with ``strict=True``, raises :class:`SyncError` there.
    The previous debug mode is restored on exit.

    Example (needs CUDA):
        >>> with sync_guard() as report:                        # doctest: +SKIP
        ...     loss.item()
        >>> report.count                                        # doctest: +SKIP
        1
    """
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, not {strict!r}.")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "sync_guard watches CUDA host-device syncs and torch sees no CUDA device here; "
            "run it on a GPU machine, or skip the check (mentor.env.needs_cuda tells you when)."
        )
    report = SyncReport()
    armed = False  # torch 2.11 reports one sync from inside set_sync_debug_mode itself, once per process
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=r".*synchroniz.*")
        shown = warnings.showwarning

        def record(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                   line: Any = None) -> None:
            if not _SYNC_MESSAGE.search(str(message)):
                shown(message, category, filename, lineno, file, line)
                return
            if not armed:
                return
            stack = tuple((f.filename, f.lineno or 0, f.name) for f in traceback.extract_stack()[:-1]
                          if not f.filename.endswith("warnings.py"))
            function = next((fn for file, ln, fn in reversed(stack) if file == filename and ln == lineno), "?")
            report.sites.append(SyncSite(filename, lineno, function, stack))

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("error" if strict else "warn")
        armed = True
        try:
            yield report
        except RuntimeError as err:
            if strict and _SYNC_MESSAGE.search(str(err)) and not isinstance(err, SyncError):
                frames = traceback.extract_tb(err.__traceback__)
                last = frames[-1] if frames else None
                where = f"{short_path(last.filename)}:{last.lineno}" if last else "?"
                raise SyncError(f"synchronizing CUDA call at {where}: {err}") from err
            raise
        finally:
            armed = False
            torch.cuda.set_sync_debug_mode(previous)


def record_steps(
    setup: Any,
    batches: Any,
    trace_path: str | Path,
    on_step: Callable[[Any], None] | None = None,
    *,
    warmup: int = 2,
    active: int = 3,
) -> Path:
    """Train ``warmup + active`` steps under :func:`profiling_session` and write the trace of the last ``active``.

    Runs two untimed steps first, so that the metric states and kernels are warm.

    Example:
        >>> import tempfile, os
        >>> from mentor.train import build_setup
        >>> from mentor.data import device_batches
        >>> path = record_steps(build_setup(num_classes=10), device_batches(2, 32, 10),
        ...                     os.path.join(tempfile.mkdtemp(), "t.json.gz"), active=1)
        >>> len(step_windows(load_trace(path)))
        1
    """
    from mentor.train import train

    train(setup, batches, steps=2, on_step=on_step)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profiling_session(trace_path, wait=0, warmup=warmup, active=active) as prof:
            train(setup, batches, steps=warmup + active, on_step=on_step, profiler=prof)
    return Path(trace_path)


def audit(cases: dict[str, Callable[[], Any]]) -> str:
    """Run each callable once under :func:`sync_guard` and tabulate its syncs and where they happen.

    Each callable is run once untimed first, so that first-call allocations do not count.

    Example (needs CUDA):
        >>> print(audit({"item": lambda: x.item()}))           # doctest: +SKIP
        item                             1  mentor_demo.py:3  x.item()
    """
    if not isinstance(cases, dict) or not all(callable(f) for f in cases.values()):
        raise TypeError("audit takes a dict of {label: callable with no arguments}.")
    if not torch.cuda.is_available():
        raise RuntimeError("audit counts CUDA host-device syncs and torch sees no CUDA device here; "
                           "run it on a GPU machine (mentor.env.needs_cuda tells you when to skip).")
    lines = []
    for label, fn in cases.items():
        fn()
        torch.cuda.synchronize()
        report = count_syncs(fn)
        sites = Counter((s.where, s.code) for s in report.sites)
        first = True
        for (where, code), n in (sites.items() or [(("", ""), 0)]):
            head = f"{label:<34}{report.count:>3}" if first else " " * 37
            lines.append(f"{head}  {f'{n}x ' if n else ''}{where}  {code}".rstrip())
            first = False
    return "\n".join(lines)


def count_syncs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> SyncReport:
    """Call ``fn(*args, **kwargs)`` once under :func:`sync_guard` and return what it saw.

    Example (needs CUDA):
        >>> from torchmetrics import MeanMetric
        >>> m = MeanMetric().cuda()                             # doctest: +SKIP
        >>> count_syncs(m.update, torch.ones((), device="cuda")).count   # doctest: +SKIP
        2
    """
    if not callable(fn):
        raise TypeError(f"count_syncs takes a callable (e.g. metric.update), not {type(fn).__name__}.")
    with sync_guard() as report:
        fn(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return report


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
