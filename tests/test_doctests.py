"""Run the examples in every mentor module's docstrings (examples marked ``+SKIP`` need CUDA)."""

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import mentor

MODULES = sorted(m.name for m in pkgutil.walk_packages(mentor.__path__, "mentor.") if not m.ispkg)


def test_every_module_is_listed():
    library = {"mentor._chrome_trace", "mentor._direct_launch", "mentor._fused_kernel", "mentor._named", "mentor._static_states",
               "mentor._scores", "mentor._threshold_kernel", "mentor._thresholded", "mentor.binary",
               "mentor.flat_sync", "mentor.invalid", "mentor.lightning", "mentor.measure", "mentor.multilabel",
               "mentor.pytest_plugin", "mentor.readback", "mentor.suite", "mentor.sync_free", "mentor.syncs"}
    lab = {p.stem for p in Path(mentor.__file__).parent.joinpath("lab").glob("*.py") if p.stem != "__init__"}
    assert set(MODULES) == library | {f"mentor.lab.{name}" for name in lab}
    assert len(lab) > 15


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name, capsys):
    module = importlib.import_module(name)
    result = doctest.testmod(module, report=True)  # default flags, as pytest --doctest-modules uses
    report = capsys.readouterr().out
    assert result.attempted > 0, f"{name} has no examples"  # every module documents itself with examples
    assert result.failed == 0, report
