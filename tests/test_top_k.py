"""FusedMetrics' top-k accuracy (``top_k=5`` or ``top_k=(1, 5)``: ``"accuracy_top5"``).

On the CPU: equal to torchmetrics' ``MulticlassAccuracy(top_k=k, average="micro")`` (hypothesis: tied logits, NaN,
inf, ignore_index, several updates, k from 1 to C), top_k=1 changes nothing, bad arguments and class indices
refused; the kernel's tie rule (``ranks_above_target``) against a sort, and equal to ``torch.topk`` on untied
logits; the kernel run by Triton's interpreter (this file run as a script, in a subprocess): equal to the plain
path on untied logits and following the rule on tied ones. On CUDA (``@gpu``): equal to torchmetrics on untied
logits in fp16, bf16 and fp32, the rule on tied ones, one launch and no sync per update, no graph break under
``torch.compile(fullgraph=True)``, and the values after CUDA-graph replays.
"""

from __future__ import annotations

import math
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.utilities.data import dim_zero_sum

import background
from exact import whole
from marks import gpu
from mentor import _fused_kernel as kernel
from mentor._direct_launch import DirectLauncher
from mentor.suite import FusedMetrics

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SPECIAL = [math.nan, math.inf, -math.inf, -0.0]
STATES = ("tp", "fp", "fn", "loss_sum", "loss_count", "invalid_labels", "top_k_hits")


def untied_logits(n: int, classes: int, dtype: torch.dtype, gen: torch.Generator, device: str = "cpu") -> torch.Tensor:
    """``(n, classes)`` logits with no two equal in a row, exactly in ``dtype``: distinct finite numbers of either sign
    (16-bit: distinct bit patterns of normal numbers, so their whole range; else distinct integer parts)."""
    if dtype in (torch.float16, torch.bfloat16):
        low, high = (0x0400, 0x7BFF) if dtype == torch.float16 else (0x0080, 0x7F7F)  # positive, normal, finite
        bits = torch.rand(n, high - low + 1, generator=gen, device=device).argsort(dim=1)[:, :classes] + low
        bits = bits + 0x8000 * torch.randint(0, 2, (n, classes), generator=gen, device=device)  # the sign bit
        logits = bits.to(torch.int32).to(torch.int16).view(dtype)
    else:
        whole_part = torch.rand(n, classes, generator=gen, device=device).argsort(dim=1)
        size = whole_part + 0.25 + 0.5 * torch.rand(n, classes, generator=gen, device=device)
        sign = 1 - 2 * torch.randint(0, 2, (n, classes), generator=gen, device=device)
        logits = (size * sign).to(dtype)
    ordered = logits.double().sort(dim=1).values
    assert bool((ordered.diff(dim=1) != 0).all()), "the untied logits have a tie"
    return logits


def key(k: int) -> str:
    return "accuracy_micro" if k == 1 else f"accuracy_top{k}"


def counted_hits(logits: torch.Tensor, target: torch.Tensor, ignore_index: int | None,
                 ks: tuple[int, ...]) -> torch.Tensor:
    """The documented kernel rule: per k, the counted rows whose target has fewer than k logits ranked above it."""
    classes = logits.shape[1]
    keep = (target >= 0) & (target < classes)
    if ignore_index is not None:
        keep &= target != ignore_index
    above = kernel.ranks_above_target(logits, target)
    return torch.stack([(keep & (above < k)).sum() for k in ks]) if ks else torch.zeros(0, dtype=torch.long)


# ----------------------------------------------------------------------------------------------------------
# On the CPU: against torchmetrics


