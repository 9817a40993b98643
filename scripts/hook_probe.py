"""Why an update that takes 12 µs of host time on its own takes about 80 µs in chapter 9's loop (issue 43, item 2).

``python scripts/hook_probe.py --out DIR`` (on the GPU machine) writes ``DIR/hook_probe.json``: under ``update_us``, the host
µs of one ``FusedMetrics.update`` (``perf_counter`` around the call; median, p10 and p90 of ``--repeats`` calls) when the
calls run

- ``back to back``: one after the other, inputs without autograd history (how ``update_cost`` measures);
- ``autograd inputs``: the same, with the loss and logits of a forward pass that requires grad, as a loop
  passes them;
- ``after other Python``: between two calls the host runs ``--churn`` µs of unrelated Python that walks
  a few MB of objects, which evicts the update's code and data from the CPU's caches as a training
  step's Python does;
- ``after a training step``: between two calls a small model's forward, backward and SGD step, on the GPU;
- ``behind a full queue`` (CUDA only): before each call the host queues ``--queued`` kernels that each keep the
  GPU busy about 20 µs (``torch.cuda._sleep`` of 20 µs worth of the card's maximum clock), as a GPU-bound loop
  whose host runs ahead queues them. CUDA does not document how many launches a stream's queue holds before a
  launch blocks; when ``--queued`` is more than that, the update's launch waits for room, and its time shows it.

``wrapper_us`` takes the call apart (issue 43: which part of the update the churn slows), each call timed back to
back and after other Python as above:

- ``update``: ``suite.update(...)`` as a loop calls it, through the wrapper that torchmetrics' ``Metric.__init__``
  puts around every metric's ``update`` (``Metric._wrap_update``, ``torchmetrics/metric.py:542-564`` in 1.9.0: it
  sets ``_computed`` to None and adds 1 to ``_update_count``, each through ``Metric.__setattr__`` and then
  ``nn.Module.__setattr__``, runs the update inside ``torch.set_grad_enabled(self._enable_grad)``, False outside
  ``forward``, and checks ``compute_on_cpu``);
- ``update without the wrapper``: ``FusedMetrics.update(suite, ...)``, the method itself (the launch);
- ``wrapper around an empty update``: the wrapper of a metric whose ``update`` does nothing;
- ``set_grad_enabled(False)``: entering and leaving that context alone;
- ``Metric.__setattr__``: ``suite._computed = None`` alone.

``launch_us`` (CUDA only; the smoke run records why it is absent) takes the method's launch path apart the same way:

- ``launcher call``: the cached launcher (``mentor._direct_launch.DirectLauncher``) called as ``update`` calls it,
  without the key and its lookup;
- ``Triton's launch alone``: the compiled kernel's own launcher (``CompiledKernel.run``, Triton's C launch), called
  with the arguments the launcher call passes it and a stream read once before, without the checks below;
- ``aligned(inputs and states)``, ``torch.cuda.current_device()``, ``hooks_idle()`` (Triton's launch hooks) and
  ``Triton's get_current_stream``: the launcher's checks and its stream, each alone.

In the other ways the GPU's queue is kept short (a synchronize every 8 calls, outside the timed call), so no
call waits for room in it. Limits: it shows which of these conditions makes the call slower, not which hardware counter; the
churn is a stand-in for a training step's Python, not that Python. ``--smoke`` runs a few calls on the CPU: a
check of the script, not a result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median": statistics.median(xs), "p10": xs[len(xs) // 10], "p90": xs[(9 * len(xs)) // 10], "n": len(xs)}


def _churn(objects: list[dict[str, int]], us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    total = 0
    while time.perf_counter() < end:
        for o in objects[::7]:
            total += o["a"]
    objects[0]["a"] = total % 3


def probe(device: torch.device, repeats: int, churn_us: float, queued: int = 1500) -> dict[str, dict]:
    """``{"update_us": way -> stats, "wrapper_us": ..., "launch_us": ...}``, as the module docstring describes."""
    from mentor.suite import FusedMetrics

    suite = FusedMetrics(1000).to(device)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1000)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256, device=device)
    target = torch.randint(0, 1000, (32,), device=device)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, target)
    plain = (loss.detach(), logits.detach(), target)
    objects = [{"a": i, "b": str(i)} for i in range(200_000)]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        torch.nn.functional.cross_entropy(out, target).backward()
        opt.step()

    def fill_queue() -> None:
        for _ in range(queued):
            torch.cuda._sleep(sleep_cycles)

    ways = {
        "back to back": (plain, None),
        "autograd inputs": ((loss, logits, target), None),
        "after other Python": (plain, lambda: _churn(objects, churn_us)),
        "after a training step": ((loss, logits, target), step),
    }
    if device.type == "cuda":  # about 20 µs of GPU time per sleep kernel at the card's clock
        khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 1_980_000)  # kHz
        sleep_cycles = int(20e-6 * khz * 1e3)
        ways["behind a full queue"] = (plain, fill_queue)
    out = {}
    for name, (args, between) in ways.items():
        sync = device.type == "cuda" and name != "behind a full queue"
        out[name] = _timed(lambda a=args: suite.update(*a), between, repeats, sync)
        print(f"{name:<24}{out[name]['median']:8.1f} µs  [{out[name]['p10']:.1f}, {out[name]['p90']:.1f}]")
    churn = lambda: _churn(objects, churn_us)  # noqa: E731
    return {"update_us": out, "wrapper_us": wrapper_probe(suite, plain, churn, repeats, device),
            "launch_us": launch_probe(suite, plain, churn, repeats, device)}


def _timed(call, between, repeats: int, sync: bool) -> dict[str, float]:
    """The host µs of ``repeats`` calls after 20 untimed ones, ``between()`` (if any) before each, the GPU's queue
    drained every 8 calls outside the timed call where ``sync``."""
    times = []
    for i in range(repeats + 20):
        if between is not None:
            between()
        if i % 8 == 0 and sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        if i >= 20:
            times.append((t1 - t0) * 1e6)
    return _stats(times)


def _time_calls(calls: dict, churn, repeats: int, device: torch.device) -> dict[str, dict[str, dict[str, float]]]:
    """Each call timed back to back and after ``churn``: call -> condition -> stats of the host µs."""
    out = {name: {condition: _timed(call, between, repeats, device.type == "cuda")
                  for condition, between in (("back to back", None), ("after other Python", churn))}
           for name, call in calls.items()}
    for name, by in out.items():
        print(f"{name:<32}" + "".join(f"{c}: {v['median']:7.1f} µs  " for c, v in by.items()))
    return out


def launch_probe(suite: torch.nn.Module, args: tuple, churn, repeats: int, device: torch.device) -> dict | str:
    """The launch path's parts on their own (the module docstring's ``launch_us``), or why they were not timed."""
    if device.type != "cuda" or not suite._launchers:
        return "not timed: the update launches no kernel here (it needs CUDA and Triton)"
    from mentor import _direct_launch

    run = next(iter(suite._launchers.values()))
    if not isinstance(run, _direct_launch.DirectLauncher) or run._compiled is None:
        return f"not timed: the update's launcher is a {type(run).__name__} that launches through Triton"
    loss, preds, target = args
    states = (suite.tp, suite.fp, suite.fn, suite.loss_sum, suite.loss_count, suite.invalid_labels)
    tensors = (preds, target, loss, *states)
    stream = _direct_launch._stream_getter()
    compiled, handle = run._compiled, stream(run._index)

    def triton_launch() -> None:  # what the launcher call ends in, with the stream read once, here
        compiled.run(run.grid, 1, 1, handle, compiled.function, compiled.packed_metadata, None, None, None, *tensors,
                     *run._tail)

    counts = (suite.tp, suite.fp, suite.fn, suite.loss_count, suite.invalid_labels)
    before = [c.clone() for c in counts]
    run(loss, preds, target, states)
    middle = [c.clone() for c in counts]
    triton_launch()
    if not all(torch.equal(m - b, c - m) for b, m, c in zip(before, middle, counts)):
        raise RuntimeError("Triton's launch alone did not add to the counts what the launcher call adds")
    calls = {
        "launcher call": lambda: run(loss, preds, target, states),
        "Triton's launch alone": triton_launch,
        "aligned(inputs and states)": lambda: _direct_launch.aligned(tensors),
        "torch.cuda.current_device()": torch.cuda.current_device,
        "hooks_idle()": _direct_launch.hooks_idle,
        "Triton's get_current_stream": lambda: stream(run._index),
    }
    return _time_calls(calls, churn, repeats, device)


def wrapper_probe(suite: torch.nn.Module, args: tuple, churn, repeats: int,
                  device: torch.device) -> dict[str, dict[str, dict[str, float]]]:
    """Each part of the wrapped update on its own (the module docstring's ``wrapper_us``): call -> condition ->
    stats of the host µs."""
    from torchmetrics import Metric

    class Empty(Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("n", torch.zeros((), device=device), dist_reduce_fx="sum")

        def update(self) -> None:
            pass

        def compute(self) -> torch.Tensor:
            return self.n

    empty, method = Empty(), type(suite).update
    calls = {
        "update": lambda: suite.update(*args),
        "update without the wrapper": lambda: method(suite, *args),
        "wrapper around an empty update": empty.update,
        "set_grad_enabled(False)": lambda: torch.set_grad_enabled(False).__exit__(None, None, None),
        "Metric.__setattr__": lambda: setattr(suite, "_computed", None),
    }
    return _time_calls(calls, churn, repeats, device)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for hook_probe.json")
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--churn", type=float, default=3000.0, help="µs of other Python between two calls")
    parser.add_argument("--queued", type=int, default=1500, help="kernels queued before each call (full queue)")
    parser.add_argument("--smoke", action="store_true", help="a few calls on whatever device there is")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    repeats, churn = (5, 50.0) if args.smoke else (args.repeats, args.churn)
    record = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "repeats": repeats, "churn_us": churn, "smoke": args.smoke, "queued": args.queued,
              **probe(device, repeats, churn, args.queued)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "hook_probe.json").write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
