"""A decomposition of the suite's cost, read back: what ``scripts/decompose_residuals.py`` stored, as numbers per
loop and a table at phone width.

The script (its docstring says what each number is and what the method cannot see) runs each loop of a point
(``"no metrics"`` first, then the loops with the suite) and writes ``<part>.json``. Per loop it stores the step
time between the starts of free-running batches (CUDA events), the host's time to issue one *gated* batch (the
GPU drained and kept busy with a sleep, so that no launch waits for it; report batches sync and are left out),
and a ``torch.profiler`` run over gated batches, one of which reports: per batch, the GPU time and the number of
the kernels, copies and memsets it launched, its kernel-launch, CUDA-graph-launch and sync calls, and its host
time per category. In the eager loop (``eager.json``) it also stores the update's host time in the hook, in the
free-running and in the gated batches. :func:`variants` reads these back for one point, :func:`decomposition_table`
prints them, :func:`changed_kernels` lists the kernels whose count differs from the loop without metrics, and
:func:`recorded_differences` compares the file's machine and releases with those a chapter's run records.

The profiler's host times are inflated (the profiler adds a cost per event) and the profiled means carry no
spread; the step and issue times give their 10th and 90th percentiles. A report batch is profiled once per loop.

Example:
    >>> doc = {"results": {"p": {"variants": {
    ...     "no metrics": example_variant(step_ms=2.0, kernels=10, launches=1),
    ...     "suite": example_variant(step_ms=2.1, kernels=11, launches=1, report_launches=9)}}}}
    >>> v = variants(doc, "p")
    >>> round(v["suite"].step_ms.median - v["no metrics"].step_ms.median, 3), v["suite"].report.kernel_launches
    (0.1, 9.0)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

BASELINE = "no metrics"
"""The loop every other loop of a point is compared with (the first the script runs)."""
GATE = "measurement gate (excluded)"
"""The host category of the script's gate (its drain, sleep and event), left out of a batch's host time;
``scripts/decompose_residuals.py`` imports this name and writes the category under it."""
SYNC = "sync (host waits)"
"""The host category of synchronizing CUDA calls (the script's first rule, which it names with this)."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _field(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"{where} has no {key!r}: pass a decomposition written by scripts/decompose_residuals.py "
                         "(json.load of its <part>.json, or load_decomposition)")
    return d[key]


