"""Chapter 15's two recipes run as printed: the code blocks of book/15_what_to_use.ipynb are executed with a tiny model
standing in for the reader's loop (its ``train_step``) and the fused suite for their ``metrics``.

On the CPU the update's recipe runs whole and the regime's recipe stops where it must, at the trace without GPU work;
the ``gpu`` tests run both on CUDA."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from marks import gpu
from mentor.suite import FusedMetrics

PAGE = Path(__file__).resolve().parents[1] / "book" / "15_what_to_use.ipynb"


def recipes() -> list[str]:
    """The ```python blocks of the page's prose, in order."""
    import nbformat

    prose = "\n".join(c.source for c in nbformat.read(PAGE, as_version=4).cells if c.cell_type == "markdown")
    return re.findall(r"```python\n(.*?)```", prose, flags=re.S)


def reader_loop(device: str) -> dict:
    """The names the recipes leave to the reader: a training step without metrics, metrics and one batch's outputs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images, labels = torch.randn(16, 3, 8, 8, device=device), torch.randint(0, 10, (16,), device=device)

    def train_step() -> None:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    logits = model(images).detach()
    loss = torch.nn.functional.cross_entropy(logits, labels)
    return {"train_step": train_step, "metrics": FusedMetrics(10).to(device), "loss": loss, "logits": logits,
            "labels": labels}


def run(code: str, names: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), dict(names))  # noqa: S102 - the page's own code, on purpose
    return out.getvalue()


def test_the_page_has_the_two_recipes() -> None:
    regime, update = recipes()
    assert "gpu_idle_share(load_trace(" in regime and "prof.step()" in regime
    assert "update_cost(" in update


def test_the_update_recipe_prints_syncs_kernels_and_host_time_on_the_cpu(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    printed = run(recipes()[1], reader_loop("cpu"))
    assert re.fullmatch(r"0 syncs, None kernels, \d+ µs of host time per update\n", printed), printed


def test_the_regime_recipe_needs_a_gpu_trace_and_says_so_on_the_cpu(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"launched no GPU work that the trace links to it"):
        run(recipes()[0], reader_loop("cpu"))
    assert (tmp_path / "regime.json.gz").is_file()


@gpu
def test_both_recipes_run_on_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    names = reader_loop("cuda")
    regime = run(recipes()[0], names)
    assert re.fullmatch(r"GPU idle \d+%: (host|GPU)-bound\n", regime), regime
    update = run(recipes()[1], names)
    assert re.fullmatch(r"0 syncs, 1 kernels, \d+ µs of host time per update\n", update), update
