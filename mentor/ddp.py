"""Distributed helpers: a one-rank process group in this process, and worker processes that always clean up."""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    os.environ["MASTER_PORT"] = str(port or free_port())
    device_id = None
    if "nccl" in backend:
        device_id = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device_id)
    try:
        dist.init_process_group(backend, rank=0, world_size=1, device_id=device_id)
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
        dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=device_id)
        queue.put(WorkerResult(rank, value=fn(rank, world_size, *args)))
    except BaseException as err:  # noqa: BLE001 - reported to the parent, not swallowed
        queue.put(WorkerResult(rank, error=f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(fn: Callable[..., Any], world_size: int = 2, *args: Any, backend: str | None = None,
           timeout: float = 120.0) -> list[WorkerResult]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes, each in one process group.

    ``fn`` must be importable (defined at the top level of a module, e.g. in ``mentor``):
    functions defined in a notebook or inside another function cannot be sent to spawned
    processes. Every worker destroys its group even when ``fn`` raises; a worker that has
    not finished after ``timeout`` seconds is terminated. Returns one result per rank.

    Example:
        >>> [r.value for r in launch(rank_and_size, 2, backend="gloo")]
        [(0, 2), (1, 2)]
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function, not {type(fn).__name__}.")
    qualname = getattr(fn, "__qualname__", "")
    if getattr(fn, "__module__", "__main__") == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"{qualname or fn!r} is defined in __main__, a notebook or a function body, so spawned processes "
            "cannot import it; move it to the top level of a module (mentor.ddp has examples) and pass that."
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}.")
    backend = backend or default_backend()
    if "nccl" in backend and torch.cuda.device_count() < world_size:
        raise RuntimeError(f"backend {backend!r} needs one GPU per rank: {world_size} ranks, "
                           f"{torch.cuda.device_count()} GPUs; use backend='gloo' or fewer ranks.")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_run_worker, args=(r, world_size, backend, port, fn, args, queue), daemon=True)
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


def always_fails(rank: int, world_size: int) -> None:
    """Worker that raises on rank 0, to show that ``launch`` still cleans up."""
    if rank == 0:
        raise ValueError("planned failure on rank 0")
    dist.barrier()