@st.composite
def top_k_steps(draw):
    """1-3 steps over 2-12 classes (or 130 / 200, where torch.topk's CPU loop takes std::partial_sort for small k):
    logits of any float dtype, often tied (small integers), some NaN / inf / -0.0; ks from 1 to C."""
    classes = draw(st.one_of(st.integers(2, 12), st.sampled_from([130, 200])))
    ks = draw(st.lists(st.integers(1, classes), min_size=1, max_size=3, unique=True))
    top_k = ks[0] if len(ks) == 1 and draw(st.booleans()) else tuple(ks)
    ignore_index = draw(st.sampled_from([None, -100, 0, classes - 1]))
    dtype = draw(st.sampled_from(FLOATS))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    out = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 20))
        if draw(st.booleans()):
            logits = torch.randint(-2, 3, (n, classes), generator=gen).to(dtype)  # many ties
        else:
            logits = torch.randn(n, classes, generator=gen).to(dtype)
        for _ in range(draw(st.integers(0, 3))):
            logits[draw(st.integers(0, n - 1)), draw(st.integers(0, classes - 1))] = draw(st.sampled_from(SPECIAL))
        target = torch.randint(0, classes, (n,), generator=gen)
        if ignore_index is not None:
            target = torch.where(torch.rand(n, generator=gen) < 0.25, torch.tensor(ignore_index), target)
        out.append((torch.rand((), generator=gen), logits, target))
    return classes, top_k, ignore_index, out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top_k_steps())
def test_equals_torchmetrics_top_k_micro_accuracy_on_the_cpu(data):
    classes, top_k, ignore_index, steps = data
    ks = top_k if isinstance(top_k, tuple) else (top_k,)
    suite = FusedMetrics(classes, ignore_index=ignore_index, top_k=top_k)
    plain = FusedMetrics(classes, ignore_index=ignore_index)
    references = {k: MulticlassAccuracy(classes, top_k=k, average="micro", ignore_index=ignore_index) for k in ks}
    for loss, logits, target in steps:
        suite.update(loss, logits, target)
        plain.update(loss, logits, target)
        for reference in references.values():
            reference.update(logits, target)
    got, before = suite.compute(), plain.compute()
    for k, reference in references.items():
        want = reference.compute()
        assert got[key(k)].dtype == want.dtype and torch.equal(got[key(k)], want), (k, got[key(k)], want)
    # top-k adds its keys (ascending k) and changes no other key or value
    assert [name for name in got if name not in before] == [key(k) for k in sorted(ks) if k > 1]
    assert [name for name in got if name in before] == list(before)
    assert all(torch.equal(got[name], value) for name, value in before.items() if name != "loss")
    assert torch.equal(got["loss"], before["loss"])


def test_top_k_1_changes_nothing():
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.rand((), generator=gen), torch.randn(9, 4, generator=gen),
                torch.randint(0, 4, (9,), generator=gen)) for _ in range(3)]
    default = FusedMetrics(4)
    for top_k in (1, (1,), [1]):
        suite = FusedMetrics(4, top_k=top_k)
        assert suite.top_k == () and list(suite._defaults) == list(default._defaults)
        assert not hasattr(suite, "top_k_hits")
        for batch in batches:
            suite.update(*batch)
    for batch in batches:
        default.update(*batch)
    got, want = suite.compute(), default.compute()
    assert list(got) == list(want) and all(torch.equal(got[name], want[name]) for name in want)


def test_counts_by_hand():
    """Target ranks 1, 0 and 3 among 4 logits; an ignored row and an out-of-range target are left out of the hits
    and of the denominator, ``tp.sum() + fn.sum()``."""
    logits = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.8, 0.1, 0.2, 0.3], [0.9, 0.1, 0.2, 0.3], [0.5, 0.1, 0.2, 0.3],
                           [0.4, 0.3, 0.2, 0.1]])
    suite = FusedMetrics(4, ignore_index=-1, top_k=(4, 2))
    assert suite.top_k == (2, 4)
    suite.update(torch.tensor(1.0), logits, torch.tensor([2, 0, -1, 7, 3]))
    assert suite.top_k_hits.tolist() == [2, 3]
    assert int(suite.tp.sum() + suite.fn.sum()) == 3 and int(suite.invalid_labels) == 1
    valid = FusedMetrics(4, ignore_index=-1, top_k=(4, 2))
    valid.update(torch.tensor(1.0), logits[[0, 1, 2, 4]], torch.tensor([2, 0, -1, 3]))
    out = valid.compute()
    assert (out["accuracy_micro"].item(), out["accuracy_top2"].item(), out["accuracy_top4"].item()) == (
        pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0)
    assert valid.top_k_hits.dtype == torch.long and valid._reductions["top_k_hits"] is dim_zero_sum


