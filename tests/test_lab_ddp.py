"""mentor.lab.ddp: the one-rank group (gloo and the CUDA-only "cuda:gloo"), launch with gloo (what it sends to the
spawned processes and what it refuses), and the placements of a host number; on CUDA (``@gpu``, run with
`pytest -m gpu`): the one-rank NCCL placements."""

import contextlib
import functools
import multiprocessing
import pickle
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torchmetrics import MeanMetric

from exact import whole
from marks import gpu
from mentor.lab.ddp import (
    WorkerResult,
    always_fails,
    compute_ms,
    default_backend,
    free_port,
    launch,
    loader_sum,
    metric_compute,
    placement_compute,
    placement_metric,
    placements_compute,
    placements_cost,
    rank_and_size,
    single_rank_group,
)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


@pytest.fixture(autouse=True)
def restore_rendezvous_env(monkeypatch):
    """single_rank_group writes MASTER_ADDR/MASTER_PORT into os.environ: put them back afterwards."""
    monkeypatch.setenv("MASTER_ADDR", "unset-by-test")
    monkeypatch.setenv("MASTER_PORT", "0")
    yield
    assert not dist.is_initialized(), "a test left a process group behind"


# Worker functions for launch: top level, so that spawned processes can import them.

def sleeps_forever(rank, world_size):
    time.sleep(600)


def fails_while_the_other_sleeps(rank, world_size):
    # both ranks past init_process_group first: a rank 0 that failed and left while rank 1 was still connecting
    # would fail rank 1's connection ("Connection closed by peer"), not leave it sleeping
    dist.barrier()
    if rank == 0:
        raise ValueError("planned failure on rank 0")
    time.sleep(600)  # not in a collective: only launch's own stop ends this rank


def _pretend_main(rank, world_size):
    return rank


_pretend_main.__module__ = "__main__"  # as if defined in a script or a notebook

_module_lambda = lambda rank, world_size: rank  # noqa: E731 - a lambda at the top level of a module


def several_gloo_workers(rank, world_size, loader_workers):
    """mentor.lab.ddp's worker functions one after the other in one launch, each called as launch calls it alone."""
    return {"rank_and_size": rank_and_size(rank, world_size),
            "metric_compute synced": metric_compute(rank, world_size, "cpu", True),
            "metric_compute unsynced": metric_compute(rank, world_size, "cpu", False),
            "loader_sum": loader_sum(rank, world_size, loader_workers)}


CUDA_ONLY_PLACEMENTS = ("gloo subgroup", "no sync", "default group")  # the failing one last


@pytest.fixture(scope="module")
def gloo_run():
    """One launch on gloo of several_gloo_workers (through functools.partial, which launch accepts), and the
    children left after it. One DataLoader worker per rank shows that a rank can start processes of its own (in a
    spawned rank they are spawned too, each importing torch: two per rank would double the cost, not the check).
    While it runs, another socket listens on the port that free_port returns: a launch that took its port from
    free_port, found free first and bound later, fails as it does when another process takes that port between."""
    with _busy_free_port():
        results = launch(functools.partial(several_gloo_workers, loader_workers=1), 2, backend="gloo", timeout=120)
    return results, multiprocessing.active_children()


@contextlib.contextmanager
def _busy_free_port():
    """free_port, in mentor.lab.ddp, returns a port on which another socket listens meanwhile."""
    import socket

    with socket.socket() as taken, pytest.MonkeyPatch.context() as patch:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        patch.setattr("mentor.lab.ddp.free_port", lambda: taken.getsockname()[1])
        yield taken.getsockname()[1]


@pytest.fixture(scope="module")
def cuda_only_run():
    """One launch, in a group with a backend for CUDA tensors only (as NCCL is), of placements_compute: each of
    CUDA_ONLY_PLACEMENTS in turn, in the group that launch made."""
    results = launch(placements_compute, 2, list(CUDA_ONLY_PLACEMENTS), 2, backend="cuda:gloo", timeout=120)
    return results, multiprocessing.active_children()


# ----------------------------------------------------------------------------------------------------------


def test_free_port():
    import socket

    port = free_port()
    # the OS picks it from its ephemeral range (Linux: ip_local_port_range), never a privileged port below 1024,
    # which only root could bind
    assert 1024 <= port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free right now


@no_cuda
def test_default_backend_without_cuda():
    assert default_backend() == "gloo"


