"""FusedMetrics' one-launch update (mentor._fused_kernel) and what keeps its states in place.

On the CPU: the kernel run by Triton's interpreter equals the plain update (hypothesis, in a subprocess); the
launcher cache per input layout, with a fake launcher; states kept in place by reset(), unsync() (two gloo ranks)
and marked static for torch.compile. On CUDA (``@gpu``): one kernel and no sync per update, equal to torchmetrics
and bit for bit to the plain path (hypothesis), and the update inside a step compiled with ``reduce-overhead``:
no graph break, no recompile, no CUDA-graph skip, no launch of its own, values equal to eager.
"""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import background
import ranks
from marks import gpu
from mentor import _direct_launch as direct_module
from mentor import _fused_kernel as kernel
from mentor import suite as suite_module
from mentor.suite import FusedMetrics
from mentor.syncs import count_syncs

def interpreted_fused(env: dict[str, str]):
    """Background job: tests/interpreted_kernel.py under Triton's interpreter, 100 hypothesis examples."""
    script = Path(__file__).with_name("interpreted_kernel.py")
    return background.run([sys.executable, str(script)], {**env, "TRITON_INTERPRET": "1", "EXAMPLES": "100"},
                          timeout=600)


INTERPRETED = background.job(interpreted_fused, "test_the_interpreted_kernel_equals_the_plain_update")

STATES = ("tp", "fp", "fn", "loss_sum", "loss_count", "invalid_labels")


@pytest.mark.subprocess
def test_the_interpreted_kernel_equals_the_plain_update():
    """Triton's interpreter runs the kernel on CPU tensors: 100 hypothesis examples (logits of every float dtype,
    transposed views, NaN / inf / ties, several column tiles, class indices, ignore_index, out-of-range labels)."""
    done = background.result(INTERPRETED)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout[-3000:] + done.stderr[-3000:]


def test_tiles_depend_on_the_class_count_only():
    assert [kernel.tiles(c, logits=True) for c in (2, 1000, 1024, 1025, 2048, 2049, 100_000)] == [
        (256, 2), (4, 1024), (4, 1024), (2, 2048), (2, 2048), (2, 2048), (2, 2048)]
    assert kernel.tiles(1000, logits=False) == (256, 1)
    assert [kernel.programs(n, 4) for n in (0, 1, 4, 5, 128)] == [1, 1, 1, 2, 32]


@pytest.mark.skipif(not kernel.AVAILABLE, reason="compares with Triton's own helper")
@given(st.integers(1, 1 << 40))
def test_the_power_of_2_helper_equals_tritons(n):
    assert kernel._next_power_of_2(n) == kernel.triton.next_power_of_2(n)


def test_the_kernel_arguments_follow_the_layout():
    logits = torch.zeros(10, 6).t()  # (6, 10), strides (1, 6)
    ints, constants, grid = kernel._arguments(logits, torch.zeros(12, dtype=torch.long)[::2], 10, -100)
    assert ints == (6, 10, 1, 6, 2, -100)
    assert constants == {"LOGITS": True, "HAS_IGNORE": True, "WIDE": False, "ROWS": 256, "COLS": 16}
    assert grid == 1
    ints, constants, grid = kernel._arguments(torch.zeros(600, dtype=torch.long), torch.zeros(600, dtype=torch.long),
                                              10, None)
    assert (ints, grid) == ((600, 10, 1, 0, 1, 0), 3)
    assert constants == {"LOGITS": False, "HAS_IGNORE": False, "WIDE": False, "ROWS": 256, "COLS": 1}
    assert kernel._arguments(torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, dtype=torch.long), 4,
                             None)[1]["WIDE"] is True


# The launcher cache, with the kernel path forced on CPU tensors and a launcher that records its uses.

