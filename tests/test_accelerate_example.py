"""The README's Accelerate loop with the suite, run as printed with a small model: what it logs and when, against
the suite updated by hand on the same outputs, and its error when a report with invalid labels arrives (a padding
label -100 that cross_entropy ignores and the suite, made without ignore_index, counts); on CUDA, that the loop makes
no sync, its reports included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="the Accelerate example needs accelerate (requirements.txt)")
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState

from marks import gpu
from mentor.invalid import InvalidLabelsError
from mentor.suite import FusedMetrics

NUM_CLASSES = 5


def snippet() -> str:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "from accelerate" in b]
    return code.replace("num_classes=1000", f"num_classes={NUM_CLASSES}")


class Recorded(torch.nn.Module):
    """The reader's model, keeping every output it gives."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, NUM_CLASSES)
        self.outputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.outputs.append(out.detach().clone())
        return out


def inputs(device: str, batches: int = 100):
    """The reader's model, optimizer and loader (batches already on ``device``), as the snippet's names."""
    gen = torch.Generator().manual_seed(1)
    loader = [(torch.randn(4, 8, generator=gen).to(device), torch.randint(0, NUM_CLASSES, (4,), generator=gen)
               .to(device)) for _ in range(batches)]
    model = Recorded().to(device)
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "loader": loader}


def run(names: dict, monkeypatch, logged: list | None = None) -> list:
    """Run the snippet on ``names``; what it handed to ``accelerator.log``, as (step, values), in ``logged``."""
    AcceleratorState._reset_state(reset_partial_state=True)
    logged = [] if logged is None else logged
    monkeypatch.setattr(Accelerator, "log", lambda self, values, step=None, log_kwargs=None: logged.append(
        (step, dict(values))))
    try:
        exec(compile(snippet(), "README.md", "exec"), names)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    return logged


def test_the_readmes_accelerate_loop_logs_every_50_steps_the_values_of_those_steps(monkeypatch) -> None:
    names = inputs("cpu")
    outputs, loader = names["model"].outputs, names["loader"]
    logged = run(names, monkeypatch)
    assert [step for step, _ in logged] == [50, 100]
    for k, (step, values) in enumerate(logged):
        by_hand = FusedMetrics(NUM_CLASSES)
        for logits, (_, labels) in list(zip(outputs, loader))[50 * k:50 * (k + 1)]:
            by_hand.update(F.cross_entropy(logits, labels), logits, labels)
        expected = {name: v.item() for name, v in by_hand.compute().items()}
        assert values.keys() == expected.keys()
        assert values == pytest.approx(expected, rel=1e-6)
        assert values["invalid_labels"] == 0.0  # the count of a good report is logged with its scores


def test_the_readmes_accelerate_loop_raises_when_a_report_with_invalid_labels_arrives(monkeypatch) -> None:
    names = inputs("cpu")
    names["loader"][59][1][0] = -100  # step 60: cross_entropy skips it, FusedMetrics(num_classes) counts it
    logged = []
    with pytest.raises(InvalidLabelsError) as caught:
        run(names, monkeypatch, logged)
    assert (caught.value.count, caught.value.step, caught.value.counts) == (1, 100, {"invalid_labels": 1})
    assert [step for step, _ in logged] == [50]  # the report of steps 51-100 is never logged
    assert not [k for _, values in logged for k, v in values.items() if v != v]  # no NaN was logged


@gpu
def test_on_cuda_the_loop_makes_no_sync_its_two_reports_included(monkeypatch) -> None:
    from mentor.syncs import sync_guard

    names = inputs("cuda")  # the batches' copies to the GPU are the reader's loader's, made before the loop
    torch.cuda.synchronize()
    with sync_guard() as report:
        logged = run(names, monkeypatch)
    loop_starts = 1 + next(n for n, line in enumerate(snippet().splitlines()) if line.startswith("for "))

    def snippet_line(site) -> int:
        return max(line for file, line, _ in site.stack if file == "README.md")

    in_loop = [site for site in report.sites if snippet_line(site) >= loop_starts]
    # before the loop, FusedMetrics(...).to(device) copies its states to the GPU with blocking copies; in the loop
    # compute() reads nothing back and the copy of its values is read once its event has completed
    assert in_loop == [], report.table()
    assert [step for step, _ in logged][:1] == [50] and logged[0][1]["invalid_labels"] == 0.0