def test_single_rank_group_gloo():
    with single_rank_group("gloo") as backend:
        assert backend == "gloo"
        assert dist.is_initialized()
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
        t = torch.tensor([2.0])
        dist.all_reduce(t)
        assert t.item() == 2.0  # one rank: the sum is its own value
        # a metric synced over the one-rank group computes its own value
        m = MeanMetric()
        m.update(torch.tensor([1.0, 2.0]))
        assert float(m.compute()) == 1.5
    assert not dist.is_initialized()


def test_single_rank_group_destroyed_when_the_body_raises():
    with pytest.raises(KeyError, match="boom"):
        with single_rank_group("gloo"):
            raise KeyError("boom")
    assert not dist.is_initialized()


def test_single_rank_group_takes_no_port_found_free_earlier():
    """Without a port, the store listens on one the OS gives it as it binds: a port that free_port found free and
    another process took meanwhile (here, a socket listening on it) does not make the group fail."""
    import os

    with _busy_free_port() as taken, single_rank_group("gloo"):
        assert dist.get_world_size() == 1
        assert os.environ["MASTER_PORT"] != str(taken)


def test_single_rank_group_uses_the_given_port():
    port = free_port()
    import os

    with single_rank_group("gloo", port=port):
        assert os.environ["MASTER_PORT"] == str(port)


def test_single_rank_group_refuses_a_second_group():
    with single_rank_group("gloo"):
        with pytest.raises(RuntimeError, match=r"a default process group already exists.*destroy_process_group"):
            with single_rank_group("gloo"):
                pass
        assert dist.is_initialized()  # the outer group is untouched
    assert not dist.is_initialized()


@no_cuda
def test_single_rank_group_nccl_needs_cuda():
    with pytest.raises(RuntimeError, match=r"backend 'nccl' needs CUDA and torch sees none; use 'gloo' or 'cuda:gloo'"):
        with single_rank_group("nccl"):
            pass
    assert not dist.is_initialized()


def test_single_rank_group_rejects_non_string_backend():
    with pytest.raises(TypeError, match=r"backend must be a string such as 'nccl', 'gloo' or 'cuda:gloo', not 3"):
        with single_rank_group(3):  # type: ignore[arg-type]
            pass


def test_cuda_only_group_breaks_cpu_metric_compute():
    """The article's DDP failure on a CPU machine: a group with a backend for CUDA tensors only
    (as NCCL is) cannot all-gather a CPU metric's state when compute() syncs it."""
    with single_rank_group("cuda:gloo"):
        m = MeanMetric()
        m.update(torch.tensor(1.0))
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            m.compute()
        # without the sync on compute, the same metric in the same group computes fine
        local = MeanMetric(sync_on_compute=False)
        local.update(torch.tensor([1.0, 3.0]))
        assert float(local.compute()) == 2.0
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------------------------------------
# launch (spawned processes, gloo)


def test_launch_rank_and_size(gloo_run):
    results, children = gloo_run
    assert [(r.rank, r.ok, r.value["rank_and_size"], r.error) for r in results] == [
        (0, True, (0, 2), None), (1, True, (1, 2), None)]
    assert children == []


@pytest.mark.parametrize("sync_on_compute,expected", [(True, [1.5, 1.5]), (False, [1.0, 2.0])])
def test_launch_metric_compute(gloo_run, sync_on_compute, expected):
    # rank r updates with r + 1: synced, both see the mean of 1 and 2; unsynced, each its own value
    results, _ = gloo_run
    assert all(r.ok for r in results), [r.error for r in results]
    key = "metric_compute synced" if sync_on_compute else "metric_compute unsynced"
    assert [r.value[key] for r in results] == expected


def test_launch_failure_returns_quickly_and_cleans_up():
    start = time.monotonic()
    results = launch(always_fails, 2, backend="gloo", timeout=120)
    elapsed = time.monotonic() - start
    assert elapsed < 60, elapsed  # far below the timeout: the failure ends the wait
    assert not results[0].ok
    assert results[0].error.startswith("ValueError: planned failure on rank 0")
    assert not results[1].ok  # rank 1 waited in a barrier: killed, or failed when rank 0 left
    assert multiprocessing.active_children() == []


def test_launch_terminates_workers_after_the_timeout():
    start = time.monotonic()
    results = launch(sleeps_forever, 1, backend="gloo", timeout=5)
    assert time.monotonic() - start < 30
    assert results == [WorkerResult(0, error="no result: the worker was terminated or died")]
    assert multiprocessing.active_children() == []