def test_nan_logits_rank_above_every_number_as_in_torchmetrics():
    nan = math.nan
    logits = torch.tensor([[nan, 1.0, 2.0], [nan, 3.0, 2.0], [nan, nan, 5.0], [1.0, nan, 0.0]])
    target = torch.tensor([0, 1, 2, 1])  # ranks 0, 1, 2 (two NaNs above 5.0), 0
    suite = FusedMetrics(3, top_k=2)
    reference = MulticlassAccuracy(3, top_k=2, average="micro")
    suite.update(torch.tensor(0.0), logits, target)
    reference.update(logits, target)
    assert suite.top_k_hits.tolist() == [3] and torch.equal(suite.compute()["accuracy_top2"], reference.compute())


def test_no_counted_sample_gives_0_as_torchmetrics():
    suite = FusedMetrics(3, ignore_index=-100, top_k=2)
    reference = MulticlassAccuracy(3, top_k=2, average="micro", ignore_index=-100)
    logits, target = torch.randn(4, 3), torch.full((4,), -100)
    suite.update(torch.tensor(0.0), logits, target)
    reference.update(logits, target)
    assert torch.equal(suite.compute()["accuracy_top2"], reference.compute()) and reference.compute().item() == 0.0


def test_states_reset_in_place_forward_and_pickle():
    suite = FusedMetrics(3, top_k=2)
    logits = torch.tensor([[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]])
    suite.update(torch.tensor(1.0), logits, torch.tensor([0, 1]))  # ranks 2 and 1
    assert suite.top_k_hits.tolist() == [1]
    again = pickle.loads(pickle.dumps(suite))
    assert again.top_k == (2,) and again.top_k_hits.tolist() == [1]
    batch = suite(torch.tensor(1.0), logits, torch.tensor([1, 0]))  # ranks 1 and 0: the batch alone scores 1
    assert batch["accuracy_top2"].item() == 1.0 and suite.top_k_hits.tolist() == [3]
    held = suite.top_k_hits
    suite.reset()
    assert suite.top_k_hits is held and held.tolist() == [0]
    assert getattr(held, "_dynamo_static_input_type", None) == "unguarded"


@pytest.mark.parametrize("top_k, message", [
    (0, "top_k must be at least 1 (top_k=1 is the plain accuracy); pass an int k from 1 to num_classes (e.g. 5) "
        "or a tuple of them (e.g. (1, 5)), got 0."),
    (-2, "top_k must be at least 1 (top_k=1 is the plain accuracy); pass an int k from 1 to num_classes (e.g. 5) "
         "or a tuple of them (e.g. (1, 5)), got -2."),
    ((2, 0), "top_k must be at least 1 (top_k=1 is the plain accuracy); pass an int k from 1 to num_classes "
             "(e.g. 5) or a tuple of them (e.g. (1, 5)), got (2, 0)."),
    (True, "top_k must be an int or a tuple of ints; pass an int k from 1 to num_classes (e.g. 5) or a tuple of "
           "them (e.g. (1, 5)), got True."),
    (2.0, "top_k must be an int or a tuple of ints; pass an int k from 1 to num_classes (e.g. 5) or a tuple of "
          "them (e.g. (1, 5)), got 2.0."),
    ((1, 2.5), "top_k must be an int or a tuple of ints; pass an int k from 1 to num_classes (e.g. 5) or a tuple "
               "of them (e.g. (1, 5)), got (1, 2.5)."),
    ("5", "top_k must be an int or a tuple of ints; pass an int k from 1 to num_classes (e.g. 5) or a tuple of "
          "them (e.g. (1, 5)), got '5'."),
    ((), "top_k must hold at least one k; pass an int k from 1 to num_classes (e.g. 5) or a tuple of them "
         "(e.g. (1, 5)), got ()."),
    ((1, 5, 5, 1), "top_k lists 1, 5 more than once, got (1, 5, 5, 1); pass each k once, e.g. (1, 5)."),
    (6, "top_k must be at most num_classes (5), got 6: a row has only 5 logits to rank; pass ks from 1 to 5."),
    ((2, 7), "top_k must be at most num_classes (5), got (2, 7): a row has only 5 logits to rank; pass ks from 1 "
             "to 5."),
])
def test_bad_top_k_is_refused(top_k, message):
    with pytest.raises(ValueError, match=whole(message)):
        FusedMetrics(5, top_k=top_k)


