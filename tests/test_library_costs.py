"""scripts/library_costs.py: every metric at every batch, measured twice in a shuffled order, written as JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "library_costs.py"
_spec = importlib.util.spec_from_file_location("library_costs", SCRIPT)
lc = importlib.util.module_from_spec(_spec)
sys.modules["library_costs"] = lc
_spec.loader.exec_module(lc)

NAMES = ["FusedBinary", "FusedMetrics", "FusedMetrics top_k=(1, 5)", "FusedMultilabel",
         "torchmetrics MeanMetric + Binary*", "torchmetrics MeanMetric + Multilabel*",
         "torchmetrics MulticlassAccuracy top_k=5"]


def test_each_case_updates_its_metric_with_inputs_of_the_batch() -> None:
    made = lc.cases(32, torch.device("cpu"))
    assert sorted(made) == NAMES
    for update in made.values():
        update()
    suite = made["FusedMetrics"].__closure__  # the closures hold the metrics they update
    metrics = [c.cell_contents for c in suite if hasattr(c.cell_contents, "compute")]
    assert len(metrics) == 1 and int(metrics[0].tp.sum() + metrics[0].fn.sum()) == 32


def test_measure_takes_every_row_in_a_shuffled_order(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def fake_cost(name, fn, *, repeats):
        seen.append(name)
        return lc.UpdateCost(name, 0, None, None, [float(len(seen))] * repeats, "n/a (CPU)")

    monkeypatch.setattr(lc, "update_cost", fake_cost)
    rows = lc.measure(torch.device("cpu"), repeats=3, takes=2, seed=1)
    assert len(rows) == len(lc.BATCHES) * len(NAMES) * 2
    assert [(r["batch"], r["metric"], r["take"]) for r in rows] == [
        (b, n, t) for b in lc.BATCHES for n in NAMES for t in range(2)]
    assert seen != sorted(seen, key=NAMES.index)  # not measured in the written order
    assert sorted(r["host_us"] for r in rows) == [float(i) for i in range(1, len(rows) + 1)]


def test_the_smoke_run_writes_json_and_a_real_run_refuses_a_machine_without_cuda(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            lc.main(["--out", str(tmp_path)])
    assert lc.main(["--out", str(tmp_path), "--smoke"]) == 0
    record = json.loads((tmp_path / "library_costs.json").read_text())
    assert record["smoke"] is True and record["target_host_us_at_batch_32"] == 15.0
    assert sorted({r["metric"] for r in record["rows"]}) == NAMES
    assert all(r["syncs"] == 0 and len(r["repeats_us"]) == 1 for r in record["rows"] if r["metric"].startswith("Fused"))
