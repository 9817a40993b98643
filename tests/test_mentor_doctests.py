"""Run the examples in every mentor module's docstrings (examples marked ``+SKIP`` need CUDA)."""

import doctest
import importlib
import pkgutil

import pytest

import mentor

MODULES = sorted(m.name for m in pkgutil.iter_modules(mentor.__path__, "mentor.") if not m.ispkg)


def test_every_module_is_listed():
    assert {"mentor.env", "mentor.data", "mentor.train", "mentor.metrics", "mentor.profiling", "mentor.trace",
            "mentor.bench", "mentor.ddp"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name, capsys):
    module = importlib.import_module(name)
    result = doctest.testmod(module, report=True)  # default flags, as pytest --doctest-modules uses
    report = capsys.readouterr().out
    assert result.attempted > 0, f"{name} has no examples"  # every module documents itself with examples
    assert result.failed == 0, report
