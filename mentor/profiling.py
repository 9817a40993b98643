"""Finding host-device syncs: a profiler session, per-step sync counts, ``sync_guard`` and ``count_syncs``."""

from __future__ import annotations

import functools
import linecache
import re
import threading
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mentor.trace import (
    DEFAULT_WAIT_THRESHOLD_US,
    Event,
    Trace,
    load_trace,
    step_windows,
    sync_events,
    wait_events,
)


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
    (ui.perfetto.dev) and chrome://tracing open both. A block that ends before the schedule
    reaches its active steps writes no trace and raises ``RuntimeError`` saying how many
    ``prof.step()`` calls it saw (unless the block raised an error of its own, which passes on).

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
            f"training step and run at least {needed} steps (mentor.train.train(..., profiler=prof) does), "
            "or shorten the schedule."
        )


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
    """Probable waits: other runtime/driver calls longer than the threshold (:func:`mentor.trace.wait_events`); not in ``count``."""

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

    A sync call is a CUDA runtime or driver call named in :data:`mentor.trace.SYNC_CALLS`; each
    is attributed to the innermost ``record_function`` range and host op on its thread. Other
    runtime/driver calls longer than ``wait_threshold_us`` microseconds are listed as probable
    ``waits`` (not counted; see :func:`mentor.trace.wait_events`).

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
        >>> from mentor.trace import Event, Trace
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
                         "record it with mentor.profiling.profiling_session (or record_steps) and call "
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


_SYNC_MESSAGE = re.compile(r"synchroniz", re.IGNORECASE)
_LIBRARY_PARTS = ("/torch/", "/torchmetrics/", "/mentor/profiling.py", "/warnings.py", "<frozen")

DEBUG_MODE = "debug mode"
"""``SyncSite.kind`` of a sync reported by ``torch.cuda.set_sync_debug_mode``."""
PAGEABLE_COPY = "pageable non_blocking copy"
"""``SyncSite.kind`` of ``dst.copy_(cuda_src, non_blocking=True)`` into pageable host memory."""


@dataclass(frozen=True)
class SyncSite:
    """Where one synchronizing call happened: the Python line that triggered it and its call stack.

    ``kind`` says how :func:`sync_guard` saw it: ``"debug mode"`` for torch's sync debug mode
    (file:line is where torch's warning points, often inside torchmetrics), otherwise the
    intercepted call, e.g. ``"torch.cuda.synchronize"`` or ``"collective: all_reduce"`` (file:line
    is then the innermost caller outside torch, torchmetrics and this module).
    """

    file: str
    line: int
    function: str
    stack: tuple[tuple[str, int, str], ...]
    """Frames outermost first, as (file, line, function)."""
    kind: str = DEBUG_MODE

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
            if not _is_library(file):
                return f"{short_path(file)}:{line}"
        return self.where


def _is_library(file: str) -> bool:
    return any(part in file.replace("\\", "/") for part in _LIBRARY_PARTS)


_CELL_FILE = re.compile(r"/ipykernel_\d+/\d+\.py$")


def short_path(path: str) -> str:
    """``.../site-packages/torchmetrics/aggregation.py`` -> ``torchmetrics/aggregation.py``.

    Example:
        >>> short_path("/x/lib/python3.11/site-packages/torchmetrics/aggregation.py")
        'torchmetrics/aggregation.py'

    Code typed into a Jupyter cell lives in a temporary file of the kernel; it is shown as
    ``<cell>``, so that ``<cell>:9`` reads as line 9 of the cell that ran:

        >>> short_path("/tmp/ipykernel_759/1813045355.py")
        '<cell>'
    """
    if _CELL_FILE.search(path.replace("\\", "/")):
        return "<cell>"
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

    def by_kind(self) -> Counter[str]:
        """Calls per ``kind`` (``"debug mode"``, ``"torch.cuda.synchronize"``, ...)."""
        return Counter(s.kind for s in self.sites)

    def table(self) -> str:
        """One line per triggering ``file:line``, with its count, the caller outside the libraries and the kind.

        The kind is shown in brackets when it is not ``"debug mode"``.
        """
        if not self.sites:
            return "no synchronizing calls"
        rows = Counter((s.where, s.function, s.caller, s.kind) for s in self.sites)
        return "\n".join(f"{n:3d}x  {where}  in {fn}()  <- {caller}" + ("" if kind == DEBUG_MODE else f"  [{kind}]")
                         for (where, fn, caller, kind), n in rows.items())


class SyncError(RuntimeError):
    """Raised by ``sync_guard(strict=True)`` at the first synchronizing call."""