def test_launch_rejects_lambdas_and_local_functions():
    def local(rank, world_size):
        return rank

    for fn in (lambda rank, world_size: rank, local, _pretend_main):
        with pytest.raises(ValueError, match=r"spawned processes cannot import it; move it to the top level"):
            launch(fn, 2, backend="gloo")


@pytest.mark.parametrize("fn,world_size,error,message", [
    (3, 2, TypeError, "fn must be a function, not int"),
    (rank_and_size, 0, ValueError, "world_size must be an int >= 1, got 0"),
    (rank_and_size, True, ValueError, "world_size must be an int >= 1, got True"),
    (rank_and_size, 1.0, ValueError, r"world_size must be an int >= 1, got 1.0"),
])
def test_launch_rejects_bad_arguments(fn, world_size, error, message):
    with pytest.raises(error, match=message):
        launch(fn, world_size, backend="gloo")
    assert multiprocessing.active_children() == []  # refused before starting anything


@no_cuda
def test_launch_nccl_needs_one_gpu_per_rank():
    with pytest.raises(RuntimeError, match=r"needs one GPU per rank: 2 ranks, 0 GPUs; use backend='gloo'"):
        launch(rank_and_size, 2, backend="nccl")


def test_worker_result_ok():
    assert WorkerResult(0, value=1).ok
    assert not WorkerResult(1, error="x").ok


def test_single_rank_group_restores_the_environment(monkeypatch):
    import os

    monkeypatch.delenv("MASTER_PORT")  # unset before: must be unset after
    with single_rank_group("gloo"):
        assert os.environ["MASTER_ADDR"] == "127.0.0.1" and "MASTER_PORT" in os.environ
    assert os.environ["MASTER_ADDR"] == "unset-by-test"
    assert "MASTER_PORT" not in os.environ


# --- where a host number can be averaged under DDP ---


def test_placements_on_two_ranks_with_a_cpu_backend_average_the_ranks_values():
    """placements_cost with ranks=2 launches placement_compute and makes its row of both ranks' values."""
    (row,) = placements_cost("cpu:gloo,cuda:gloo", ["default group"], ranks=2, repeats=2)
    assert row["values"] == [1.5, 1.5] and row["compute_ms"] > 0 and "error" not in row
    assert set(row) == {"backend", "placement", "values", "compute_ms"}
    assert (row["backend"], row["placement"]) == ("cpu:gloo,cuda:gloo", "default group")


@pytest.mark.parametrize("placement, expected", [("gloo subgroup", [1.5, 1.5]), ("no sync", [1.0, 2.0])])
def test_placements_on_two_ranks_under_a_cuda_only_backend(cuda_only_run, placement, expected):
    """The gloo subgroup syncs the CPU metric although the default group cannot; no sync keeps each rank's own."""
    results, children = cuda_only_run
    assert all(r.ok for r in results), [r.error for r in results]
    rows = [r.value[CUDA_ONLY_PLACEMENTS.index(placement)] for r in results]
    assert [row["value"] for row in rows] == expected
    assert all(set(row) == {"placement", "value", "compute_ms"} and row["placement"] == placement
               and row["compute_ms"] > 0 for row in rows), rows
    assert children == []


def test_cpu_metric_without_a_cpu_backend_reports_the_error(cuda_only_run):
    results, _ = cuda_only_run
    assert [r.value[CUDA_ONLY_PLACEMENTS.index("default group")] for r in results] == [
        {"placement": "default group", "error": "No backend type associated with device type cpu"}] * 2


def test_placements_in_one_launch_make_a_row_per_placement(monkeypatch):
    """fresh=False: one launch of placements_compute for all placements; its per-rank lists become the rows."""
    calls = []

    def fake_launch(fn, world_size, placements, repeats, backend):
        calls.append((fn, world_size, placements, repeats, backend))
        return [WorkerResult(r, value=[{"placement": "no sync", "value": r + 1.0, "compute_ms": 0.5 + r},
                                       {"placement": "default group", "error": "no backend"}])
                for r in range(world_size)]

    monkeypatch.setattr("mentor.lab.ddp.launch", fake_launch)
    rows = placements_cost("cuda:gloo", ["no sync", "default group"], ranks=2, repeats=3, fresh=False)
    assert calls == [(placements_compute, 2, ["no sync", "default group"], 3, "cuda:gloo")]
    assert rows == [{"backend": "cuda:gloo", "placement": "no sync", "values": [1.0, 2.0], "compute_ms": 1.5},
                    {"backend": "cuda:gloo", "placement": "default group", "error": "no backend"}]


