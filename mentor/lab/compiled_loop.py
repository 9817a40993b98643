"""What a metric update costs in the training loop when the model is compiled, at each operating point.

For each operating point and each way of running the model (:data:`MODES`: eager, ``torch.compile`` in its
default mode, and with ``mode="reduce-overhead"``, which replays CUDA graphs), :func:`loop_costs` runs the
configurations in chapter 9's block design (:func:`mentor.lab.blocks.compare_blocks`: short alternating blocks,
a new random order each round, reports inside timed steps). The configurations always include the loop
without metrics twice, the second time as :data:`AA`: an A/A comparison, whose interval must contain 0.
Where it does not, the host drifted between the two copies by more than the interval admits, and every
overhead at that point and mode is reported as unresolved (:func:`aa_resolved`), not as a result.

In :func:`loop_costs` the metric updates run after the optimizer step, outside the compiled region, as in
chapter 9's loop; the compiled model's backward pass is compiled too (AOTAutograd), and the optimizer step is
eager. :func:`inside_costs` puts the suite's update *inside* the reader's compiled step instead (forward, loss
and update in one ``torch.compile``'d function, :func:`step_function`), against the same step compiled
without it, in the same block design. Each (point, mode) pair builds a new model and resets dynamo
(``torch._dynamo.reset``) first, so that no compiled code carries over; the compiles fall into the warm-up
blocks (``warmup_rounds`` untimed rounds before the timed ones).

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

import contextlib
import dataclasses
import random
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from mentor.lab.blocks import ReportSchedule, _Counted, compare_blocks
from mentor.lab.comparison import Comparison
from mentor.lab.configs import Config, OperatingPoint, point_setup
from mentor.lab.env import Profile, environment_report
from mentor.lab.stats import NOT_COUNTED, Result
from mentor.lab.train import Setup, Step, _StepClock

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
    ones, so that dynamo's compiles and CUDA-graph recordings are not timed; they report once per block (when
    ``report_every`` is not 0), so that a first, slow report is not timed either. ``seed`` orders the rounds,
    the same for every pair.
    """
    if not configs or not all(isinstance(c, Config) for c in configs):
        raise TypeError("configs must be a non-empty sequence of mentor.lab.configs.Config, the baseline first.")
    _check_modes(modes)
    if isinstance(warmup_rounds, bool) or not isinstance(warmup_rounds, int) or warmup_rounds < 0:
        raise ValueError(f"warmup_rounds must be an int >= 0, got {warmup_rounds!r}.")
    configs = list(configs)
    if AA not in [c.name for c in configs]:
        configs.insert(1, Config(AA, configs[0].make, "the baseline again: an A/A comparison, whose interval "
                                 "must contain 0"))
    out: dict[str, dict[str, Comparison]] = {}
    for point, mode, setup, batches in _each_fresh(points, profile, modes):
        setup = compiled_setup(setup, mode, **compile_options)
        if warmup_rounds:  # reports at least once per block here, so that their first run is not timed
            compare_blocks(configs, setup, batches, rounds=warmup_rounds, block=block, settle=settle,
                           report_every=min(report_every, max(1, block - settle - 1)), count_syncs=False,
                           seed=seed)
        out.setdefault(point.name, {})[mode] = compare_blocks(configs, setup, batches, rounds=rounds, block=block,
                                                              settle=settle, report_every=report_every,
                                                              count_syncs=count_syncs, seed=seed)
    return out


def _check_modes(modes: Sequence[str]) -> None:
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty selection of {list(MODES)}, got {list(modes)!r}.")


def _each_fresh(points: Sequence[OperatingPoint], profile: Profile,
                modes: Sequence[str]) -> Iterator[tuple[OperatingPoint, str, Setup, Iterable]]:
    """Each point and mode, in that order, with ``torch._dynamo.reset()`` and a fresh model and data
    (:func:`mentor.lab.configs.point_setup`), so that no compiled code carries over from one pair to the next."""
    for point in points:
        for mode in modes:
            torch._dynamo.reset()
            setup, batches = point_setup(point, profile)
            yield point, mode, setup, batches