def is_pageable_d2h_copy(src_device: str | torch.device, dst_device: str | torch.device, dst_pinned: bool,
                         non_blocking: bool) -> bool:
    """Whether ``dst.copy_(src, non_blocking=...)`` is a ``non_blocking`` CUDA-to-host copy into pageable memory.

    torch issues such a copy as a plain ``cudaMemcpyAsync`` into the pageable buffer, which
    CUDA documents as "might be synchronous with respect to host": the host can wait for the
    stream to reach the copy, and torch's sync debug mode does not flag it. A blocking copy
    (``non_blocking=False``) is flagged by the debug mode already, a copy into pinned memory
    does not wait, and host-to-device copies are not this case: all give ``False``.

    Example:
        >>> is_pageable_d2h_copy("cuda:0", "cpu", dst_pinned=False, non_blocking=True)
        True
        >>> is_pageable_d2h_copy("cuda", "cpu", dst_pinned=True, non_blocking=True)
        False
    """
    for name, value in (("dst_pinned", dst_pinned), ("non_blocking", non_blocking)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, not {value!r}.")
    types = []
    for name, device in (("src_device", src_device), ("dst_device", dst_device)):
        try:
            types.append(torch.device(device).type)
        except (RuntimeError, TypeError):
            raise ValueError(f"{name} must be a device such as 'cuda:0', 'cpu' or a torch.device, "
                             f"not {device!r}.") from None
    return types[0] == "cuda" and types[1] == "cpu" and not dst_pinned and non_blocking


# ----------------------------------------------------------------------------------------------------------
# Interception of the Python-level calls that torch's sync debug mode does not flag

COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object",
    "scatter", "scatter_object_list", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
)
"""``torch.distributed`` functions that :func:`sync_guard` intercepts (kind ``"collective: <name>"``)."""

_MISSING = object()
_local = threading.local()  # .depth: intercepted calls in progress in this thread


def _depth() -> int:
    return getattr(_local, "depth", 0)


@contextmanager
def _inside_intercepted() -> Iterator[None]:
    _local.depth = _depth() + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _targets() -> list[tuple[Any, str, str]]:
    """(owner, attribute, kind) of every function and method that the guard wraps, those present in this torch."""
    import torch.cuda.memory

    targets: list[tuple[Any, str, str]] = [
        (torch.cuda, "synchronize", "torch.cuda.synchronize"),
        (torch.cuda.Event, "synchronize", "Event.synchronize"),
        (torch.cuda.Stream, "synchronize", "Stream.synchronize"),
        (torch.cuda, "empty_cache", "empty_cache"),
        (torch.cuda.memory, "empty_cache", "empty_cache"),
    ]
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        targets.append((accelerator, "synchronize", "torch.accelerator.synchronize"))
    if torch.distributed.is_available():
        from torch.distributed import distributed_c10d

        for owner in (torch.distributed, distributed_c10d):
            targets += [(owner, name, f"collective: {name}") for name in COLLECTIVES if hasattr(owner, name)]
    return targets


def _site_here(kind: str) -> SyncSite:
    """A SyncSite for the current call stack, without the frames of this module at its inner end."""
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_stack()]
    while frames and frames[-1][0] == __file__:
        frames.pop()
    stack = tuple(frames)
    file, line, function = next((f for f in reversed(stack) if not _is_library(f[0])),
                                stack[-1] if stack else ("?", 0, "?"))
    return SyncSite(file, line, function, stack, kind)


def _seen(report: SyncReport, strict: bool, kind: str) -> None:
    site = _site_here(kind)
    report.sites.append(site)
    if strict:
        raise SyncError(f"{kind} at {site.where} (in {site.function}()): sync_guard(strict=True) forbids "
                        "synchronizing calls; the call was not made.")


