"""Host-device syncs, seen as they happen: :func:`sync_guard`, :func:`count_syncs` and :class:`SyncReport`.

A sync is a CUDA call that makes the host wait for the GPU (``.item()``, a blocking copy,
``torch.cuda.synchronize()``, ...). Inside ``with sync_guard() as report:`` each one is recorded with
the Python ``file:line`` that made it; ``sync_guard(strict=True)`` raises :class:`SyncError` at the
first one instead. What the guard can and cannot see is listed in :func:`sync_guard`'s docstring.

Example (needs CUDA):
    >>> from torchmetrics import MeanMetric
    >>> m = MeanMetric().cuda()                                 # doctest: +SKIP
    >>> print(count_syncs(m.update, torch.ones((), device="cuda")).table())   # doctest: +SKIP
      1x  torchmetrics/aggregation.py:...  in _cast_and_nan_check_input()  <- <cell>:3
"""

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


_SYNC_MESSAGE = re.compile(r"synchroniz", re.IGNORECASE)
_LIBRARY_PARTS = ("/torch/", "/torchmetrics/", "/mentor/syncs.py", "/warnings.py", "<frozen")

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

    Example:
        >>> site = SyncSite("/x/site-packages/torchmetrics/aggregation.py", 93, "update",
        ...                 (("/home/me/train.py", 40, "step"), ("/x/site-packages/torchmetrics/aggregation.py", 93, "update")))
        >>> site.where, site.caller, site.kind
        ('torchmetrics/aggregation.py:93', '/home/me/train.py:40', 'debug mode')
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
        """``file:line`` of the innermost frame outside torch, torchmetrics and mentor.syncs."""
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
    """The synchronizing calls seen by :func:`sync_guard` or :func:`count_syncs`.

    Example:
        >>> site = SyncSite("/x/site-packages/torch/cuda/__init__.py", 1080, "synchronize",
        ...                 (("/home/me/train.py", 12, "main"),), kind="torch.cuda.synchronize")
        >>> report = SyncReport([site, site])
        >>> report.count, dict(report.by_kind())
        (2, {'torch.cuda.synchronize': 2})
        >>> print(report.table())
          2x  torch/cuda/__init__.py:1080  in synchronize()  <- /home/me/train.py:12  [torch.cuda.synchronize]
    """

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
    """Raised by ``sync_guard(strict=True)`` at the first synchronizing call, naming its kind and file:line.

    Example (needs CUDA):
        >>> with sync_guard(strict=True):                       # doctest: +SKIP
        ...     torch.cuda.synchronize()
        Traceback (most recent call last):
        ...
        mentor.syncs.SyncError: torch.cuda.synchronize at train.py:12 (in step()): sync_guard(strict=True) forbids synchronizing calls; the call was not made.
    """


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


_OnError = Callable[[int, str, Exception], None]  # (index of the call's site in the report, its kind, its error)


def _wrap(original: Callable[..., Any], kind: str, report: SyncReport, strict: bool,
          on_error: _OnError | None = None) -> Callable[..., Any]:
    @functools.wraps(original)
    def intercepted(*args: Any, **kwargs: Any) -> Any:
        index = None
        if _depth() == 0:  # calls made inside another intercepted call are part of it
            index = len(report.sites)
            _seen(report, strict, kind)
        with _inside_intercepted():
            try:
                return original(*args, **kwargs)
            except Exception as err:
                if on_error is not None and index is not None:
                    on_error(index, kind, err)
                raise

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
def _intercept(report: SyncReport, strict: bool = False, on_error: _OnError | None = None) -> Iterator[SyncReport]:
    """Wrap the Python-level synchronizing calls (see :func:`sync_guard`) while the block runs; no CUDA needed.

    Each call records a :class:`SyncSite` into ``report`` (or, with ``strict``, raises
    :class:`SyncError` before calling the original). Every attribute is put back on exit, also
    when the block raises; nested uses restore the enclosing use's wrappers. When the original of
    a recorded call raises (``torch.cuda.synchronize()`` where torch sees no CUDA device),
    ``on_error(index of its site, kind, the error)`` is called before the error goes on.

    ``torch.Tensor.copy_`` is replaced on the class rather than watched with a
    ``TorchFunctionMode``: a mode is per thread, routes every torch call in the block through
    Python, and would become the innermost Python frame of every op, so the file:line of the
    debug-mode warnings would point at the mode instead of the caller.
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, kind in _targets():
            saved.append((owner, name, vars(owner).get(name, _MISSING)))
            setattr(owner, name, _wrap(getattr(owner, name), kind, report, strict, on_error))
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
      returns at once) and how long: use a profiler trace for that (:func:`mentor.lab.profiling.step_syncs`).

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
            "run it on a GPU machine, or skip the check (mentor.lab.env.needs_cuda tells you when)."
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
