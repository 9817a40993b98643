"""mentor.worker under torchrun with two CPU processes and gloo: the same worker the two-GPU chapter runs with NCCL."""

from __future__ import annotations

import pytest

from mentor import worker

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def agree_records() -> list[dict]:
    return worker.run("agree", 2, backend="gloo")


def test_each_rank_writes_its_record(agree_records: list[dict]) -> None:
    assert [(r["task"], r["rank"], r["world_size"], r["backend"], r["device"]) for r in agree_records] == [
        ("agree", 0, 2, "gloo", "cpu"), ("agree", 1, 2, "gloo", "cpu")]


def test_the_ranks_split_the_batches_unevenly(agree_records: list[dict]) -> None:
    """203 samples are 26 batches of 8 (the last one of 3): rank 0 gets 13 batches, rank 1 the other 13."""
    shards = [r["result"]["batches"] for r in agree_records]
    assert shards == [list(range(0, 26, 2)), list(range(1, 26, 2))]


def test_synced_metrics_equal_one_process_over_all_data(agree_records: list[dict]) -> None:
    for record in agree_records:
        result = record["result"]
        assert set(result["distributed"]) == set(result["reference"])
        assert {k.split("/")[0] for k in result["reference"]} == {"suite", "flat suite", "torchmetrics"}
        assert result["distributed"] == result["reference"], f"rank {record['rank']}"


def test_the_suite_equals_torchmetrics_on_the_same_data(agree_records: list[dict]) -> None:
    reference = agree_records[0]["result"]["reference"]
    for suite_key, tm_key in [("loss", "loss"), ("accuracy_micro", "accuracy_micro"),
                              ("accuracy_macro", "accuracy_macro"), ("f1_weighted", "f1_weighted")]:
        assert reference[f"suite/{suite_key}"] == pytest.approx(reference[f"torchmetrics/{tm_key}"], abs=1e-7)


def test_the_flat_sync_gives_the_suite_its_exact_values(agree_records: list[dict]) -> None:
    for record in agree_records:
        values = record["result"]["distributed"]
        suite = {k.split("/", 1)[1]: v for k, v in values.items() if k.startswith("suite/")}
        flat = {k.split("/", 1)[1]: v for k, v in values.items() if k.startswith("flat suite/")}
        assert flat == suite and len(suite) == 13


def test_without_the_sync_each_rank_sees_only_its_shard(agree_records: list[dict]) -> None:
    """The check above could pass by accident if every rank saw all the data; each rank's own values differ."""
    for record in agree_records:
        result = record["result"]
        differ = [k for k in result["reference"] if result["local"][k] != result["reference"][k]]
        assert len(differ) >= len(result["reference"]) - 1, differ


@pytest.fixture(scope="module")
def cost_records(monkeypatch_module: pytest.MonkeyPatch) -> list[dict]:
    monkeypatch_module.setenv("MENTOR_PROFILE", "smoke")
    return worker.run("sync-cost", 2, backend="gloo")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_sync_cost_compares_every_configuration_on_both_ranks(cost_records: list[dict]) -> None:
    """Smoke profile: 2 rounds of 3 timed steps per configuration, in the same order on both ranks."""
    orders = [r["result"]["comparison"]["settings"]["orders"] for r in cost_records]
    assert orders[0] == orders[1] and len(orders[0]) == 2
    for record in cost_records:
        raw = record["result"]["comparison"]
        assert (raw["baseline"], raw["batch_size"]) == ("no metrics", 8)
        assert [r["name"] for r in raw["results"]] == list(worker.SYNC_CONFIGS)
        assert [[len(steps) for steps in r["round_step_ms"]] for r in raw["results"]] == [[3, 3]] * 5


def test_each_rank_record_rebuilds_its_comparison(cost_records: list[dict]) -> None:
    comparisons = [worker.comparison_of(record) for record in cost_records]
    assert [c.baseline for c in comparisons] == ["no metrics", "no metrics"]
    assert [r.name for r in comparisons[1].results] == list(worker.SYNC_CONFIGS)
    with pytest.raises(ValueError, match="comparison_of takes one rank's record of task 'sync-cost'"):
        worker.comparison_of({"task": "agree", "result": {}})


def test_collectives_per_report_follow_the_states(cost_records: list[dict]) -> None:
    """torchmetrics 1.9's gather_all_tensors, per state: one barrier, then one all_gather for a 0-dim state or
    two (sizes, then data) for a 1-dim one. The suite has 3 per-class states and 3 scalars: 6 barriers and
    3 * 2 + 3 = 9 all_gathers; flat_sync turns them into one all_reduce. The torchmetrics set syncs 22 states: MetricCollection's _compute_and_reduce calls
    compute() on every member, so each of the 4 score metrics syncs its own tp, fp, tn, fn (per class) and
    invalid-label count even inside one compute group, and the mean loss its 2 scalars: 22 barriers and
    16 * 2 + 6 = 38 all_gathers. With dist_sync_on_step each forward() syncs the 4 score metrics' 20 states."""
    for record in cost_records:
        counts = record["result"]["collectives"]
        assert counts["no metrics"] == {"per_step": {}, "per_report": {}}
        assert counts["suite, compute"] == {
            "per_step": {}, "per_report": {"collective: all_gather": 9, "collective: barrier": 6}}
        assert counts["suite, one all-reduce"] == {"per_step": {}, "per_report": {"collective: all_reduce": 1}}
        assert counts["torchmetrics, compute"] == {
            "per_step": {}, "per_report": {"collective: all_gather": 38, "collective: barrier": 22}}
        assert counts["torchmetrics, per step"]["per_step"] == {
            "collective: all_gather": 36.0, "collective: barrier": 20.0}


def test_placements_on_gloo_give_each_rank_the_expected_mean() -> None:
    records = worker.run("placements", 2, backend="gloo")
    by_rank = [{row["placement"]: row.get("value", row.get("error")) for row in r["result"]} for r in records]
    assert by_rank == [{"no sync": 1.0, "default group": 1.5, "gloo subgroup": 1.5},
                       {"no sync": 2.0, "default group": 1.5, "gloo subgroup": 1.5}]


def test_a_failed_run_says_so_with_torchrun_output() -> None:
    with pytest.raises(RuntimeError, match=r"torchrun of mentor.worker agree failed \(exit 1\)"):
        worker.run("agree", 2, backend="nccl")  # no CUDA here: every rank fails to pick its GPU


@pytest.mark.parametrize("task, nproc, match", [("train", 2, r"unknown task 'train'"),
                                                 ("agree", 0, r"nproc must be a whole number"),
                                                 ("agree", True, r"nproc must be a whole number")])
def test_run_refuses_bad_arguments(task: str, nproc: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        worker.run(task, nproc)


def test_main_outside_torchrun_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit):
        worker.main(["agree", "--out", str(tmp_path)])
    assert "start the worker with torchrun (torchrun --nproc-per-node=2 -m mentor.worker agree" in capsys.readouterr().err
