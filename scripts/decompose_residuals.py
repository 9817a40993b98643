"""Where the suite's residual cost goes in the book's loops (issue 43, item 2): host, GPU and profiler breakdowns.

``python scripts/decompose_residuals.py --part compiled|frameworks|eager --out DIR`` (on the GPU machine; ``--part``
also takes a comma-separated list) writes ``DIR/<part>.json``. Each loop runs without metrics, with the suite
updated every batch and reported every 50 batches as the chapters do (``compute()``, the values read back in one
copy, ``reset()``), and with the suite never reported:

- ``compiled``: the step compiled with ``mode="reduce-overhead"``, the update inside it
  (:func:`mentor.lab.compiled_loop.step_function`), at fp32 b32 and bf16 b32 96 px;
- ``frameworks``: chapter 16's Lightning (``LogEvery``) and Accelerate (``DeferredReadback``) loops
  (:mod:`mentor.lab.frameworks`) at fp32 b128 and bf16 b32; one that does not import is recorded "not installed";
- ``eager``: chapter 9's loop (:func:`mentor.lab.train.train`'s batch, the update after it) at fp32 b32 and b128.

Per variant (``differences``: each variant minus ``no metrics``, number by number):

- ``step_ms`` (CUDA events) and ``host_free_us`` (``perf_counter``) between batch starts, free-running. A GPU-bound
  host blocks in launches once the launch queue is full, so ``host_free_us`` is the step time there, not the issue.
- ``host_issue_us``: the host's time to issue one batch, without the profiler, in *gated* batches: at the batch's
  start the GPU is drained and a ``torch.cuda._sleep`` queued (1.5 free-running steps; doubled when too short, up
  to 4 steps + 5 ms), and ``perf_counter`` runs to the next batch start. An event queued after the sleep must still
  be pending then, else the batch is dropped (``gated.waited``): the queue never ran dry, and a batch's few hundred
  launches do not fill it, so the host never waits for the GPU. Report batches sync and so wait for the sleep:
  counted (``gated.report``), dropped. Eager: ``hook_us``, the update's host time in the hook, free-running and
  gated (in free-running GPU-bound batches a launch waits for room in the full queue). Variants alternate in
  blocks, in a new random order each round.
- ``profile``: ``torch.profiler`` (CPU, CUDA, ``profile_memory``) over ``active`` gated batches, one report placed
  in the middle (drained, with no sleep: its sync waits for its own batch's work); ``stack_profile``: fewer, with
  ``with_stack=True`` (Python functions), no report; eager also ``free_profile``, not gated. A window is one
  batch; :func:`decompose_trace` splits it, :func:`aggregate` averages ``plain`` (no report), ``report`` and
  ``amortized`` windows (``(1 - 1/every) plain + (1/every) report``); :func:`compare` subtracts.
  ``host_us``: *self* time (less the children's) per category of :data:`RULES`, summed over host threads; an event
  no rule names takes its innermost named ancestor's category (``rest`` if none; all below the gate's own ranges
  is the gate's); ``no event (main thread)`` is main-thread time in no event (Python without stacks, the wait for
  autograd's thread). Categories sum to ``window_us + other_threads_us``. ``host_us_scaled``: each category times
  ``host_issue_us / (window_us - gate)``. GPU: kernels, copies, memsets whose launch (``args.correlation``) lies
  in the window, the gate's sleep left out; ``kernels`` by name, the top 15.

Limits: the profiler adds a cost per event, so dense categories are inflated more; ``host_us_scaled`` assumes a
uniform slowdown (a rough guide; the raw shares are what was measured). Kernels inside CUDA-graph replays show only
where CUPTI reports them (``api.graph_launches_without_gpu_events`` counts replays it did not). The caching
allocator's host work is inside ops' self time (``allocation ops``; ``[memory]`` events are only counted). Dynamo's
replay of Python side effects has no event: it is self time of ``Torch-Compiled Region``. A gated batch starts on
a drained GPU right after the host waited, so the host's caches and clocks may differ from the free-running loop's;
the gate itself (its annotated sync, sleep, event) is left out of every window. Without CUDA (``--smoke``)
there is no gate, GPU trace or CUDA graph (``backend="eager"``): ``host_issue_us`` is null; a check, not a result.

Batches per variant (:data:`SETTINGS`): compiled 6 rounds of 3 settle + 20 free + 10 gated, 12 profiled, 4 with
stacks; eager 5 x (2 + 16 + 10), 8 + 3 (+ 8 free); frameworks 4 x (3 + 12 + 8), 6 + 2; all after a warm-up that
makes one report. Estimated H200 durations: compiled 2-2.5 min (four cold compiles), eager 1.5 min, frameworks
2-2.5 min. By default the gated traces of each part's first point are kept, gzipped, in ``DIR/traces/`` while they
total under 6 MB a part; ``--no-traces`` keeps none.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gzip
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from mentor.lab.decomposition import GATE, SYNC  # the category names that the reader of these files expects
from mentor.lab.trace import GPU_CATEGORIES, HOST_API_CATEGORIES, LAUNCH_CALLS, SYNC_CALLS, Event

NO_EVENT, REST = "no event (main thread)", "rest (other Python, annotations)"
RULES: tuple[tuple[str, str, Any], ...] = (
    (SYNC, "api", SYNC_CALLS),
    ("CUDA-graph launch", "api", ("cudaGraphLaunch", "cuGraphLaunch")),
    ("kernel launch", "api", LAUNCH_CALLS),
    ("copy/memset API", "api prefix", ("cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset")),
    ("allocator API", "api", ("cudaMalloc", "cudaMallocAsync", "cudaFreeAsync", "cudaHostAlloc", "cudaMallocHost",
                              "cudaFreeHost", "cuMemAlloc_v2", "cuMemCreate", "cuMemMap", "cuMemUnmap",
                              "cuMemRelease", "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree")),
    ("other CUDA API", "cat", HOST_API_CATEGORIES),
    ("dynamo guards", "name", ("TorchDynamo Cache Lookup",)),
    ("dynamo frame (graph call, side-effect replay)", "prefix", ("Torch-Compiled Region",)),
    ("inductor call (cudagraph trees)", "prefix", ("## Call CompiledFxGraph",)),
    ("AOTAutograd wrappers", "prefix", ("CompiledFunction", "AOTDispatcher")),
    ("autograd engine", "prefix", ("autograd::engine::evaluate_function",)),
    ("optimizer annotations", "prefix", ("Optimizer.",)),
    ("copy ops", "name", ("aten::copy_", "aten::_to_copy", "aten::to", "aten::_foreach_copy_", "aten::clone",
                          "aten::contiguous")),
    ("allocation ops", "name", ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros",
                                "aten::zeros_like", "aten::new_empty", "aten::new_empty_strided", "aten::resize_")),
    ("metric update", "name", ("decompose: update",)),
    ("metric report", "name", ("decompose: report",)),
    (GATE, "name", ("decompose: gate",)),
    ("suite Python (mentor/, not mentor/lab/)", "python", re.compile(r"(^|/)mentor/[^/]+\.py\(")),
    ("Lightning Python", "python", re.compile(r"(^|/)(lightning|pytorch_lightning|lightning_fabric)/")),
    ("Accelerate Python", "python", re.compile(r"(^|/)accelerate/")),
    ("torchmetrics Python", "python", re.compile(r"(^|/)torchmetrics/")),
    ("other aten ops", "cat", ("cpu_op",)),
    ("profiler overhead", "cat", ("overhead",)),
)
"""Host categories, the first that matches an event's own name and trace category: ``api``, a CUDA runtime or
driver call so named; ``api prefix``, one whose name starts so; ``cat``, any event of these trace categories;
``name``/``prefix``, any event so named; ``python``, a ``python_function`` whose path matches."""
CATEGORIES = tuple(dict.fromkeys([r[0] for r in RULES] + [REST, NO_EVENT]))
RULE_TEXT = [[c, f"{k}: {v.pattern if hasattr(v, 'pattern') else ', '.join(v)}"] for c, k, v in RULES]


def category(name: str, cat: str) -> str | None:
    """The category of a host event by its own name and trace category (:data:`RULES`), or None.

    >>> category("cudaGraphLaunch", "cuda_runtime"), category("/x/mentor/suite.py(259): update", "python_function")
    ('CUDA-graph launch', 'suite Python (mentor/, not mentor/lab/)')
    """
    api = cat in HOST_API_CATEGORIES
    for label, kind, values in RULES:
        if ((kind == "api" and api and name in values) or (kind == "api prefix" and api and name.startswith(values))
                or (kind == "cat" and cat in values) or (kind == "name" and name in values)
                or (kind == "prefix" and name.startswith(values))
                or (kind == "python" and cat == "python_function" and values.search(name))):
            return label
    return None


def _events(raw: Any) -> tuple[list[Event], list[dict]]:
    """The complete events (sorted by start, longest first) and the ``[memory]`` instants of a Chrome trace."""
    items = raw.get("traceEvents") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise ValueError("raw must be a Chrome trace: a dict with a 'traceEvents' list (torch.profiler's "
                         "export_chrome_trace writes one) or that list itself.")
    events, memory = [], []
    for index, e in enumerate(items):
        if isinstance(e, dict) and e.get("ph") == "i" and e.get("name") == "[memory]":
            memory.append(e)
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur, corr = e.get("ts"), e.get("dur", 0), (e.get("args") or {}).get("correlation")
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in (ts, dur)) \
                or dur < 0:
            raise ValueError(f"trace event {index} ({e.get('name')!r}) has ts={ts!r}, dur={dur!r}: both must be "
                             "finite numbers of microseconds, dur >= 0; pass a trace written by torch.profiler.")
        events.append(Event(str(e.get("name", "")), str(e.get("cat", "")), float(ts), float(dur), e.get("pid"),
                            e.get("tid"), corr if isinstance(corr, int) and not isinstance(corr, bool) else None))
    events.sort(key=lambda e: (e.start, -e.dur))
    return events, memory


def _window_stats(dur: float) -> dict[str, Any]:
    zero = lambda *keys: dict.fromkeys(keys, 0.0)  # noqa: E731
    return {"window_us": dur, "other_threads_us": 0.0, "host_us": zero(*CATEGORIES),
            "api": zero("kernel_launches", "graph_launches", "graph_launches_without_gpu_events", "syncs"),
            "gpu": zero("us", "kernels", "kernel_us", "copies", "copy_us", "memsets", "memset_us"), "kernels": {},
            "memory": zero("cuda_allocs", "cuda_frees", "cpu_allocs", "cpu_frees")}


def decompose_trace(raw: Any) -> list[dict[str, Any]]:
    """One dict per ``ProfilerStep`` window of a Chrome trace: host µs per category, CUDA API counts, GPU work
    launched in the window, ``[memory]`` events (the module docstring says how).

    >>> trace = {"traceEvents": [
    ...     {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
    ...     {"ph": "X", "name": "cudaGraphLaunch", "cat": "cuda_runtime", "ts": 10, "dur": 30, "pid": 1, "tid": 1,
    ...      "args": {"correlation": 5}},
    ...     {"ph": "X", "name": "k", "cat": "kernel", "ts": 50, "dur": 8, "pid": 0, "tid": 7,
    ...      "args": {"correlation": 5}}]}
    >>> w = decompose_trace(trace)[0]
    >>> w["host_us"]["CUDA-graph launch"], w["host_us"][NO_EVENT], w["gpu"]["us"], w["kernels"]
    (30.0, 70.0, 8.0, {'k': {'count': 1.0, 'us': 8.0}})
    """
    events, memory = _events(raw)
    gpu_side = lambda e: e.cat in GPU_CATEGORIES or e.cat.startswith("gpu_")  # noqa: E731
    windows = [e for e in events if e.name.startswith("ProfilerStep#") and not gpu_side(e)]
    if not windows:
        raise ValueError("the trace has no ProfilerStep windows: record it with a torch.profiler schedule and call "
                         "prof.step() at every batch start.")
    starts, main, out = [w.start for w in windows], (windows[0].pid, windows[0].tid), [_window_stats(w.dur)
                                                                                         for w in windows]
    covered = [0.0] * len(windows)

    def window_of(t: float) -> int | None:
        k = bisect.bisect_right(starts, t) - 1
        return k if k >= 0 and t < windows[k].end else None

    threads: dict[Any, list[Event]] = {}
    for e in events:
        if not gpu_side(e) and not e.name.startswith("ProfilerStep#") and e.cat != "Trace":
            threads.setdefault((e.pid, e.tid), []).append(e)
    gated, launched, graph_calls = set(), {}, []  # the gate's correlation ids; correlation -> window; graph calls
    for key, evs in threads.items():
        stack: list[tuple[float, str]] = []  # (effective end, category) of the open ancestors
        for e in evs:
            while stack and stack[-1][0] <= e.start:
                stack.pop()
            parent = stack[-1] if stack else None
            end, own = min(e.end, parent[0]) if parent else e.end, category(e.name, e.cat)
            cat = GATE if parent and parent[1] == GATE else own or (parent[1] if parent else REST)
            k = max(bisect.bisect_right(starts, e.start) - 1, 0)
            while k < len(windows) and windows[k].start < end:  # self time: add to mine, take from my parent
                c = min(end, windows[k].end) - max(e.start, windows[k].start)
                if c > 0:
                    out[k]["host_us"][cat] += c
                    if parent:
                        out[k]["host_us"][parent[1]] -= c
                    elif key == main:
                        covered[k] += c
                    else:
                        out[k]["other_threads_us"] += c
                k += 1
            k = window_of(e.start)
            if e.cat in HOST_API_CATEGORIES and cat == GATE:  # neither counted nor its GPU work kept
                gated.update([e.correlation] if e.correlation is not None else [])
            elif e.cat in HOST_API_CATEGORIES and k is not None:
                if e.correlation is not None:
                    launched[e.correlation] = k
                api = out[k]["api"]
                api["kernel_launches"] += e.name in LAUNCH_CALLS
                api["syncs"] += e.name in SYNC_CALLS
                if own == "CUDA-graph launch":
                    api["graph_launches"] += 1
                    graph_calls.append((k, e.correlation))
            stack.append((end, cat))
    for k, w in enumerate(windows):
        out[k]["host_us"][NO_EVENT] = w.dur - covered[k]
    kinds = {"kernel": ("kernels", "kernel_us"), "gpu_memcpy": ("copies", "copy_us"),
             "gpu_memset": ("memsets", "memset_us")}
    gpu_events = [e for e in events if e.cat in kinds and e.correlation not in gated]
    for e in gpu_events:
        if (k := launched.get(e.correlation)) is not None:  # type: ignore[arg-type]
            gpu, (count, us) = out[k]["gpu"], kinds[e.cat]
            gpu["us"] += e.dur
            gpu[count] += 1
            gpu[us] += e.dur
            if e.cat == "kernel":
                row = out[k]["kernels"].setdefault(e.name, {"count": 0.0, "us": 0.0})
                row["count"] += 1
                row["us"] += e.dur
    seen = {e.correlation for e in gpu_events}
    for k, corr in graph_calls:
        out[k]["api"]["graph_launches_without_gpu_events"] += corr not in seen
    for m in memory:
        args, t = m.get("args") or {}, m.get("ts")
        if isinstance(t, (int, float)) and (k := window_of(float(t))) is not None and args.get("Bytes"):
            device = "cuda" if args.get("Device Type") == 1 else "cpu"  # c10::DeviceType: CPU 0, CUDA 1
            out[k]["memory"][f"{device}_{'allocs' if args['Bytes'] > 0 else 'frees'}"] += 1
    return out


def _blend(parts: Sequence[tuple[float, dict]]) -> dict:
    """Σ weight × dict, recursively over nested dicts, a missing key counting as 0."""
    out: dict = {}
    for key in dict.fromkeys(k for _, d in parts for k in d):
        values = [(w, d.get(key)) for w, d in parts]
        if any(isinstance(v, dict) for _, v in values):
            out[key] = _blend([(w, v if isinstance(v, dict) else {}) for w, v in values])
        else:
            out[key] = sum(w * (v or 0.0) for w, v in values)
    return out


def aggregate(windows: Sequence[dict], report: Sequence[bool], every: int | None) -> dict[str, Any]:
    """Per-batch means of :func:`decompose_trace`'s windows: ``plain`` (no report), ``report``, and ``amortized`` at one
    report every ``every`` batches (``plain`` when ``every`` is None: the loop never reports; None when the windows
    do not hold both kinds).

    >>> aggregate([{"us": 10.0}, {"us": 60.0}, {"us": 20.0}], [False, True, False], every=5)
    {'windows': 3, 'report_windows': 1, 'plain': {'us': 15.0}, 'report': {'us': 60.0}, 'amortized': {'us': 24.0}}
    """
    if len(windows) != len(report):
        raise ValueError(f"report must flag each window: got {len(report)} flags for {len(windows)} windows.")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"every must be an int >= 1 (batches between reports) or None, got {every!r}.")
    plain, rep = [w for w, r in zip(windows, report) if not r], [w for w, r in zip(windows, report) if r]
    if rep and every is None:
        raise ValueError("report flags a window but every is None: pass the loop's report period.")
    mean = lambda ws: _blend([(1.0 / len(ws), w) for w in ws]) if ws else None  # noqa: E731
    out = {"windows": len(windows), "report_windows": len(rep), "plain": mean(plain), "report": mean(rep)}
    out["amortized"] = (out["plain"] if every is None else _blend([(1 - 1 / every, out["plain"]),
                        (1 / every, out["report"])]) if plain and rep else None)
    return out


def difference(a: Any, b: Any) -> Any:
    """``a - b`` number by number, recursively (a missing key counts as 0; None where either side is None).

    >>> difference({"x": 3.0, "d": {"k": 1.0}}, {"x": 1.0, "d": {"j": 2.0}})
    {'x': 2.0, 'd': {'k': 1.0, 'j': -2.0}}
    """
    if a is None or b is None:
        return None
    if isinstance(a, dict) or isinstance(b, dict):
        a, b = a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {}
        return {k: difference(a.get(k, 0.0), b.get(k, 0.0)) for k in dict.fromkeys([*a, *b])}
    return a - b if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def top_kernels(kernels: dict[str, dict[str, float]], n: int = 15) -> dict[str, dict[str, float]]:
    """The ``n`` kernel names with the most microseconds (in absolute value: differences may be negative).

    >>> top_kernels({"a": {"count": 1, "us": 2.0}, "b": {"count": 1, "us": -5.0}}, 1)
    {'b': {'count': 1, 'us': -5.0}}
    """
    return dict(sorted(kernels.items(), key=lambda kv: -abs(kv[1].get("us", 0.0)))[:n])


# ---- measuring ---------------------------------------------------------------------------------------------------

@dataclass
class Settings:
    """Batches per variant: rounds of (settle, free, gated) blocks, profiled batches (gated, with stacks)."""

    rounds: int
    settle: int
    free: int
    gated: int
    active: int
    stack: int
    free_profile: bool = False


SETTINGS = {"compiled": Settings(6, 3, 20, 10, 12, 4), "eager": Settings(5, 2, 16, 10, 8, 3, True),
            "frameworks": Settings(4, 3, 12, 8, 6, 2)}
SMOKE = Settings(1, 1, 2, 2, 2, 1, True)
MAX_SLEEP_MS = 400.0


@dataclass
class Loop:
    """A training loop: ``run(n, on_batch_start)`` runs ``n`` batches and calls ``on_batch_start(i)`` at the start
    of batch ``i``; it reports after batch ``k`` (counted over all runs from 1) when ``every`` divides ``k``."""

    run: Callable[[int, Callable[[int], None]], None]
    every: int | None
    done: int = 0
    hook_us: dict[str, list[float]] = field(default_factory=lambda: {"free": [], "gated": []})
    phase: str | None = None  # of the running batch, for hook_us
    annotate: bool = False

    def batches(self, n: int, on_batch_start: Callable[[int], None] = lambda i: None) -> None:
        self.run(n, on_batch_start)
        self.done += n

    def reports(self, n: int) -> set[int]:
        return {j for j in range(n) if self.every and (self.done + j + 1) % self.every == 0}

    def timed(self, name: str, fn: Callable[[], Any]) -> None:
        """``fn()``, in a profiler range when profiling; an update's host µs kept in ``hook_us``."""
        t0 = time.perf_counter()
        if self.annotate:
            with torch.profiler.record_function(f"decompose: {name}"):
                fn()
        else:
            fn()
        if name == "update" and self.phase:
            self.hook_us[self.phase].append((time.perf_counter() - t0) * 1e6)


class Gate:
    """Drain the GPU and queue a sleep that outlasts the host's issue of one batch (the module docstring)."""

    def __init__(self) -> None:
        from mentor.lab.update_cost import _sleep_cycles_per_ms

        self.cycles, self.sleep_ms, self.event, self.t0 = _sleep_cycles_per_ms(), 2.0, None, 0.0

    def open(self, scale: float = 1.0) -> None:
        torch.cuda.synchronize()
        if scale:
            torch.cuda._sleep(int(self.cycles * self.sleep_ms * scale))
        self.event = torch.cuda.Event()
        self.event.record()
        self.t0 = time.perf_counter()

    def close(self) -> tuple[float, bool]:
        """Host µs since :meth:`open`, and whether the sleep still ran (the batch never waited for the GPU)."""
        us = (time.perf_counter() - self.t0) * 1e6
        valid, self.event = not self.event.query(), None
        return us, valid


def measure_block(loop: Loop, s: Settings, gate: Gate | None) -> dict[str, Any]:
    """``settle`` batches, ``free`` timed free-running ones, ``gated`` gated ones (CUDA only), one closing batch."""
    end_free, found = s.settle + s.free, {"issue_us": [], "waited": 0, "report": 0}
    n = end_free + (s.gated if gate else 0) + 1
    reports, perf, marks, cap, cuda = loop.reports(n), [], [], [MAX_SLEEP_MS], torch.cuda.is_available()

    def on_batch_start(i: int) -> None:
        if s.settle <= i <= end_free:
            perf.append(time.perf_counter())
            if cuda:
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()
        if gate and i > end_free:
            us, valid = gate.close()
            key = "report" if i - 1 in reports else None if valid else "waited"
            if key:
                found[key] += 1
            else:
                found["issue_us"].append(us)
            if key == "waited":  # too short a sleep, unless it already outlasts 4 free-running steps (a sync)
                gate.sleep_ms = min(2 * gate.sleep_ms, max(gate.sleep_ms, cap[0]))
        if gate and end_free <= i < n - 1:
            if i == end_free:
                step = 1e3 * (perf[-1] - perf[0]) / s.free  # ms
                cap[0] = min(4 * step + 5.0, MAX_SLEEP_MS)
                gate.sleep_ms = min(max(gate.sleep_ms, 1.5 * step), cap[0])
            gate.open()
        loop.phase = "free" if s.settle <= i < end_free else "gated" if end_free <= i < n - 1 else None

    loop.batches(n, on_batch_start)
    if marks:
        marks[-1].synchronize()
    found["host_free_us"] = [(b - a) * 1e6 for a, b in zip(perf, perf[1:])]
    found["step_ms"] = ([a.elapsed_time(b) for a, b in zip(marks, marks[1:])] if marks
                        else [u / 1e3 for u in found["host_free_us"]])
    return found


def profile_run(loop: Loop, s: Settings, active: int, gate: Gate | None, *, stack: bool = False,
                keep: Path | None = None) -> tuple[list[dict], list[bool], int]:
    """``settle`` + ``active`` profiled batches and a closing one, gated when ``gate``; a report falls at active
    position ``active // 2`` (after the run with ``stack``). The windows, their report flags, how many gated
    batches waited. ``keep``: where to gzip the trace."""
    n = s.settle + active + 1
    if loop.every:  # a lead-in puts the report where it belongs
        loop.batches(-(loop.done + (n if stack else s.settle + active // 2 + 1)) % loop.every)
    reports, waited = loop.reports(n), []
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                           if torch.cuda.is_available() else [])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        with torch.profiler.profile(activities=activities, with_stack=stack, profile_memory=not stack,
                                    schedule=torch.profiler.schedule(wait=0, warmup=s.settle + 1, active=active,
                                                                     repeat=1),
                                    on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
            def on_batch_start(i: int) -> None:
                if gate and gate.event is not None:
                    with torch.profiler.record_function("decompose: gate"):
                        waited.append(not gate.close()[1] and s.settle < i and i - 1 not in reports)
                prof.step()
                if gate and i < n - 1:  # a report batch's sync waits for its own work only, not for a sleep
                    with torch.profiler.record_function("decompose: gate"):
                        gate.open(scale=0.0 if i in reports else 3.0)  # the profiled host is slower

            loop.annotate = True
            try:
                loop.batches(n, on_batch_start)
            finally:
                loop.annotate = False
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if keep is not None:
            with open(path, "rb") as src, gzip.open(keep, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return decompose_trace(raw), [s.settle + k in reports for k in range(active)], sum(waited)


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    q = sorted(values)
    return {"median": statistics.median(q), "mean": statistics.fmean(q), "p10": q[len(q) // 10],
            "p90": q[(9 * len(q)) // 10], "n": len(q)} if q else None


def _profiled(windows: list[dict], flags: list[bool], every: int | None, issue: dict | None) -> dict[str, Any]:
    """:func:`aggregate` and ``plain.host_us_scaled`` (the module docstring)."""
    agg = aggregate(windows, flags, every)
    plain = agg["plain"]
    net = plain["window_us"] - plain["host_us"][GATE] if plain else 0.0
    if issue and net > 0:
        plain["host_us_scaled"] = {c: v * issue["median"] / net for c, v in plain["host_us"].items() if c != GATE}
    return agg


def _safely(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``{"error": ...}`` when it raises (printed with its traceback): one failed measurement costs
    its own result, not the part's."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - recorded in the JSON, the run goes on
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"}


def measure_point(loops: dict[str, Loop], s: Settings, label: str, keep: Callable[[str], Path | None],
                  counts: Callable[[], dict[str, int]] | None = None) -> dict[str, Any]:
    """Every measurement of the module docstring for each loop, and ``differences`` against the first."""
    cuda, rng = torch.cuda.is_available(), random.Random(43)
    gates = {name: Gate() if cuda else None for name in loops}
    blocks: dict[str, list[dict]] = {name: [] for name in loops}
    compiled: dict[str, dict] = {name: {} for name in loops}
    for loop in loops.values():  # compiles, CUDA-graph recordings and a first report, untimed
        loop.batches(max(s.settle * 3, (loop.every or 0) + 1))
    for r in range(s.rounds):
        for name in rng.sample(list(loops), len(loops)):
            before = counts() if counts else {}
            blocks[name].append(measure_block(loops[name], s, gates[name]))
            if counts:  # graphs compiled, graph breaks, CUDA-graph skips in the timed blocks
                compiled[name] = _blend([(1.0, compiled[name]), (1.0, counts()), (-1.0, before)])
        print(f"  {label}: round {r + 1}/{s.rounds}", flush=True)
    out: dict[str, Any] = {"variants": {}, "differences": {}}
    for name, loop in loops.items():
        joined = {k: [x for b in blocks[name] for x in b[k]] for k in ("step_ms", "host_free_us", "issue_us")}
        issue, gate = _stats(joined["issue_us"]), gates[name]
        v = {"step_ms": _stats(joined["step_ms"]), "host_free_us": _stats(joined["host_free_us"]),
             "host_issue_us": issue, "gated": {k: sum(b[k] for b in blocks[name]) for k in ("waited", "report")},
             "sleep_ms": gate.sleep_ms if gate else None, "compile_counts_timed": compiled[name] or None,
             "hook_us": {k: _stats(x) for k, x in loop.hook_us.items()} if any(loop.hook_us.values()) else None}

        def gated_profile() -> dict[str, Any]:
            windows, flags, waited = profile_run(loop, s, s.active, gate, keep=keep(name))
            return {**_profiled(windows, flags, loop.every, issue), "gated": cuda, "waited": waited}

        v["profile"] = _safely(gated_profile)
        v["stack_profile"] = _safely(lambda: _profiled(*profile_run(loop, s, s.stack, gate, stack=True)[:2],
                                                       loop.every, issue))
        if s.free_profile and cuda:
            v["free_profile"] = _safely(lambda: _profiled(*profile_run(loop, s, s.active, None)[:2], loop.every,
                                                          None))
        out["variants"][name] = v
        print(f"  {label} / {name}: step {v['step_ms'] and round(v['step_ms']['median'], 3)} ms, host issue "
              f"{issue and round(issue['median'], 1)} us", flush=True)
    out["differences"] = compare(out["variants"])
    return out


def compare(variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each variant minus the first (times, and the profiles' ``plain`` and ``amortized`` means), taken over every
    kernel; then the variants' and the differences' kernels are cut to the top 15 (in place).

    >>> v = {"none": {"step_ms": {"median": 2.0}, "profile": {"plain": {"kernels": {}}, "amortized": None}},
    ...      "suite": {"step_ms": {"median": 2.5}, "profile": {"plain": {"kernels": {"k": {"count": 1, "us": 5}}},
    ...                                                         "amortized": None}}}
    >>> d = compare(v)["suite - none"]
    >>> d["step_ms"], d["profile"]["plain"]
    ({'median': 0.5}, {'kernels': {'k': {'count': 1.0, 'us': 5.0}}})
    """
    (base_name, base), *others = variants.items()
    out = {}
    for name, v in others:
        d = {k: difference(v.get(k), base.get(k)) for k in ("step_ms", "host_free_us", "host_issue_us") if k in v}
        for k in ("profile", "stack_profile", "free_profile"):
            if k in v:
                d[k] = {m: difference(v[k].get(m), base.get(k, {}).get(m)) for m in ("plain", "amortized")}
        out[f"{name} - {base_name}"] = d
    for found in [*variants.values(), *out.values()]:
        for k in ("profile", "stack_profile", "free_profile"):
            for m in found.get(k, {}).values():
                if isinstance(m, dict) and "kernels" in m:
                    m["kernels"] = top_kernels(m["kernels"])
    return out


# ---- the loops and the parts -------------------------------------------------------------------------------------

def _report(suite: Any) -> None:
    torch.stack(list(suite.compute().values())).tolist()  # as mentor.lab.configs.suite_config's report
    suite.reset()


def plain_loop(setup: Any, batches: Any, step: Callable[..., Any], suite: Any, every: int | None, *,
               update: bool = False, compiled: bool = False) -> Loop:
    """The book's batch (:func:`mentor.lab.train.train`'s, :func:`mentor.lab.compiled_loop._time_block`'s): ``step``
    (:func:`mentor.lab.compiled_loop.step_function`: forward and loss, under autocast; the suite's update inside
    when compiled so), backward, SGD, then with ``update`` the suite's update as chapter 9's hook makes it
    (:func:`mentor.lab.configs.suite_config`), then the report when due. A compiled step starts a new iteration
    of the CUDA-graph tree at each batch."""
    it, mark = iter(batches), compiled and setup.device.type == "cuda"
    layout = torch.channels_last if setup.channels_last else torch.preserve_format

    def run(n: int, on_batch_start: Callable[[int], None]) -> None:
        for i in range(n):
            on_batch_start(i)
            images, labels = next(it)
            images = images.to(setup.device, non_blocking=True, memory_format=layout)
            labels = labels.to(setup.device, non_blocking=True)
            setup.optimizer.zero_grad(set_to_none=True)
            if mark:
                torch.compiler.cudagraph_mark_step_begin()
            loss, logits = step(images, labels)
            loss.backward()
            setup.optimizer.step()
            if update:
                loop.timed("update", lambda: suite.update(loss, logits, labels))
            if every and (loop.done + i + 1) % every == 0:
                loop.timed("report", lambda: _report(suite))

    loop = Loop(run, every)
    return loop


def _points(profile: Any, names: Sequence[str], smoke: bool) -> list[Any]:
    from mentor.lab.configs import operating_points

    found = [p for p in operating_points(profile) if p.name in names]
    return found[:1] if smoke else found


def part_compiled(profile: Any, s: Settings, smoke: bool, keep: Callable[..., Path | None]) -> dict[str, Any]:
    from mentor.lab.compiled_loop import _compile_counts, step_function
    from mentor.lab.configs import point_setup
    from mentor.suite import FusedMetrics

    options, out = ({} if profile.is_cuda else {"backend": "eager"}), {}
    for k, point in enumerate(_points(profile, ("fp32 b32", "bf16 b32 96px"), smoke)):
        torch._dynamo.reset()
        setup, batches = point_setup(point, profile)
        suite = FusedMetrics(profile.num_classes).to(setup.device)  # one suite, one compiled step for both
        plain = step_function(setup, None, "reduce-overhead", **options)
        inside = step_function(setup, suite, "reduce-overhead", **options)
        loops = {"no metrics": plain_loop(setup, batches, plain, None, None, compiled=True),
                 "suite inside": plain_loop(setup, batches, inside, suite, profile.report_every, compiled=True),
                 "suite inside, no report": plain_loop(setup, batches, inside, suite, None, compiled=True)}
        out[point.name] = _safely(lambda: measure_point(loops, s, point.name, lambda v, k=k, p=point: keep(
            k, p.name, v), counts=_compile_counts))
    return out


def part_eager(profile: Any, s: Settings, smoke: bool, keep: Callable[..., Path | None]) -> dict[str, Any]:
    from mentor.lab.compiled_loop import step_function
    from mentor.lab.configs import point_setup
    from mentor.suite import FusedMetrics

    out = {}
    for k, point in enumerate(_points(profile, ("fp32 b32", "fp32 b128"), smoke)):
        setup, batches = point_setup(point, profile)
        step, suites = step_function(setup, None, "eager"), [FusedMetrics(profile.num_classes).to(setup.device)
                                                             for _ in range(2)]
        loops = {"no metrics": plain_loop(setup, batches, step, None, None),
                 "suite": plain_loop(setup, batches, step, suites[0], profile.report_every, update=True),
                 "suite, no report": plain_loop(setup, batches, step, suites[1], None, update=True)}
        out[point.name] = _safely(lambda: measure_point(loops, s, point.name,
                                                        lambda v, k=k, p=point: keep(k, p.name, v)))
    return out


def part_frameworks(profile: Any, s: Settings, smoke: bool, keep: Callable[..., Path | None]) -> dict[str, Any]:
    from mentor.lab import frameworks as fw
    from mentor.lab.configs import point_setup

    out: dict[str, Any] = {}
    for name, modules, make, way in (("Lightning", ("lightning", "mentor.lightning"), fw._lightning_runner,
                                      "suite, LogEvery"),
                                     ("Accelerate", ("accelerate",), fw._accelerate_runner, "suite, readback")):
        try:
            for module in modules:
                __import__(module)
        except ImportError as error:
            out[name] = f"not installed: {type(error).__name__}: {error}"
            print(f"  {name}: {out[name]}", flush=True)
            continue
        for k, point in enumerate(_points(profile, ("fp32 b128", "bf16 b32"), smoke)):
            reset = (__import__("accelerate.state").state.AcceleratorState._reset_state if name == "Accelerate"
                     else lambda **_: None)
            reset(reset_partial_state=True)  # a new precision needs a new Accelerate state
            try:
                with fw._quiet():
                    loops, batches = {}, None
                    for label, every in (("no metrics", None), (way, profile.report_every), ("suite, no report", None)):
                        setup, stream = point_setup(point, profile)  # the same weights for every variant
                        batches = batches if batches is not None else stream
                        runner = make("no metrics" if label == "no metrics" else way, setup.model,
                                      profile.num_classes, point, profile.device, every or 10**9)
                        loops[label] = Loop(lambda n, on, r=runner, b=batches, f=name: r(
                            b, n, [fw._mark_callback(f, 0, on)]), every)
                    out[f"{name}, {point.name}"] = _safely(lambda: measure_point(
                        loops, s, f"{name} {point.name}", lambda v, k=k, p=point: keep(k, f"{name} {p.name}", v)))
            finally:
                reset(reset_partial_state=True)
    return out


PARTS = {"compiled": part_compiled, "frameworks": part_frameworks, "eager": part_eager}
TRACE_BUDGET = 6 * 2**20


def _keeper(out: Path, part: str, enabled: bool) -> Callable[[int, str, str], Path | None]:
    """Where to gzip a gated trace: the first point's, while the part's saved traces total under 6 MB."""
    def keep(point_index: int, point: str, variant: str) -> Path | None:
        folder = out / "traces"
        used = sum(p.stat().st_size for p in folder.glob(f"{part}_*.json.gz")) if folder.is_dir() else 0
        if not enabled or point_index or used > TRACE_BUDGET:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        return folder / (re.sub(r"[^A-Za-z0-9]+", "_", f"{part} {point} {variant}").strip("_") + ".json.gz")

    return keep


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", required=True, help="compiled, frameworks or eager (or a comma-separated list)")
    parser.add_argument("--out", type=Path, required=True, help="the folder for <part>.json and traces/")
    parser.add_argument("--smoke", action="store_true", help="a tiny CPU run: checks the script, measures nothing")
    parser.add_argument("--no-traces", action="store_true", help="keep no raw trace")
    args = parser.parse_args(argv)
    parts = args.part.split(",")
    if any(p not in PARTS for p in parts):
        parser.error(f"--part takes {', '.join(PARTS)} or a comma-separated list of them, not {args.part!r}")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("torch sees no CUDA device: run this on the GPU machine, or pass --smoke for a CPU check")
    from mentor.lab.env import get_profile

    profile = get_profile("smoke").with_(batch_size=2, num_classes=10) if args.smoke else get_profile("full")
    if args.smoke:
        torch.set_num_threads(1)  # a shared CPU: more threads spin against each other
    args.out.mkdir(parents=True, exist_ok=True)
    for part in parts:
        start, s = time.perf_counter(), SMOKE if args.smoke else SETTINGS[part]
        print(f"== {part}", flush=True)
        result = PARTS[part](profile, s, args.smoke, _keeper(args.out, part, not args.no_traces))
        versions = {}
        for package in ("torch", "triton", "torchmetrics", "lightning", "accelerate"):
            with contextlib.suppress(Exception):
                versions[package] = __import__(package).__version__
        doc = {"part": part, "results": result, "settings": asdict(s), "report_every": profile.report_every,
               "smoke": "CPU smoke run: no CUDA, so no gate (host_issue_us is null), no GPU events, no CUDA graphs "
                        "(compiled with backend='eager'); it checks the script and measures nothing" if args.smoke
                        else None,
               "meta": {"versions": versions, "argv": argv, "seconds": round(time.perf_counter() - start, 1),
                        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                        "cpus": sorted(os.sched_getaffinity(0)), "finished": time.strftime("%Y-%m-%d %H:%M:%S")},
               "method": {"categories": RULE_TEXT, "derived": [REST, NO_EVENT], "description": __doc__}}
        (args.out / f"{part}.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
        print(f"== {part}: {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
