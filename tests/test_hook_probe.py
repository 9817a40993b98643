"""scripts/hook_probe.py: its smoke run on the CPU writes every way with as many timed calls as asked."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_smoke_run_writes_each_way_with_its_calls(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "hook_probe.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "hook_probe.json").read_text())
    assert record["smoke"] is True and record["repeats"] == 5
    assert list(record["update_us"]) == ["back to back", "autograd inputs", "after other Python",
                                         "after a training step"]
    parts = record["wrapper_us"]
    assert list(parts) == ["update", "update without the wrapper", "wrapper around an empty update",
                           "set_grad_enabled(False)", "Metric.__setattr__"]
    assert all(list(by) == ["back to back", "after other Python"] for by in parts.values())
    for stats in [*record["update_us"].values(), *(s for by in parts.values() for s in by.values())]:
        assert stats["n"] == 5 and 0 < stats["p10"] <= stats["median"] <= stats["p90"]