def test_top_k_above_num_classes_is_refused_as_by_torchmetrics():
    with pytest.raises(ValueError, match="smaller or equal to `num_classes` but got 6 and 5"):
        MulticlassAccuracy(5, top_k=6, average="micro")
    assert FusedMetrics(5, top_k=5).top_k == (5,)  # k = C is allowed there and here: every target is in


def test_class_indices_with_top_k_are_refused():
    """torchmetrics fails deep inside torch.topk (k out of range for a (N, 1) view); here before any count."""
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        MulticlassAccuracy(5, top_k=2, average="micro").update(torch.tensor([0, 1]), torch.tensor([0, 1]))
    suite = FusedMetrics(5, top_k=(1, 2))
    with pytest.raises(ValueError, match=whole(
            "top_k=(2,) needs logits of shape (2, 5): class indices of shape (2,) do not rank the classes. Pass the "
            "logits, or leave top_k at 1.")):
        suite.update(torch.tensor(1.0), torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert int(suite.loss_count) == 0 and suite.top_k_hits.tolist() == [0]
    FusedMetrics(5, top_k=1).update(torch.tensor(1.0), torch.tensor([0, 1]), torch.tensor([0, 1]))  # top-1: fine


def test_traces_into_one_graph_without_a_break():
    suite = FusedMetrics(6, top_k=(2, 3))

    def step(loss, logits, target):
        suite.update(loss, logits, target)

    explanation = torch._dynamo.explain(step)(torch.tensor(0.5), torch.randn(8, 6), torch.randint(0, 6, (8,)))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


# ----------------------------------------------------------------------------------------------------------
# The kernel's tie rule


@st.composite
def rows_with_ties(draw):
    classes = draw(st.integers(1, 9))
    n = draw(st.integers(1, 6))
    values = st.one_of(st.sampled_from([*SPECIAL, 0.0, 1.0, -1.0]), st.integers(-2, 2).map(float))
    logits = torch.tensor([[draw(values) for _ in range(classes)] for _ in range(n)])
    target = torch.tensor([draw(st.integers(0, classes - 1)) for _ in range(n)])
    return logits, target


@given(rows_with_ties())
def test_the_rule_is_the_place_in_a_stable_descending_sort_with_nan_first(data):
    logits, target = data
    got = kernel.ranks_above_target(logits, target).tolist()
    for row, label, rank in zip(logits.tolist(), target.tolist(), got):
        # NaN first, then larger numbers first (-0.0 == 0.0), then the lower class index first
        order = sorted(range(len(row)), key=lambda c: (0, 0.0, c) if math.isnan(row[c]) else (1, -row[c], c))
        assert order.index(label) == rank, (row, label, rank)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 300), st.integers(1, 20), st.sampled_from(FLOATS), st.integers(0, 2**31 - 1), st.data())
