"""A metric update inside the reader's compiled step: what dynamo, inductor and CUDA graphs make of it.

:func:`step_report` runs a compiled step function that updates a metric inside it, next to the same step
compiled without the update, and reports:

- **graph breaks** (``torch._dynamo.utils.counters["graph_break"]``, every reason summed) over all steps;
- **recompiles**: graphs dynamo compiled after the warm-up steps (``counters["stats"]["unique_graphs"]``
  after them, less before), so a guard that fails at every step shows as one per step;
- **CUDA-graph skips**: graphs inductor left out of CUDA graphs (``counters["inductor"]["cudagraph_skips"]``),
  meaningful with ``mode="reduce-overhead"`` only;
- **launches per step**, with and without the update: CUDA runtime and driver calls that launch work
  (kernels, CUDA graphs), counted by ``torch.profiler`` over a few steps. Under ``reduce-overhead`` a step
  replays its graphs, so an update captured in them adds no launch. None on the CPU;
- **equal to eager**: whether the metric's states equal those of the same metric updated eagerly with the
  step's returned outputs, exactly (``torch.equal``).

Limits: the counters are process-wide; the report clears them first (``counters.clear()``) and so reads
everything compiled during its steps, by any function. The launch count sees what the profiler records on
the host thread; work launched by other threads is not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cuGraphLaunch")
"""Names of the runtime and driver calls counted as launches."""

@dataclass(frozen=True)
class StepReport:
    """What :func:`step_report` found (see the module docstring).

    Example:
        >>> print(StepReport(8, 0, 0, 0, 24.0, 24.0, True).table())
        steps                               8
        graph breaks                        0
        recompiles after warm-up            0
        CUDA-graph skips                    0
        launches per step, with update   24.0
        launches per step, without       24.0
        states equal to eager             yes
    """

    steps: int
    graph_breaks: int
    recompiles: int
    cudagraph_skips: int
    launches_with: float | None
    launches_without: float | None
    equal_to_eager: bool

    def table(self) -> str:
        """One line per finding."""
        def launches(value: float | None) -> str:
            return "n/a (CPU)" if value is None else f"{value:.1f}"

        rows = [("steps", str(self.steps)), ("graph breaks", str(self.graph_breaks)),
                ("recompiles after warm-up", str(self.recompiles)), ("CUDA-graph skips", str(self.cudagraph_skips)),
                ("launches per step, with update", launches(self.launches_with)),
                ("launches per step, without", launches(self.launches_without)),
                ("states equal to eager", "yes" if self.equal_to_eager else "no")]
        return "\n".join(f"{name:<32}{value:>5}" for name, value in rows)


def launch_calls(fn: Callable[[], Any], steps: int = 5) -> float | None:
    """Launch calls (:data:`LAUNCH_CALLS`) per call of ``fn``, over ``steps`` profiled calls; None without CUDA.

    Example:
        >>> torch.cuda.is_available() or launch_calls(lambda: None) is None
        True
    """
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    # one cycle, so keeping its events (acc_events) changes nothing but the profiler's warning that it would not
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return sum(event.name in LAUNCH_CALLS for event in prof.events()) / steps


def _call(step: Callable[..., Any], batch: Sequence[torch.Tensor]) -> Any:
    """``step(*batch)`` as a new iteration for CUDA graph trees (``torch.compiler.cudagraph_mark_step_begin``).

    Two compiled functions called in turn share one tree of CUDA graphs; without the mark, a replay may
    overwrite outputs of the other function that its backward pass still needs, and torch raises
    "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run".
    """
    torch.compiler.cudagraph_mark_step_begin()
    return step(*batch)


def step_report(with_update: Callable[..., Any], without_update: Callable[..., Any], metric: Any, reference: Any,
                batches: Iterable[Sequence[torch.Tensor]], train: Callable[[Any], None], *, steps: int = 8,
                warmup: int = 3) -> StepReport:
    """Run ``warmup + steps`` steps of ``with_update`` and of ``without_update``, then report (module docstring).

    ``with_update(*batch)`` is the compiled step that updates ``metric`` inside it; it returns
    ``(loss, logits)``. ``without_update(*batch)`` is the same step compiled without the update. After each
    call, ``train(output)`` runs the rest of the step (backward, optimizer), and ``reference`` (a fresh metric
    of the same kind) is updated eagerly with the returned loss and logits and the batch's labels.

    Example:
        >>> from mentor.suite import FusedMetrics
        >>> m, ref = FusedMetrics(3), FusedMetrics(3)
        >>> def step(x, y):
        ...     m.update(x.sum(), x, y)
        ...     return x.sum(), x
        >>> batch = (torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([0]))
        >>> r = step_report(torch.compile(step, backend="eager"), torch.compile(lambda x, y: (x.sum(), x),
        ...                 backend="eager"), m, ref, [batch], train=lambda out: None, steps=2, warmup=1)
        >>> r.graph_breaks, r.recompiles, r.equal_to_eager
        (0, 0, True)
    """
    from torch._dynamo.utils import counters

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1 (the first call compiles), got {warmup!r}.")
    batches = list(batches)
    if not batches:
        raise ValueError("batches is empty: pass at least one (images, labels) batch.")
    counters.clear()
    compiled_before = 0
    for i in range(warmup + steps):
        if i == warmup:
            compiled_before = counters["stats"]["unique_graphs"]
        batch = batches[i % len(batches)]
        out = _call(with_update, batch)
        train(out)
        loss, logits = out
        reference.update(loss.detach(), logits.detach(), batch[-1])
        train(_call(without_update, batch))
    recompiles = counters["stats"]["unique_graphs"] - compiled_before
    equal = all(torch.equal(getattr(metric, s), getattr(reference, s)) for s in metric._defaults)
    batch = batches[0]
    launches_with = launch_calls(lambda: train(_call(with_update, batch)))
    launches_without = launch_calls(lambda: train(_call(without_update, batch)))
    return StepReport(steps=warmup + steps, graph_breaks=sum(counters["graph_break"].values()), recompiles=recompiles,
                      cudagraph_skips=counters["inductor"]["cudagraph_skips"], launches_with=launches_with,
                      launches_without=launches_without, equal_to_eager=equal)