class FakeLaunchers:
    def __init__(self):
        self.made, self.runs = [], 0

    def __call__(self, preds, target, num_classes, ignore_index):
        self.made.append((tuple(preds.shape), preds.dtype, num_classes, ignore_index))

        def run(loss, preds, target, states):
            self.runs += 1
            metric = FusedMetrics(num_classes, ignore_index=ignore_index)
            metric._plain_update(loss, preds, target)
            for state, value in zip(states, (metric.tp, metric.fp, metric.fn, metric.loss_sum, metric.loss_count,
                                             metric.invalid_labels)):
                state += value

        return run


@pytest.fixture
def fake(monkeypatch):
    launchers = FakeLaunchers()
    monkeypatch.setattr(suite_module, "_uses_kernel", lambda target: True)
    monkeypatch.setattr(direct_module, "launcher", launchers)  # the suite's launcher
    return launchers


def test_a_launcher_is_made_once_per_input_layout(fake):
    suite = FusedMetrics(3, ignore_index=-1)
    logits, target = torch.randn(4, 3), torch.tensor([0, 1, 2, -1])
    for _ in range(3):
        suite.update(torch.tensor(1.0), logits, target)
    assert fake.made == [((4, 3), torch.float32, 3, -1)] and fake.runs == 3
    suite.update(torch.tensor(1.0), logits[:2], target[:2])  # another batch size
    suite.update(torch.tensor(1.0), logits.t().contiguous().t(), target)  # another stride
    suite.update(torch.tensor(1.0), logits.double(), target)  # another dtype
    assert len(fake.made) == 4 and fake.runs == 6
    plain = FusedMetrics(3, ignore_index=-1)
    for batch in [(logits, target)] * 3 + [(logits[:2], target[:2]), (logits, target), (logits.double(), target)]:
        plain._plain_update(torch.tensor(1.0), *batch)
    assert all(torch.equal(getattr(suite, s), getattr(plain, s)) for s in STATES)


def test_a_cached_layout_still_refuses_bad_inputs(fake):
    suite = FusedMetrics(3)
    suite.update(torch.tensor(1.0), torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="loss must be a 0-dim floating-point tensor"):
        suite.update(1.0, torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="loss must be a 0-dim"):
        suite.update(torch.tensor([1.0]), torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"logits must have shape \(N, num_classes\) = \(2, 3\), got \(2, 4\)"):
        suite.update(torch.tensor(1.0), torch.randn(2, 4), torch.tensor([0, 1]))
    assert len(fake.made) == 1 and fake.runs == 1


def test_the_cache_is_bounded_and_dropped_on_a_move_or_a_load(fake):
    suite = FusedMetrics(3)
    for n in range(1, suite_module._MAX_LAUNCHERS + 1):
        suite.update(torch.tensor(1.0), torch.randn(n, 3), torch.zeros(n, dtype=torch.long))
    assert len(suite._launchers) == suite_module._MAX_LAUNCHERS
    suite.update(torch.tensor(1.0), torch.randn(100, 3), torch.zeros(100, dtype=torch.long))
    assert len(suite._launchers) == 1
    suite.to("cpu")
    assert suite._launchers == {}
    suite.update(torch.tensor(1.0), torch.randn(100, 3), torch.zeros(100, dtype=torch.long))
    fresh = FusedMetrics(3)
    fresh.persistent(True)
    suite.load_state_dict(fresh.state_dict())
    assert suite._launchers == {} and int(suite.loss_count) == 0


def test_launchers_are_not_pickled_or_shared_by_copies(fake):
    suite = FusedMetrics(3)
    suite.update(torch.tensor(1.0), torch.randn(2, 3), torch.tensor([0, 1]))
    assert len(suite._launchers) == 1
    again = pickle.loads(pickle.dumps(suite))
    assert again._launchers == {} and again.tp.tolist() == suite.tp.tolist()
    again.update(torch.tensor(1.0), torch.randn(2, 3), torch.tensor([0, 1]))
    assert len(fake.made) == 2
    assert copy.deepcopy(suite)._launchers == {}