INSIDE = "fused suite, inside"
"""The name of the configuration whose compiled step updates a :class:`mentor.suite.FusedMetrics` inside it."""

def step_function(setup: Setup, metric: Any | None = None, mode: str = "reduce-overhead",
                  **compile_options: Any) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """``step(images, labels) -> (loss, logits)``: the forward pass and the loss (under the setup's autocast) and, when
    ``metric`` is given, ``metric.update(loss, logits, labels)``, compiled as one function as :data:`MODES`
    says (``"eager"``: not compiled). This is the function a reader writes around their model (chapter 14);
    the backward pass and the optimizer step stay outside it.

    Example:
        >>> from mentor.lab.train import build_setup
        >>> from mentor.suite import FusedMetrics
        >>> setup, suite = build_setup(num_classes=10), FusedMetrics(10)
        >>> step = step_function(setup, suite, "eager")
        >>> loss, logits = step(torch.randn(2, 3, 32, 32), torch.tensor([1, 2]))
        >>> loss.ndim, tuple(logits.shape), int(suite.loss_count)
        (0, (2, 10), 1)
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}.")
    model, criterion, dtype = setup.model, setup.criterion, setup.autocast
    device_type = setup.device.type

    def step(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cast = contextlib.nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)
        with cast:
            logits = model(images)
            loss = criterion(logits, labels)
        if metric is not None:
            metric.update(loss.detach(), logits.detach(), labels)
        return loss, logits

    options = MODES[mode]
    return step if options is None else torch.compile(step, dynamic=False, **options, **compile_options)


def _time_block(step: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]], setup: Setup,
                batches: Iterable, steps: int, settle: int, hook: _Counted) -> _StepClock:
    """``settle`` untimed then ``steps`` timed training steps of ``step``; their step boundaries in train's clock
    (CUDA events, read with ``durations_ms()`` at the end of the round). After each optimizer step, outside the
    compiled step, ``hook`` (:class:`mentor.lab.blocks._Counted`, as in :func:`mentor.lab.blocks.compare_blocks`)
    gets the step's loss and logits: it updates, reports inside the timed steps its schedule says, and times its
    host span."""
    cuda = setup.device.type == "cuda"
    memory_format = torch.channels_last if setup.channels_last else torch.preserve_format
    iterator = iter(batches)
    clock = _StepClock(setup.device)
    for index in range(settle + steps):
        if index == settle:
            clock.mark()
        images, labels = next(iterator)
        images = images.to(setup.device, non_blocking=True, memory_format=memory_format)
        labels = labels.to(setup.device, non_blocking=True)
        setup.optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.compiler.cudagraph_mark_step_begin()  # each step a new iteration of the CUDA-graph tree
        loss, logits = step(images, labels)
        loss.backward()
        setup.optimizer.step()
        hook(Step(index, images, labels, logits, loss, 0.0))
        if index >= settle:
            clock.mark()
    return clock


def _synchronize(setup: Setup) -> None:
    if setup.device.type == "cuda":
        torch.cuda.synchronize(setup.device)


def _check_design(mode_list: Sequence[str], rounds: int, block: int, settle: int, report_every: int,
                  warmup_rounds: int) -> None:
    _check_modes(mode_list)
    for label, value, low in (("rounds", rounds, 1), ("block", block, 1), ("settle", settle, 0),
                              ("report_every", report_every, 0), ("warmup_rounds", warmup_rounds, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{label} must be an int >= {low}, got {value!r}.")
    if settle >= block:
        raise ValueError(f"settle ({settle}) must be smaller than block ({block}): a block needs a timed step.")
    if report_every and block - settle < 2:
        raise ValueError(f"block - settle is {block - settle} timed step with report_every={report_every}: a report "
                         "needs a timed step after it in its block; pass a block at least settle + 2 long, "
                         "e.g. block=10, settle=2, or report_every=0.")


def _compile_counts() -> dict[str, int]:
    """Dynamo's and inductor's process-wide counts so far: graphs compiled, graph breaks, CUDA-graph skips."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]), "breaks": int(sum(counters["graph_break"].values())),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}


