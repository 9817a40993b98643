"""mentor._direct_launch: the update kernel launched without Triton's per-call binding.

On the CPU, with a fake JIT function and a fake compiled kernel: the first launch goes through Triton, later ones
call the compiled kernel's launcher with exactly the arguments ``JITFunction.run`` passes; each reason to fall back
does. On CUDA (``@gpu``): the suite, which launches through it, equals the plain path bit for bit, with one kernel and no
sync per update, and the launches really bypass Triton.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marks import gpu
from mentor import _direct_launch as direct
from mentor import _fused_kernel as kernel
from mentor.suite import FusedMetrics

pytestmark = pytest.mark.skipif(not kernel.AVAILABLE, reason="Triton is not installed")


class FakeCompiled:
    function, packed_metadata = "FUNCTION", "PACKED"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


class FakeJit:
    arg_names = kernel._update_kernel.arg_names

    def __init__(self):
        self.compiled, self.calls = FakeCompiled(), []

    def __getitem__(self, grid):
        def launch(*args, **constants):
            self.calls.append((grid, args, constants, torch.cuda.current_device()))
            return self.compiled
        return launch


@pytest.fixture
def fake(monkeypatch):
    jit = FakeJit()
    monkeypatch.setattr(kernel, "_update_kernel", jit)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(direct, "_stream_getter", lambda: lambda index: 1000 + index)
    return jit


def _inputs(n=32, classes=1000, ignore_index=-100):
    logits, labels = torch.randn(n, classes), torch.randint(0, classes, (n,))
    states = [torch.zeros(classes, dtype=torch.long) for _ in range(3)] + [
        torch.zeros(()), torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)]
    return torch.tensor(0.5), logits, labels, states


def _launcher(loss, logits, labels, ignore_index=-100):
    run = direct.launcher(logits, labels, num_classes=1000, ignore_index=ignore_index)
    run._index = 0  # CPU tensors have no device index; the fake current device is 0
    return run


def test_the_first_launch_binds_and_later_ones_call_the_compiled_launcher_with_jits_arguments(fake, monkeypatch):
    monkeypatch.setattr(direct, "triton_version", lambda: (3, 6))
    loss, logits, labels, states = _inputs()
    run = _launcher(loss, logits, labels)
    run(loss, logits, labels, states)
    assert (run.bound, run.direct) == (1, 0) and fake.compiled.calls == []
    grid, args, constants, _ = fake.calls[0]
    assert grid == (8,) and args[:9] == (logits, labels, loss, *states)
    assert args[9:] == (32, 1000, 1000, 1, 1, -100)
    assert constants == {"LOGITS": True, "HAS_IGNORE": True, "WIDE": False, "ROWS": 4, "COLS": 1024}
    run(loss, logits, labels, states)
    run(loss, logits, labels, states)
    assert (run.bound, run.direct) == (1, 2) and len(fake.calls) == 1
    expected = (8, 1, 1, 1000, "FUNCTION", "PACKED", None, None, None, logits, labels, loss, *states,
                32, 1000, 1000, 1, 1, -100, True, True, False, 4, 1024)
    assert len(fake.compiled.calls) == 2
    for call in fake.compiled.calls:
        assert len(call) == len(expected) and all(a is b or a == b for a, b in zip(call, expected))


@pytest.mark.parametrize("reason", ["misaligned", "device", "hook", "version"])
def test_each_reason_to_fall_back_goes_through_triton(fake, monkeypatch, reason):
    monkeypatch.setattr(direct, "triton_version", lambda: (3, 2) if reason == "version" else (3, 8))
    loss, logits, labels, states = _inputs()
    run = _launcher(loss, logits, labels)
    run(loss, logits, labels, states)
    if reason == "misaligned":
        logits = torch.randn(32 * 1000 + 1)[1:].view(32, 1000)  # 4 bytes past an aligned start
    elif reason == "device":
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
        monkeypatch.setattr(torch.cuda, "device", lambda index: _Device(index))
    elif reason == "hook":
        monkeypatch.setattr(kernel.triton.knobs.runtime, "launch_enter_hook", lambda metadata: None)
    run(loss, logits, labels, states)
    assert (run.bound, run.direct) == (2, 0) and fake.compiled.calls == []
    if reason == "device":  # launched on the inputs' device, with every argument
        assert _Device.entered == [0]
        _, args, constants, _ = fake.calls[-1]
        assert args == (logits, labels, loss, *states, 32, 1000, 1000, 1, 1, -100) and constants["COLS"] == 1024


class _Device:
    entered: list[int] = []

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        _Device.entered.append(self.index)

    def __exit__(self, *exc):
        return False


def test_a_first_launch_with_a_misaligned_pointer_waits_for_an_aligned_one(fake, monkeypatch):
    monkeypatch.setattr(direct, "triton_version", lambda: (3, 6))
    loss, logits, labels, states = _inputs()
    shifted = torch.randn(32 * 1000 + 1)[1:].view(32, 1000)
    run = _launcher(loss, shifted, labels)
    run(loss, shifted, labels, states)  # compiled for a misaligned pointer: not kept
    run(loss, logits, labels, states)  # aligned: bound once more, and this compiled kernel kept
    run(loss, logits, labels, states)
    assert (run.bound, run.direct) == (2, 1)


def test_helpers():
    assert direct.supported((3, 6)) and direct.supported((3, 7)) and direct.supported((3, 8))
    assert not direct.supported((3, 5)) and not direct.supported((3, 9)) and not direct.supported(None)
    x = torch.zeros(16)
    assert direct.aligned([x, x[4:]]) and not direct.aligned([x, x[1:]]) and not direct.aligned([x[2:]])
    assert direct.triton_version() == tuple(int(p) for p in kernel.triton.__version__.split(".")[:2])
    assert direct.hooks_idle()


def test_hooks_idle_sees_a_hook_in_a_chain_or_a_plain_function(monkeypatch):
    runtime = kernel.triton.knobs.runtime
    chain = type(runtime.launch_exit_hook)()
    monkeypatch.setattr(runtime, "launch_exit_hook", chain)
    assert direct.hooks_idle()
    chain.add(print)
    assert not direct.hooks_idle()
    monkeypatch.setattr(runtime, "launch_exit_hook", None)
    assert direct.hooks_idle()
    monkeypatch.setattr(runtime, "launch_enter_hook", print)
    assert not direct.hooks_idle()


def test_a_changed_kernel_signature_is_refused(monkeypatch):
    class Renamed(FakeJit):
        arg_names = [*kernel._update_kernel.arg_names[:9], "rows", *kernel._update_kernel.arg_names[10:]]

    monkeypatch.setattr(kernel, "_update_kernel", Renamed())
    with pytest.raises(RuntimeError, match=r"the update kernel's parameters changed \(\['rows', 'num_classes'"):
        direct.launcher(torch.randn(4, 10), torch.zeros(4, dtype=torch.long), 10, None)


# --- on CUDA --------------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("n", [32, 128])
def test_on_cuda_direct_launches_make_one_kernel_no_sync_and_bypass_triton(n):
    from mentor.lab.update_cost import _gpu_ops
    from mentor.syncs import count_syncs

    assert direct.supported(direct.triton_version()), direct.triton_version()
    suite = FusedMetrics(1000, ignore_index=-100).cuda()
    gen = torch.Generator(device="cuda").manual_seed(n)
    batch = (torch.rand((), device="cuda", generator=gen), torch.randn(n, 1000, device="cuda", generator=gen),
             torch.randint(0, 1000, (n,), device="cuda", generator=gen))
    for _ in range(3):
        suite.update(*batch)
    torch.cuda.synchronize()
    assert _gpu_ops(lambda: suite.update(*batch), 10) == (1, 0)
    assert count_syncs(suite.update, *batch).count == 0
    (run,) = suite._launchers.values()  # the suite's own launcher, which made the first launch through Triton
    assert isinstance(run, direct.DirectLauncher) and run.bound == 1 and run.direct == 3 - 1 + 10 + 1


@gpu
@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.sampled_from([2, 10, 1000, 3000]), st.integers(0, 300), st.sampled_from([torch.float32, torch.bfloat16]),
       st.sampled_from([None, -100]), st.integers(0, 1000), st.booleans())
def test_on_cuda_direct_launches_equal_the_plain_path(classes, n, dtype, ignore_index, seed, indices):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(n, classes, device="cuda", generator=gen).to(dtype)
    target = torch.randint(0, classes, (n,), device="cuda", generator=gen)
    if ignore_index is not None:
        target[::5] = ignore_index
    if n:
        logits[0, classes - 1] = float("nan")
    preds = logits.argmax(1) if indices else logits
    loss = torch.rand((), device="cuda", generator=gen)
    fused = FusedMetrics(classes, ignore_index=ignore_index).cuda()
    plain = FusedMetrics(classes, ignore_index=ignore_index).cuda()
    for _ in range(3):
        fused.update(loss, preds, target)
        plain._plain_update(loss, preds, target)
    for s in ("tp", "fp", "fn", "loss_sum", "loss_count", "invalid_labels"):
        assert torch.equal(getattr(fused, s), getattr(plain, s)), s
    assert all(run.bound == 1 and run.direct == 2 for run in fused._launchers.values())  # Triton made the 1st launch
