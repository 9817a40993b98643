"""Data and stand-ins shared by several test files: five rounds of step times, and a stdout that records flushes."""

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
