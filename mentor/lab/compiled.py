"""Metric updates under ``torch.compile``: the graph breaks of one update, and the recompiles over steps.

:func:`compile_report` traces one metric set's ``update(loss, logits, target)`` with
``torch._dynamo.explain`` (graphs, breaks and, for each break, dynamo's reason and the innermost
source line it points at), then calls ``torch.compile(update)`` for a number of steps with a
backend that only counts what it is given (``torch._dynamo.testing.CompileCounter``), so that a
recompile shows as one more frame compiled after a step. No code is generated: the counts are
dynamo's, the same on CPU and GPU for these updates, and they say nothing about speed.

Limits: ``explain`` reports each break once per distinct reason and frame, while
``graph_breaks`` counts them all; a recompile caused by a guard on a Python attribute appears
only when the attribute changes between calls (as ``_update_count`` does at every update).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

COMPILE_SETS: dict[str, str] = {
    "torchmetrics defaults": "MeanMetric() and MulticlassAccuracy, Precision, Recall, F1 as they ship (macro)",
    "optimized": "the article's optimized set: no NaN check, a tensor weight, micro-averaged classifiers",
    "fused suite": "mentor.suite.FusedMetrics: the loss mean and every score in one update",
}
"""The metric sets whose updates :func:`compile_report` traces, by name."""


def compile_set(name: str, num_classes: int = 10, device: torch.device | str = "cpu") -> Any:
    """A fresh metric set of :data:`COMPILE_SETS`; it has ``update(loss, logits, target)``.

    Example:
        >>> type(compile_set("fused suite", 5)).__name__
        'FusedMetrics'
    """
    from torchmetrics import MeanMetric, MetricCollection

    from mentor.lab.metric_sets import LossAndScores, metric_set, score_metrics
    from mentor.suite import FusedMetrics

    if name not in COMPILE_SETS:
        raise ValueError(f"unknown metric set {name!r}: pass one of {list(COMPILE_SETS)}.")
    if name == "torchmetrics defaults":
        collection = MetricCollection(score_metrics(num_classes, "macro"), compute_groups=False)
        return LossAndScores(MeanMetric().to(device), collection.to(device), description=COMPILE_SETS[name])
    if name == "optimized":
        return metric_set("optimized", num_classes, device)
    return FusedMetrics(num_classes).to(device)


@dataclass(frozen=True)
class GraphBreak:
    """One reason dynamo gave for a graph break, and where: the innermost source line of its user stack."""

    reason: str
    where: str


@dataclass(frozen=True)
class CompileReport:
    """What ``torch.compile`` made of one metric set's update (see :func:`compile_report`)."""

    name: str
    graphs: int
    graph_breaks: int
    breaks: tuple[GraphBreak, ...]
    frames_after_step: tuple[int, ...]
    """Frames compiled in total after each compiled call: growth after the first call is recompiles."""
    error: str | None = None
    """The first line of dynamo's error, when tracing failed instead of breaking the graph."""

    @property
    def recompiles(self) -> int:
        """Frames compiled after the first call's."""
        return self.frames_after_step[-1] - self.frames_after_step[0] if self.frames_after_step else 0

    @property
    def recompile_calls(self) -> tuple[int, ...]:
        """The calls, counted from 1, after which more frames were compiled than after the call before.

        Example:
            >>> CompileReport("x", 1, 0, (), (1, 2, 2, 3)).recompile_calls
            (2, 4)
        """
        f = self.frames_after_step
        return tuple(i + 1 for i in range(1, len(f)) if f[i] > f[i - 1])


def _where(frame: Any) -> str:
    from mentor.syncs import short_path

    return f"{short_path(frame.filename)}:{frame.lineno}"


