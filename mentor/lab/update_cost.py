"""The book's tables of what metric updates cost: :func:`update_costs` of several updates and :func:`cost_table`.

What one update costs (its syncs, the kernels and copies it launches, its host microseconds with the GPU kept
busy) is measured by the library's :func:`mentor.measure.update_cost`, whose docstring says how and what it
cannot see; it, :class:`~mentor.measure.UpdateCost` and :func:`~mentor.measure.one_core` are imported here under
their old names, so ``from mentor.lab.update_cost import update_cost`` keeps working.

Example:
    >>> import torch
    >>> costs = update_costs({"add": lambda: torch.ones(3).add_(1)}, repeats=3)
    >>> [(c.name, c.syncs) for c in costs]
    [('add', 0)]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mentor.measure import (  # noqa: F401 - re-exported under their old names (the book's scripts and tests)
    LAUNCHES_PER_REPEAT,
    UpdateCost,
    _gpu_ops,
    _measure,
    _sleep_cycles_per_ms,
    _time_behind_sleep,
    one_core,
    update_cost,
)


def update_costs(cases: dict[str, Callable[[], Any]], repeats: int = 21) -> list[UpdateCost]:
    """:func:`~mentor.measure.update_cost` of each case, in order.

    Example:
        >>> [c.name for c in update_costs({"a": lambda: None, "b": lambda: None}, repeats=2)]
        ['a', 'b']
    """
    return [update_cost(name, fn, repeats=repeats) for name, fn in cases.items()]


def cost_table(costs: list[UpdateCost], width: int = 80) -> str:
    """One line per update: syncs, kernels, copies, host µs (median and 95 % interval) and the GPU's queue.

    Example:
        >>> print(cost_table([UpdateCost("mean", 2, 4, 1, [30.0, 31.0, 29.0], "idle")]))
        update                syncs kernels copies  host us [95 % interval]  queue
        mean                      2       4      1     30.0 [29.0, 31.0]     idle
    """
    name_width = width - 58  # the other columns take 49, the longest queue note 9
    lines = [f"{'update':<{name_width}}{'syncs':>5}{'kernels':>8}{'copies':>7}  {'host us [95 % interval]':<25}queue"]
    for c in costs:
        lo, hi = c.host_interval
        name = c.name if len(c.name) <= name_width - 1 else c.name[:name_width - 2] + "…"
        kernels = "-" if c.kernels is None else str(c.kernels)
        copies = "-" if c.copies is None else str(c.copies)
        host = f"{c.host_us:7.1f} [{lo:.1f}, {hi:.1f}]"
        lines.append(f"{name:<{name_width}}{c.syncs:>5}{kernels:>8}{copies:>7}  {host:<25}{c.queue}".rstrip())
    return "\n".join(lines)