def _wrap(original: Callable[..., Any], kind: str, report: SyncReport, strict: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def intercepted(*args: Any, **kwargs: Any) -> Any:
        if _depth() == 0:  # calls made inside another intercepted call are part of it
            _seen(report, strict, kind)
        with _inside_intercepted():
            return original(*args, **kwargs)

    return intercepted


def _copy_waits(dst: Any, src: Any, non_blocking: Any) -> bool:
    """Whether ``dst.copy_(src, non_blocking)`` is a pageable non-blocking device-to-host copy (pinning asked last)."""
    if non_blocking is not True or not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
        return False
    if src.device.type != "cuda" or dst.device.type != "cpu":
        return False
    return is_pageable_d2h_copy(src.device, dst.device, bool(dst.is_pinned()), True)


def _wrap_copy(original: Callable[..., Any], report: SyncReport, strict: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def copy_(self: Any, *args: Any, **kwargs: Any) -> Any:
        src = args[0] if args else kwargs.get("src")
        non_blocking = args[1] if len(args) > 1 else kwargs.get("non_blocking", False)
        if _depth() == 0 and _copy_waits(self, src, non_blocking):
            _seen(report, strict, PAGEABLE_COPY)
            with _inside_intercepted():
                return original(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    return copy_


def _record_warning(report: SyncReport, message: Any, category: type, filename: str, lineno: int, file: Any = None,
                    line: Any = None) -> None:
    """Append the debug-mode warning raised at ``filename:lineno`` to ``report``, with the current stack.

    ``functools.partial(_record_warning, report)`` has the signature of ``warnings.showwarning``.

    The frames of this module at the inner end of the stack (the warning handler and, for a
    blocking copy, the ``copy_`` wrapper) are dropped; a warning that Python attributes to the
    wrapper is moved to the wrapper's caller, where it would point without the guard.
    """
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_stack()
              if not f.filename.endswith("warnings.py")]
    while frames and frames[-1][0] == __file__:
        frames.pop()
    if filename == __file__ and frames:
        filename, lineno = frames[-1][0], frames[-1][1]
    function = next((fn for file, ln, fn in reversed(frames) if file == filename and ln == lineno), "?")
    report.sites.append(SyncSite(filename, lineno, function, tuple(frames), DEBUG_MODE))


@contextmanager
def _intercept(report: SyncReport, strict: bool = False) -> Iterator[SyncReport]:
    """Wrap the Python-level synchronizing calls (see :func:`sync_guard`) while the block runs; no CUDA needed.

    Each call records a :class:`SyncSite` into ``report`` (or, with ``strict``, raises
    :class:`SyncError` before calling the original). Every attribute is put back on exit, also
    when the block raises; nested uses restore the enclosing use's wrappers.

    ``torch.Tensor.copy_`` is replaced on the class rather than watched with a
    ``TorchFunctionMode``: a mode is per thread, routes every torch call in the block through
    Python, and would become the innermost Python frame of every op, so the file:line of the
    debug-mode warnings would point at the mode instead of the caller.
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, kind in _targets():
            saved.append((owner, name, vars(owner).get(name, _MISSING)))
            setattr(owner, name, _wrap(getattr(owner, name), kind, report, strict))
        saved.append((torch.Tensor, "copy_", vars(torch.Tensor).get("copy_", _MISSING)))
        torch.Tensor.copy_ = _wrap_copy(torch.Tensor.copy_, report, strict)  # type: ignore[method-assign]
        yield report
    finally:
        for owner, name, value in reversed(saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@contextmanager
def sync_guard(strict: bool = False) -> Iterator[SyncReport]:
    """Watch the CUDA calls that make the host wait for the GPU, inside the ``with`` block.

    Each synchronizing call is recorded as a :class:`SyncSite` with the Python file:line that
    made it and a ``kind``, or, with ``strict=True``, raises :class:`SyncError` there. Two
    mechanisms feed the report:

    - ``torch.cuda.set_sync_debug_mode("warn")`` (``"error"`` when strict), kind
      ``"debug mode"``. It flags what goes through c10's ``warn_or_error_on_sync`` check:
      ``c10::cuda::stream_synchronize`` and ``memcpy_and_sync`` (blocking copies between host
      and device, ``.item()``, ``bool(t)``, ``.cpu()``, ``torch.cuda.Stream.synchronize()``
      ...). It does not flag ``torch.cuda.synchronize()`` (``c10::cuda::device_synchronize``
      has no such check), ``Event.synchronize()`` (``CUDAEvent::synchronize`` calls
      ``cudaEventSynchronize`` directly), ``empty_cache()``, non-blocking copies or collectives.
    - Wrappers installed for the block: ``torch.cuda.synchronize``, ``torch.accelerator.synchronize``,
      ``torch.cuda.Event.synchronize``, ``torch.cuda.Stream.synchronize`` (also flagged by the
      debug mode; the wrapper names it), ``torch.cuda.empty_cache`` (and ``torch.cuda.memory.empty_cache``),
      the ``torch.distributed`` functions in :data:`COLLECTIVES` (on ``torch.distributed`` and on
      ``torch.distributed.distributed_c10d``; torchmetrics calls ``torch.distributed.all_gather``
      by attribute at call time, so its syncs are seen), and ``torch.Tensor.copy_``, which reports
      a ``non_blocking=True`` copy from a CUDA tensor into pageable host memory
      (:func:`is_pageable_d2h_copy`). ``cuda_t.to("cpu", non_blocking=True)`` is not such a copy:
      ``_to_copy`` allocates its output in pinned memory when ``non_blocking`` and the source is
      CUDA. The file:line of these sites is the innermost caller outside torch, torchmetrics and
      this module; in strict mode the ``SyncError`` names the kind and that line and the original
      is not called. A wrapped call counts once: syncs inside it (an object collective's
      ``.item()``, the stream sync in ``Stream.synchronize``) are not reported again.

    On exit the debug mode, the warning filters and every wrapped attribute are restored, also
    when the block raises; an inner guard records the syncs of its block (the outer one does not
    see them) and restores the outer guard's state when it exits.

    Process-wide effects: the sync debug mode is one setting for the whole process, and the
    wrappers replace module and class attributes, so calls made by other threads while the guard
    is on are affected too. Wrapped calls from another thread are recorded in this report with
    that thread's stack (in strict mode they raise there). ``warnings.catch_warnings`` swaps the
    module-level ``warnings.filters`` and ``warnings.showwarning`` (it is documented as not
    thread-safe): while the guard is on, a debug-mode warning raised in any thread is recorded in
    this report, with that thread's stack, and other warnings of all threads pass to the previous
    ``showwarning``; in strict mode a debug-mode sync in another thread raises a plain
    ``RuntimeError`` in that thread. Do not run guards in several threads at once: each restores
    what it saw on entry, so overlapping guards can leave each other's wrappers installed.

    What the guard still cannot see:

    - syncs made from C++ without the debug-mode check: extensions or torch ops that call
      ``cudaDeviceSynchronize``/``cudaStreamSynchronize``/``cudaEventSynchronize`` or
      ``at::cuda::device_synchronize`` directly, ``torch.Event``/``torch.Stream`` (the
      device-generic C++ classes, which cannot be patched), DDP's gradient all-reduce and its
      start-up broadcast (issued by its C++ reducer), functional collectives
      (``torch.distributed._functional_collectives``, ``torch.distributed.nn``), which run as ops;
    - Python references taken before the guard began (``from torch.cuda import synchronize``,
      ``sync = torch.cuda.synchronize``, ``from torch.distributed import all_reduce``): they point
      at the originals;
    - ``copy_`` calls made from C++, Tensor subclasses that define their own ``copy_``, and
      non-blocking copies from pageable host memory to the device;
    - ``cudaFree``/``cudaMalloc`` issued by the caching allocator (when it frees cached blocks to
      retry a failed allocation, say) and pinned host allocations;
    - driver-API calls made by other libraries (CuPy, Triton's launcher and autotuner, NCCL
      internals, cuDNN/cuBLAS), and any CUDA call that blocks for reasons of its own ("any CUDA
      API call may block or synchronize", CUDA's API synchronization behavior page);
    - threads that run no Python code (autograd's backward worker threads, NCCL's watchdog) meet
      no wrapper; a debug-mode sync in such a thread reaches the report only if torch passes its
      warning on to a Python thread;
    - whether a reported call really waited (a ``torch.cuda.synchronize()`` on an idle device
      returns at once) and how long: use a profiler trace for that (:func:`step_syncs`).

    Example (needs CUDA):
        >>> with sync_guard() as report:                        # doctest: +SKIP
        ...     loss.item()
        ...     torch.cuda.synchronize()
        >>> [s.kind for s in report.sites]                      # doctest: +SKIP
        ['debug mode', 'torch.cuda.synchronize']
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
            if not armed or _depth() > 0:  # inside an intercepted call: that call is the site
                return
            _record_warning(report, message, category, filename, lineno)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("error" if strict else "warn")
        armed = True
        try:
            with _intercept(report, strict):
                yield report
        except RuntimeError as err:
            if strict and _SYNC_MESSAGE.search(str(err)) and not isinstance(err, SyncError):
                frames = traceback.extract_tb(err.__traceback__)
                while frames and frames[-1].filename == __file__:  # the copy_ wrapper: point at its caller
                    frames.pop()
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
                           "run it on a GPU machine (mentor.env.needs_cuda tells you when to skip).")
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


def count_syncs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> SyncReport:
    """Call ``fn(*args, **kwargs)`` once under :func:`sync_guard` and return what it saw.

    Pass ``lambda: torch.cuda.synchronize()`` rather than ``torch.cuda.synchronize`` itself: a
    reference taken before the guard starts is the original, which the guard does not see.

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


def debug_mode_count(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """How many syncs torch's own ``set_sync_debug_mode("warn")`` flags in one call of ``fn``, with no wrappers.

    This is the probe without :func:`sync_guard`'s additions, to show what torch alone sees.
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
