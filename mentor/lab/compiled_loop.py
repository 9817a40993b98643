"""What a metric update costs in the training loop when the model is compiled, at each operating point.

For each operating point and each way of running the model (:data:`MODES`: eager, ``torch.compile`` in its
default mode, and with ``mode="reduce-overhead"``, which replays CUDA graphs), :func:`loop_costs` runs the
configurations in chapter 9's block design (:func:`mentor.lab.blocks.compare_blocks`: short alternating blocks,
a new random order each round, reports inside timed steps). The configurations always include the loop
without metrics twice, the second time as :data:`AA`: an A/A comparison, whose interval must contain 0.
Where it does not, the host drifted between the two copies by more than the interval admits, and every
overhead at that point and mode is reported as unresolved (:func:`aa_resolved`), not as a result.

The metric updates here run after the optimizer step, outside the compiled region, as in chapter 9's loop;
the compiled model's backward pass is compiled too (AOTAutograd), and the optimizer step is eager. An update
inside the compiled step is chapter 14's :mod:`mentor.lab.compiled_step`. Each (point, mode) pair builds a
new model and resets dynamo (``torch._dynamo.reset``) first, so that no compiled code carries over; the
compiles fall into the warm-up blocks (``warmup_rounds`` untimed rounds before the timed ones).

Example:
    >>> from mentor.lab.configs import Config, OperatingPoint
    >>> from mentor.lab.env import get_profile
    >>> profile = get_profile("smoke").with_(num_classes=10)
    >>> costs = loop_costs([OperatingPoint("tiny", 2, 32)], profile, [Config("no metrics")], modes=["eager"],
    ...                    rounds=2, block=2, settle=1, report_every=0, warmup_rounds=0, count_syncs=False)
    >>> list(costs), [r.name for r in costs["tiny"]["eager"].results]
    (['tiny'], ['no metrics', 'no metrics, again'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from mentor.lab.blocks import compare_blocks
from mentor.lab.comparison import Comparison
from mentor.lab.configs import Config, OperatingPoint, point_setup
from mentor.lab.env import Profile
from mentor.lab.train import Setup

MODES: dict[str, dict[str, Any] | None] = {
    "eager": None,
    "default": {},
    "reduce-overhead": {"mode": "reduce-overhead"},
}
"""How the model runs: not compiled, or the ``torch.compile`` keyword arguments (with ``dynamic=False``)."""

AA = "no metrics, again"
"""The name of the second copy of the baseline, the A/A comparison."""


def compiled_setup(setup: Setup, mode: str, **compile_options: Any) -> Setup:
    """``setup`` with its model compiled as ``mode`` says (:data:`MODES`; ``"eager"`` returns it unchanged).

    ``compile_options`` go to ``torch.compile`` as well (``backend="eager"`` traces without generating code,
    for tests on the CPU). The optimizer keeps the same parameters: ``torch.compile`` wraps the module.

    Example:
        >>> from mentor.lab.train import build_setup
        >>> setup = build_setup(num_classes=10)
        >>> type(compiled_setup(setup, "default", backend="eager").model).__name__
        'OptimizedModule'
        >>> compiled_setup(setup, "eager") is setup
        True
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}.")
    options = MODES[mode]
    if options is None:
        return setup
    return dataclasses.replace(setup, model=torch.compile(setup.model, dynamic=False, **options, **compile_options))