def test_placements_one_rank_in_process():
    rows = placements_cost("cuda:gloo", ["no sync", "gloo subgroup"], repeats=2)
    assert [r["values"] for r in rows] == [[1.0], [1.0]]
    assert not dist.is_initialized()


def test_compute_ms_times_each_compute_after_an_update(monkeypatch):
    ticks = iter(range(100))
    monkeypatch.setattr("time.perf_counter", lambda: next(ticks) * 0.004)  # 4 ms between readings
    metric = MeanMetric()
    value, ms = compute_ms(metric, 3.0, repeats=3)
    assert value == 3.0 and ms == pytest.approx(4.0)
    assert int(metric.update_count) == 4  # one untimed and three timed reports, each after its own update


@pytest.mark.parametrize("call, error, message", [
    (lambda: placement_metric("somewhere"), ValueError, "unknown placement 'somewhere'"),
    (lambda: placement_metric("gloo subgroup"), ValueError, "needs group=torch.distributed.new_group"),
    (lambda: placements_cost("gloo", ["nowhere"]), ValueError, r"unknown placement\(s\) \['nowhere'\]"),
    (lambda: placements_cost("gloo", ["no sync"], ranks=0), ValueError, "ranks must be an int >= 1, got 0"),
    (lambda: placements_cost("gloo", ["no sync"], fresh=None), TypeError, "fresh must be True or False"),
    (lambda: compute_ms(MeanMetric(), 1.0, repeats=0), ValueError, "repeats must be an int >= 1, got 0"),
])
def test_placement_helpers_reject_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_launch_workers_can_use_dataloader_workers(gloo_run):
    results, children = gloo_run
    assert [r.value["loader_sum"] for r in results] == [6.0, 7.0], [r.error for r in results]
    assert children == []