@dataclass(frozen=True)
class Spread:
    """The median, mean and 10th and 90th percentiles of ``n`` per-batch values (the script's ``_stats``).

    Example:
        >>> s = Spread.of({"median": 4.73, "mean": 4.77, "p10": 4.71, "p90": 4.76, "n": 120}, "step_ms")
        >>> s.holds(4.732), s.holds(4.8), s.range(2), s.place(4.8), s.place(4.71)
        (True, False, '4.71–4.76', 'above', 'inside')
    """

    median: float
    mean: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, stats: Any, where: str) -> Spread:
        """The spread of a stored ``{"median", "mean", "p10", "p90", "n"}``; ``where`` names it in errors."""
        values = {k: _number(_field(stats, k, where), f"{where}[{k!r}]") for k in ("median", "mean", "p10", "p90")}
        n = _field(stats, "n", where)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{where}['n'] must be a count of at least 1, got {n!r}")
        if not values["p10"] <= values["median"] <= values["p90"]:
            raise ValueError(f"{where}: p10 <= median <= p90 must hold, got {values}")
        return cls(n=n, **values)

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the range from the 10th to the 90th percentile, ends included."""
        return self.p10 <= value <= self.p90

    def range(self, digits: int) -> str:
        """``"p10–p90"``, each with ``digits`` decimals."""
        return f"{self.p10:.{digits}f}–{self.p90:.{digits}f}"

    def place(self, value: float) -> str:
        """Where ``value`` lies against the range from the 10th to the 90th percentile: ``"inside"`` (ends
        included), ``"above"`` or ``"below"``."""
        return "inside" if self.holds(value) else "above" if value > self.p90 else "below"


@dataclass(frozen=True)
class ProfiledBatch:
    """Per batch, under the profiler: the mean over the profiled batches of one kind (``windows`` of them).

    ``host_us`` is the main thread's time in the batch's window, the gate left out; ``sync_us`` the part of it in
    synchronizing calls. The GPU counts are the work the batch launched; ``kernels`` counts kernels run (inside
    CUDA-graph replays too, where CUPTI reported them), ``kernel_launches`` the host's launch calls.

    Example:
        >>> b = ProfiledBatch.of(example_batch(kernels=11, launches=2), 3, "plain")
        >>> b.kernels, b.kernel_launches, b.graph_launches, b.host_us, b.windows
        (11.0, 2.0, 2.0, 900.0, 3)
    """

    windows: int
    gpu_us: float
    kernels: float
    copies: float
    kernel_launches: float
    graph_launches: float
    graphs_unseen: float
    syncs: float
    host_us: float
    sync_us: float

    @classmethod
    def of(cls, batch: Any, windows: int, where: str) -> ProfiledBatch:
        """From a profile's ``plain`` or ``report`` mean; ``where`` names it in errors."""
        api, gpu, host = (_field(batch, k, where) for k in ("api", "gpu", "host_us"))
        if not isinstance(host, dict):
            raise ValueError(f"{where}['host_us'] must be a dict of host categories, got {host!r}")
        num = lambda d, k, part: _number(_field(d, k, f"{where}[{part!r}]"), f"{where}[{part!r}][{k!r}]")  # noqa: E731
        return cls(windows=windows, gpu_us=num(gpu, "us", "gpu"), kernels=num(gpu, "kernels", "gpu"),
                   copies=num(gpu, "copies", "gpu"), kernel_launches=num(api, "kernel_launches", "api"),
                   graph_launches=num(api, "graph_launches", "api"),
                   graphs_unseen=_number(api.get("graph_launches_without_gpu_events", 0.0),
                                         f"{where}['api']['graph_launches_without_gpu_events']"),
                   syncs=num(api, "syncs", "api"),
                   host_us=num(batch, "window_us", "window") - _number(host.get(GATE, 0.0), f"{where} gate"),
                   sync_us=_number(host.get(SYNC, 0.0), f"{where}['host_us'][{SYNC!r}]"))


@dataclass(frozen=True)
class Variant:
    """One loop of a point: its step time, its gated issue time (None without CUDA: the script's smoke run), its
    profiled batch without a report and, where the loop reports, its profiled report batch. ``hook_free`` and
    ``hook_gated``: the update's host µs in the hook (``suite.update`` timed with ``perf_counter``) over the
    free-running and the gated batches, report batches included (the update comes before the report); None where
    the loop makes no update in a hook (the loop without metrics, every compiled loop) or had no such batches."""

    name: str
    step_ms: Spread
    issue_us: Spread | None
    plain: ProfiledBatch
    report: ProfiledBatch | None
    hook_free: Spread | None = None
    hook_gated: Spread | None = None


def _hook(v: dict[str, Any], where: str) -> tuple[Spread | None, Spread | None]:
    """A loop's stored ``hook_us`` (None or ``{"free": stats or None, "gated": stats or None}``) as two spreads."""
    hook = v.get("hook_us")
    if hook is None:
        return None, None
    if not isinstance(hook, dict):
        raise ValueError(f"{where}['hook_us'] must be None or a dict with 'free' and 'gated', got {hook!r}")
    return tuple(None if _field(hook, k, f"{where}['hook_us']") is None  # type: ignore[return-value]
                 else Spread.of(hook[k], f"{where}['hook_us'][{k!r}]") for k in ("free", "gated"))


