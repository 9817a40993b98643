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