def test_on_untied_logits_the_rule_agrees_with_torch_topk(classes, n, dtype, seed, data):
    gen = torch.Generator().manual_seed(seed)
    logits = untied_logits(n, classes, dtype, gen)
    if data.draw(st.booleans()):  # one NaN in a row is no tie
        logits[data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, classes - 1))] = math.nan
    target = torch.randint(0, classes, (n,), generator=gen)
    above = kernel.ranks_above_target(logits, target)
    for k in {1, 2, classes // 2 or 1, classes}:
        among = (torch.topk(logits, k, dim=1).indices == target[:, None]).any(1)
        assert torch.equal(among, above < k), k


# ----------------------------------------------------------------------------------------------------------
# The kernel under Triton's interpreter (this file as a script, in a subprocess with TRITON_INTERPRET=1)


def interpreted_top_k(env: dict[str, str]):
    """Background job: this file as a script under Triton's interpreter, 40 hypothesis examples."""
    return background.run([sys.executable, str(Path(__file__))], {**env, "TRITON_INTERPRET": "1", "EXAMPLES": "40"},
                          timeout=900)


INTERPRETED = background.job(interpreted_top_k,
                             "test_the_interpreted_kernel_equals_the_plain_path_untied_and_follows_the_rule_tied")


@pytest.mark.subprocess
def test_the_interpreted_kernel_equals_the_plain_path_untied_and_follows_the_rule_tied():
    done = background.result(INTERPRETED)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]


@st.composite
def kernel_batches(draw, tied: bool):
    """Logits of any float dtype over 2 to 4100 classes (up to 3 column tiles), row- or column-major, targets in
    and out of range, an ignore_index; tied: small integers, NaN, inf and -0.0; untied: distinct values, at most
    one NaN, +inf and -inf per row."""
    classes = draw(st.sampled_from([2, 3, 17, 300, 2049, 4100]))
    n = draw(st.integers(0, 24))
    dtype = draw(st.sampled_from(FLOATS))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    rows = torch.arange(n)
    if tied:
        logits = torch.randint(-3, 4, (n, classes), generator=gen).to(dtype)
        for special in SPECIAL:  # in a share of the places: none, a few, many
            logits[torch.rand(n, classes, generator=gen) < draw(st.sampled_from([0.0, 0.05, 0.3]))] = special
    else:
        logits = untied_logits(n, classes, dtype, gen)
        for special in (math.nan, math.inf, -math.inf):  # one of each in some rows at most: still no tie
            some = rows[torch.rand(n, generator=gen) < draw(st.sampled_from([0.0, 0.5, 1.0]))]
            logits[some, torch.randint(0, classes, (len(some),), generator=gen)] = special
    if draw(st.booleans()):  # column-major: column stride != 1
        logits = logits.t().contiguous().t()
    ks = tuple(sorted(draw(st.lists(st.integers(2, classes), min_size=1, max_size=3, unique=True))))
    target = torch.randint(-2, classes + 2, (n,), generator=gen)
    ignore = draw(st.sampled_from([None, -100, 0, -1]))
    if ignore is not None and n:
        target[:: draw(st.integers(1, 5))] = ignore
    loss = torch.tensor(draw(st.floats(-10, 10, width=32)))
    return classes, ks, ignore, loss, logits, target


def _run_kernel(suite: FusedMetrics, loss, logits, target) -> None:
    ints, constants, grid = kernel._arguments(logits, target, suite.num_classes, suite.ignore_index, suite.top_k)
    kernel._top_k_kernel[(grid,)](logits, target, loss, *(getattr(suite, s) for s in STATES), *ints, **constants)


