"""scripts/hook_probe.py: its smoke run on the CPU writes every way with as many timed calls as asked; on CUDA
it also takes the launch path apart."""

import json
import sys
from pathlib import Path

import background
from marks import gpu

REPO = Path(__file__).resolve().parents[1]


def smoke_run(env: dict[str, str]):
    """Background job: the probe's smoke run into a folder of its own; (the finished process, the folder)."""
    out = background.scratch("hook-probe-smoke-")
    return background.run([sys.executable, str(REPO / "scripts" / "hook_probe.py"), "--smoke", "--out", str(out)],
                          env, timeout=300, cwd=REPO), out


SMOKE = background.job(smoke_run, "test_smoke_run_writes_each_way_with_its_calls")


def test_smoke_run_writes_each_way_with_its_calls():
    done, tmp_path = background.result(SMOKE)
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
    assert record["launch_us"] == "not timed: the update launches no kernel here (it needs CUDA and Triton)"


@gpu
def test_on_cuda_each_part_of_the_launch_path_is_timed(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import hook_probe
    finally:
        sys.path.remove(str(REPO / "scripts"))
    record = hook_probe.main(["--out", str(tmp_path), "--repeats", "5", "--churn", "50", "--queued", "10"])
    assert list(record["launch_us"]) == ["launcher call", "Triton's launch alone", "aligned(inputs and states)",
                                         "torch.cuda.current_device()", "hooks_idle()", "Triton's get_current_stream"]
    for by in record["launch_us"].values():
        assert list(by) == ["back to back", "after other Python"]
        assert all(s["n"] == 5 and 0 < s["p10"] <= s["median"] <= s["p90"] for s in by.values())