def variants(doc: dict[str, Any], point: str) -> dict[str, Variant]:
    """The loops of ``point`` in ``doc`` (a decomposition: the script's JSON), in the order the script ran them,
    :data:`BASELINE` first.

    Example:
        >>> doc = {"results": {"p": {"variants": {"no metrics": example_variant(step_ms=2.0, kernels=10)}}}}
        >>> list(variants(doc, "p")), variants(doc, "p")["no metrics"].report is None
        (['no metrics'], True)
        >>> variants(doc, "q")
        Traceback (most recent call last):
        ValueError: point 'q' is not in the decomposition; its points: p
    """
    results = _field(doc, "results", "the decomposition")
    if not isinstance(results, dict) or point not in results:
        names = ", ".join(results) if isinstance(results, dict) else "none"
        raise ValueError(f"point {point!r} is not in the decomposition; its points: {names}")
    if isinstance(results[point], dict) and "error" in results[point]:
        raise ValueError(f"results[{point!r}] holds no measurement: the script recorded {results[point]['error']!r}")
    found = _field(results[point], "variants", f"results[{point!r}]")
    if not isinstance(found, dict) or next(iter(found), None) != BASELINE:
        raise ValueError(f"results[{point!r}]['variants'] must start with {BASELINE!r}, got {list(found or [])}")
    out = {}
    for name, v in found.items():
        where = f"results[{point!r}]['variants'][{name!r}]"
        profile = _field(v, "profile", where)
        if isinstance(profile, dict) and "error" in profile:
            raise ValueError(f"{where}['profile'] holds no profile: the script recorded {profile['error']!r}")
        plain, report = _field(profile, "plain", f"{where}['profile']"), profile.get("report")
        if plain is None:
            raise ValueError(f"{where}['profile']['plain'] is None: no batch without a report was profiled")
        count = _field(profile, "windows", f"{where}['profile']")
        reports = profile.get("report_windows", 0)
        issue = _field(v, "host_issue_us", where)
        out[name] = Variant(
            name, Spread.of(_field(v, "step_ms", where), f"{where}['step_ms']"),
            None if issue is None else Spread.of(issue, f"{where}['host_issue_us']"),
            ProfiledBatch.of(plain, count - reports, f"{where}['profile']['plain']"),
            None if report is None else ProfiledBatch.of(report, reports, f"{where}['profile']['report']"),
            *_hook(v, where))
    return out


def changed_kernels(doc: dict[str, Any], point: str, variant: str) -> dict[str, tuple[float, float]]:
    """The kernels whose count per batch without a report differs between ``variant`` and :data:`BASELINE`:
    name -> (count difference, µs difference), from the script's ``differences`` (which keep the 15 kernels with
    the largest difference in µs, so a kernel outside them is not listed).

    Example:
        >>> diff = {"profile": {"plain": {"kernels": {"k": {"count": 1.0, "us": 4.2}, "c": {"count": 0.0, "us": 6.0}}}}}
        >>> changed_kernels({"results": {"p": {"differences": {"suite - no metrics": diff}}}}, "p", "suite")
        {'k': (1.0, 4.2)}
    """
    results = _field(doc, "results", "the decomposition")
    key = f"{variant} - {BASELINE}"
    differences = _field(_field(results, point, "results"), "differences", f"results[{point!r}]")
    d = _field(differences, key, f"results[{point!r}]['differences']")
    kernels = _field(_field(_field(d, "profile", key), "plain", f"{key}['profile']"), "kernels", f"{key} plain")
    return {name: (float(k["count"]), float(k["us"])) for name, k in kernels.items() if round(k["count"], 6) != 0}


