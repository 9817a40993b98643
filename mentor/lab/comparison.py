"""The result of a comparison: overheads with intervals, verdicts, a table, JSON, and sweeps of comparisons.

A :class:`Comparison` holds one :class:`mentor.lab.stats.Result` per configuration, all timed in the
same interleaved rounds (:func:`mentor.lab.compare.compare`, :func:`mentor.lab.blocks.compare_blocks`).
Its overheads against the baseline (the first configuration) come with paired bootstrap intervals
over rounds (:func:`mentor.lab.stats.paired_overhead`). A sweep is a dict of comparisons by operating
point, saved and loaded by :func:`save_sweep` and :func:`load_sweep`.

Example:
    >>> base = Result("none", "", [[10.0, 10.0], [12.0, 12.0], [11.0, 11.0]])
    >>> slow = Result("metrics", "", [[11.0, 11.0], [13.2, 13.2], [12.1, 12.1]])
    >>> cmp = Comparison([base, slow], baseline="none", batch_size=4)
    >>> print(cmp.overhead("metrics"))
    +10.0 % [10.0, 10.0]
    >>> cmp.verdict("metrics")
    'slower'
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mentor.lab.stats import KINDS, Interval, Result, _short, paired_overhead
from mentor.lab.wording import resolved, side

_VERDICTS = {"above 0": "slower", "below 0": "faster", "containing 0": "no difference resolved",
             "not resolved": "no difference resolved", "without an interval": "no interval (1 round)"}
"""A verdict for each answer of :func:`mentor.lab.wording.resolved` (and :func:`~mentor.lab.wording.side`)."""
AA_NAMES = ("no metrics, again", "no metrics again")
"""The names under which the book's comparisons run the baseline a second time (the A/A): see :attr:`Comparison.aa`."""

NAME_WIDTH = 22
"""Configuration names longer than this are truncated in :meth:`Comparison.table`."""

TABLE_WIDTH = 80
"""The widest line of :meth:`Comparison.table`: it fits a book page at desktop width without scrolling."""


