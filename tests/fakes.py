"""Data and stand-ins shared by several test files: five rounds of step times, results and a comparison made of them,
the run orders compare documents, and a stdout that records flushes."""

import contextlib
import random

import pytest
import torch

from mentor.lab.comparison import Comparison
from mentor.lab.stats import Result

BASE = [[10.0, 11.0, 9.5, 10.2], [12.0, 12.5, 11.8, 12.1], [9.0, 9.4, 9.1, 8.8], [10.5, 10.0, 10.9, 10.4],
        [11.1, 11.3, 10.7, 11.0]]
"""Five rounds of four step times (ms) that drift from round to round, as a baseline."""


def scaled(rounds, factors):
    """``rounds`` with each round's steps multiplied by that round's factor."""
    return [[t * f for t in steps] for steps, f in zip(rounds, factors)]


def two_rounds(name, a, b):
    """A Result of two rounds of one step each."""
    return Result(name, "", [[a], [b]])


class FlushRecorder:
    """A stdout that records what is written and when it is flushed."""

    def __init__(self):
        self.events = []

    def write(self, text):
        self.events.append(text)
        return len(text)

    def flush(self):
        self.events.append("<flush>")


def result(name, rounds, report_steps=(), syncs=None, report_syncs=None, note=None):
    """A Result whose description is ``"<name> config"``."""
    return Result(name, f"{name} config", [list(r) for r in rounds], list(report_steps), syncs, report_syncs, note)


def table_comparison():
    """Four configurations over BASE: syncs counted, a long name, a report step, and both sync notes."""
    long = "a configuration with a rather long name indeed"
    return Comparison([
        result("no metrics", BASE, note="n/a (CPU)"),
        result("naive", scaled(BASE, [1.31, 1.33, 1.30, 1.32, 1.35]), report_steps=[3], syncs=3, report_syncs=5),
        result(long, scaled(BASE, [1.0, 1.01, 0.99, 1.0, 0.98]), syncs=0.5, note=None),
        result("not counted one", scaled(BASE, [0.93, 0.95, 0.92, 0.94, 0.93]), note="not counted"),
    ], baseline="no metrics", batch_size=128, settings={"seed": 0})


def expected_orders(names, rounds, seed):
    """The orders compare documents: ``order = list(configs); random.Random(seed).shuffle(order)`` each round."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def two_points() -> dict:
    """A sweep of two points: a slow one where "m" and "n" cost 10 % and 25 % (median), a fast one where "m" costs 20 %."""
    a = Comparison([Result("none", "", [[10.0, 10.0], [10.0, 10.0]]),
                    Result("m", "", [[11.0, 11.0], [11.0, 11.0]]),
                    Result("n", "", [[12.0, 12.0], [13.0, 13.0]])], "none", 4)
    b = Comparison([Result("none", "", [[5.0], [5.0]]), Result("m", "", [[6.0], [6.0]]),
                    Result("n", "", [[5.0], [5.0]])], "none", 4)
    return {"slow point": a, "fast": b}


@contextlib.contextmanager
def tensor_reads():
    """A list of the ``Tensor.__bool__`` and ``Tensor.item`` calls made inside the block, by name: each is a read of a
    tensor's value on the host (a sync on CUDA), counted on any device."""
    reads = []
    real_bool, real_item = torch.Tensor.__bool__, torch.Tensor.item
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "__bool__", lambda t: reads.append("bool") or real_bool(t))
        patch.setattr(torch.Tensor, "item", lambda t: reads.append("item") or real_item(t))
        yield reads