def test_without_the_kernel_cpu_inputs_take_the_plain_path_each_time():
    suite = FusedMetrics(3)
    for _ in range(2):
        suite.update(torch.tensor(0.5), torch.randn(2, 3), torch.tensor([0, 1]))
    assert suite._launchers == {} and int(suite.loss_count) == 2
    assert suite_module._uses_kernel(torch.zeros(1)) is False


# States kept in place, and marked static.

def _static(tensor):
    return getattr(tensor, "_dynamo_static_input_type", None) == "unguarded"


def test_reset_zeroes_the_states_in_place():
    suite = FusedMetrics(3)
    suite.update(torch.tensor(0.5), torch.tensor([0, 2]), torch.tensor([0, 1]))
    held = [getattr(suite, s) for s in STATES]
    suite.reset()
    assert all(getattr(suite, s) is t for s, t in zip(STATES, held))
    assert [t.tolist() for t in held] == [[0, 0, 0]] * 3 + [0.0, 0, 0]
    assert suite._update_count == 0 and all(_static(t) for t in held)


def test_forward_replaces_the_states_and_marks_the_new_ones():
    suite = FusedMetrics(3)
    suite.update(torch.tensor(0.5), torch.tensor([0, 2]), torch.tensor([0, 1]))
    before = suite.tp
    batch = suite(torch.tensor(1.0), torch.tensor([1, 1]), torch.tensor([1, 1]))
    assert batch["accuracy_micro"].item() == 1.0  # the batch alone, computed from fresh states
    assert suite.tp is not before and suite.tp.tolist() == [1, 2, 0] and before.tolist() == [1, 0, 0]
    assert all(_static(getattr(suite, s)) for s in STATES) and suite._replacing_reset is False
    suite.reset()
    assert suite.tp.tolist() == [0, 0, 0]


def test_moved_and_loaded_states_are_marked_static():
    suite = FusedMetrics(3).to(torch.float64)
    assert all(_static(getattr(suite, s)) for s in STATES)
    other = FusedMetrics(3)
    other.persistent(True)
    other.load_state_dict({**{s: getattr(suite, s).clone() for s in STATES}})
    assert all(_static(getattr(other, s)) for s in STATES)


def held_states_across_compute(rank: int, world_size: int) -> dict[str, object]:
    """Worker: update, compute (a sync over both ranks), then report whether each state is the tensor it was."""
    suite = FusedMetrics(3)
    suite.update(torch.tensor(float(rank)), torch.tensor([rank, 2]), torch.tensor([rank, 1]))
    held = {s: getattr(suite, s) for s in STATES}
    out = suite.compute()
    return {"same": [getattr(suite, s) is held[s] for s in STATES], "tp": suite.tp.tolist(),
            "global_accuracy": out["accuracy_micro"].item(), "loss": out["loss"].item()}


HELD_STATES_ACROSS_COMPUTE_KEY = ranks.on_two_ranks(held_states_across_compute)


def test_on_two_gloo_ranks_compute_leaves_each_state_in_its_own_tensor():
    results = ranks.results(HELD_STATES_ACROSS_COMPUTE_KEY)
    assert [r.error for r in results] == [None, None]
    for r in results:
        assert r.value["same"] == [True] * 6
        assert r.value["tp"] == ([1, 0, 0] if r.rank == 0 else [0, 1, 0])  # local values again
        assert r.value["global_accuracy"] == 0.5 and r.value["loss"] == 0.5


# On CUDA

def _batch(n, classes, seed, dtype=torch.float32, ignore_index=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(n, classes, device="cuda", generator=gen).to(dtype)
    target = torch.randint(0, classes, (n,), device="cuda", generator=gen)
    if ignore_index is not None:
        target[::5] = ignore_index
    return torch.rand((), device="cuda", generator=gen), logits, target


@gpu
@pytest.mark.parametrize("n", [32, 128])
def test_one_kernel_and_no_sync_per_update(n):
    from mentor.lab.update_cost import _gpu_ops

    suite = FusedMetrics(1000, ignore_index=-100).cuda()
    batch = _batch(n, 1000, 0, ignore_index=-100)
    suite.update(*batch)
    torch.cuda.synchronize()
    assert _gpu_ops(lambda: suite.update(*batch), 10) == (1, 0)
    report = count_syncs(suite.update, *batch)
    assert report.count == 0, report.table()
    (run,) = suite._launchers.values()  # the suite's launcher: after the first launch, direct ones only
    assert isinstance(run, direct_module.DirectLauncher) and run.bound == 1 and run.direct == 10 + 1


@gpu
@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from([2, 10, 1000, 3000]), st.integers(0, 300), st.sampled_from([torch.float32, torch.bfloat16]),
       st.sampled_from([None, -100]), st.integers(0, 1000), st.booleans())
