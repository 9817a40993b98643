"""What one update of each of the library's metrics costs, measured with the reader's own tool, as JSON.

For issue 44's target (host time per update at most 15 µs at batch 32): :func:`mentor.measure.update_cost` of
``FusedMetrics`` (top-1, and with ``top_k=(1, 5)``), ``FusedBinary`` and ``FusedMultilabel``, each beside the
torchmetrics classes that give the same values, at batch 32 and 128. Multiclass: bf16 logits of 1000 classes;
binary: bf16 logits; multilabel: bf16 logits of 100 labels. Each row: syncs, kernels and copies per update,
the median host µs over the repeats and its 95 % bootstrap interval, and the queue it was timed behind.

Every measurement is taken twice, in an order shuffled with a fixed seed, so that the spread between the two
takes of a row shows how far a median moves between takes; the JSON keeps both.

Usage (on the GPU machine): ``python scripts/library_costs.py --out DIR``; ``--smoke`` runs one repeat of each
on whatever device there is (the CPU in the tests: host time only, nothing to compare with the target).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchmetrics
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import (BinaryAccuracy, BinaryF1Score, BinaryPrecision, BinaryRecall,
                                         MulticlassAccuracy, MultilabelAccuracy, MultilabelF1Score,
                                         MultilabelPrecision, MultilabelRecall)

from mentor.binary import FusedBinary
from mentor.measure import UpdateCost, update_cost
from mentor.multilabel import FusedMultilabel
from mentor.suite import FusedMetrics

BATCHES = (32, 128)
CLASSES = 1000
LABELS = 100
TARGET_US = 15.0


def cases(batch: int, device: torch.device) -> dict[str, Callable[[], Any]]:
    """One update of each metric on fixed inputs of ``batch`` rows, by name; each metric made and warmed here."""
    g = torch.Generator(device="cpu").manual_seed(batch)
    loss = torch.rand((), generator=g).to(device)
    logits = torch.randn(batch, CLASSES, generator=g).to(device, torch.bfloat16)
    labels = torch.randint(0, CLASSES, (batch,), generator=g).to(device)
    scalar = torch.randn(batch, generator=g).to(device, torch.bfloat16)
    bits = torch.randint(0, 2, (batch,), generator=g).to(device)
    multi = torch.randn(batch, LABELS, generator=g).to(device, torch.bfloat16)
    multi_bits = torch.randint(0, 2, (batch, LABELS), generator=g).to(device)

    suite = FusedMetrics(CLASSES).to(device)
    top5 = FusedMetrics(CLASSES, top_k=(1, 5)).to(device)
    binary = FusedBinary().to(device)
    multilabel = FusedMultilabel(LABELS).to(device)
    mean = MeanMetric().to(device)
    tm_top5 = MulticlassAccuracy(CLASSES, top_k=5, average="micro").to(device)
    tm_binary = MetricCollection([BinaryAccuracy(), BinaryPrecision(), BinaryRecall(), BinaryF1Score()]).to(device)
    tm_multi = MetricCollection([MultilabelAccuracy(LABELS), MultilabelPrecision(LABELS), MultilabelRecall(LABELS),
                                 MultilabelF1Score(LABELS)]).to(device)
    return {
        "FusedMetrics": lambda: suite.update(loss, logits, labels),
        "FusedMetrics top_k=(1, 5)": lambda: top5.update(loss, logits, labels),
        "FusedBinary": lambda: binary.update(loss, scalar, bits),
        "FusedMultilabel": lambda: multilabel.update(loss, multi, multi_bits),
        "torchmetrics MulticlassAccuracy top_k=5": lambda: tm_top5.update(logits, labels),
        "torchmetrics MeanMetric + Binary*": lambda: (mean.update(loss), tm_binary.update(scalar, bits)),
        "torchmetrics MeanMetric + Multilabel*": lambda: (mean.update(loss), tm_multi.update(multi, multi_bits)),
    }


def row(cost: UpdateCost) -> dict[str, Any]:
    low, high = cost.host_interval
    return {"syncs": cost.syncs, "kernels": cost.kernels, "copies": cost.copies, "host_us": cost.host_us,
            "host_us_interval": [low, high], "repeats_us": cost.repeats_us, "queue": cost.queue, "core": cost.core}


def measure(device: torch.device, repeats: int, takes: int, seed: int = 0) -> list[dict[str, Any]]:
    """Every (batch, metric, take) once, in an order shuffled with ``seed``; one row each."""
    made = {batch: cases(batch, device) for batch in BATCHES}
    order = [(batch, name, take) for batch in BATCHES for name in made[batch] for take in range(takes)]
    random.Random(seed).shuffle(order)
    rows = []
    for batch, name, take in order:
        cost = update_cost(name, made[batch][name], repeats=repeats)
        rows.append({"batch": batch, "metric": name, "take": take, **row(cost)})
        print(f"b{batch:<4} take {take}  {name:<42} {cost.host_us:8.1f} µs  syncs {cost.syncs}  kernels "
              f"{cost.kernels}", flush=True)
    return sorted(rows, key=lambda r: (r["batch"], r["metric"], r["take"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for library_costs.json")
    parser.add_argument("--smoke", action="store_true", help="one repeat, one take, on whatever device there is")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        parser.error("needs a CUDA device (the target is GPU host time); pass --smoke to check the script on the CPU")
    device = torch.device("cuda" if cuda else "cpu")
    rows = measure(device, repeats=1 if args.smoke else 21, takes=1 if args.smoke else 2)
    record = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "torchmetrics": torchmetrics.__version__, "python": platform.python_version(),
              "triton": _triton_version(), "smoke": args.smoke, "classes": CLASSES, "labels": LABELS,
              "target_host_us_at_batch_32": TARGET_US, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "library_costs.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