def recorded_differences(doc: dict[str, Any], env: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What the decomposition's ``meta`` records that differs from ``env``, the environment a chapter's stored run
    records (:func:`mentor.lab.env.environment_report`'s keys): the GPU model, the day (the first 10 characters of
    the file's ``finished`` and of the run's ``date``), and the torch and torchmetrics releases. What -> (the
    file's, the run's), for those that differ only; an empty dict where all four agree. A missing entry of ``env``
    reads as None, so it differs.

    Example:
        >>> doc = {"meta": {"device": "NVIDIA H100 80GB HBM3", "finished": "2026-12-07 05:26:12",
        ...                 "versions": {"torch": "2.11.0+cu130", "torchmetrics": "1.9.0"}}}
        >>> env = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-07T05:06:57+00:00", "torch": "2.11.0+cu130",
        ...        "torchmetrics": "1.9.0"}
        >>> recorded_differences(doc, env)
        {}
        >>> recorded_differences(doc, env | {"gpu": "NVIDIA H200", "date": "2026-12-08T01:00:00+00:00"})
        {'GPU': ('NVIDIA H100 80GB HBM3', 'NVIDIA H200'), 'day': ('2026-12-07', '2026-12-08')}
    """
    meta = _field(doc, "meta", "the decomposition")
    if not isinstance(env, dict):
        raise ValueError(f"env must be the dict of a chapter's stored environment (its 'gpu', 'date', 'torch', "
                         f"'torchmetrics'), got {env!r}")
    versions = _field(meta, "versions", "the decomposition's meta")
    day = lambda x: x[:10] if isinstance(x, str) else x  # noqa: E731
    pairs = {"GPU": (_field(meta, "device", "the decomposition's meta"), env.get("gpu")),
             "day": (day(_field(meta, "finished", "the decomposition's meta")), day(env.get("date"))),
             "torch": (_field(versions, "torch", "the decomposition's meta['versions']"), env.get("torch")),
             "torchmetrics": (_field(versions, "torchmetrics", "the decomposition's meta['versions']"),
                              env.get("torchmetrics"))}
    return {what: pair for what, pair in pairs.items() if pair[0] != pair[1]}


def _count(x: float) -> str:
    """A mean count: one decimal, none when whole."""
    return f"{x:.1f}".removesuffix(".0")


def decomposition_table(doc: dict[str, Any], point: str, names: dict[str, str] | None = None) -> str:
    """One point's loops side by side: the step (median, p10–p90, mean), the gated issue time, where a loop of the
    point updates in a hook the update's host time (median, p10–p90; free-running, then gated), and the profiled
    batch without a report and report batch. ``names``: column headings by loop (default the loop's own name).
    Each column is as wide as its widest cell, two spaces apart (the book's points, three loops with headings of up
    to 10 characters: 53 characters in chapter 14, 59 in chapter 9). "–": not measured (no report or no hook in
    the loop, no gate).

    Example:
        >>> doc = {"results": {"p": {"variants": {
        ...     "no metrics": example_variant(step_ms=2.0, kernels=10, launches=1),
        ...     "suite": example_variant(step_ms=2.1, kernels=11, launches=1, report_launches=9)}}}}
        >>> print(decomposition_table(doc, "p", {"no metrics": "none"}))
        p                          none      suite
        step ms, median           2.000      2.100
          p10–p90             2.00–2.00  2.10–2.10
          mean                    2.000      2.100
        host issue µs, gated          –          –
          p10–p90                     –          –
        batch without report
          GPU µs                   1000       1000
          kernels, copies         10, 2      11, 2
          launches, graphs         1, 2       1, 2
          syncs                       0          0
          host µs, profiled         900        900
        report batch
          GPU µs                      –       1000
          kernels, copies             –      11, 2
          launches, graphs            –       9, 2
          syncs                       –          1
          host µs, profiled           –        900

        The hook's rows, where a loop updates in one:

        >>> doc["results"]["p"]["variants"]["suite"] = example_variant(2.1, 11, hook_us=80.0)
        >>> for line in decomposition_table(doc, "p").splitlines():
        ...     if "hook" in line:
        ...         print(line)
        hook µs, free                  –         80
        hook µs, gated                 –         80
    """
    loops = variants(doc, point)
    rows: list[tuple[str, list[str]]] = [(point, [(names or {}).get(name, name) for name in loops])]
    issue = [v.issue_us for v in loops.values()]
    rows += [("step ms, median", [f"{v.step_ms.median:.3f}" for v in loops.values()]),
             ("  p10–p90", [v.step_ms.range(2) for v in loops.values()]),
             ("  mean", [f"{v.step_ms.mean:.3f}" for v in loops.values()]),
             ("host issue µs, gated", [f"{s.median:.0f}" if s else "–" for s in issue]),
             ("  p10–p90", [s.range(0) if s else "–" for s in issue])]
    for label, kind in (("hook µs, free", "hook_free"), ("hook µs, gated", "hook_gated")):
        hooks = [getattr(v, kind) for v in loops.values()]
        if any(hooks):
            rows += [(label, [f"{s.median:.0f}" if s else "–" for s in hooks]),
                     ("  p10–p90", [s.range(0) if s else "–" for s in hooks])]
    for title, kind in (("batch without report", "plain"), ("report batch", "report")):
        batches = [getattr(v, kind) for v in loops.values()]
        rows.append((title, []))
        for label, cell in (("  GPU µs", lambda b: f"{b.gpu_us:.0f}"),
                            ("  kernels, copies", lambda b: f"{_count(b.kernels)}, {_count(b.copies)}"),
                            ("  launches, graphs", lambda b: f"{_count(b.kernel_launches)}, {_count(b.graph_launches)}"),
                            ("  syncs", lambda b: _count(b.syncs)),
                            ("  host µs, profiled", lambda b: f"{b.host_us:.0f}")):
            rows.append((label, [cell(b) if b is not None else "–" for b in batches]))
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(cells[j]) for _, cells in rows if cells) for j in range(len(loops))]
    return "\n".join((label.ljust(label_width) + "".join("  " + c.rjust(w) for c, w in zip(cells, widths))).rstrip()
                     for label, cells in rows)


def load_decomposition(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The decomposition stored at ``path`` (a ``<part>.json`` of the script), checked: every point reads with
    :func:`variants`. Errors name the file.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "compiled.json"
        >>> _ = path.write_text(json.dumps({"results": {"p": {"variants": {}}}}))
        >>> load_decomposition(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: ...compiled.json: results['p']['variants'] must start with 'no metrics', got []
    """
    try:
        doc = json.loads(open(path, encoding="utf-8").read())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist: pass the path of a decomposition, e.g. "
                                "results/decomposition/2026-12-07_h100/compiled.json from the book's folder") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error}): pass a <part>.json of scripts/decompose_residuals.py") from None
    try:
        for point in _field(doc, "results", "the decomposition"):
            variants(doc, point)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return doc


