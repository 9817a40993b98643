"""mentor.worker's functions called in this process, without torchrun: fakes for torchrun, training and the
collectives' process group, so that a changed default or argument fails here (tests/test_mentor_worker.py starts
the real workers)."""

from __future__ import annotations

import pytest

from mentor import worker


def test_run_starts_torchrun_with_two_gloo_processes_seed_0_and_a_600_s_timeout(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The command line, environment and timeout of run()'s defaults; the records come back rank 0 first."""
    import json
    import subprocess
    import sys

    calls = []

    def fake_run(command, **kwargs):
        calls.append((command, kwargs))
        for rank in (1, 0):
            (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(worker.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker.run("agree", out=tmp_path) == [{"rank": 0}, {"rank": 1}]
    [(command, kwargs)] = calls
    assert command == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                       "-m", "mentor.worker", "agree", "--out", str(tmp_path), "--seed", "0"]
    assert (kwargs["capture_output"], kwargs["text"], kwargs["timeout"]) == (True, True, 600.0)
    assert kwargs["env"]["PYTHONPATH"] == f"{worker.REPO}{__import__('os').pathsep}/elsewhere"
    assert kwargs["env"]["OMP_NUM_THREADS"] == "1"


def test_placements_on_cpu_runs_the_three_cpu_placements_with_20_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    import mentor.ddp

    monkeypatch.setattr(mentor.ddp, "placement_compute", lambda *args: args)
    assert worker.placements(1, 2, worker.torch.device("cpu")) == [
        (1, 2, "no sync", 20), (1, 2, "default group", 20), (1, 2, "gloo subgroup", 20)]


def test_collectives_per_report_averages_over_two_measured_steps_and_reports_at_step_3(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake training loop calls on_step once per step: the first (unmeasured) step and the second make no
    collective, the third makes one all_reduce, so 1 call over the 2 measured steps is 0.5 per step; the report
    hook is called with the step after them (3) and makes one barrier."""
    import torch.distributed as dist

    import mentor.train
    from mentor.ddp import single_rank_group

    def fake_train(setup, batches, steps, *, on_step=None, **kwargs):
        assert (setup, batches) == ("setup", "batches") and kwargs == {}
        for _ in range(steps):
            on_step("state")

    calls, reports = [], []

    def on_step(state):
        calls.append(state)
        if len(calls) == 3:
            dist.all_reduce(worker.torch.zeros(1))

    def on_report(step):
        reports.append(step)
        dist.barrier()

    monkeypatch.setattr(mentor.train, "train", fake_train)
    config = type("Config", (), {"make": staticmethod(lambda: (on_step, on_report))})()
    with single_rank_group("gloo"):
        counts = worker.collectives_per_report(config, "setup", "batches")
    assert counts == {"per_step": {"collective: all_reduce": 0.5}, "per_report": {"collective: barrier": 1}}
    assert len(calls) == 3 and reports == [3]


def test_sync_cost_seeds_the_model_with_seed_and_the_batches_with_seed_plus_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """sync_cost with its default seed (0) on rank 1, the smoke profile, and compare() and the collective counts
    replaced by recorders: every rank builds the same model and runs the configurations in the same order
    (seed 0), on batches of its own (seed 0 + rank)."""
    from torch.nn.parallel import DistributedDataParallel

    import mentor.bench
    import mentor.data
    import mentor.train
    from mentor.ddp import single_rank_group

    seen: dict = {}
    real_build_setup, real_device_batches = mentor.train.build_setup, mentor.data.device_batches

    def build_setup(num_classes, device, seed):
        seen["build_setup"] = (num_classes, device, seed)
        return real_build_setup(num_classes, device, seed=seed)

    def device_batches(batch_size, image_size, num_classes, device, seed):
        seen["device_batches"] = (batch_size, image_size, num_classes, device, seed)
        return real_device_batches(batch_size, image_size, num_classes, device, seed=seed)

    class Comparison:
        def to_dict(self):
            return {"stand-in": True}

    def compare(configs, setup, batches, **kwargs):
        seen["compare"] = ([c.name for c in configs], type(setup.model), kwargs)
        return Comparison()

    monkeypatch.setenv("MENTOR_PROFILE", "smoke")
    monkeypatch.setattr(mentor.train, "build_setup", build_setup)
    monkeypatch.setattr(mentor.data, "device_batches", device_batches)
    monkeypatch.setattr(mentor.bench, "compare", compare)
    monkeypatch.setattr(worker, "collectives_per_report", lambda config, setup, batches: config.name)
    cpu = worker.torch.device("cpu")
    with single_rank_group("gloo"):
        result = worker.sync_cost(1, 2, cpu)
    assert result == {"comparison": {"stand-in": True},
                      "collectives": {name: name for name in worker.SYNC_CONFIGS}}
    assert seen["build_setup"] == (1000, cpu, 0)
    assert seen["device_batches"] == (8, 32, 1000, cpu, 1)
    assert seen["compare"] == (list(worker.SYNC_CONFIGS), DistributedDataParallel,
                               dict(steps=3, warmup=1, rounds=2, report_every=2, progress=False, seed=0))