def _interpreted(tied: bool) -> None:
    @settings(max_examples=int(os.environ.get("EXAMPLES", "40")), deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(kernel_batches(tied), st.integers(1, 2))
    def check(batch, updates):
        classes, ks, ignore, loss, logits, target = batch
        fused = FusedMetrics(classes, ignore_index=ignore, top_k=ks)
        plain = FusedMetrics(classes, ignore_index=ignore, top_k=ks)
        for _ in range(updates):
            _run_kernel(fused, loss, logits, target)
            plain._plain_update(loss, logits, target)
        names = STATES[:-1] if tied else STATES  # tied: torch.topk's pick is not the kernel's rule
        for name in names:
            assert torch.equal(getattr(fused, name), getattr(plain, name)), (name, getattr(fused, name),
                                                                            getattr(plain, name))
        rule = counted_hits(logits, target, ignore, ks) * updates
        assert torch.equal(fused.top_k_hits, rule), (fused.top_k_hits, rule)

    check()


# ----------------------------------------------------------------------------------------------------------
# On CUDA


def _cuda_steps(classes, dtype, seeds, ignore_index=None, n=256):
    out = []
    for seed in seeds:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        logits = untied_logits(n, classes, dtype, gen, device="cuda")
        target = torch.randint(0, classes, (n,), device="cuda", generator=gen)
        if ignore_index is not None:
            target[::7] = ignore_index
        out.append((torch.rand((), device="cuda", generator=gen), logits, target))
    return out


def _kernels_per_call(fn, calls=10):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels) / calls, sorted(set(kernels))


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("classes, ignore_index", [(10, None), (1000, -100), (3000, 0)])
def test_on_cuda_equals_torchmetrics_on_untied_logits(dtype, classes, ignore_index):
    ks = tuple(sorted({1, 2, 5, classes // 3, classes}))
    suite = FusedMetrics(classes, ignore_index=ignore_index, top_k=ks).cuda()
    plain = FusedMetrics(classes, ignore_index=ignore_index, top_k=ks).cuda()
    references = {k: MulticlassAccuracy(classes, top_k=k, average="micro", ignore_index=ignore_index).cuda()
                  for k in ks}
    for loss, logits, target in _cuda_steps(classes, dtype, range(3), ignore_index):
        suite.update(loss, logits, target)
        plain._plain_update(loss, logits, target)
        for reference in references.values():
            reference.update(logits, target)
    assert suite._launchers and all(isinstance(run, DirectLauncher) for run in suite._launchers.values())
    for name in STATES:
        assert torch.equal(getattr(suite, name), getattr(plain, name)), name
    got = suite.compute()
    for k, reference in references.items():
        assert torch.equal(got[key(k)], reference.compute()), (k, got[key(k)], reference.compute())
    assert 0 < got[key(ks[-2])].item() < 1  # a meaningful comparison: neither all hits nor none


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_cuda_one_nan_in_a_row_ranks_first_as_in_torchmetrics(dtype):
    """A single NaN in a row is no tie: the kernel ranks it above every number, as torch.topk on CUDA does."""
    classes = 50
    suite = FusedMetrics(classes, top_k=(2, 3, 10)).cuda()
    references = {k: MulticlassAccuracy(classes, top_k=k, average="micro").cuda() for k in (2, 3, 10)}
    for loss, logits, target in _cuda_steps(classes, dtype, range(3), n=512):
        rows = torch.arange(0, 512, 2, device="cuda")
        logits[rows, target[rows]] = math.nan  # the target's own logit is the NaN: in even the top 2
        rows = torch.arange(1, 512, 4, device="cuda")
        logits[rows, (target[rows] + 1) % classes] = math.nan  # another class's: it pushes the target down
        suite.update(loss, logits, target)
        for reference in references.values():
            reference.update(logits, target)
    got = suite.compute()
    for k, reference in references.items():
        assert torch.equal(got[key(k)], reference.compute()), (k, got[key(k)], reference.compute())


@gpu
@pytest.mark.parametrize("classes", [7, 3000])
def test_on_cuda_tied_logits_follow_the_documented_rule(classes):
    gen = torch.Generator(device="cuda").manual_seed(classes)
    logits = torch.randint(-2, 3, (300, classes), device="cuda", generator=gen).to(torch.bfloat16)
    logits[0] = math.nan
    logits[1, ::3] = math.nan
    logits[2, 1::2] = -0.0
    logits[3] = math.inf
    target = torch.randint(0, classes, (300,), device="cuda", generator=gen)
    target[::11] = -100
    ks = (2, 3, classes // 2 + 1)
    suite = FusedMetrics(classes, ignore_index=-100, top_k=ks).cuda()
    suite.update(torch.tensor(1.0, device="cuda"), logits, target)
    assert torch.equal(suite.top_k_hits, counted_hits(logits, target, -100, ks))
    plain = FusedMetrics(classes, ignore_index=-100, top_k=ks).cuda()
    plain._plain_update(torch.tensor(1.0, device="cuda"), logits, target)
    for name in STATES[:-1]:  # the argmax counts are torch.argmax's, ties or not
        assert torch.equal(getattr(suite, name), getattr(plain, name)), name


@gpu
def test_on_cuda_one_launch_and_no_sync_per_update():
    from mentor.syncs import sync_guard

    suite = FusedMetrics(1000, ignore_index=-100, top_k=(1, 5)).cuda()
    (batch,) = _cuda_steps(1000, torch.bfloat16, [0], ignore_index=-100, n=128)
    suite.update(*batch)
    torch.cuda.synchronize()
    per_call, names = _kernels_per_call(lambda: suite.update(*batch))
    assert per_call == 1 and all("_top_k_kernel" in name for name in names), names
    with sync_guard() as report:
        for _ in range(5):
            suite.update(*batch)
    assert report.count == 0, report.table()
    (run,) = suite._launchers.values()
    assert run.bound == 1 and run.direct == 10 + 5  # after the first launch, direct ones only
    assert int(suite.loss_count) == 16


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_on_cuda_compiles_with_fullgraph_and_equals_eager(mode):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    suite, eager = FusedMetrics(1000, top_k=(1, 5, 500)).cuda(), FusedMetrics(1000, top_k=(1, 5, 500)).cuda()

    def step(loss, logits, target):
        suite.update(loss, logits, target)

    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for batch in _cuda_steps(1000, torch.float32, range(6), n=64):
        compiled(*batch)
        eager.update(*batch)
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
    for name in STATES:
        assert torch.equal(getattr(suite, name), getattr(eager, name)), name
    assert int(suite.loss_count) == 6 and 0 < int(suite.top_k_hits[1]) < 6 * 64


@gpu
def test_on_cuda_graph_replays_count_each_replay():
    classes, n, replays = 1000, 64, 5
    suite = FusedMetrics(classes, ignore_index=-100, top_k=(5, 300)).cuda()
    references = {k: MulticlassAccuracy(classes, top_k=k, average="micro", ignore_index=-100).cuda() for k in (5, 300)}
    steps = _cuda_steps(classes, torch.float16, range(replays + 1), ignore_index=-100, n=n)
    static = [t.clone() for t in steps[0]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        suite.update(*static)  # the first launch compiles and binds the kernel, outside the capture
    torch.cuda.current_stream().wait_stream(side)
    suite.reset()  # in place: the graph updates these tensors
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        suite.update(*static)
    for batch in steps[1:]:
        for into, values in zip(static, batch):
            into.copy_(values)
        graph.replay()
        for reference in references.values():
            reference.update(batch[1], batch[2])
    torch.cuda.synchronize()
    assert int(suite.loss_count) == replays and int(suite.top_k_hits[1]) > 0
    got = suite.compute()
    for k, reference in references.items():
        assert torch.equal(got[key(k)], reference.compute()), (k, got[key(k)], reference.compute())


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1 (test_the_interpreted_kernel_... does)")
    _interpreted(tied=False)
    _interpreted(tied=True)
    print("ok")
