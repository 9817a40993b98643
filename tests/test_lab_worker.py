"""mentor.lab.worker: under torchrun with two CPU processes and gloo, the same worker the two-GPU chapter runs with
NCCL (marked ``subprocess``); and its functions called in this process, with fakes for torchrun, training and the
collectives' process group, so that a changed default or argument fails here too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import background
import pytest

from mentor.lab import worker

REPO = Path(__file__).resolve().parent.parent
RUNS = """
import json, os, sys
from mentor.lab import worker
out = {}
for name, task, nproc, backend, profile in [
        ("agree", "agree", 2, "gloo", None), ("sync-cost", "sync-cost", 2, "gloo", "smoke"),
        ("placements", "placements", 2, "gloo", None), ("agree on nccl", "agree", 1, "nccl", None)]:
    if profile:
        os.environ["MENTOR_PROFILE"] = profile
    try:
        out[name] = {"records": worker.run(task, nproc, backend=backend)}
    except RuntimeError as error:
        out[name] = {"error": str(error)}
    os.environ.pop("MENTOR_PROFILE", None)
json.dump(out, sys.stdout)
"""


def torchrun_runs(env: dict[str, str]) -> dict[str, dict]:
    """Background job: worker.run of each task the tests below read, in one process of its own (each run starts
    torchrun and its ranks: two, one for the failing nccl run); {name: {"records": [...]} or {"error": the
    RuntimeError's message}}."""
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)}
    env.pop("MENTOR_PROFILE", None)  # the profile of each run is set inside
    done = subprocess.run([sys.executable, "-c", RUNS], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the torchrun runs failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


RUNS_KEY = background.job(torchrun_runs, "agree_records", "cost_records",
                          "test_placements_on_gloo_give_each_rank_the_expected_mean",
                          "test_a_failed_run_says_so_with_torchrun_output")


def _records(name: str) -> list[dict]:
    """The records of run ``name``; raises the RuntimeError worker.run raised."""
    run = background.result(RUNS_KEY)[name]
    if "error" in run:
        raise RuntimeError(run["error"])
    return run["records"]


@pytest.fixture(scope="module")
def agree_records() -> list[dict]:
    return _records("agree")


@pytest.mark.subprocess
def test_each_rank_writes_its_record(agree_records: list[dict]) -> None:
    assert [(r["task"], r["rank"], r["world_size"], r["backend"], r["device"]) for r in agree_records] == [
        ("agree", 0, 2, "gloo", "cpu"), ("agree", 1, 2, "gloo", "cpu")]


@pytest.mark.subprocess
def test_the_ranks_split_the_batches_unevenly(agree_records: list[dict]) -> None:
    """203 samples are 26 batches of 8 (the last one of 3): rank 0 gets 13 batches, rank 1 the other 13."""
    shards = [r["result"]["batches"] for r in agree_records]
    assert shards == [list(range(0, 26, 2)), list(range(1, 26, 2))]


@pytest.mark.subprocess
def test_synced_metrics_equal_one_process_over_all_data(agree_records: list[dict]) -> None:
    for record in agree_records:
        result = record["result"]
        assert set(result["distributed"]) == set(result["reference"])
        assert {k.split("/")[0] for k in result["reference"]} == {"suite", "flat suite", "torchmetrics"}
        assert result["distributed"] == result["reference"], f"rank {record['rank']}"


@pytest.mark.subprocess
def test_the_suite_equals_torchmetrics_on_the_same_data(agree_records: list[dict]) -> None:
    reference = agree_records[0]["result"]["reference"]
    for suite_key, tm_key in [("loss", "loss"), ("accuracy_micro", "accuracy_micro"),
                              ("accuracy_macro", "accuracy_macro"), ("f1_weighted", "f1_weighted")]:
        assert reference[f"suite/{suite_key}"] == pytest.approx(reference[f"torchmetrics/{tm_key}"], abs=1e-7)


@pytest.mark.subprocess
def test_the_flat_sync_gives_the_suite_its_exact_values(agree_records: list[dict]) -> None:
    for record in agree_records:
        values = record["result"]["distributed"]
        suite = {k.split("/", 1)[1]: v for k, v in values.items() if k.startswith("suite/")}
        flat = {k.split("/", 1)[1]: v for k, v in values.items() if k.startswith("flat suite/")}
        assert flat == suite and len(suite) == 14  # the loss, 12 scores and the count of invalid labels
        assert suite["invalid_labels"] == [0.0]


@pytest.mark.subprocess
def test_without_the_sync_each_rank_sees_only_its_shard(agree_records: list[dict]) -> None:
    """The check above could pass by accident if every rank saw all the data; each rank's own values differ."""
    for record in agree_records:
        result = record["result"]
        values = [k for k in result["reference"] if not k.endswith("invalid_labels")]  # 0 everywhere: no shard in it
        differ = [k for k in values if result["local"][k] != result["reference"][k]]
        assert len(differ) >= len(values) - 1, differ


@pytest.fixture(scope="module")
def cost_records() -> list[dict]:
    return _records("sync-cost")  # in the smoke profile


@pytest.mark.subprocess
def test_sync_cost_compares_every_configuration_on_both_ranks(cost_records: list[dict]) -> None:
    """Smoke profile: 2 rounds of 3 timed steps per configuration, in the same order on both ranks."""
    orders = [r["result"]["comparison"]["settings"]["orders"] for r in cost_records]
    assert orders[0] == orders[1] and len(orders[0]) == 2
    for record in cost_records:
        raw = record["result"]["comparison"]
        assert (raw["baseline"], raw["batch_size"]) == ("no metrics", 8)
        assert [r["name"] for r in raw["results"]] == list(worker.SYNC_CONFIGS)
        assert [[len(steps) for steps in r["round_step_ms"]] for r in raw["results"]] == [[3, 3]] * 5


@pytest.mark.subprocess
def test_each_rank_record_rebuilds_its_comparison(cost_records: list[dict]) -> None:
    comparisons = [worker.comparison_of(record) for record in cost_records]
    assert [c.baseline for c in comparisons] == ["no metrics", "no metrics"]
    assert [r.name for r in comparisons[1].results] == list(worker.SYNC_CONFIGS)
    with pytest.raises(ValueError, match="comparison_of takes one rank's record of task 'sync-cost'"):
        worker.comparison_of({"task": "agree", "result": {}})


@pytest.mark.subprocess
def test_collectives_per_report_follow_the_states(cost_records: list[dict]) -> None:
    """torchmetrics 1.9's gather_all_tensors, per state: one barrier, then one all_gather for a 0-dim state or
    two (sizes, then data) for a 1-dim one. The suite has 3 per-class states and 3 scalars: 6 barriers and
    3 * 2 + 3 = 9 all_gathers; flat_sync turns them into one all_reduce. The torchmetrics set syncs 22 states:
    MetricCollection's _compute_and_reduce calls compute() on every member, so each of the 4 score metrics syncs
    its own tp, fp, tn, fn (per class) and invalid-label count even inside one compute group, and the mean loss
    its 2 scalars: 22 barriers and 16 * 2 + 6 = 38 all_gathers. With dist_sync_on_step each forward() syncs the
    4 score metrics' 20 states."""
    for record in cost_records:
        counts = record["result"]["collectives"]
        assert counts["no metrics"] == {"per_step": {}, "per_report": {}}
        assert counts["suite, compute"] == {
            "per_step": {}, "per_report": {"collective: all_gather": 9, "collective: barrier": 6}}
        assert counts["suite, one all-reduce"] == {"per_step": {}, "per_report": {"collective: all_reduce": 1}}
        assert counts["macro, compute"] == {
            "per_step": {}, "per_report": {"collective: all_gather": 38, "collective: barrier": 22}}
        assert counts["macro, per step"]["per_step"] == {
            "collective: all_gather": 36.0, "collective: barrier": 20.0}


@pytest.mark.subprocess
def test_placements_on_gloo_give_each_rank_the_expected_mean() -> None:
    records = _records("placements")
    by_rank = [{row["placement"]: row.get("value", row.get("error")) for row in r["result"]} for r in records]
    assert by_rank == [{"no sync": 1.0, "default group": 1.5, "gloo subgroup": 1.5},
                       {"no sync": 2.0, "default group": 1.5, "gloo subgroup": 1.5}]


@pytest.mark.subprocess
def test_a_failed_run_says_so_with_torchrun_output() -> None:
    with pytest.raises(RuntimeError, match=r"torchrun of mentor.lab.worker agree failed \(exit 1\)"):
        _records("agree on nccl")  # no CUDA here: the one rank fails to pick its GPU


@pytest.mark.subprocess
@pytest.mark.parametrize("task, nproc, match", [("train", 2, r"unknown task 'train'"),
                                                 ("agree", 0, r"nproc must be a whole number"),
                                                 ("agree", True, r"nproc must be a whole number")])
def test_run_refuses_bad_arguments(task: str, nproc: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        worker.run(task, nproc)


@pytest.mark.subprocess
def test_main_outside_torchrun_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit):
        worker.main(["agree", "--out", str(tmp_path)])
    assert ("start the worker with torchrun (torchrun --nproc-per-node=2 -m mentor.lab.worker agree"
            in capsys.readouterr().err)


# ----------------------------------------------------------------------------------------------------------
# The worker's functions in this process: torchrun, training and compare() replaced by fakes


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
                       "-m", "mentor.lab.worker", "agree", "--out", str(tmp_path), "--seed", "0"]
    assert (kwargs["capture_output"], kwargs["text"], kwargs["timeout"]) == (True, True, 600.0)
    assert kwargs["env"]["PYTHONPATH"] == f"{worker.REPO}{__import__('os').pathsep}/elsewhere"
    assert worker.REPO == Path(__file__).resolve().parent.parent  # the folder holding mentor/, not mentor/ itself
    assert kwargs["env"]["OMP_NUM_THREADS"] == "1"