def _batch(num_classes: int, batch: int, device: torch.device | str, step: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(step)
    logits = torch.randn(batch, num_classes, generator=g).to(device)
    target = torch.randint(0, num_classes, (batch,), generator=g).to(device)
    return torch.tensor(0.5 + step, device=device), logits, target


def compile_report(name: str, num_classes: int = 10, device: torch.device | str = "cpu", steps: int = 10,
                   batch: int = 8, label: str | None = None) -> CompileReport:
    """Trace and compile the update of metric set ``name`` (a key of :data:`COMPILE_SETS`); the report is named
    ``label`` (default: ``name``). Dynamo's settings are those in force at the call, so a report under another
    setting runs inside ``torch._dynamo.config.patch(...)`` and says so in its ``label``.

    One update runs eagerly first, so that state and torchmetrics' lazy checks of optional
    packages are set up outside the tracer (in a fresh process, dynamo 2.14 fails with an internal
    error when it meets one of those checks, ``_XLA_AVAILABLE``, on the first traced call). An error
    dynamo still raises is returned in ``error`` (no graph counts) rather than raised.

    Example:
        >>> r = compile_report("fused suite", steps=3)
        >>> r.graphs, r.graph_breaks, r.frames_after_step
        (1, 0, (1, 1, 1))
        >>> with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
        ...     r = compile_report("optimized", steps=10, label="optimized, ints unspecialized")
        >>> r.name, r.recompiles
        ('optimized, ints unspecialized', 1)
    """
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounter

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number of compiled calls >= 1, not {steps!r}.")
    if label is not None and (not isinstance(label, str) or not label):
        raise ValueError(f"label must be a non-empty string naming the report, got {label!r}.")
    label = name if label is None else label
    metrics = compile_set(name, num_classes, device)
    metrics.update(*_batch(num_classes, batch, device, -1))
    dynamo.reset()
    try:
        explained = dynamo.explain(metrics.update)(*_batch(num_classes, batch, device, 0))
    except Exception as error:  # dynamo wraps what went wrong in several types; the report names it
        dynamo.reset()
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return CompileReport(label, 0, 0, (), (), error=f"{type(error).__name__}: {first}")
    breaks = tuple(GraphBreak(r.reason.strip().splitlines()[0], _where(r.user_stack[-1]) if r.user_stack else "?")
                   for r in explained.break_reasons)
    dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(metrics.update, backend=counter)
    frames = []
    for step in range(steps):
        compiled(*_batch(num_classes, batch, device, step + 1))
        frames.append(counter.frame_count)
    dynamo.reset()
    return CompileReport(label, explained.graph_count, explained.graph_break_count, breaks, tuple(frames))


def compile_reports(names: Sequence[str] = tuple(COMPILE_SETS), **options: Any) -> list[CompileReport]:
    """:func:`compile_report` for each of ``names``, with the same ``options``."""
    return [compile_report(name, **options) for name in names]


def compile_table(reports: Sequence[CompileReport]) -> str:
    """One block per report: graphs, breaks, recompiles, then each distinct break reason with its source line.

    Example:
        >>> print(compile_table([CompileReport("x", 2, 1, (GraphBreak("Data-dependent branching", "a.py:3"),),
        ...                                    (2, 3, 4))]))
        x: 2 graphs, 1 graph break, 2 recompiles in 3 calls
          - Data-dependent branching  at a.py:3
    """
    def plural(n: int, word: str) -> str:
        return f"{n} {word}" if n == 1 else f"{n} {word}s"

    lines = []
    for r in reports:
        if r.error is not None:
            lines.append(f"{r.name}: tracing failed: {r.error}")
            continue
        lines.append(f"{r.name}: {plural(r.graphs, 'graph')}, {plural(r.graph_breaks, 'graph break')}, "
                     f"{plural(r.recompiles, 'recompile')} in {plural(len(r.frames_after_step), 'call')}")
        seen: dict[tuple[str, str], int] = {}
        for b in r.breaks:
            seen[(b.reason, b.where)] = seen.get((b.reason, b.where), 0) + 1
        for (reason, where), n in seen.items():
            lines.append(f"  - {reason}  at {where}" + (f"  ({n}x)" if n > 1 else ""))
    return "\n".join(lines)


def save_reports(reports: Sequence[CompileReport], path: str | os.PathLike[str]) -> Path:
    """Write ``reports`` to ``path`` as JSON, one object per report: its fields, and ``recompiles`` and
    ``recompile_calls`` for a reader of the file. :func:`load_reports` reads them back.

    Example:
        >>> import tempfile
        >>> report = CompileReport("x", 2, 1, (GraphBreak("Data-dependent branching", "a.py:3"),), (2, 3, 3))
        >>> path = save_reports([report], os.path.join(tempfile.mkdtemp(), "reports.json"))
        >>> json.loads(path.read_text())[0]["recompile_calls"]
        [2]
        >>> load_reports(path) == [report]
        True
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stored = [asdict(r) | {"recompiles": r.recompiles, "recompile_calls": list(r.recompile_calls)} for r in reports]
    path.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")
    return path


def load_reports(path: str | os.PathLike[str]) -> list[CompileReport]:
    """The :class:`CompileReport` list that :func:`save_reports` wrote to ``path`` (its derived counts,
    ``recompiles`` and ``recompile_calls``, are recomputed from ``frames_after_step``, not read).

    Example:
        >>> load_reports("no-such-file.json")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no compile reports at no-such-file.json; write them with save_reports(reports, path).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no compile reports at {path}; write them with save_reports(reports, path).")
    names = {f.name for f in fields(CompileReport)}
    reports = []
    for stored in json.loads(path.read_text(encoding="utf-8")):
        kept = {k: v for k, v in stored.items() if k in names}
        kept["breaks"] = tuple(GraphBreak(**b) for b in kept.get("breaks", ()))
        kept["frames_after_step"] = tuple(kept.get("frames_after_step", ()))
        reports.append(CompileReport(**kept))
    return reports


def compiled_update_config(name: str, num_classes: int, device: torch.device | str, mode: str | None = None,
                           backend: str = "inductor", label: str | None = None) -> Any:
    """A :class:`mentor.lab.configs.Config` that updates metric set ``name`` each step through ``torch.compile``,
    named ``label`` (default: ``"<name>, compiled"``, and the mode in brackets).

    The model stays eager; only the update is compiled (``mode`` and ``backend`` go to
    ``torch.compile``: ``mode="reduce-overhead"`` asks inductor for CUDA graphs). Each ``make()``
    compiles a fresh set, so the first steps of every run include compilation: give the
    comparison enough warm-up steps. At each report the values are computed eagerly, read back in
    one copy and reset (``on_report`` returns them).

    Example:
        >>> cfg = compiled_update_config("fused suite", 10, "cpu", backend="eager")
        >>> cfg.name, callable(cfg.make()[0])
        ('fused suite, compiled', True)
        >>> compiled_update_config("fused suite", 10, "cpu", "reduce-overhead", label="suite, CUDA graphs").name
        'suite, CUDA graphs'
    """
    from mentor.lab.configs import Config
    from mentor.lab.metric_sets import read_values

    if name not in COMPILE_SETS:
        raise ValueError(f"unknown metric set {name!r}: pass one of {list(COMPILE_SETS)}.")

    def make() -> Any:
        metrics = compile_set(name, num_classes, device)
        update = torch.compile(metrics.update, mode=mode, backend=backend)

        def on_report(_: int) -> dict[str, Any]:
            values = read_values(metrics.compute())
            metrics.reset()
            return values

        return (lambda s: update(s.loss, s.output, s.labels)), on_report

    if label is None:
        label = f"{name}, compiled" + (f" ({mode})" if mode else "")
    return Config(label, make, f"{COMPILE_SETS[name]}; update through torch.compile(mode={mode!r})")


_PATH = re.compile(r"(?:/[^\s/'\"()]+)+?/((?:mentor|torchmetrics|torch)/[^\s'\"():]+)")


def _one_line(message: str) -> str:
    """dynamo's multi-line warning as one line: its first line, function and last reason, paths from the package down."""
    lines = [line.strip() for line in message.strip().splitlines()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith(("function:", "last reason:"))]
    text = "; ".join(kept)
    text = re.sub(r"\s*\(HINT:.*?\)(?=;|$)", "", text)
    return _PATH.sub(r"\1", re.sub(r"\s{2,}#.*?(?=;|$)", "", text))


@contextlib.contextmanager
def dynamo_warnings() -> Iterator[list[str]]:
    """Collect what ``torch._dynamo`` logs at WARNING or above inside the block, one line per message, instead of
    printing it: its first line, the ``function:`` and ``last reason:`` lines, with file paths cut to the
    package (``mentor/...``, ``torchmetrics/...``). The ``torch._dynamo`` logger's handlers and propagation are
    restored on exit.

    Example:
        >>> with dynamo_warnings() as seen:
        ...     logging.getLogger("torch._dynamo.convert_frame").warning("hit config.recompile_limit (8)")
        >>> seen
        ['hit config.recompile_limit (8)']
    """
    seen: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(_one_line(record.getMessage()))

    logger = logging.getLogger("torch._dynamo")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    logger.handlers, logger.propagate = [_Keep(logging.WARNING)], False
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield seen
    finally:
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)