def example_batch(kernels: float = 10, launches: float = 1, syncs: float = 0) -> dict[str, Any]:
    """A hand-made profiled batch (the script's shape), for examples and tests: 1000 µs of GPU work, 2 copies,
    2 CUDA-graph launches, a 1000 µs window of which the gate took 100.

    Example:
        >>> example_batch()["api"]
        {'kernel_launches': 1, 'graph_launches': 2, 'graph_launches_without_gpu_events': 0, 'syncs': 0}
    """
    return {"window_us": 1000.0, "host_us": {GATE: 100.0, SYNC: 5.0 * syncs},
            "api": {"kernel_launches": launches, "graph_launches": 2, "graph_launches_without_gpu_events": 0,
                    "syncs": syncs},
            "gpu": {"us": 1000.0, "kernels": kernels, "copies": 2}}


def example_variant(step_ms: float, kernels: float, launches: float = 1,
                    report_launches: float | None = None, hook_us: float | None = None) -> dict[str, Any]:
    """A hand-made loop (the script's shape): the same ``step_ms`` at every percentile over 3 batches, no gated
    time (as without CUDA), 4 profiled batches, one of them a report batch when ``report_launches`` is given, and
    where ``hook_us`` is given an update in the hook that took ``hook_us`` in every free-running and gated batch.

    Example:
        >>> example_variant(2.0, 10)["step_ms"]
        {'median': 2.0, 'mean': 2.0, 'p10': 2.0, 'p90': 2.0, 'n': 3}
        >>> example_variant(2.0, 10, hook_us=80.0)["hook_us"]["gated"]
        {'median': 80.0, 'mean': 80.0, 'p10': 80.0, 'p90': 80.0, 'n': 3}
    """
    report = None if report_launches is None else example_batch(kernels, report_launches, syncs=1)
    same = lambda x: dict.fromkeys(("median", "mean", "p10", "p90"), x) | {"n": 3}  # noqa: E731
    return {"step_ms": same(step_ms), "host_issue_us": None,
            "hook_us": None if hook_us is None else {"free": same(hook_us), "gated": same(hook_us)},
            "profile": {"windows": 4, "report_windows": 0 if report is None else 1,
                        "plain": example_batch(kernels, launches), "report": report}}