def matrix_costs(points: Sequence[OperatingPoint], profile: Profile, configs: Sequence[Config] = (), *,
                 modes: Sequence[str] = tuple(MODES), inside: bool = True, rounds: int, block: int = 10,
                 settle: int = 2, report_every: int = 50, warmup_rounds: int = 2, seed: int = 0,
                 **compile_options: Any) -> dict[str, dict[str, Comparison]]:
    """Metric updates against the reader's compiled step: ``{point name: {mode: Comparison}}``.

    At each point and for each mode of :data:`MODES`, the training step (forward and loss, :func:`step_function`)
    runs eager or compiled, and in one block design (``block`` steps per block, ``settle`` of them untimed, a new
    random order each round, step times read once per round) it is timed: without metrics (``"no metrics"``, the
    baseline), again (:data:`AA`), with each of ``configs`` updating after the optimizer step, outside the compiled
    step (their hooks are made once and kept, their reports run inside a timed step every ``report_every`` timed
    steps, never the last of a block), and, with ``inside``, with a :class:`mentor.suite.FusedMetrics` updated
    inside the compiled step (:data:`INSIDE`). Each (point, mode) gets a fresh model and ``torch._dynamo.reset()``;
    ``warmup_rounds`` untimed rounds first take the compiles and CUDA-graph recordings, then every report runs once,
    untimed (a first report loads its kernels).

    ``settings["compile"]`` gives, per configuration, what dynamo and inductor did in its blocks: graphs compiled,
    graph breaks and CUDA-graph skips, in the warm-up (``"warmup"``) and in the timed rounds (``"timed"``: a graph
    compiled there is a recompile). The counters are process-wide and read between blocks, so a count lands on
    the configuration whose block ran. ``settings["hook_ms"]``: per outside configuration, the median host time of
    its update in a timed step without a report. Syncs are not counted here (chapter 9 counts them).

    Example:
        >>> from mentor.lab.env import get_profile
        >>> profile = get_profile("smoke").with_(num_classes=10)
        >>> costs = matrix_costs([OperatingPoint("tiny", 2, 32)], profile, [Config("nothing")], modes=["eager"],
        ...                      rounds=2, block=3, settle=1, report_every=1, warmup_rounds=0)
        >>> [r.name for r in costs["tiny"]["eager"].results]
        ['no metrics', 'no metrics, again', 'nothing', 'fused suite, inside']
    """
    from mentor.suite import FusedMetrics

    if not all(isinstance(c, Config) for c in configs):
        raise TypeError("configs must be a sequence of mentor.lab.configs.Config (the updates outside the step).")
    _check_design(list(modes), rounds, block, settle, report_every, warmup_rounds)
    names = ["no metrics", AA, *[c.name for c in configs]] + ([INSIDE] if inside else [])
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique and not {['no metrics', AA, INSIDE]}, got {names}.")
    out: dict[str, dict[str, Comparison]] = {}
    for point, mode, setup, batches in _each_fresh(points, profile, modes):
        plain = step_function(setup, None, mode, **compile_options)
        entries = {"no metrics": (plain, Config("no metrics")), AA: (plain, Config(AA))}
        entries |= {c.name: (plain, c) for c in configs}
        suite = None
        if inside:
            suite = FusedMetrics(profile.num_classes).to(setup.device)

            def make(suite: Any = suite) -> tuple[None, Callable[[int], None]]:
                def report(_: int) -> None:
                    # compute() reads nothing back; the values, its count of invalid labels too, come back in one copy
                    torch.stack(list(suite.compute().values())).tolist()
                    suite.reset()

                return None, report

            entries[INSIDE] = (step_function(setup, suite, mode, **compile_options), Config(INSIDE, make))
        out.setdefault(point.name, {})[mode] = _time_matrix(entries, setup, batches, point, mode, rounds=rounds,
                                                            block=block, settle=settle, report_every=report_every,
                                                            warmup_rounds=warmup_rounds, seed=seed, suite=suite)
    return out


