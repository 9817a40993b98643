"""Issue 22's targets, measured on the GPU with mentor's own tools; results as JSON under an output folder.

Parts (``--parts``, comma-separated; each writes ``<out>/<part>.json``):

- ``host``: host µs per update (:func:`mentor.lab.update_cost`'s measurement: 21 repeats of 20 calls behind a
  GPU sleep) at batch 32 and 128, 1000 classes, for the suite launching each update through Triton's
  ``JITFunction.run`` (``JitSuite``, the suite before it used :mod:`mentor._direct_launch`), the suite as it is
  (direct launches), each launcher called alone, and one
  ``add_`` (a single torch kernel launch), each pinned to the lowest allowed core, to the highest, and
  not pinned.
- ``warm``: in the training loop, the host time of the suite's update at each step, and of a second update
  made right after it (same inputs), and the same for one ``add_``: whether the loop's update is slower than
  the isolated one because the rest of the step ran in between.
- ``regimes``: :func:`mentor.lab.regimes.measure_regime` at chapter 9's points, with the loop's hook time of
  the suite (from ``eager``'s comparison when it ran first in the same call).
- ``eager``: chapter 9's block design at its six points: no metrics, the A/A copy, the suite, the suite with
  direct launches.
- ``compiled``: the model compiled with ``reduce-overhead`` (:func:`mentor.lab.compiled_loop.loop_costs`: the
  suite and the optimized torchmetrics set updated after the step) and the suite inside the compiled step
  (:func:`mentor.lab.compiled_loop.inside_costs`), at fp32 b32 and bf16 b32 96 px.
- ``kernel``: the GPU time of the suite's update. Alone: 200 updates queued behind a GPU sleep, timed with CUDA
  events from the sleep's end, so that they run back to back (batch 32 and 128, fp32 and bf16 logits). In the
  step: the step compiled with ``reduce-overhead`` with and without the update inside
  (:func:`mentor.lab.compiled_loop.step_function`), 20 steps under ``torch.profiler`` after 10 untimed ones, at
  fp32 b32 and bf16 b32 96 px; the GPU time of every kernel per step, by name, and the wall time of the 20 steps
  from CUDA events. Whether the profiler sees the kernels inside a replayed CUDA graph depends on CUPTI; the
  per-step kernel counts say whether it did.

Usage (on the GPU machine): ``python scripts/measure_targets.py --out DIR --parts host,warm,eager,regimes``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mentor import _direct_launch as direct
from mentor import _fused_kernel as kernel
from mentor.suite import FusedMetrics

CLASSES = 1000
QUICK = False
ROUNDS = int(os.environ.get("ROUNDS", "30"))
"""Rounds of the compiled comparisons (``$ROUNDS``)."""
"""``--quick``: a few steps and rounds, to check the script on the CPU (the smoke profile); no result."""


def _n(full: int, quick: int) -> int:
    return quick if QUICK else full


class JitSuite(FusedMetrics):
    """FusedMetrics whose cached launchers call ``JITFunction.run`` at every update (:func:`mentor._fused_kernel.launcher`),
    as the suite did before it used :mod:`mentor._direct_launch`; the runs in ``book/results/suite_cost_targets`` measured that
    suite as ``FusedMetrics`` and the direct one as a subclass."""

    def _checked_update(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> Any:
        run = super()._checked_update(loss, preds, target)
        return None if run is None else kernel.launcher(preds, target, self.num_classes, self.ignore_index)


@contextlib.contextmanager
def pinned(where: str) -> Any:
    """The calling thread on the lowest allowed core (``"min"``), the highest (``"max"``) or left alone."""
    allowed = os.sched_getaffinity(0)
    if where != "none":
        os.sched_setaffinity(0, {min(allowed) if where == "min" else max(allowed)})
    try:
        yield None if where == "none" else min(allowed) if where == "min" else max(allowed)
    finally:
        os.sched_setaffinity(0, allowed)


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(n)
    return (torch.rand((), device="cuda", generator=gen), torch.randn(n, CLASSES, device="cuda", generator=gen),
            torch.randint(0, CLASSES, (n,), device="cuda", generator=gen))


def host(out: Path) -> dict[str, Any]:
    from mentor.lab.update_cost import _measure

    rows = []
    for n in (32, 128):
        loss, logits, labels = _batch(n)
        suite, fast = JitSuite(CLASSES).cuda(), FusedMetrics(CLASSES).cuda()
        states = (suite.tp, suite.fp, suite.fn, suite.loss_sum, suite.loss_count, suite.invalid_labels)
        jit_run = kernel.launcher(logits, labels, CLASSES, None)
        direct_run = direct.launcher(logits, labels, CLASSES, None)
        x = torch.zeros(CLASSES, device="cuda")
        cases = {
            "FusedMetrics.update (JITFunction.run)": lambda: suite.update(loss, logits, labels),
            "FusedMetrics.update (direct launch)": lambda: fast.update(loss, logits, labels),
            "JIT launcher alone": lambda: jit_run(loss, logits, labels, states),
            "direct launcher alone": lambda: direct_run(loss, logits, labels, states),
            "one torch add_": lambda: x.add_(1),
        }
        for where in ("min", "max", "none"):
            for name, fn in cases.items():
                with pinned(where) as core:
                    cost = _measure(name, fn, 21, 3)
                rows.append({"batch": n, "pinned": where, "core": core, "name": name, "host_us": cost.host_us,
                             "interval": list(cost.host_interval), "kernels": cost.kernels, "syncs": cost.syncs,
                             "queue": cost.queue, "times_us": list(cost.repeats_us)})
                print(f"b{n:<4} {where:<5} {name:<40} {cost.host_us:8.1f} us "
                      f"[{cost.host_interval[0]:.1f}, {cost.host_interval[1]:.1f}] k={cost.kernels} s={cost.syncs}",
                      flush=True)
        rows.append({"batch": n, "direct_launches": direct_run.direct, "bound_launches": direct_run.bound})
    return {"rows": rows}


def warm(out: Path) -> dict[str, Any]:
    from mentor.lab.configs import operating_points, point_setup
    from mentor.lab.env import get_profile
    from mentor.lab.train import train

    profile = get_profile()
    rows = []
    for point in operating_points(profile):
        for label, cls in (("JITFunction.run", JitSuite), ("direct launch", FusedMetrics),
                           ("one torch add_", None)):
            setup, batches = point_setup(point, profile)
            if cls is None:
                x = torch.zeros(profile.num_classes, device=profile.device)
                update = lambda step: x.add_(1)  # noqa: E731 - the floor: one launch through torch's dispatcher
            else:
                suite = cls(profile.num_classes).to(profile.device)
                update = lambda step: suite.update(step.loss, step.output, step.labels)  # noqa: E731
            first, second = [], []

            def on_step(step: Any) -> None:
                t0 = time.perf_counter()
                update(step)
                t1 = time.perf_counter()
                update(step)
                t2 = time.perf_counter()
                first.append((t1 - t0) * 1e6)
                second.append((t2 - t1) * 1e6)

            train(setup, batches, steps=_n(200, 3), warmup=_n(20, 1), on_step=on_step)
            first, second = first[_n(20, 1):], second[_n(20, 1):]
            row = {"point": point.name, "launcher": label, "first_us": statistics.median(first),
                   "second_us": statistics.median(second), "first_p90": sorted(first)[int(0.9 * len(first))],
                   "second_p90": sorted(second)[int(0.9 * len(second))], "steps": len(first)}
            rows.append(row)
            print(f"{point.name:<14} {label:<16} first {row['first_us']:7.1f} us  second {row['second_us']:7.1f} us",
                  flush=True)
    return {"rows": rows}


def eager(out: Path) -> dict[str, Any]:
    from mentor.lab.blocks import compare_blocks
    from mentor.lab.compiled_loop import AA, aa_resolved
    from mentor.lab.configs import Config, operating_points, point_setup, suite_config
    from mentor.lab.env import get_profile

    profile = get_profile()

    def jit_config() -> Config:
        def make() -> Any:
            suite = JitSuite(profile.num_classes).to(profile.device)

            def on_report(_: int) -> None:
                torch.stack(list(suite.compute().values())).tolist()
                suite.reset()

            return (lambda s: suite.update(s.loss, s.output, s.labels)), on_report

        return Config("fused suite, JITFunction.run", make, "FusedMetrics launching through JITFunction.run")

    summary = {}
    for point in operating_points(profile):
        setup, batches = point_setup(point, profile)
        configs = [Config("no metrics"), Config(AA), jit_config(),
                   suite_config(profile.num_classes, profile.device, name="fused suite, direct launch")]
        compare_blocks(configs, setup, batches, rounds=_n(2, 1), block=10, settle=2, report_every=50, count_syncs=False)
        cmp = compare_blocks(configs, setup, batches, rounds=_n(48, 3), block=10, settle=2, report_every=50,
                             count_syncs=False, seed=9)
        safe = point.name.replace(" ", "_")
        cmp.save_json(out / f"eager_{safe}.json")
        summary[point.name] = {
            "resolved": aa_resolved(cmp),
            "overheads": {r.name: str(cmp.overhead(r.name, "throughput")) for r in cmp.results[1:]},
            "hook_ms": cmp.settings["hook_ms"], "base_ms": cmp["no metrics"].median_ms}
        print(point.name, json.dumps(summary[point.name]), flush=True)
    return summary


def regimes(out: Path, hooks: dict[str, float] | None = None) -> dict[str, Any]:
    from mentor.lab.configs import operating_points
    from mentor.lab.env import get_profile
    from mentor.lab.regimes import measure_regime, regime_table

    profile = get_profile()
    found = [measure_regime(point, profile, steps=5, hook_ms=(hooks or {}).get(point.name)) for point in
             operating_points(profile)]
    print(regime_table(found), flush=True)
    return {"rows": [dataclasses.asdict(r) for r in found]}


def compiled(out: Path) -> dict[str, Any]:
    from mentor.lab.compiled_loop import cost_table, inside_costs, loop_costs
    from mentor.lab.configs import Config, metrics_config, operating_points, suite_config
    from mentor.lab.env import get_profile

    profile = get_profile()
    points = [p for p in operating_points(profile) if p.name in ("fp32 b32", "bf16 b32 96px")]
    inside = inside_costs(points, profile, rounds=_n(ROUNDS, 2), block=10, settle=2, report_every=50, warmup_rounds=2, seed=3)
    for name, cmp in inside.items():
        cmp.save_json(out / f"inside_{name.replace(' ', '_')}.json")
    print(cost_table({p: {"reduce-overhead, inside": c} for p, c in inside.items()}), flush=True)
    configs = [Config("no metrics"), suite_config(profile.num_classes, profile.device),
               metrics_config("optimized", profile.num_classes, profile.device)]
    outside = loop_costs(points, profile, configs, modes=["reduce-overhead"], rounds=_n(ROUNDS, 2), block=10, settle=2,
                         report_every=50, warmup_rounds=2, count_syncs=False, seed=3)
    for name, by_mode in outside.items():
        by_mode["reduce-overhead"].save_json(out / f"outside_{name.replace(' ', '_')}.json")
    print(cost_table(outside), flush=True)
    return {"inside": {p: {r.name: str(c.overhead(r.name, "throughput")) for r in c.results[1:]}
                       for p, c in inside.items()},
            "outside": {p: {r.name: str(m["reduce-overhead"].overhead(r.name, "throughput"))
                            for r in m["reduce-overhead"].results[1:]} for p, m in outside.items()},
            "base_ms": {p: c["no metrics"].median_ms for p, c in inside.items()}}


def kernel_time(out: Path) -> dict[str, Any]:
    """The ``kernel`` part (see the module docstring)."""
    from mentor.lab.compiled_loop import step_function
    from mentor.lab.configs import operating_points, point_setup
    from mentor.lab.env import get_profile
    from mentor.lab.update_cost import _sleep_cycles_per_ms

    alone = []
    cycles = _sleep_cycles_per_ms()
    for n in (32, 128):
        for dtype in (torch.float32, torch.bfloat16):
            loss, logits, labels = _batch(n)
            logits = logits.to(dtype)
            suite = FusedMetrics(CLASSES).cuda()
            for _ in range(5):
                suite.update(loss, logits, labels)
            calls = _n(200, 5)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(int(cycles * 20))
            start.record()
            for _ in range(calls):
                suite.update(loss, logits, labels)
            end.record()
            queued = not start.query()  # the sleep still ran when the last update was queued
            torch.cuda.synchronize()
            row = {"batch": n, "logits": str(dtype), "calls": calls, "gpu_us_per_update": start.elapsed_time(end) * 1000 / calls,
                   "queued_behind_sleep": queued}
            alone.append(row)
            print(f"alone b{n} {dtype}: {row['gpu_us_per_update']:.2f} us per update on the GPU (queued: {queued})",
                  flush=True)
    profile = get_profile()
    points = [p for p in operating_points(profile) if p.name in ("fp32 b32", "bf16 b32 96px")]
    inside: dict[str, Any] = {}
    for point in points:
        inside[point.name] = {}
        for label in ("without", "with"):
            torch._dynamo.reset()
            setup, batches = point_setup(point, profile)
            suite = FusedMetrics(profile.num_classes).to(setup.device) if label == "with" else None
            step = step_function(setup, suite, "reduce-overhead")
            iterator = iter(batches)
            memory_format = torch.channels_last if setup.channels_last else torch.preserve_format

            def one() -> None:
                images, labels = next(iterator)
                images = images.to(setup.device, non_blocking=True, memory_format=memory_format)
                setup.optimizer.zero_grad(set_to_none=True)
                torch.compiler.cudagraph_mark_step_begin()
                step(images, labels.to(setup.device, non_blocking=True)).backward()
                setup.optimizer.step()

            for _ in range(_n(10, 3)):
                one()
            steps = _n(20, 2)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                start.record()
                for _ in range(steps):
                    one()
                end.record()
                torch.cuda.synchronize()
            kernels: dict[str, float] = {}
            count = 0
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
                    kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time / steps
                    count += 1
            top = sorted(kernels.items(), key=lambda kv: -kv[1])
            fused = {k: v for k, v in kernels.items() if "fused" in k.lower()}
            inside[point.name][label] = {"step_ms_profiled": start.elapsed_time(end) / steps,
                                         "gpu_us_per_step": sum(kernels.values()), "kernels_per_step": count / steps,
                                         "fused_kernels_us_per_step": fused, "top": top[:15]}
            print(f"{point.name} {label}: {start.elapsed_time(end) / steps:.3f} ms a step (profiled), GPU "
                  f"{sum(kernels.values()):.1f} us, {count / steps:.1f} kernels a step; fused: {fused}", flush=True)
    return {"alone": alone, "inside": inside}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="host,warm,eager,regimes")
    parser.add_argument("--quick", action="store_true", help="a few steps and rounds (a check, not a result)")
    args = parser.parse_args(argv)
    global QUICK
    QUICK = args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "triton": kernel.triton.__version__ if kernel.AVAILABLE else None,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "quick": QUICK,
            "cpus": sorted(os.sched_getaffinity(0)), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
    hooks = None
    for part in args.parts.split(","):
        start = time.perf_counter()
        if part == "regimes":
            result = regimes(args.out, hooks)
        elif part == "kernel":
            result = kernel_time(args.out)
        else:
            result = globals()[part](args.out)
        if part == "eager":
            hooks = {p: v["hook_ms"]["fused suite, direct launch"] for p, v in result.items()}
        (args.out / f"{part}.json").write_text(json.dumps(result, indent=1, default=str))
        print(f"== {part}: {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