@dataclass
class Comparison:
    """The results of :func:`mentor.lab.compare.compare`: overheads with bootstrap intervals, a table, a chart and JSON.

    ``settings`` holds how the runs were made, including ``seed`` and ``orders`` (the order
    the configurations ran in, round by round).
    """

    results: list[Result]
    baseline: str
    batch_size: int
    settings: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.results or not all(isinstance(r, Result) for r in self.results):
            raise TypeError("Comparison.results must be a non-empty list of mentor.lab.stats.Result.")
        names = [r.name for r in self.results]
        if len(set(names)) != len(names):
            raise ValueError(f"Comparison result names must be unique, got {names}.")
        if self.baseline not in names:
            raise KeyError(f"baseline {self.baseline!r} is not among the results {names}; pass one of them.")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (images per step), got {self.batch_size!r}.")
        counts = {r.name: r.rounds for r in self.results}
        if len(set(counts.values())) != 1:
            raise ValueError(f"every result needs the same number of rounds (the bootstrap pairs rounds), "
                             f"got {counts}.")
        seed = self.settings.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"settings['seed'] must be an int, got {seed!r}.")

    @property
    def rounds(self) -> int:
        """Number of rounds (the same for every configuration)."""
        return self.results[0].rounds

    @property
    def seed(self) -> int:
        """The seed of the run order, also used for the bootstrap (0 when not recorded)."""
        return int(self.settings.get("seed", 0))

    def __getitem__(self, name: str) -> Result:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no configuration {name!r}; have {[r.name for r in self.results]}")

    def ratio(self, name: str) -> float:
        """Median step time of ``name`` over the baseline's (pooled over rounds)."""
        return self[name].median_ms / self[self.baseline].median_ms

    def overhead(self, name: str, kind: str = "median", level: float = 0.95, against: str | None = None) -> Interval:
        """Overhead of ``name`` over the baseline in percent, with a paired bootstrap interval over rounds.

        ``against`` names another configuration of the same rounds to compare with instead of
        the baseline (for example the float weight against the plain update). ``kind`` and the
        interval are :func:`mentor.lab.stats.paired_overhead`'s, seeded with ``settings["seed"]``;
        the interval covers the variation between the rounds of this run, not between runs.

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
            >>> cmp.overhead("b").fmt(3), cmp.overhead("a").fmt(3)
            ('+10.000 % [10.000, 10.000]', '+0.000 % [0.000, 0.000]')
        """
        base = self.baseline if against is None else self[against].name
        return paired_overhead(self[name].round_step_ms, self[base].round_step_ms, kind, level, self.seed)

    @property
    def aa(self) -> str | None:
        """The configuration that runs the baseline a second time (the A/A; its name is one of :data:`AA_NAMES`),
        or None when the comparison has none."""
        return next((r.name for r in self.results if r.name in AA_NAMES and r.name != self.baseline), None)

    def verdict(self, name: str, kind: str = "median", against: str | None = None) -> str:
        """``"slower"`` or ``"faster"`` when the run resolves a difference by the book's rule
        (:func:`mentor.lab.wording.resolved`, with this comparison's A/A of the same ``kind`` when it has one), else
        ``"no difference resolved"``; the A/A itself is judged by the side of 0 its interval lies on.

        ``"baseline"`` for the baseline, ``"no interval (1 round)"`` with one round.

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[9.0], [18.0]])], "a", 1)
            >>> cmp.verdict("a"), cmp.verdict("b")
            ('baseline', 'faster')
        """
        return self._judge(name, self.overhead(name, kind, against=against), against, kind)

    def _judge(self, name: str, interval: Interval, against: str | None = None, kind: str = "median") -> str:
        if name == (self.baseline if against is None else against):
            return "baseline"
        aa = self.aa
        if aa is None or name == aa or self.rounds < 2:
            return _VERDICTS[side(interval)]
        return _VERDICTS[resolved(interval, self.overhead(aa, kind))]

    def images_per_s(self, name: str) -> float:
        """Images per second over all timed steps, report steps included: batch x steps / total time."""
        r = self[name]
        return self.batch_size * len(r.step_ms) / (math.fsum(r.total_ms) / 1000.0)

    def report_ms(self, name: str) -> float | None:
        """Median time of the steps that ran ``on_report`` (``None`` when no step did).

        A block comparison reports at other positions in each round: its ``settings["report_steps"]`` (per
        configuration, ``[round, position]`` pairs) say where, and are used when they name ``name``.

        Example:
            >>> from mentor.lab.stats import Result
            >>> blocks = Comparison([Result("a", "", [[1.0, 1.0], [1.0, 1.0]]), Result("b", "", [[1.0, 9.0], [7.0, 1.0]])],
            ...                     "a", 4, settings={"report_steps": {"a": [], "b": [[0, 1], [1, 0]]}})
            >>> blocks.report_ms("b"), blocks.report_ms("a")
            (8.0, None)
        """
        where = (self.settings.get("report_steps") or {}).get(name)
        if where is not None:
            rounds = self[name].round_step_ms
            times = [rounds[k][p] for k, p in where]
        else:
            times = self[name].report_step_ms
        return statistics.median(times) if times else None

    def facts(self, name: str) -> dict[str, Any]:
        """The numbers the book's prose quotes about ``name`` (for ``glue``): formatted intervals, plain numbers.

        ``overhead`` and ``tput_overhead`` are ``str(Interval)``; ``syncs`` and ``report_syncs``
        are NaN when not counted, so that number formats still apply (``syncs_note`` says why).

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 4)
            >>> f = cmp.facts("b")
            >>> f["overhead"], f["verdict"], f["median_ms"], round(f["images_per_s"], 1)
            ('+10.0 % [10.0, 10.0]', 'slower', 16.5, 242.4)
        """
        r = self[name]
        median, tput = self.overhead(name, "median"), self.overhead(name, "throughput")
        report = self.report_ms(name)
        return {
            "median_ms": r.median_ms, "images_per_s": self.images_per_s(name),
            "overhead": str(median), "tput_overhead": str(tput),
            "verdict": self._judge(name, median), "tput_verdict": self._judge(name, tput, kind="throughput"),
            "report_ms": math.nan if report is None else report,
            "syncs": math.nan if r.syncs_per_step is None else r.syncs_per_step,
            "report_syncs": math.nan if r.report_syncs is None else r.report_syncs,
            "syncs_note": r.syncs_note or "",
        }

    def rows(self) -> list[dict[str, Any]]:
        """One dict per configuration with every value of :meth:`table` as numbers (``None`` when undefined)."""
        out = []
        for r in self.results:
            row: dict[str, Any] = {"config": r.name, "description": r.description, "median_ms": r.median_ms,
                                   "ratio": self.ratio(r.name)}
            verdicts = {}
            for kind, prefix in (("median", "overhead"), ("throughput", "throughput_overhead")):
                iv = self.overhead(r.name, kind)
                row[f"{prefix}_pct"] = iv.point
                row[f"{prefix}_lo"] = iv.lo if iv.has_interval else None
                row[f"{prefix}_hi"] = iv.hi if iv.has_interval else None
                verdicts[kind] = self._judge(r.name, iv, kind=kind)
            row.update({
                "images_per_s": self.images_per_s(r.name), "total_ms": math.fsum(r.total_ms),
                "report_ms": self.report_ms(r.name), "syncs_per_step": r.syncs_per_step,
                "report_syncs": r.report_syncs, "syncs_note": r.syncs_note,
                "verdict": verdicts["median"], "throughput_verdict": verdicts["throughput"],
            })
            out.append(row)
        return out

    def table(self) -> str:
        """A plain-text table, at most 80 characters wide: one row per configuration, then a legend.

        Columns: configuration (truncated to fit, at most 22 characters), median step time,
        the overhead of the median step time and of the total time (report steps included),
        each in % with its interval, syncs per step and syncs of one report call. Images per
        second and verdicts are in :meth:`rows` and :meth:`facts`.

        Example:
            >>> cmp = Comparison([Result("base", "", [[10.0], [20.0]]), Result("cfg", "", [[11.0], [22.0]])], "base", 8)
            >>> print(cmp.table().splitlines()[4])
            cfg      16.50  +10.0 [10.0, 10.0]  +10.0 [10.0, 10.0]      -      -
        """
        body = []
        for r in self.results:
            cells: list[str | None] = [r.name, f"{r.median_ms:.2f}"]
            for kind in KINDS:
                iv = self.overhead(r.name, kind)
                cells.append(iv.cell(1))
            if r.syncs_per_step is None and r.syncs_note:  # the note spans both sync columns
                cells += [r.syncs_note, None]
            else:
                cells += ["-" if r.syncs_per_step is None else f"{r.syncs_per_step:g}",
                          "-" if r.report_syncs is None else f"{r.report_syncs:g}"]
            body.append(cells)
        head = [("config", ""), ("median", "ms"), ("overhead %", "median step"), ("overhead %", "total time"),
                ("syncs", "/step"), ("syncs", "/rep")]
        gap = [0, 2, 2, 2, 2, 2]  # spaces before each column
        right = {1, 4, 5}
        widths = [max([len(h1), len(h2)] + [len(c[i] or "") for c in body if c[5] is not None or i != 4])
                  for i, (h1, h2) in enumerate(head)]
        span = max([widths[4] + gap[5] + widths[5]] + [len(c[4] or "") for c in body if c[5] is None])
        widths[5] = span - widths[4] - gap[5]
        rest = sum(widths[1:]) + sum(gap)
        widths[0] = max(len("config"), min(NAME_WIDTH, max(len(c[0] or "") for c in body), TABLE_WIDTH - rest))
        for c in body:
            c[0] = _short(c[0] or "", widths[0])

        def line(cells: Sequence[str | None]) -> str:
            out = ""
            for i, cell in enumerate(cells):
                if cell is None:
                    continue
                if i == 4 and cells[5] is None:
                    text = cell.rjust(span)
                else:
                    text = cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                out += " " * gap[i] + text
            return out.rstrip()

        lines = [line([h[0] for h in head]), line([h[1] for h in head])]
        lines.append("-" * max(len(s) for s in lines + [line(c) for c in body]))
        lines += [line(c) for c in body]
        n = self.rounds
        lines.append(f"overhead vs {_short(self.baseline, 20)} [95 % bootstrap interval, {n} rounds]"
                     if n > 1 else f"overhead vs {_short(self.baseline, 20)}, one round: no interval")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready: settings (seed, orders), every step of every round, and :meth:`rows`."""
        results = []
        for r in self.results:
            d = asdict(r)
            d.update(round_medians_ms=r.round_medians_ms, total_ms=r.total_ms, step_ms=r.step_ms)
            results.append(d)
        return {"baseline": self.baseline, "batch_size": self.batch_size, "settings": self.settings,
                "environment": self.environment, "rows": self.rows(), "results": results}

    def save_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` to ``path``; :meth:`load_json` reads it back."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load_json(cls, path: str | Path) -> Comparison:
        """Rebuild a :class:`Comparison` from a file written by :meth:`save_json`.

        Example:
            >>> import os, tempfile
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
            >>> path = cmp.save_json(os.path.join(tempfile.mkdtemp(), "cmp.json"))
            >>> str(Comparison.load_json(path).overhead("b"))
            '+10.0 % [10.0, 10.0]'
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no comparison file at {path}; write one with Comparison.save_json(path).")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON ({err}); pass a file written by Comparison.save_json.") from None
        missing = [k for k in ("baseline", "batch_size", "results") if not isinstance(data, dict) or k not in data]
        if missing:
            raise ValueError(f"{path} lacks {missing}; pass a file written by Comparison.save_json.")
        names = {f.name for f in fields(Result)}
        results = []
        for d in data["results"]:
            if "round_step_ms" not in d:
                raise ValueError(f"{path}: result {d.get('name')!r} has no round_step_ms; it was saved by an older "
                                 "mentor.lab.bench; re-run the comparison.")
            results.append(Result(**{k: v for k, v in d.items() if k in names}))
        return cls(results, baseline=data["baseline"], batch_size=data["batch_size"],
                   settings=data.get("settings", {}), environment=data.get("environment", {}))

    def plot(self, ax: Any = None, kind: str = "median") -> Any:
        """Horizontal bars of each configuration's overhead with its interval (:func:`mentor.lab.plots.plot_comparison`).

        Part I's chapters, whose stored runs call it, draw with it; new code calls :mod:`mentor.lab.plots` directly.
        """
        from mentor.lab.plots import plot_comparison

        return plot_comparison(self, ax=ax, kind=kind)

    def figure(self, kind: str = "throughput") -> Any:
        """:meth:`plot` in a figure of its own, detached from pyplot (:func:`mentor.lab.plots.comparison_figure`).

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
            >>> cmp.figure().axes[0].get_yticklabels()[0].get_text()
            'b'
        """
        from mentor.lab.plots import comparison_figure

        return comparison_figure(self, kind=kind)


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def save_sweep(results: dict[str, Comparison], folder: str | Path) -> list[Path]:
    """Write each comparison of :func:`mentor.lab.compare.sweep` to ``folder/NN_<point>.json``; :func:`load_sweep` reads them back.

    Example:
        >>> import tempfile
        >>> cmp = Comparison([Result("a", "", [[10.0]]), Result("b", "", [[11.0]])], "a", 1)
        >>> [p.name for p in save_sweep({"fp32 b128": cmp}, tempfile.mkdtemp())]
        ['00_fp32_b128.json']
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("[0-9][0-9]_*.json"):
        old.unlink()
    return [cmp.save_json(folder / f"{k:02d}_{_slug(name)}.json") for k, (name, cmp) in enumerate(results.items())]


def load_sweep(folder: str | Path) -> dict[str, Comparison]:
    """The comparisons that :func:`save_sweep` wrote, by point name, in their order.

    Example:
        >>> import tempfile
        >>> cmp = Comparison([Result("a", "", [[10.0]]), Result("b", "", [[11.0]])], "a", 1,
        ...                  settings={"point": {"name": "fp32 b128"}})
        >>> folder = tempfile.mkdtemp(); _ = save_sweep({"fp32 b128": cmp}, folder)
        >>> list(load_sweep(folder))
        ['fp32 b128']
    """
    paths = sorted(Path(folder).glob("[0-9][0-9]_*.json"))
    if not paths:
        raise FileNotFoundError(f"no sweep files (NN_<point>.json) in {folder}; write them with save_sweep().")
    out = {}
    for path in paths:
        cmp = Comparison.load_json(path)
        name = cmp.settings.get("point", {}).get("name", path.stem[3:])
        out[name] = cmp
    return out


def sweep_table(results: dict[str, Comparison], kind: str = "throughput") -> str:
    """Baseline step time and each configuration's overhead with its interval, one line per point.

    Example:
        >>> base = Result("none", "", [[10.0], [12.0]]); slow = Result("m", "", [[11.0], [13.2]])
        >>> print(sweep_table({"p": Comparison([base, slow], "none", 4)}))
        point           base ms  m
        p                 11.00  +10.0 [10.0, 10.0]
    """
    if not results:
        raise ValueError("results is empty: pass the dict that sweep() returns.")
    first = next(iter(results.values()))
    names = [r.name for r in first.results if r.name != first.baseline]
    width = 20
    lines = [f"{'point':<14}{'base ms':>9}  " + "".join(f"{_short(n, width):<{width}}" for n in names).rstrip()]
    for point, cmp in results.items():
        cells = "".join(f"{str(cmp.overhead(n, kind=kind)).replace(' %', ''):<{width}}" for n in names)
        lines.append(f"{_short(point, 14):<14}{cmp[cmp.baseline].median_ms:>9.2f}  {cells}".rstrip())
    return "\n".join(lines)