def _time_matrix(entries: dict[str, tuple[Any, Config]], setup: Setup, batches: Iterable, point: OperatingPoint,
                 mode: str, *, rounds: int, block: int, settle: int, report_every: int, warmup_rounds: int,
                 seed: int, suite: Any | None) -> Comparison:
    names = list(entries)
    rng = random.Random(seed)
    hooks = {name: _Counted(config, report_every, settle, block - settle) for name, (_, config) in entries.items()}
    per_round: dict[str, list[list[float]]] = {name: [] for name in names}
    report_steps: dict[str, list[list[int]]] = {name: [] for name in names}
    compiled = {name: {phase: dict.fromkeys(("graphs", "breaks", "cudagraph_skips"), 0)
                       for phase in ("warmup", "timed")} for name in names}
    orders: list[list[str]] = []
    for k in range(-warmup_rounds, rounds):
        if k == 0 and warmup_rounds:  # the warm-up is over: count and time afresh, with the same metrics
            if report_every:
                _synchronize(setup)
                for hook in hooks.values():  # a first report loads its kernels: untimed, like the compiles
                    if hook.on_report is not None:
                        hook.on_report(0)
            for hook in hooks.values():
                hook.schedule, hook.host_ms, hook.report_at = ReportSchedule(hook.schedule.every), [], []
        if k <= 0 and suite is not None:
            suite.reset()
        order = list(names)
        rng.shuffle(order)
        pending = []
        for name in order:
            hook, before, reported = hooks[name], _compile_counts(), len(hooks[name].report_at)
            clock = _time_block(entries[name][0], setup, batches, block - settle, settle, hook)
            after = _compile_counts()
            phase = compiled[name]["timed" if k >= 0 else "warmup"]
            for key in phase:
                phase[key] += after[key] - before[key]
            pending.append((name, clock))
            if k >= 0:
                report_steps[name] += [[k, p] for p in hook.report_at[reported:]]
        durations = [(name, clock.durations_ms()) for name, clock in pending]  # waits for the round once
        if k >= 0:
            orders.append(order)
            for name, ms in durations:
                per_round[name].append(ms)
    results = [Result(name, entries[name][1].description, per_round[name], [], None, None, NOT_COUNTED)
               for name in names]
    hook_ms = {name: statistics.median(h.host_ms) for name, h in hooks.items() if h.on_step is not None and h.host_ms}
    settings = dict(design="blocks", block=block, settle=settle, steps=block - settle, warmup=settle, rounds=rounds,
                    report_every=report_every, seed=seed, orders=orders, report_steps=report_steps, hook_ms=hook_ms,
                    mode=mode, warmup_rounds=warmup_rounds, compile=compiled)
    return Comparison(results, baseline="no metrics", batch_size=point.batch_size, settings=settings,
                      environment=environment_report())