def test_on_cuda_equals_the_plain_path_and_torchmetrics(classes, n, dtype, ignore_index, seed, indices):
    from torchmetrics.classification import MulticlassStatScores

    loss, logits, target = _batch(n, classes, seed, dtype, ignore_index)
    if n:
        logits[0, classes - 1] = float("nan")
    preds = logits.argmax(1) if indices else logits
    fused, plain = FusedMetrics(classes, ignore_index=ignore_index).cuda(), FusedMetrics(classes, ignore_index=ignore_index).cuda()
    stat = MulticlassStatScores(classes, average="none", ignore_index=ignore_index).cuda()
    for _ in range(2):
        fused.update(loss, preds, target)
        plain._plain_update(loss, preds, target)
        if n:
            stat.update(preds.float() if not indices else preds, target)
    for s in STATES:
        assert torch.equal(getattr(fused, s), getattr(plain, s)), s
    if n and not indices:  # torchmetrics' argmax of logits (NaN rows as torch.argmax) equals the kernel's
        tp, fp, _, _, _ = stat.compute().unbind(-1)
        assert torch.equal(fused.tp, tp) and torch.equal(fused.fp, fp)


@gpu
def test_inside_a_step_compiled_with_reduce_overhead_the_update_adds_no_launch():
    from torch._dynamo.utils import counters

    from mentor.lab.compiled_step import launch_calls

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 100)).cuda()
    suite, eager = FusedMetrics(100).cuda(), FusedMetrics(100).cuda()

    def forward(images, labels):
        logits = model(images)
        return torch.nn.functional.cross_entropy(logits, labels), logits

    def forward_and_update(images, labels):
        loss, logits = forward(images, labels)
        suite.update(loss, logits, labels)
        return loss, logits

    plain = torch.compile(forward, mode="reduce-overhead", dynamic=False)
    inside = torch.compile(forward_and_update, mode="reduce-overhead", dynamic=False)
    gen = torch.Generator(device="cuda").manual_seed(1)
    batches = [(torch.randn(32, 3, 4, 4, device="cuda", generator=gen),
                torch.randint(0, 100, (32,), device="cuda", generator=gen)) for _ in range(8)]
    def call(step, images, labels):  # each call a new iteration of the CUDA graph tree both functions share
        # the gradients too start afresh, as after optimizer.zero_grad(): accumulating into a .grad that an
        # earlier replay wrote (a CUDA-graph output) would read memory the next replay overwrote
        model.zero_grad(set_to_none=True)
        torch.compiler.cudagraph_mark_step_begin()
        return step(images, labels)

    for images, labels in batches:
        loss, logits = call(inside, images, labels)
        loss.backward()
        eager.update(loss.detach(), logits.detach(), labels)
        call(plain, images, labels)[0].backward()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # one per compiled function: no recompile
    assert counters["inductor"]["cudagraph_skips"] == 0
    for s in STATES:
        assert torch.equal(getattr(suite, s), getattr(eager, s)), s
    images, labels = batches[0]
    assert (launch_calls(lambda: call(inside, images, labels)[0].backward())
            == launch_calls(lambda: call(plain, images, labels)[0].backward()))
    suite.reset()  # in place: the recorded graph keeps counting into the same memory
    call(inside, images, labels)
    assert int(suite.loss_count) == 1 and counters["stats"]["unique_graphs"] == 2