def loop_costs(points: Sequence[OperatingPoint], profile: Profile, configs: Sequence[Config], *,
               modes: Sequence[str] = tuple(MODES), rounds: int, block: int = 10, settle: int = 2,
               report_every: int = 50, warmup_rounds: int = 2, count_syncs: bool = True, seed: int = 0,
               **compile_options: Any) -> dict[str, dict[str, Comparison]]:
    """One :func:`mentor.lab.blocks.compare_blocks` per point and mode: ``{point name: {mode: Comparison}}``.

    ``configs[0]`` is the baseline (the loop without metrics); :data:`AA`, a copy of it, is added after it
    unless present. Each pair gets a fresh model (:func:`mentor.lab.configs.point_setup`), compiled by
    :func:`compiled_setup`, and ``warmup_rounds`` untimed rounds of every configuration before the timed
    ones, so that dynamo's compiles and CUDA-graph recordings are not timed. ``seed`` orders the rounds,
    the same for every pair.
    """
    if not configs or not all(isinstance(c, Config) for c in configs):
        raise TypeError("configs must be a non-empty sequence of mentor.lab.configs.Config, the baseline first.")
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty selection of {list(MODES)}, got {list(modes)!r}.")
    if isinstance(warmup_rounds, bool) or not isinstance(warmup_rounds, int) or warmup_rounds < 0:
        raise ValueError(f"warmup_rounds must be an int >= 0, got {warmup_rounds!r}.")
    configs = list(configs)
    if AA not in [c.name for c in configs]:
        configs.insert(1, Config(AA, configs[0].make, "the baseline again: an A/A comparison, whose interval "
                                 "must contain 0"))
    out: dict[str, dict[str, Comparison]] = {}
    for point in points:
        out[point.name] = {}
        for mode in modes:
            torch._dynamo.reset()
            setup, batches = point_setup(point, profile)
            setup = compiled_setup(setup, mode, **compile_options)
            if warmup_rounds:
                compare_blocks(configs, setup, batches, rounds=warmup_rounds, block=block, settle=settle,
                               report_every=report_every, count_syncs=False, seed=seed)
            out[point.name][mode] = compare_blocks(configs, setup, batches, rounds=rounds, block=block,
                                                   settle=settle, report_every=report_every,
                                                   count_syncs=count_syncs, seed=seed)
    return out


def aa_resolved(comparison: Comparison, kind: str = "throughput") -> bool:
    """Whether the A/A interval (:data:`AA` over the baseline, ``kind`` as in ``Comparison.overhead``) contains 0.

    Example:
        >>> from mentor.lab.stats import Result
        >>> same = Comparison([Result("no metrics", "", [[10.0], [20.0], [15.0]]),
        ...                    Result(AA, "", [[10.0], [20.0], [15.0]])], "no metrics", 1)
        >>> aa_resolved(same)
        True
        >>> drifted = Comparison([Result("no metrics", "", [[10.0], [20.0], [15.0]]),
        ...                       Result(AA, "", [[11.0], [22.0], [16.5]])], "no metrics", 1)
        >>> aa_resolved(drifted)
        False
    """
    interval = comparison.overhead(AA, kind)
    return interval.has_interval and interval.lo <= 0.0 <= interval.hi


def cost_table(costs: dict[str, dict[str, Comparison]], kind: str = "throughput") -> str:
    """One line per point, mode and configuration: its overhead over the baseline (``kind``), with the A/A's
    verdict; at a pair whose A/A interval misses 0, every overhead reads ``unresolved``.

    Example:
        >>> from mentor.lab.stats import Result
        >>> cmp = Comparison([Result("no metrics", "", [[10.0], [20.0], [15.0]]),
        ...                   Result(AA, "", [[10.0], [20.0], [15.0]]),
        ...                   Result("suite", "", [[11.0], [22.0], [16.5]])], "no metrics", 1)
        >>> print(cost_table({"fp32 b32": {"eager": cmp}}))
        point       mode             configuration        overhead [95 % interval]
        fp32 b32    eager            no metrics, again    +0.0 % [0.0, 0.0]
        fp32 b32    eager            suite                +10.0 % [10.0, 10.0]
    """
    lines = [f"{'point':<12}{'mode':<17}{'configuration':<21}overhead [95 % interval]"]
    for point, by_mode in costs.items():
        for mode, comparison in by_mode.items():
            resolved = aa_resolved(comparison, kind)
            for result in comparison.results:
                if result.name == comparison.baseline:
                    continue
                text = str(comparison.overhead(result.name, kind))
                if not resolved:
                    text = "unresolved (A/A missed 0: " + text + ")" if result.name == AA else "unresolved"
                lines.append(f"{point:<12}{mode:<17}{result.name:<21}{text}")
    return "\n".join(lines)
