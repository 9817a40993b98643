"""Distributed helpers: a one-rank process group in this process, and worker processes that always clean up."""

from __future__ import annotations

import functools
import os
import socket
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on localhost that is free right now.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    """``nccl`` when CUDA is available, else ``gloo``.

    Example:
        >>> default_backend() in ("nccl", "gloo")
        True
    """
    return "nccl" if torch.cuda.is_available() else "gloo"


@contextmanager
def single_rank_group(backend: str | None = None, port: int | None = None) -> Iterator[str]:
    """A process group of one rank in this process (the article's DDP setting), destroyed on exit.

    ``MASTER_ADDR`` and ``MASTER_PORT`` are set for the group and restored afterwards.

    ``backend`` is ``nccl``, ``gloo``, or a device map such as ``"cuda:gloo"``, which gives
    the group a backend for CUDA tensors only (on a CPU machine this reproduces what NCCL
    does to CPU tensors). Yields the backend name.

    Example:
        >>> with single_rank_group("gloo") as backend:
        ...     torch.distributed.get_world_size()
        1
    """
    backend = backend or default_backend()
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string such as 'nccl', 'gloo' or 'cuda:gloo', not {backend!r}.")
    if dist.is_initialized():
        raise RuntimeError("a default process group already exists in this process; "
                           "destroy it first (torch.distributed.destroy_process_group()).")
    if "nccl" in backend and not torch.cuda.is_available():
        raise RuntimeError(f"backend {backend!r} needs CUDA and torch sees none; use 'gloo' or 'cuda:gloo'.")
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    # without a port, the OS gives the store one as it starts listening (no other process can take it between)
    store = dist.TCPStore("127.0.0.1", port or 0, is_master=True, wait_for_workers=False)
    os.environ["MASTER_PORT"] = str(store.port)
    device_id = None
    if "nccl" in backend:
        device_id = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device_id)
    try:
        dist.init_process_group(backend, store=store, rank=0, world_size=1, device_id=device_id)
        try:
            yield backend
        finally:
            dist.destroy_process_group()
    finally:
        for key, value in saved.items():  # leave the environment as it was
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class WorkerResult:
    """What one rank returned, or the error it raised (as text)."""

    rank: int
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the worker returned without raising."""
        return self.error is None


def _run_worker(rank: int, world_size: int, backend: str, port: int, fn: Callable[..., Any], args: tuple,
                queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        device_id = None
        if "nccl" in backend:
            device_id = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device_id)
        # a client of the store that the launching process serves (see launch)
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, device_id=device_id)
        queue.put(WorkerResult(rank, value=fn(rank, world_size, *args)))
    except BaseException as err:  # noqa: BLE001 - reported to the parent, not swallowed
        queue.put(WorkerResult(rank, error=f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _check_sendable(fn: Callable[..., Any]) -> None:
    """Refuse ``fn`` when spawned processes could not import it, or when it cannot be pickled, saying why."""
    inner = fn
    while isinstance(inner, functools.partial):  # a partial pickles its function by reference too
        inner = inner.func
    qualname = getattr(inner, "__qualname__", "")
    # only a name that says so: builtins and method descriptors (int.__add__) have no __module__ and pickle fine
    if getattr(inner, "__module__", None) == "__main__":
        reason = "is defined in __main__ (a script run directly, or a notebook)"
    elif "<lambda>" in qualname:
        reason = "is a lambda"
    elif "<locals>" in qualname:
        reason = "is defined inside a function body"
    else:
        reason = ""
    if reason:
        raise ValueError(f"{qualname or inner!r} {reason}, so spawned processes cannot import it; move it to the top "
                         "level of a module (mentor.lab.ddp has examples) and pass that.")
    try:
        ForkingPickler.dumps(fn)  # what the spawn context does with it
    except Exception as err:  # noqa: BLE001 - any failure to pickle is the refusal's reason
        raise ValueError(f"{fn!r} cannot be sent to the spawned processes: pickling it fails ({type(err).__name__}: "
                         f"{err}); pass a function defined at the top level of a module (mentor.lab.ddp has "
                         "examples), or functools.partial of one with arguments that pickle.") from err


def launch(fn: Callable[..., Any], world_size: int = 2, *args: Any, backend: str | None = None,
           timeout: float = 120.0) -> list[WorkerResult]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes, each in one process group.

    ``fn`` is pickled and sent to each process, so it must be importable there: a function
    defined at the top level of a module (e.g. in ``mentor``), a builtin or a method
    descriptor (``int.__add__``), or ``functools.partial`` of one. Functions defined in
    ``__main__`` (a notebook), lambdas and functions defined inside another function are
    refused, saying which; so is anything else that cannot be pickled, before any process
    starts. Every worker destroys its group even when ``fn`` raises; a worker that has
    not finished after ``timeout`` seconds is terminated. Returns one result per rank.

    Example:
        >>> [r.value for r in launch(rank_and_size, 2, backend="gloo")]
        [(0, 2), (1, 2)]
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function, not {type(fn).__name__}.")
    _check_sendable(fn)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    backend = backend or default_backend()
    if "nccl" in backend and torch.cuda.device_count() < world_size:
        raise RuntimeError(f"backend {backend!r} needs one GPU per rank: {world_size} ranks, "
                           f"{torch.cuda.device_count()} GPUs; use backend='gloo' or fewer ranks.")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    # The group's store is served from this process, on a port the OS gives it as it starts listening. A port
    # found free first and bound by rank 0 later (free_port) can be taken in between by any other process on the
    # machine, and then the launch fails with EADDRINUSE.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port
    # not daemonic: a daemonic process may not start children, so a worker could not use a
    # DataLoader with workers; the finally block below terminates and joins them instead
    procs = [ctx.Process(target=_run_worker, args=(r, world_size, backend, port, fn, args, queue), daemon=False)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, WorkerResult] = {}
    try:
        import time

        deadline = time.monotonic() + timeout
        while len(results) < world_size and time.monotonic() < deadline:
            if not queue.empty():
                res = queue.get()
                results[res.rank] = res
                if not res.ok:  # one failed: the others may hang in a collective
                    time.sleep(1.0)
                    break
            elif not any(p.is_alive() for p in procs) and queue.empty():
                break
            else:
                time.sleep(0.05)
        while not queue.empty():
            res = queue.get()
            results[res.rank] = res
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=10)
            if p.is_alive():  # ignored SIGTERM: a non-daemonic child must not outlive us
                p.kill()
                p.join()
    return [results.get(r, WorkerResult(r, error="no result: the worker was terminated or died"))
            for r in range(world_size)]


# Worker functions. They live here so that spawned processes can import them.

def rank_and_size(rank: int, world_size: int) -> tuple[int, int]:
    """Worker that returns its rank and the world size (a smoke test of ``launch``)."""
    return rank, dist.get_world_size()


def metric_compute(rank: int, world_size: int, device: str = "cpu", sync_on_compute: bool = True) -> float:
    """Worker: each rank updates a MeanMetric on ``device`` with ``rank + 1`` and returns ``compute()``.

    With ``sync_on_compute=True`` the ranks' states are gathered, so every rank returns the
    mean over ranks; with ``False`` each returns its own value.
    """
    from torchmetrics import MeanMetric

    metric = MeanMetric(sync_on_compute=sync_on_compute).to(device)
    metric.update(torch.tensor(float(rank + 1), device=device))
    return float(metric.compute())


def loader_sum(rank: int, world_size: int, num_workers: int = 2) -> float:
    """Worker: sum the first batch of a DataLoader with ``num_workers`` worker processes of its own."""
    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(8)), batch_size=4, num_workers=num_workers)
    return float(next(iter(loader)).sum()) + rank


def always_fails(rank: int, world_size: int) -> None:
    """Worker that raises on rank 0, to show that ``launch`` still cleans up."""
    if rank == 0:
        raise ValueError("planned failure on rank 0")
    dist.barrier()


PLACEMENTS: dict[str, str] = {
    "no sync": "CPU metric with sync_on_compute=False: each rank keeps its own value",
    "default group": "CPU metric synced through the default group (it needs a CPU backend: 'cpu:gloo,cuda:nccl')",
    "gloo subgroup": "CPU metric given a gloo subgroup as process_group: dist.new_group(backend='gloo')",
    "gpu": "GPU metric (on this rank's device) updated with host_scalar, synced through the default group",
}
"""Where a per-step host number (such as the step time) can be averaged under DDP; see :func:`placement_compute`."""


def placement_metric(placement: str, group: Any = None) -> Any:
    """A ``MeanMetric`` placed as ``placement`` (a key of :data:`PLACEMENTS`) in the current process group.

    ``"gloo subgroup"`` needs ``group``, made once by every rank with
    ``torch.distributed.new_group(backend="gloo")``; collective calls must match across ranks,
    so it is made by the caller, not here.

    Example:
        >>> with single_rank_group("gloo"):
        ...     placement_metric("no sync").sync_on_compute
        False
    """
    from torchmetrics import MeanMetric

    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: pass one of {list(PLACEMENTS)}.")
    if placement == "no sync":
        return MeanMetric(sync_on_compute=False)
    if placement == "default group":
        return MeanMetric()
    if placement == "gloo subgroup":
        if group is None:
            raise ValueError("placement 'gloo subgroup' needs group=torch.distributed.new_group(backend='gloo'), "
                             "made by every rank.")
        return MeanMetric(process_group=group)
    if not torch.cuda.is_available():
        raise RuntimeError("placement 'gpu' needs a CUDA device and torch sees none; use a CPU placement.")
    return MeanMetric().to(torch.device("cuda", torch.cuda.current_device()))


def compute_ms(metric: Any, value: float, repeats: int = 20) -> tuple[float, float]:
    """Update ``metric`` with ``value`` and time ``float(metric.compute())``, ``repeats`` times.

    Returns ``(computed value, median milliseconds of one compute)``; each compute follows an
    update, so none is served from torchmetrics' cache. The float is what a logger reads, so
    for a GPU metric the time includes waiting for its result.

    Example:
        >>> from torchmetrics import MeanMetric
        >>> value, ms = compute_ms(MeanMetric(), 2.0, repeats=3)
        >>> value
        2.0
    """
    import statistics
    import time

    from mentor.sync_free import host_scalar

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}.")
    on_gpu = metric.device.type == "cuda"
    times, result = [], float("nan")
    for _ in range(repeats + 1):  # the first compute is not timed
        metric.update(host_scalar(value) if on_gpu else value)
        start = time.perf_counter()
        result = float(metric.compute())
        times.append((time.perf_counter() - start) * 1000.0)
    return result, statistics.median(times[1:])


def placement_compute(rank: int, world_size: int, placement: str, repeats: int = 20) -> dict[str, Any]:
    """Worker: rank r averages the number r + 1 in a metric placed as ``placement``; returns value and cost.

    Returns ``{"placement", "value", "compute_ms"}`` or, when ``compute()`` raises,
    ``{"placement", "error"}`` with the first line of the error. Also runs in-process inside
    :func:`single_rank_group` (rank 0 of 1), which is how the book shows the one-rank NCCL case.

    Example:
        >>> [r.value["value"] for r in launch(placement_compute, 2, "default group", 3, backend="gloo")]
        [1.5, 1.5]
    """
    group = dist.new_group(backend="gloo") if placement == "gloo subgroup" else None
    metric = placement_metric(placement, group)
    try:
        value, ms = compute_ms(metric, float(rank + 1), repeats)
    except RuntimeError as err:
        return {"placement": placement, "error": str(err).splitlines()[0]}
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    return {"placement": placement, "value": value, "compute_ms": ms}


def placements_compute(rank: int, world_size: int, placements: list[str], repeats: int = 20) -> list[dict[str, Any]]:
    """Worker: :func:`placement_compute` of each of ``placements`` in turn, in the one group that launch made."""
    return [placement_compute(rank, world_size, placement, repeats) for placement in placements]


def placements_cost(backend: str, placements: list[str], ranks: int = 1, repeats: int = 20,
                    fresh: bool = True) -> list[dict[str, Any]]:
    """Run :func:`placement_compute` for each placement in a group of ``ranks`` on ``backend``.

    One rank runs in this process (:func:`single_rank_group`); more ranks run as worker
    processes (:func:`launch`), by default (``fresh``) new ones for each placement, so that
    none runs in processes that another placement used; with ``fresh=False`` one launch runs
    the placements in turn (:func:`placements_compute`), which saves starting the processes
    again (seconds each: the CPU smoke run, which only checks the code, does this).
    Returns one dict per placement with ``backend``, ``placement``,
    ``values`` (one per rank), ``compute_ms`` (the slowest rank's median) or ``error``.

    Example:
        >>> placements_cost("gloo", ["no sync"], repeats=3)[0]["values"]
        [1.0]
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}.")
    unknown = [p for p in placements if p not in PLACEMENTS]
    if unknown:
        raise ValueError(f"unknown placement(s) {unknown}: pass some of {list(PLACEMENTS)}.")
    if not isinstance(fresh, bool):
        raise TypeError(f"fresh must be True or False, not {fresh!r}.")
    together: list[list[dict[str, Any]]] | None = None  # per rank, one dict per placement
    if ranks > 1 and not fresh:
        done = launch(placements_compute, ranks, list(placements), repeats, backend=backend)
        failed = [r for r in done if not r.ok]
        if failed:
            raise RuntimeError(f"rank {failed[0].rank} failed for placements {placements!r}: {failed[0].error}")
        together = [r.value for r in done]
    rows = []
    for index, placement in enumerate(placements):
        if together is not None:
            results = [per_rank[index] for per_rank in together]
        elif ranks == 1:
            with single_rank_group(backend):
                results = [placement_compute(0, 1, placement, repeats)]
        else:
            done = launch(placement_compute, ranks, placement, repeats, backend=backend)
            failed = [r for r in done if not r.ok]
            if failed:
                raise RuntimeError(f"rank {failed[0].rank} failed for placement {placement!r}: {failed[0].error}")
            results = [r.value for r in done]
        row: dict[str, Any] = {"backend": backend, "placement": placement}
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            row["error"] = errors[0]
        else:
            row["values"] = [r["value"] for r in results]
            row["compute_ms"] = max(r["compute_ms"] for r in results)
        rows.append(row)
    return rows