@pytest.mark.parametrize("timeout", [-1, 0, float("inf"), float("nan"), True, "10"])
def test_launch_rejects_bad_timeouts(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        launch(rank_and_size, 1, backend="gloo", timeout=timeout)


def test_launch_stops_waiting_at_the_first_failure():
    start = time.monotonic()
    results = launch(fails_while_the_other_sleeps, 2, backend="gloo", timeout=100)
    assert time.monotonic() - start < 40  # a launch that kept waiting would take the whole timeout
    assert results[0].error.startswith("ValueError: planned failure on rank 0")
    assert results[1] == WorkerResult(1, error="no result: the worker was terminated or died")
    assert multiprocessing.active_children() == []


def test_metric_compute_by_default_syncs_a_cpu_metric_on_compute():
    """In this process, in a one-rank gloo group: rank 1's value 2.0, gathered (one barrier and one all_gather per
    0-dim state of MeanMetric, its mean_value and weight); with sync_on_compute=False, no collective at all."""
    from mentor.syncs import SyncReport, _intercept

    with single_rank_group("gloo"):
        with _intercept(SyncReport()) as synced:
            assert metric_compute(1, 2) == 2.0
        with _intercept(SyncReport()) as local:
            assert metric_compute(1, 2, "cpu", False) == 2.0
    assert dict(synced.by_kind()) == {"collective: barrier": 2, "collective: all_gather": 2}
    assert dict(local.by_kind()) == {}


def test_metric_compute_by_default_breaks_under_a_cuda_only_group():
    """The article's failure, in this process: the default (a CPU metric synced on compute) needs a CPU backend."""
    with single_rank_group("cuda:gloo"):
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            metric_compute(0, 1)


# --- the default backend's spelling, compute_ms's feeding, the placements' groups and defaults ---


def test_default_backend_is_lower_case_nccl_when_cuda_is_available(monkeypatch):
    """single_rank_group tests `"nccl" in backend`: the name must be spelled as torch spells it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_backend() == "nccl"


class _FakeCudaMetric:
    """Stands in for a metric on a CUDA device: records what each update gets; compute returns the last value."""

    device = torch.device("cuda")

    def __init__(self):
        self.updates = []

    def update(self, value):
        self.updates.append(value)

    def compute(self):
        return torch.as_tensor(self.updates[-1])


def test_compute_ms_feeds_a_cuda_metric_host_tensors_and_a_cpu_metric_the_float(monkeypatch):
    """A CUDA metric gets host_scalar(value) (a float32 CPU tensor, copied without a sync), never the bare float."""
    from mentor.sync_free import host_scalar

    made = []
    monkeypatch.setattr("mentor.sync_free.host_scalar", lambda v: made.append(v) or host_scalar(v))
    metric = _FakeCudaMetric()
    assert compute_ms(metric, 2.5, repeats=2)[0] == 2.5
    assert made == [2.5, 2.5, 2.5]  # the untimed update and two timed ones
    assert all(isinstance(u, torch.Tensor) and u.device.type == "cpu" and u.dtype == torch.float32
               and float(u) == 2.5 for u in metric.updates)
    cpu = MeanMetric()
    cpu_updates = []
    monkeypatch.setattr(cpu, "update", lambda v: cpu_updates.append(v))
    monkeypatch.setattr(cpu, "compute", lambda: torch.tensor(2.5))
    compute_ms(cpu, 2.5, repeats=1)
    assert cpu_updates == [2.5, 2.5] and made == [2.5, 2.5, 2.5]


def test_compute_ms_accepts_a_single_repeat():
    metric = MeanMetric()
    assert compute_ms(metric, 4.0, repeats=1)[0] == 4.0
    assert int(metric.update_count) == 2  # the untimed report and the one timed


def test_placement_metric_default_group_syncs_through_the_default_group():
    with single_rank_group("gloo"):
        metric = placement_metric("default group")
        assert type(metric) is MeanMetric
        assert metric.sync_on_compute is True and metric.process_group is None


def test_only_the_gloo_subgroup_placement_makes_a_group(monkeypatch):
    """new_group is a collective of every rank: placements that do not need a subgroup must not make one."""
    made = []
    real = dist.new_group
    monkeypatch.setattr(dist, "new_group", lambda **kw: made.append(kw) or real(**kw))
    with single_rank_group("gloo"):
        for placement in ("no sync", "default group"):
            result = placement_compute(0, 1, placement, 1)
            assert (result["placement"], result["value"]) == (placement, 1.0)
        assert made == []
        assert placement_compute(0, 1, "gloo subgroup", 1)["value"] == 1.0
    assert made == [{"backend": "gloo"}]


def test_placement_compute_reports_twenty_timed_computes_by_default(monkeypatch):
    seen = []
    monkeypatch.setattr("mentor.lab.ddp.compute_ms",
                        lambda metric, value, repeats: seen.append(repeats) or (value, 1.0))
    with single_rank_group("gloo"):
        assert placement_compute(0, 1, "no sync") == {"placement": "no sync", "value": 1.0, "compute_ms": 1.0}
    assert seen == [20]


def test_one_rank_placements_run_in_a_group_on_the_given_backend():
    """ranks=1 runs in this process on `backend`: a CUDA-only group breaks the CPU metric's sync, as on two ranks."""
    (row,) = placements_cost("cuda:gloo", ["default group"], repeats=1)
    assert row == {"backend": "cuda:gloo", "placement": "default group",
                   "error": "No backend type associated with device type cpu"}
    assert not dist.is_initialized()


class _TopLevelCallable:
    """A callable object: importable through its class, but without a __qualname__ of its own."""

    def __call__(self, rank, world_size):
        return rank


def test_launch_checks_a_callable_without_a_qualname_and_goes_on_to_the_next_check():
    assert not hasattr(_TopLevelCallable(), "__qualname__")
    with pytest.raises(ValueError) as raised:
        launch(_TopLevelCallable(), 0, backend="gloo")
    assert str(raised.value) == "world_size must be an int >= 1, got 0."


def test_launch_names_the_function_it_refuses_in_the_whole_message():
    def local(rank, world_size):
        return rank

    with pytest.raises(ValueError) as raised:
        launch(local, 2, backend="gloo")
    assert str(raised.value) == (
        "'test_launch_names_the_function_it_refuses_in_the_whole_message.<locals>.local' is defined inside a "
        "function body, so spawned processes cannot import it; move it to the top level of a module "
        "(mentor.lab.ddp has examples) and pass that.")


def test_launch_nccl_with_one_gpu_per_rank_goes_on_to_start_the_workers(monkeypatch):
    """As many GPUs as ranks is enough: the check lets it through to the spawn context (stopped here)."""
    import mentor.lab.ddp

    class Spawned(Exception):
        pass

    def get_context(method):
        raise Spawned(method)

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(mentor.lab.ddp.mp, "get_context", get_context)
    with pytest.raises(Spawned, match="^spawn$"):
        launch(rank_and_size, 2, backend="nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RuntimeError) as raised:
        launch(rank_and_size, 2, backend="nccl")
    assert str(raised.value) == ("backend 'nccl' needs one GPU per rank: 2 ranks, 1 GPUs; use backend='gloo' "
                                 "or fewer ranks.")


# ----------------------------------------------------------------------------------------------------------
# What launch sends: anything that pickles and that spawned processes can import; the rest is refused by name


class _Unpicklable:
    """A top-level callable whose pickling fails, as one holding a lock or an open file would."""

    def __call__(self, rank, world_size):
        return rank

    def __reduce__(self):
        raise TypeError("cannot pickle this stand-in for a lock")

    def __repr__(self):
        return "<_Unpicklable>"


@pytest.fixture(scope="module")
def slot_wrapper_run():
    """One launch of int.__add__, a slot wrapper: it has no __module__, and pickles by reference."""
    results = launch(int.__add__, 2, backend="gloo", timeout=120)
    return results, multiprocessing.active_children()


def test_launch_sends_a_slot_wrapper_to_the_spawned_processes(slot_wrapper_run):
    """int.__add__(rank, world_size) runs in each rank: 0 + 2 and 1 + 2."""
    assert not hasattr(int.__add__, "__module__")
    results, children = slot_wrapper_run
    assert results == [WorkerResult(0, value=2), WorkerResult(1, value=3)]
    assert children == []


@pytest.mark.parametrize("fn, reason", [
    (lambda rank, world_size: rank, "is a lambda"),
    (_module_lambda, "is a lambda"),
    (_pretend_main, "is defined in __main__ (a script run directly, or a notebook)"),
    (functools.partial(_pretend_main), "is defined in __main__ (a script run directly, or a notebook)"),
], ids=["lambda", "module-level lambda", "__main__ function", "partial of a __main__ function"])
def test_launch_refuses_what_spawned_processes_cannot_import_and_says_why(fn, reason):
    """A functools.partial pickles (by reference to its function) but is refused for the function it holds."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    with pytest.raises(ValueError, match=whole(
            f"{inner.__qualname__!r} {reason}, so spawned processes cannot import it; move it to the top level of a "
            "module (mentor.lab.ddp has examples) and pass that.")):
        launch(fn, 2, backend="gloo")
    assert multiprocessing.active_children() == []


def test_launch_refuses_what_cannot_be_pickled_naming_it_and_what_to_pass():
    with pytest.raises(ValueError, match=whole(
            "<_Unpicklable> cannot be sent to the spawned processes: pickling it fails (TypeError: cannot pickle "
            "this stand-in for a lock); pass a function defined at the top level of a module (mentor.lab.ddp has "
            "examples), or functools.partial of one with arguments that pickle.")):
        launch(_Unpicklable(), 2, backend="gloo")
    assert multiprocessing.active_children() == []


def test_launch_refuses_a_partial_of_a_local_function_by_the_function_s_name():
    def local(rank, world_size):
        return rank

    with pytest.raises(ValueError, match=whole(
            "'test_launch_refuses_a_partial_of_a_local_function_by_the_function_s_name.<locals>.local' is defined "
            "inside a function body, so spawned processes cannot import it; move it to the top level of a module "
            "(mentor.lab.ddp has examples) and pass that.")):
        launch(functools.partial(local, 1), 2, backend="gloo")
    assert multiprocessing.active_children() == []


def test_launch_refuses_a_partial_with_an_argument_that_does_not_pickle_with_pickle_s_reason():
    """The function is importable, but a lock among the partial's arguments cannot be sent: pickle's own error."""
    fn = functools.partial(rank_and_size, threading.Lock())
    with pytest.raises(Exception) as pickling:
        pickle.dumps(fn)
    with pytest.raises(ValueError, match=whole(
            f"{fn!r} cannot be sent to the spawned processes: pickling it fails ({type(pickling.value).__name__}: "
            f"{pickling.value}); pass a function defined at the top level of a module (mentor.lab.ddp has "
            "examples), or functools.partial of one with arguments that pickle.")):
        launch(fn, 2, backend="gloo")
    assert multiprocessing.active_children() == []


# ----------------------------------------------------------------------------------------------------------
# On CUDA


@gpu
def test_one_rank_nccl_placements():
    rows = {r["placement"]: r for r in placements_cost("nccl", ["default group", "gloo subgroup", "gpu"], repeats=3)}
    assert rows["default group"]["error"] == "No backend type associated with device type cpu"
    assert rows["gloo subgroup"]["values"] == [1.0] and rows["gpu"]["values"] == [1.0]
    (mixed,) = placements_cost("cpu:gloo,cuda:nccl", ["default group"], repeats=3)
    assert mixed["values"] == [1.0]