def test_placements_on_cpu_runs_the_three_cpu_placements_with_20_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    import mentor.lab.ddp

    monkeypatch.setattr(mentor.lab.ddp, "placement_compute", lambda *args: args)
    assert worker.placements(1, 2, worker.torch.device("cpu")) == [
        (1, 2, "no sync", 20), (1, 2, "default group", 20), (1, 2, "gloo subgroup", 20)]


def test_collectives_per_report_averages_over_two_measured_steps_and_reports_at_step_3(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake training loop calls on_step once per step: the first (unmeasured) step and the second make no
    collective, the third makes one all_reduce, so 1 call over the 2 measured steps is 0.5 per step; the report
    hook is called with the step after them (3) and makes one barrier."""
    import torch.distributed as dist

    import mentor.lab.train
    from mentor.lab.ddp import single_rank_group

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

    monkeypatch.setattr(mentor.lab.train, "train", fake_train)
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

    import mentor.lab.compare
    import mentor.lab.data
    import mentor.lab.train
    from mentor.lab.ddp import single_rank_group

    seen: dict = {}
    real_build_setup, real_device_batches = mentor.lab.train.build_setup, mentor.lab.data.device_batches

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
    monkeypatch.setattr(mentor.lab.train, "build_setup", build_setup)
    monkeypatch.setattr(mentor.lab.data, "device_batches", device_batches)
    monkeypatch.setattr(mentor.lab.compare, "compare", compare)
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


def test_run_with_its_own_scratch_folder_passes_every_argument_and_keeps_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """run() without ``out``: the ranks write into a fresh ``mentor-worker-*`` folder of the temp dir, removed
    afterwards; nproc, backend, seed and timeout reach torchrun; the child keeps this process's environment and
    its OMP_NUM_THREADS (one process, nproc=1, is allowed)."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    calls = []

    def fake_run(command, **kwargs):
        calls.append((command, kwargs))
        folder = Path(command[command.index("--out") + 1])
        assert folder.is_dir()
        (folder / "rank0.json").write_text(json.dumps({"rank": 0}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(worker.subprocess, "run", fake_run)
    monkeypatch.setenv("MENTOR_WORKER_PROBE", "kept")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker.run("placements", 1, backend="gloo", seed=5, timeout=7.0) == [{"rank": 0}]
    [(command, kwargs)] = calls
    folder = Path(command[command.index("--out") + 1])
    assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("mentor-worker-")
    assert not folder.exists()
    assert command == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                       "-m", "mentor.lab.worker", "placements", "--out", str(folder), "--seed", "5",
                       "--backend", "gloo"]
    assert kwargs["timeout"] == 7.0
    assert (kwargs["env"]["MENTOR_WORKER_PROBE"], kwargs["env"]["OMP_NUM_THREADS"]) == ("kept", "3")


@pytest.mark.parametrize("task, nproc, options, message", [
    ("train", 2, {}, "unknown task 'train': pass one of ['agree', 'sync-cost', 'placements']."),
    ("agree", 0, {}, "nproc must be a whole number of processes >= 1, not 0."),
    ("agree", -1, {}, "nproc must be a whole number of processes >= 1, not -1."),
    ("agree", True, {}, "nproc must be a whole number of processes >= 1, not True."),
    ("agree", 1.5, {}, "nproc must be a whole number of processes >= 1, not 1.5."),
    ("sync-cost", 2, {"rounds": 0}, "rounds must be an int >= 1, got 0."),
    ("sync-cost", 2, {"rounds": True}, "rounds must be an int >= 1, got True."),
    ("sync-cost", 2, {"rounds": 2.0}, "rounds must be an int >= 1, got 2.0."),
    ("agree", 2, {"rounds": 16}, "rounds applies to task 'sync-cost' only, not 'agree': leave it out."),
])
def test_run_refuses_bad_arguments_before_starting_torchrun(monkeypatch: pytest.MonkeyPatch, task: str, nproc,
                                                            options: dict, message: str) -> None:
    """The whole message of each refusal; torchrun is never started."""
    def fake_run(command, **kwargs):
        raise AssertionError(f"torchrun started: {command}")

    monkeypatch.setattr(worker.subprocess, "run", fake_run)
    with pytest.raises(ValueError) as exc:
        worker.run(task, nproc, **options)
    assert str(exc.value) == message


def test_placements_on_cuda_add_the_gpu_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a CUDA device (no GPU needed: placement_compute is a recorder) all four placements run."""
    import mentor.lab.ddp

    monkeypatch.setattr(mentor.lab.ddp, "placement_compute", lambda *args: args)
    assert worker.placements(0, 2, worker.torch.device("cuda", 0), repeats=3) == [
        (0, 2, "no sync", 3), (0, 2, "default group", 3), (0, 2, "gloo subgroup", 3), (0, 2, "gpu", 3)]


def test_sync_configs_describe_each_configuration_and_build_its_metrics_on_the_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the meta device (so that a metric left on the CPU shows): the descriptions, and for the two torchmetrics
    configurations 7-class macro scores and a loss mean on that device, synced at each step (and fed by forward)
    only in the second; the suite configuration gets the number of classes, the device and its name."""
    import mentor.lab.configs

    meta = worker.torch.device("meta")
    suites = []
    monkeypatch.setattr(mentor.lab.configs, "suite_config",
                        lambda num_classes, device, name: suites.append((num_classes, device, name))
                        or mentor.lab.configs.Config(name))
    configs = worker.sync_configs(7, meta)
    assert suites == [(7, meta, "suite, compute")]
    assert [(c.name, c.description) for c in configs] == [
        ("no metrics", ""),
        ("macro, compute",
         "macro scores (scatter_stat_scores) and a mean loss, updated, synced by compute()"),
        ("macro, per step",
         "macro scores (scatter_stat_scores) and a mean loss, called (forward) with dist_sync_on_step=True"),
        ("suite, compute", ""),
        ("suite, one all-reduce", "FusedMetrics synced in one all-reduce of one float64 buffer")]
    for config, per_step in ((configs[1], False), (configs[2], True)):
        on_step, on_report = config.make()
        metrics = on_report.__self__  # the LossAndScores whose report() is the report hook
        assert (metrics.forward, metrics.loss.dist_sync_on_step, metrics.loss.mean_value.device) == (
            per_step, per_step, meta)
        assert {name: (m.num_classes, m.average, m.dist_sync_on_step, m.tp.device)
                for name, m in metrics.scores.items()} == {
            name: (7, "macro", per_step, meta) for name in ("accuracy", "f1_score", "precision", "recall")}


def test_sync_cost_on_cuda_gives_ddp_the_rank_device_and_passes_the_same_setup_and_batches_everywhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """sync_cost on cuda:1 with DDP, the model, the batches, compare() and the collective counts replaced by
    recorders (no GPU needed): DDP gets device_ids=[1]; sync_configs gets the profile's classes and the device;
    compare() and every collectives_per_report() get the DDP setup and this rank's batches."""
    from dataclasses import dataclass

    import torch.nn.parallel

    import mentor.lab.compare
    import mentor.lab.data
    import mentor.lab.train

    @dataclass
    class FakeSetup:
        model: object

    class FakeDDP:
        def __init__(self, module, device_ids=None):
            self.module, self.device_ids = module, device_ids

    seen: dict = {"collectives": []}
    batches = object()
    real_sync_configs = worker.sync_configs

    def sync_configs(num_classes, device):
        seen["sync_configs"] = (num_classes, device)
        return real_sync_configs(num_classes, device)

    class Comparison:
        def to_dict(self):
            return {"stand-in": True}

    def compare(configs, setup, got_batches, **kwargs):
        seen["compare"] = (setup, got_batches)
        return Comparison()

    def collectives_per_report(config, setup, got_batches):
        seen["collectives"].append((config.name, setup, got_batches))
        return {}

    cuda1 = worker.torch.device("cuda", 1)
    monkeypatch.setenv("MENTOR_PROFILE", "smoke")
    monkeypatch.setattr(mentor.lab.train, "build_setup", lambda num_classes, device, seed: FakeSetup("resnet"))
    monkeypatch.setattr(mentor.lab.data, "device_batches", lambda *args, **kwargs: batches)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", FakeDDP)
    monkeypatch.setattr(mentor.lab.compare, "compare", compare)
    monkeypatch.setattr(worker, "sync_configs", sync_configs)
    monkeypatch.setattr(worker, "collectives_per_report", collectives_per_report)
    worker.sync_cost(1, 2, cuda1)
    setup, got_batches = seen["compare"]
    assert (setup.model.module, setup.model.device_ids, got_batches) == ("resnet", [1], batches)
    assert seen["sync_configs"] == (1000, cuda1)
    assert seen["collectives"] == [(name, setup, batches) for name in worker.SYNC_CONFIGS]


def test_agree_defaults_are_5_classes_203_samples_and_seed_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """203 samples in batches of 8 make 26 batches, the last one of 3: it need not divide among the ranks."""
    import torch

    asked = []
    real = worker._agree_data
    monkeypatch.setattr(worker, "_agree_data", lambda *a: asked.append(a) or real(*a))
    result = worker.agree(1, 2, torch.device("cpu"))
    assert asked == [(5, 203, 0)]
    assert result["batches"] == list(range(1, 26, 2))


def test_run_passes_rounds_to_sync_cost_as_its_last_argument(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """rounds=16 reaches torchrun as ``--rounds 16``, after every other argument; without it no --rounds is sent."""
    import json
    import subprocess

    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        for rank in (0, 1):
            (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(worker.subprocess, "run", fake_run)
    worker.run("sync-cost", 2, out=tmp_path, backend="nccl", rounds=16, timeout=1800.0)
    worker.run("sync-cost", 2, out=tmp_path)
    assert commands[0][-6:] == ["--seed", "0", "--backend", "nccl", "--rounds", "16"]
    assert "--rounds" not in commands[1]


@pytest.mark.parametrize("argv, error", [
    (["sync-cost", "--rounds", "0"], "argument --rounds: a whole number of interleaved rounds >= 1, not '0'"),
    (["sync-cost", "--rounds", "many"], "argument --rounds: a whole number of interleaved rounds >= 1, not 'many'"),
    (["placements", "--rounds", "4"], "--rounds applies to task sync-cost only, not placements: leave it out."),
])
def test_main_refuses_bad_rounds_before_joining_a_group(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], tmp_path,
                                                        argv: list[str], error: str) -> None:
    def init_process_group(*args, **kwargs):
        raise AssertionError("joined a process group")

    monkeypatch.setattr(worker.dist, "init_process_group", init_process_group)
    with pytest.raises(SystemExit) as exc:
        worker.main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert error in capsys.readouterr().err


def test_sync_cost_with_rounds_gives_compare_those_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """rounds=7 overrides the smoke profile's 2 rounds; everything else compare() gets stays the profile's."""
    import mentor.lab.compare
    from mentor.lab.ddp import single_rank_group

    seen: dict = {}

    class Comparison:
        def to_dict(self):
            return {}

    def compare(configs, setup, batches, **kwargs):
        seen.update(kwargs)
        return Comparison()

    monkeypatch.setenv("MENTOR_PROFILE", "smoke")
    monkeypatch.setattr(mentor.lab.compare, "compare", compare)
    monkeypatch.setattr(worker, "collectives_per_report", lambda config, setup, batches: {})
    with single_rank_group("gloo"):
        worker.sync_cost(0, 1, worker.torch.device("cpu"), rounds=7)
    assert seen == dict(steps=3, warmup=1, rounds=7, report_every=2, progress=False, seed=0)
    with single_rank_group("gloo"), pytest.raises(ValueError, match=r"rounds must be an int >= 1, got -3\."):
        worker.sync_cost(0, 1, worker.torch.device("cpu"), rounds=-3)