def inside_costs(points: Sequence[OperatingPoint], profile: Profile, *, mode: str = "reduce-overhead",
                 rounds: int, block: int = 10, settle: int = 2, report_every: int = 50, warmup_rounds: int = 2,
                 seed: int = 0, **compile_options: Any) -> dict[str, Comparison]:
    """The cost of updating a :class:`mentor.suite.FusedMetrics` inside the compiled step: ``{point: Comparison}``.

    :func:`matrix_costs` at one ``mode`` with no configuration outside the step: ``"no metrics"``, the
    :func:`step_function` compiled without the update; :data:`AA`, the same compiled function again; and
    :data:`INSIDE`, the step compiled with the suite's update in it, whose report (``compute()``, every value
    read back in one copy, ``reset()``) runs inside the timed step that completes every ``report_every`` timed
    steps (or the next block's first timed step, when that one is the last of its block: the step after a report
    is always timed). After the warm-up rounds the report runs once untimed (in a run on the H200 the first
    report was far slower than the later ones; timed, it would have counted as the suite's cost).

    Example:
        >>> from mentor.lab.env import get_profile
        >>> profile = get_profile("smoke").with_(num_classes=10)
        >>> costs = inside_costs([OperatingPoint("tiny", 2, 32)], profile, mode="eager", rounds=2, block=3,
        ...                      settle=1, report_every=1, warmup_rounds=0)
        >>> [r.name for r in costs["tiny"].results], costs["tiny"].settings["report_steps"][INSIDE]
        (['no metrics', 'no metrics, again', 'fused suite, inside'], [[0, 0], [1, 0]])
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}.")
    costs = matrix_costs(points, profile, (), modes=[mode], rounds=rounds, block=block, settle=settle,
                         report_every=report_every, warmup_rounds=warmup_rounds, seed=seed, **compile_options)
    return {name: by_mode[mode] for name, by_mode in costs.items()}


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


def _name_width(costs: dict[str, dict[str, Comparison]], names: Any) -> int:
    return max([len("configuration")] + [len(n) for by_mode in costs.values() for c in by_mode.values()
                                         for n in names(c)])


def cost_table(costs: dict[str, dict[str, Comparison]], kind: str = "throughput") -> str:
    """One block per point and mode, one line per configuration: its overhead over the baseline (``kind``).
    A block whose A/A interval misses 0 says so in its heading: its overheads are printed, but nothing in it is
    resolved. Names are never cut: the name column is as wide as the longest.

    Example:
        >>> from mentor.lab.stats import Result
        >>> cmp = Comparison([Result("no metrics", "", [[10.0], [20.0], [15.0]]),
        ...                   Result(AA, "", [[10.0], [20.0], [15.0]]),
        ...                   Result("suite", "", [[11.0], [22.0], [16.5]])], "no metrics", 1)
        >>> print(cost_table({"fp32 b32": {"eager": cmp}}))
        configuration        overhead [95 % interval]
        fp32 b32, eager
          no metrics, again  +0.0 % [0.0, 0.0]
          suite              +10.0 % [10.0, 10.0]
    """
    width = _name_width(costs, lambda c: [r.name for r in c.results if r.name != c.baseline])
    lines = [f"{'configuration':<{width + 4}}overhead [95 % interval]"]
    for point, by_mode in costs.items():
        for mode, comparison in by_mode.items():
            resolved = aa_resolved(comparison, kind)
            lines.append(f"{point}, {mode}" + ("" if resolved else ": unresolved, its A/A interval missed 0"))
            for result in comparison.results:
                if result.name != comparison.baseline:
                    lines.append(f"  {result.name:<{width}}  {comparison.overhead(result.name, kind)}")
    return "\n".join(lines)


def compile_counts_table(costs: dict[str, dict[str, Comparison]]) -> str:
    """One block per point and mode of a :func:`matrix_costs` run, one line per configuration: graphs compiled,
    graph breaks and CUDA-graph skips in its blocks, in the warm-up and in the timed rounds (a graph compiled
    there is a recompile).

    Example:
        >>> from mentor.lab.stats import Result
        >>> counts = {"warmup": {"graphs": 2, "breaks": 0, "cudagraph_skips": 0},
        ...           "timed": {"graphs": 0, "breaks": 1, "cudagraph_skips": 0}}
        >>> cmp = Comparison([Result("no metrics", "", [[1.0]])], "no metrics", 1,
        ...                  settings={"compile": {"no metrics": counts}})
        >>> print(compile_counts_table({"fp32 b32": {"default": cmp}}))
                        warm-up              timed
        configuration   graphs breaks skips  graphs breaks skips
        fp32 b32, default
          no metrics         2      0     0       0      1     0
    """
    width = _name_width(costs, lambda c: list(c.settings.get("compile", {})))
    phase_head = f"{'graphs':>6}{'breaks':>7}{'skips':>6}"
    lines = [f"{'':<{width + 3}}{'warm-up':<21}timed", f"{'configuration':<{width + 3}}{phase_head}  {phase_head}"]
    for point, by_mode in costs.items():
        for mode, comparison in by_mode.items():
            lines.append(f"{point}, {mode}")
            for name, phases in comparison.settings.get("compile", {}).items():
                cells = "  ".join("".join(f"{phases[phase][key]:>{w}}" for key, w in
                                          (("graphs", 6), ("breaks", 7), ("cudagraph_skips", 6)))
                                  for phase in ("warmup", "timed"))
                lines.append(f"  {name:<{width}} {cells}")
    return "\n".join(lines)
