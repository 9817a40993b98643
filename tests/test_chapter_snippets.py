"""Code blocks that chapters print for the reader to copy (```python in a notebook's markdown) run as printed, on
the CPU, and do what the prose around them says."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import torch
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

BOOK = Path(__file__).resolve().parents[1] / "book"


def snippets(notebook: str) -> list[str]:
    """The ```python blocks of a notebook's markdown cells, in order."""
    nb = nbformat.read(BOOK / notebook, as_version=4)
    return [block for cell in nb.cells if cell.cell_type == "markdown"
            for block in re.findall(r"```python\n(.*?)```", cell.source, flags=re.S)]


def test_chapter_10s_explicit_group_updates_one_metric_and_gives_the_four_values() -> None:
    (code,) = snippets("10_macro_and_collections.ipynb")
    torch.manual_seed(0)
    labels = torch.randint(0, 1000, (3000,))
    logits = torch.randn(3000, 1000)
    logits[torch.arange(0, 3000, 2), labels[::2]] += 10.0  # every other sample predicted right
    names = {"logits": logits, "labels": labels}
    exec(compile(code, "10_macro_and_collections.ipynb", "exec"), names)  # noqa: S102 - the chapter's own code
    scores = names["scores"]
    assert scores.compute_groups == {0: ["accuracy", "precision", "recall", "f1_score"]}
    called = []
    for key in ("accuracy", "precision", "recall", "f1_score"):  # a second update, each metric's update spied on
        metric = scores[key]
        metric.update = (lambda update, key: lambda *a, **k: called.append(key) or update(*a, **k))(metric.update, key)
    scores.update(logits, labels)
    assert called == ["accuracy"]  # one update, for the whole group
    alone = {"accuracy": MulticlassAccuracy(1000), "precision": MulticlassPrecision(1000),
             "recall": MulticlassRecall(1000), "f1_score": MulticlassF1Score(1000)}
    for key, metric in alone.items():  # values computed before the second update above
        metric.update(logits, labels)
        assert torch.equal(names["values"][key], metric.compute()), key
    assert not torch.equal(names["values"]["accuracy"], names["values"]["precision"])  # four different scores
