"""The same sweep run several times: what moved between the runs and what held (chapter 9).

A comparison's interval covers the variation between the rounds of one run, not between runs
(:meth:`mentor.lab.comparison.Comparison.overhead`). When a sweep (:func:`mentor.lab.blocks.sweep_blocks`) has
been run several times, these functions say, from the stored runs alone, how far each configuration's cost moved
between them (:func:`spread`), where a set of configurations came in the same order in every run
(:func:`order_held`), which pairs changed places (:func:`order_swaps`), and where the repeated baseline's
interval missed 0 (:func:`aa_misses`). Orders compare point estimates only: two configurations whose intervals
overlap are ordered here all the same, so an order that changes between runs may be within each run's noise.

Example:
    >>> from mentor.lab.comparison import Comparison
    >>> from mentor.lab.stats import Result
    >>> def sweep(b_ms, c_ms):
    ...     rounds = [[10.0], [10.0], [10.0]]
    ...     return {"p": Comparison([Result("a", "", rounds), Result("b", "", [[b_ms]] * 3),
    ...                              Result("c", "", [[c_ms]] * 3)], "a", 1)}
    >>> runs = {"first": sweep(11.0, 12.0), "second": sweep(12.5, 12.0)}
    >>> [round(cost, 6) for cost in spread(runs, ["b", "c"])["p"]["b"]]
    [10.0, 25.0]
    >>> order_held(runs, ["b", "c"]), order_swaps(runs, ["b", "c"])
    ([], {'p': [('b', 'c')]})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path

from mentor.lab.comparison import Comparison, load_sweep

Runs = Mapping[str, Mapping[str, Comparison]]
"""Run name -> (operating point -> comparison), in the order the runs were made."""


def load_runs(folders: Mapping[str, str | Path]) -> dict[str, dict[str, Comparison]]:
    """Each folder's sweep (:func:`mentor.lab.comparison.load_sweep`), keyed by the run's name, in the given order.

    Every run must hold the same operating points; a run that lacks one, or has another, is refused by name.
    """
    runs = {name: load_sweep(folder) for name, folder in folders.items()}
    _points(runs)
    return runs


def _points(runs: Runs) -> list[str]:
    if len(runs) < 2:
        raise ValueError(f"comparing runs needs at least two runs, got {len(runs)}: {list(runs)}")
    first_name, first = next(iter(runs.items()))
    points = list(first)
    for name, sweep in runs.items():
        if set(sweep) != set(points):
            raise ValueError(f"run {name!r} has the points {sorted(sweep)}, run {first_name!r} has {sorted(points)}: "
                             "pass runs of the same sweep")
    return points


def _costs(runs: Runs, point: str, configs: Sequence[str], kind: str) -> list[dict[str, float]]:
    """Per run, each configuration's overhead point estimate (%) at ``point``."""
    return [{c: sweep[point].overhead(c, kind=kind).point for c in configs} for sweep in runs.values()]


def spread(runs: Runs, configs: Sequence[str], kind: str = "throughput") -> dict[str, dict[str, tuple[float, float]]]:
    """Point -> configuration -> (lowest, highest) overhead point estimate over the runs, in %."""
    out = {}
    for point in _points(runs):
        costs = _costs(runs, point, configs, kind)
        out[point] = {c: (min(run[c] for run in costs), max(run[c] for run in costs)) for c in configs}
    return out


def _order(costs: Mapping[str, float]) -> tuple[str, ...]:
    return tuple(sorted(costs, key=lambda c: costs[c]))


def order_held(runs: Runs, configs: Sequence[str], kind: str = "throughput") -> list[str]:
    """The points at which ``configs`` came in the same order of overhead point estimates in every run."""
    return [point for point in _points(runs) if len({_order(run) for run in _costs(runs, point, configs, kind)}) == 1]


def order_swaps(runs: Runs, configs: Sequence[str], kind: str = "throughput") -> dict[str, list[tuple[str, str]]]:
    """Point -> the pairs of ``configs`` (in the given order) that changed places between runs; points with none
    are left out."""
    out = {}
    for point in _points(runs):
        costs = _costs(runs, point, configs, kind)
        swapped = [(a, b) for a, b in combinations(configs, 2)
                   if len({run[a] < run[b] for run in costs}) > 1]
        if swapped:
            out[point] = swapped
    return out


def lowest_in(runs: Runs, config: str, among: Sequence[str], kind: str = "throughput") -> dict[str, int]:
    """Point -> in how many runs ``config`` had the lowest overhead point estimate of ``among`` (it included)."""
    names = list(dict.fromkeys([config, *among]))
    return {point: sum(min(run, key=run.__getitem__) == config for run in _costs(runs, point, names, kind))
            for point in _points(runs)}


def aa_misses(runs: Runs, again: str, kind: str = "throughput") -> dict[str, list[str]]:
    """Run -> the points where the interval of ``again`` (the baseline run a second time) does not contain 0
    (:meth:`mentor.lab.comparison.Comparison.verdict` is "slower" or "faster"; a one-round run has no interval)."""
    _points(runs)
    out = {}
    for name, sweep in runs.items():
        out[name] = [point for point, cmp in sweep.items() if cmp.verdict(again, kind=kind) in ("slower", "faster")]
    return out
