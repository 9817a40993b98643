"""mentor.lab.regimes: the GPU's idle share over traced steps (gaps between steps counted), pinned on hand-made
traces; the regime's label at its threshold; the table; measure_regime's refusals and arithmetic with the trace
faked (a real trace needs CUDA)."""

from __future__ import annotations

import pytest
import torch

import mentor.lab.regimes as regimes
from mentor.lab.configs import OperatingPoint
from mentor.lab.env import get_profile
from mentor.lab.regimes import HOST_BOUND_IDLE, Regime, gpu_idle_share, measure_regime, regime_table
from mentor.lab.trace import Event, Trace


def _trace(kernels, steps=2):
    """``steps`` host windows of 10 µs, each launching one kernel; ``kernels``: (start, duration) per step."""
    events = []
    for i, (start, dur) in enumerate(kernels[:steps]):
        events += [Event(f"ProfilerStep#{i + 1}", "user_annotation", 10 * i, 10, 1, 1),
                   Event("cudaLaunchKernel", "cuda_runtime", 10 * i + 2, 1, 1, 1, correlation=i + 1),
                   Event(f"k{i}", "kernel", start, dur, 0, 7, correlation=i + 1)]
    for start, dur in kernels[steps:]:  # uncorrelated GPU work, e.g. another stream's
        events.append(Event("other", "kernel", start, dur, 0, 8))
    return Trace(sorted(events, key=lambda e: e.start))


def test_the_gaps_between_steps_count_as_idle():
    assert gpu_idle_share(_trace([(20, 5), (35, 5)])) == pytest.approx(10 / 20)
    assert gpu_idle_share(_trace([(20, 10), (30, 10)])) == 0.0
    # work overlapping the gap (uncorrelated, on another stream) is busy time: counted once where it overlaps
    assert gpu_idle_share(_trace([(20, 5), (35, 5), (22, 8)])) == pytest.approx(5 / 20)


def test_one_step_is_refused_and_a_step_without_gpu_work_is_named():
    with pytest.raises(ValueError, match=r"^gpu_idle_share needs a trace of at least 2 steps, got 1: the gaps"):
        gpu_idle_share(_trace([(20, 5)], steps=1))
    cpu_only = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
                      Event("ProfilerStep#2", "user_annotation", 10, 10, 1, 1)])
    with pytest.raises(ValueError, match=r"^ProfilerStep#1 \(host window at 0 us\) launched no GPU work"):
        gpu_idle_share(cpu_only)


def test_the_label_at_the_threshold():
    assert HOST_BOUND_IDLE == 0.10
    assert Regime("p", 1.0, 0.10).bound == "GPU-bound"
    assert Regime("p", 1.0, 0.1001).bound == "host-bound"


def test_the_table():
    assert regime_table([Regime("fp32 b32", 9.0, 0.305, 0.0167), Regime("bf16 b128", 10.75, 0.02)]).splitlines() == [
        "point        step ms  GPU idle  update / step  regime",
        "fp32 b32        9.00    30.5 %         1.67 %  host-bound",
        "bf16 b128      10.75     2.0 %              -  GPU-bound"]


CUDA_PROFILE = get_profile("smoke").with_(device=torch.device("cuda"))


@pytest.mark.parametrize("args, kwargs, error, message", [
    (("tiny", CUDA_PROFILE), {}, TypeError, r"^point must be a mentor\.lab\.configs\.OperatingPoint, not str\.$"),
    ((OperatingPoint("tiny", 2, 32), "full"), {}, TypeError,
     r"^profile must be a mentor\.lab\.env\.Profile \(get_profile\(\)\), not str\.$"),
    ((OperatingPoint("tiny", 2, 32), get_profile("smoke")), {}, ValueError, r"^measure_regime needs a CUDA profile"),
    ((OperatingPoint("tiny", 2, 32), CUDA_PROFILE), {"steps": 1}, ValueError,
     r"^steps must be an int >= 2 \(the gaps between steps are measured\), got 1\.$"),
    ((OperatingPoint("tiny", 2, 32), CUDA_PROFILE), {"steps": True}, ValueError, r"^steps must be an int >= 2"),
])
def test_measure_regime_refuses_bad_arguments(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        measure_regime(*args, **kwargs)


def test_measure_regime_reads_its_trace(monkeypatch, tmp_path):
    import mentor.lab.configs
    import mentor.lab.profiling

    recorded = {}
    monkeypatch.setattr(mentor.lab.configs, "point_setup", lambda point, profile: ("setup", "batches"))

    def record_steps(setup, batches, path, active):
        recorded.update(setup=setup, batches=batches, path=path, active=active)
        return path

    monkeypatch.setattr(mentor.lab.profiling, "record_steps", record_steps)
    monkeypatch.setattr(regimes, "load_trace", lambda path: _trace([(2000, 500), (3500, 500), (5000, 1000)], 3))
    r = measure_regime(OperatingPoint("tiny", 2, 32), CUDA_PROFILE, steps=3, hook_ms=0.4, trace_path=tmp_path / "t")
    assert recorded == {"setup": "setup", "batches": "batches", "path": tmp_path / "t", "active": 3}
    # GPU work from 2000 to 6000 µs over 3 steps: 4/3 ms per step; busy 2000 of 4000 µs
    assert (r.point, r.step_ms, r.gpu_idle, r.hook_share) == ("tiny", pytest.approx(4 / 3), 0.5,
                                                              pytest.approx(0.4 / (4 / 3)))


def test_measure_regime_defaults_and_what_it_passes_on(monkeypatch):
    import mentor.lab.configs
    import mentor.lab.profiling

    seen = {}
    monkeypatch.setattr(mentor.lab.configs, "point_setup", lambda point, profile: seen.update(point=point,
                        profile=profile) or ("setup", "batches"))
    monkeypatch.setattr(mentor.lab.profiling, "record_steps",
                        lambda setup, batches, path, active: seen.update(path=path, active=active) or path)
    monkeypatch.setattr(regimes, "load_trace", lambda path: _trace([(20, 5), (35, 5)]))
    point = OperatingPoint("tiny", 2, 32)
    r = measure_regime(point, CUDA_PROFILE)
    assert seen["point"] is point and seen["profile"] is CUDA_PROFILE and seen["active"] == 5
    assert seen["path"].name == "regime.json.gz" and seen["path"].parent.is_dir()
    assert r.hook_share is None
    assert measure_regime(point, CUDA_PROFILE, steps=2).gpu_idle == pytest.approx(0.5)  # 2 steps are enough
    assert seen["active"] == 2
    with pytest.raises(ValueError, match=r"^steps must be an int >= 2 \(the gaps between steps are measured\), "
                                         r"got 2\.5\.$"):
        measure_regime(point, CUDA_PROFILE, steps=2.5)
