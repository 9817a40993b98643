"""Helpers for the worker functions that tests run on two gloo ranks (``mentor.lab.ddp.launch``)."""

from datetime import timedelta


def short_gloo_group(seconds: float = 20):
    """A gloo group whose collectives fail after ``seconds`` when a rank does not join, instead of gloo's 30 min."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timedelta(seconds=seconds))


class Attempts(dict):
    """Calls that may raise, run on a rank: ``attempts(key, fn)`` returns ``fn()``, or records the error under
    ``key`` (as ``"Type: message"``, for the parent to check exactly) and returns None."""

    def __call__(self, key, fn):
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - reported to the parent, which checks the exact error
            self[key] = f"{type(err).__name__}: {err}"
            return None


# --- one launch for the rank functions of every collected test module ---
# Each launch starts two spawned processes that import torch and torchmetrics (about 5 s of CPU each, on a 2-core
# machine shared with the notebooks' smoke run). The rank functions that only need two gloo ranks register at import
# (collection); the first test that asks for its results runs every registered function not yet run, in order, in
# one launch, each under its own try so that one that raises leaves the others' results. A function that needs a
# process of its own (one that leaves state behind, or tests launch itself) calls launch directly instead.

_JOBS: dict[str, tuple] = {}
_DONE: dict[str, list] = {}
TIMEOUT_S = 300


def on_two_ranks(fn, *args) -> str:
    """Register ``fn(rank, world_size, *args)`` for the shared launch; returns the key :func:`results` takes."""
    key = f"{fn.__module__}.{fn.__qualname__}{args!r}"
    _JOBS[key] = (fn, args)
    return key


def results(key: str) -> list:
    """Each rank's ``WorkerResult`` for the function registered under ``key``, as ``launch`` would return it."""
    from mentor.lab.ddp import WorkerResult, launch

    if key not in _JOBS:
        raise KeyError(f"{key!r} was not registered with on_two_ranks at import")
    if key not in _DONE:
        todo = [(k, *job) for k, job in _JOBS.items() if k not in _DONE]
        launched = launch(run_each, 2, todo, backend="gloo", timeout=TIMEOUT_S)
        for k, _, _ in todo:
            _DONE[k] = [WorkerResult(r.rank, error=r.error) if not r.ok
                        else WorkerResult(r.rank, value=r.value[k][1]) if r.value[k][0] == "ok"
                        else WorkerResult(r.rank, error=r.value[k][1]) for r in launched]
    return _DONE[key]


def run_each(rank: int, world_size: int, jobs: list) -> dict:
    """Worker: each ``(key, fn, args)`` of ``jobs`` in turn; ``{key: ("ok", value) or ("error", traceback)}``."""
    import traceback

    out = {}
    for key, fn, args in jobs:
        try:
            out[key] = ("ok", fn(rank, world_size, *args))
        except Exception:  # noqa: BLE001 - reported to the test that registered fn, as launch reports it
            out[key] = ("error", traceback.format_exc())
    return out
