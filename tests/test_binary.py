"""mentor.binary.FusedBinary against torchmetrics 1.9.0 (hypothesis, on the CPU): every dtype, layout, threshold,
ignore_index and zero_division, ties, NaN and infinite logits, several updates, reset, forward; invalid targets
(NaN values and the count, nothing read back); bad input; flat_sync and two gloo ranks. On CUDA (``@gpu``): equal to
torchmetrics and to the plain path, one kernel launch and no sync per update, torch.compile without a graph break,
a CUDA graph's replays. Helpers here are shared with tests/test_multilabel.py."""

from __future__ import annotations

import math
import pickle
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAccuracy, BinaryF1Score, BinaryPrecision, BinaryRecall

from exact import whole
from marks import gpu
from mentor import _threshold_kernel as kernel
from mentor.binary import FusedBinary
from mentor.flat_sync import flat_sync
from mentor.lab.ddp import single_rank_group
from mentor.syncs import SyncReport, _intercept, sync_guard
import ranks
from ranks import short_gloo_group
from test_threshold_kernel import neighbours, relaid

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
BINARY = {"accuracy": BinaryAccuracy, "precision": BinaryPrecision, "recall": BinaryRecall, "f1": BinaryF1Score}
COUNTS = ("tp", "fp", "tn", "fn", "loss_sum", "loss_count", "invalid_labels")


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """The same keys, and every value equal to the bit, in dtype too (NaN equal to NaN)."""
    assert list(got) == list(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, equal_nan=True, msg=key)


def mean_loss(losses: list[torch.Tensor]) -> torch.Tensor:
    mean = MeanMetric().to(losses[0].device)
    for loss in losses:
        mean.update(loss)
    return mean.compute()


# Random steps, made on the CPU (and moved to CUDA by the GPU tests).

@st.composite
def predictions(draw, shape: tuple[int, ...], kind: str, threshold: float, gen: torch.Generator) -> torch.Tensor:
    """Logits, probabilities (float ``kind``) or 0/1 labels (integer / bool ``kind``), with ties at the threshold.

    Logits always hold a value outside [0, 1]: torchmetrics takes a float batch inside it for probabilities, which
    is its guess, not the caller's word (see mentor._thresholded); probabilities always lie inside it."""
    dtype, inputs = kind
    count = math.prod(shape)
    if not dtype.is_floating_point:
        return torch.randint(0, 2, shape, generator=gen).to(dtype)
    if inputs == "logits":
        scale = draw(st.sampled_from([0.5, 4.0, 40.0]))
        values = (torch.randn(count, generator=gen, dtype=torch.float64) * scale).to(dtype)
        compared = kernel.compared_threshold(threshold, dtype)
        tie = float(torch.logit(torch.tensor(compared, dtype=torch.float64)))
        specials = neighbours(tie, dtype, 3) + [0.0, float("nan"), float("inf"), float("-inf")]
    else:
        values = torch.rand(count, generator=gen, dtype=torch.float64).to(dtype)
        # the threshold's neighbours that are probabilities: one above 1 (a threshold near 1, bf16 rounds 0.998 to
        # 1.0) would make torchmetrics guess logits and take the sigmoid, where the caller said "probs"
        near = neighbours(kernel.compared_threshold(threshold, dtype), dtype, 2)
        specials = [value for value in near if 0.0 <= value <= 1.0] + [0.0, 1.0]
    for _ in range(draw(st.integers(0, 6)) if count else 0):
        values[draw(st.integers(0, count - 1))] = draw(st.sampled_from(specials))
    if inputs == "logits" and count and not bool(((values < 0) | (values > 1)).any()):
        values[draw(st.integers(0, count - 1))] = draw(st.sampled_from([-3.0, 2.5]))
    return values.view(shape)


def targets(shape: tuple[int, ...], dtype: torch.dtype, ignore_index: int | None, gen: torch.Generator) -> torch.Tensor:
    """0/1 targets, about a quarter of them ``ignore_index`` when it is set."""
    target = torch.randint(0, 2, shape, generator=gen)
    if ignore_index is not None:
        target[torch.rand(shape, generator=gen) < 0.25] = ignore_index
    return target.to(dtype)


KINDS = [(dtype, inputs) for dtype in FLOATS for inputs in ("logits", "probs")] + [
    (torch.int64, "logits"), (torch.bool, "probs"), (torch.uint8, "logits")]


ANY_THRESHOLD = st.sampled_from([0.5, 0.3, 0.75]) | st.floats(0.001, 0.999)
FEW_THRESHOLDS = st.sampled_from([0.5, 0.3, 0.75, 0.1])
"""On CUDA: the threshold is a constexpr of the kernel, so each one compiles a kernel of its own (a few seconds)."""


@st.composite
def settings_and_steps(draw, shapes, thresholds=ANY_THRESHOLD):
    """(threshold, ignore_index, zero_division, inputs, steps): 1-3 steps of (loss, preds, target) in one layout."""
    kind = draw(st.sampled_from(KINDS))
    target_dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8]))
    ignores = [None, 0, 1] + ([] if target_dtype in (torch.bool, torch.uint8) else [-1, -100])
    ignore_index = draw(st.sampled_from(ignores))
    threshold = draw(thresholds)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    layout = draw(st.sampled_from(["contiguous", "strided", "transposed"]))
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        shape = draw(shapes)
        preds = relaid(draw(predictions(shape, kind, threshold, gen)), layout)
        target = relaid(targets(shape, target_dtype, ignore_index, gen), layout)
        loss = torch.tensor(draw(st.floats(-10, 10, width=32)), dtype=draw(st.sampled_from([torch.float32,
                                                                                             torch.bfloat16])))
        steps.append((loss, preds, target))
    return threshold, ignore_index, draw(st.sampled_from([0, 1])), kind[1], steps


BINARY_SHAPES = st.tuples(st.integers(1, 24)) | st.tuples(st.integers(1, 8), st.integers(1, 4)) | st.tuples(
    st.integers(1, 5), st.integers(1, 3), st.integers(1, 3))


def binary_reference(threshold, ignore_index, zero_division, steps) -> dict[str, torch.Tensor]:
    """torchmetrics' MeanMetric and Binary* metrics over the same steps, keyed as FusedBinary's compute()."""
    out = {"loss": mean_loss([loss for loss, _, _ in steps])}
    for name, cls in BINARY.items():
        kwargs = {} if name == "accuracy" else {"zero_division": zero_division}
        metric = cls(threshold=threshold, ignore_index=ignore_index, **kwargs).to(steps[0][1].device)
        for _, preds, target in steps:
            metric.update(preds, target.long())
        out[name] = metric.compute()
    out["invalid_labels"] = torch.tensor(0, device=steps[0][1].device)
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(settings_and_steps(BINARY_SHAPES))
def test_equals_torchmetrics(case):
    threshold, ignore_index, zero_division, inputs, steps = case
    metric = FusedBinary(threshold, ignore_index=ignore_index, zero_division=zero_division, inputs=inputs)
    for step in steps:
        metric.update(*step)
    assert_same(metric.compute(), binary_reference(threshold, ignore_index, zero_division, steps))


def test_ties_at_the_threshold_are_negative_as_in_torchmetrics():
    """A probability equal to the threshold, or a logit of 0 with a threshold of 0.5, is not above it: a negative."""
    probs = torch.tensor([0.3, 0.3, 0.31, 0.29])
    metric = FusedBinary(0.3, inputs="probs")
    metric.update(torch.tensor(0.0), probs, torch.tensor([1, 0, 1, 0]))
    assert [int(metric.tp), int(metric.fp), int(metric.tn), int(metric.fn)] == [1, 0, 2, 1]
    logits = torch.tensor([0.0, 0.0, 5.0, -5.0])
    metric = FusedBinary(0.5, inputs="logits")
    metric.update(torch.tensor(0.0), logits, torch.tensor([1, 0, 1, 0]))
    assert [int(metric.tp), int(metric.fp), int(metric.tn), int(metric.fn)] == [1, 0, 2, 1]
    want = binary_reference(0.5, None, 0, [(torch.tensor(0.0), logits, torch.tensor([1, 0, 1, 0]))])
    assert_same(metric.compute(), want)
    # in float16 the threshold 0.3 is 0.30004883: torch compares with that, and so does the metric
    half = FusedBinary(0.3, inputs="probs")
    half.update(torch.tensor(0.0), torch.tensor([0.30004883], dtype=torch.float16), torch.tensor([1]))
    assert int(half.tp) == 0 and (torch.tensor([0.30004883], dtype=torch.float16) > 0.3).tolist() == [False]


def test_nan_and_infinite_logits():
    """NaN logits are negatives (sigmoid(NaN) > t is False), +inf positives, -inf negatives, as torchmetrics counts
    them (its CPU path applies the sigmoid to a batch holding a NaN)."""
    logits = torch.tensor([float("nan"), float("nan"), float("inf"), float("-inf"), 0.2])
    target = torch.tensor([1, 0, 1, 1, 0])
    metric = FusedBinary()
    metric.update(torch.tensor(1.0), logits, target)
    assert [int(metric.tp), int(metric.fp), int(metric.tn), int(metric.fn)] == [1, 1, 1, 2]
    assert_same(metric.compute(), binary_reference(0.5, None, 0, [(torch.tensor(1.0), logits, target)]))


def test_nan_probabilities_are_negatives_where_torchmetrics_would_take_the_batch_for_logits():
    probs = torch.tensor([float("nan"), 0.9, 0.2, 0.6])
    target = torch.tensor([1, 1, 0, 0])
    metric = FusedBinary(inputs="probs")
    metric.update(torch.tensor(1.0), probs, target)
    assert [int(metric.tp), int(metric.fp), int(metric.tn), int(metric.fn)] == [1, 1, 1, 1]
    # equal to torchmetrics with the NaN as a certain negative ...
    certain = torch.tensor([0.0, 0.9, 0.2, 0.6])
    assert_same(metric.compute(), binary_reference(0.5, None, 0, [(torch.tensor(1.0), certain, target)]))
    # ... while torchmetrics on the CPU applies the sigmoid to the whole batch (NaN >= 0 is False): 0.2 and 0.6
    # become 0.55 and 0.65, two false positives
    assert float(BinaryPrecision()(probs, target)) == pytest.approx(1 / 3)


def test_an_empty_batch_adds_its_loss_only():
    metric = FusedBinary()
    metric.update(torch.tensor(2.0), torch.zeros(0), torch.zeros(0, dtype=torch.long))
    metric.update(torch.tensor(1.0), torch.tensor([3.0]), torch.tensor([1]))
    out = metric.compute()
    assert out["loss"].item() == 1.5 and out["accuracy"].item() == 1.0 and int(metric.tp) == 1


@pytest.mark.parametrize("bad, count", [([-1, 0, 1, 2], 2), ([5, 5, 5, 1], 3)])
def test_invalid_targets_make_every_value_nan_and_are_counted(bad, count):
    metric = FusedBinary()
    metric.update(torch.tensor(0.5), torch.tensor([1.0, -1.0, 2.0, 3.0]), torch.tensor([1, 0, 1, 1]))
    metric.update(torch.tensor(0.5), torch.tensor([1.0, -1.0, 2.0, 3.0]), torch.tensor(bad))
    out = metric.compute()
    assert list(out) == ["loss", "accuracy", "precision", "recall", "f1", "invalid_labels"]
    assert all(math.isnan(out[k].item()) for k in ("loss", "accuracy", "precision", "recall", "f1"))
    assert out["invalid_labels"].dtype == torch.int64 and out["invalid_labels"].item() == count
    # the valid positions were counted; the invalid ones left out
    assert int(metric.tp + metric.fp + metric.tn + metric.fn) == 8 - count
    with pytest.raises(RuntimeError, match="Detected the following values in `target`"):
        BinaryAccuracy()(torch.tensor([1.0, -1.0, 2.0, 3.0]), torch.tensor(bad))  # torchmetrics raises
    metric.reset()
    metric.update(torch.tensor(0.5), torch.tensor([1.0, -1.0]), torch.tensor([1, 0]))
    assert metric.compute()["accuracy"].item() == 1.0 and metric.compute()["invalid_labels"].item() == 0


def test_ignore_index_is_not_invalid_and_label_predictions_outside_0_1_are():
    metric = FusedBinary(ignore_index=-1)
    metric.update(torch.tensor(0.5), torch.tensor([1, 0, 2, 1]), torch.tensor([1, -1, 1, -1]))
    assert metric.compute()["invalid_labels"].item() == 1  # the 2, at a counted position; the ignored 1 is not
    assert [int(metric.tp), int(metric.fp), int(metric.tn), int(metric.fn)] == [1, 0, 0, 0]


def test_several_updates_reset_and_forward():
    gen = torch.Generator().manual_seed(3)
    steps = [(torch.rand((), generator=gen), torch.randn(20, generator=gen) * 3,
              torch.randint(0, 2, (20,), generator=gen)) for _ in range(4)]
    metric = FusedBinary(0.4)
    held = [getattr(metric, name) for name in COUNTS]
    for step in steps[:2]:
        metric.update(*step)
    assert_same(metric.compute(), binary_reference(0.4, None, 0, steps[:2]))
    metric.reset()
    assert all(getattr(metric, name) is tensor for name, tensor in zip(COUNTS, held))  # zeroed in place
    assert [int(t) for t in held] == [0] * 7
    batch = metric(*steps[2])  # forward: the batch's own values, and the batch added
    assert_same(batch, binary_reference(0.4, None, 0, steps[2:3]))
    metric.update(*steps[3])
    assert_same(metric.compute(), binary_reference(0.4, None, 0, steps[2:]))


def test_a_forward_with_a_bad_input_leaves_the_metric_as_it_was():
    metric = FusedBinary()
    metric.update(torch.tensor(0.5), torch.tensor([2.0, -2.0]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="preds and target must have one shape"):
        metric(torch.tensor(0.5), torch.tensor([2.0, -2.0]), torch.tensor([1, 1, 1]))
    assert [int(metric.tp), int(metric.fn), int(metric.loss_count)] == [1, 1, 1]
    assert metric.compute()["recall"].item() == 0.5


def test_pickles_and_loads_its_state():
    metric = FusedBinary(0.25, ignore_index=-1, inputs="probs")
    metric.update(torch.tensor(0.5), torch.tensor([0.3, 0.1]), torch.tensor([1, -1]))
    again = pickle.loads(pickle.dumps(metric))
    assert again.threshold == 0.25 and again.inputs == "probs" and int(again.tp) == 1
    other = FusedBinary()
    other.persistent(True)
    metric.persistent(True)
    other.load_state_dict(metric.state_dict())
    assert int(other.tp) == 1 and other.loss_sum.item() == 0.5


# Bad input: the argument named, what to pass said.

@pytest.mark.parametrize("kwargs, message", [
    ({"threshold": 0.0}, "threshold must be a float strictly between 0 and 1"),
    ({"threshold": 1.0}, "threshold must be a float strictly between 0 and 1"),
    ({"threshold": 1.5}, "threshold must be a float strictly between 0 and 1"),
    ({"threshold": "0.5"}, "threshold must be a float strictly between 0 and 1"),
    ({"threshold": True}, "threshold must be a float strictly between 0 and 1"),
    ({"threshold": float("nan")}, "threshold must be a float strictly between 0 and 1"),
    ({"inputs": "logit"}, "inputs must be 'logits' (a sigmoid is applied before the threshold) or 'probs'"),
    ({"inputs": None}, "inputs must be 'logits'"),
    ({"ignore_index": 1.0}, "ignore_index must be an int"),
    ({"ignore_index": True}, "ignore_index must be an int"),
    ({"zero_division": 0.5}, "zero_division must be 0 or 1"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError) as error:
        FusedBinary(**kwargs)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("loss, preds, target, error, message", [
    (0.5, torch.zeros(2), torch.zeros(2, dtype=torch.long), ValueError,
     "loss must be a 0-dim floating-point tensor (the step's mean loss), got float 0.5; pass loss (or loss.detach()), "
     "not loss.item(), which would sync."),
    (torch.zeros(1), torch.zeros(2), torch.zeros(2, dtype=torch.long), ValueError, "loss must be a 0-dim"),
    (torch.tensor(1), torch.zeros(2), torch.zeros(2, dtype=torch.long), ValueError, "loss must be a 0-dim"),
    (torch.tensor(0.5), torch.zeros(2), torch.zeros(3, dtype=torch.long), ValueError,
     "preds and target must have one shape (N,) or (N, ...), got preds of shape (2,) and target of shape (3,)."),
    (torch.tensor(0.5), torch.zeros(()), torch.zeros((), dtype=torch.long), ValueError,
     "preds and target must have one shape (N,) or (N, ...), got preds of shape () and target of shape ()."),
    (torch.tensor(0.5), torch.zeros(2), torch.zeros(2), TypeError,
     "target must be a tensor of 0/1 labels with an integer or bool dtype (e.g. target.long()), got a torch.float32 "
     "tensor of shape (2,)."),
    (torch.tensor(0.5), torch.zeros(2, dtype=torch.complex64), torch.zeros(2, dtype=torch.long), TypeError,
     "preds must be a tensor of logits or probabilities (float16, bfloat16, float32 or float64) or of 0/1 labels "
     "(an integer or bool dtype), got a torch.complex64 tensor of shape (2,)."),
    (torch.tensor(0.5), [0.1, 0.2], torch.zeros(2, dtype=torch.long), TypeError, "preds must be a tensor"),
    (torch.tensor(0.5), torch.zeros(2), [0, 1], TypeError, "target must be a tensor"),
    (torch.tensor(0.5), torch.zeros(2, device="meta"), torch.zeros(2, dtype=torch.long), ValueError,
     "loss, preds and target must be on one device, got cpu, meta and cpu; move them to one device "
     "(e.g. target.to(preds.device))."),
], ids=["python float", "1-dim loss", "integer loss", "shapes differ", "0-dim", "float target", "complex preds",
        "list preds", "list target", "devices differ"])
def test_bad_inputs_are_refused_by_name(loss, preds, target, error, message):
    metric = FusedBinary()
    with pytest.raises(error, match=whole(message) if message.endswith(".") else None) as raised:
        metric.update(loss, preds, target)
    assert str(raised.value).startswith(message)
    assert int(metric.loss_count) == 0


def test_inputs_on_another_device_than_the_metric_are_refused():
    metric = FusedBinary()
    with pytest.raises(ValueError, match=r"FusedBinary is on cpu and the inputs on meta; move it with \.to\('meta'\)"):
        metric.update(torch.zeros((), device="meta"), torch.zeros(2, device="meta"),
                      torch.zeros(2, dtype=torch.long, device="meta"))


# Ranks: flat_sync in one all-reduce, and two gloo ranks equal to one process over all the data.

def _steps(seed: int, kind: str = "binary"):
    gen = torch.Generator().manual_seed(seed)
    shape = (12,) if kind == "binary" else (12, 4)
    return [(torch.tensor(float(i) / 4), torch.randn(shape, generator=gen) * 2,
             torch.randint(0, 2, shape, generator=gen)) for i in range(4)]


def test_flat_sync_syncs_in_one_all_reduce_with_the_same_values():
    def compute(metric):
        for step in _steps(5):
            metric.update(*step)
        with single_rank_group("gloo"):
            with _intercept(SyncReport()) as report:
                value = metric.compute()
        return dict(report.by_kind()), value

    plain_calls, plain = compute(FusedBinary())
    flat_calls, flat = compute(flat_sync(FusedBinary)())
    assert flat_calls == {"collective: all_reduce": 1} and plain_calls["collective: all_gather"] == 7
    assert_same(flat, plain)
    assert_same(flat, binary_reference(0.5, None, 0, _steps(5)))


def binary_on_a_shard(rank: int, world_size: int) -> dict[tuple[bool, int | None], dict[str, list[float]]]:
    """Worker: FusedBinary and its flat_sync subclass, each updated with this rank's steps, then again with an
    invalid target on rank 1; compute() syncs both ranks. One launch for the four, since each launch starts two
    Python processes that import torch."""
    out = {}
    for flat in (False, True):
        cls = flat_sync(FusedBinary) if flat else FusedBinary
        for invalid_on in (None, 1):
            metric = cls(0.5, process_group=short_gloo_group())
            for loss, preds, target in _steps(11)[rank::world_size]:
                if rank == invalid_on:
                    target = target.clone()
                    target[0] = 2
                metric.update(loss, preds, target)
            values = metric.compute()
            out[flat, invalid_on] = {key: [value.item()] for key, value in values.items()} | {
                "local_tp": [int(metric.tp)]}
    return out


BINARY_ON_A_SHARD_KEY = ranks.on_two_ranks(binary_on_a_shard)


def test_two_gloo_ranks_equal_torchmetrics_on_all_the_data():
    """Under torchmetrics' sync and under flat_sync, both ranks get the values of all the data; after compute()
    each rank's state is its own again; an invalid target on one rank makes both ranks' values NaN."""
    steps = _steps(11)
    want = {key: [value.item()] for key, value in binary_reference(0.5, None, 0, steps).items()}
    results = ranks.results(BINARY_ON_A_SHARD_KEY)
    assert [r.error for r in results] == [None, None]
    for flat in (False, True):
        for r in results:
            value = dict(r.value[flat, None])
            local = value.pop("local_tp")
            assert value == want, (flat, r.rank)
            shard = FusedBinary()
            for step in steps[r.rank::2]:
                shard.update(*step)
            assert local == [int(shard.tp)], (flat, r.rank)  # unsynced after compute: each rank's own count again
            invalid = r.value[flat, 1]  # an invalid target on rank 1: both ranks' values NaN, with the summed count
            assert invalid["invalid_labels"] == [2] and all(math.isnan(invalid[k][0]) for k in BINARY), (flat, r.rank)


# On CUDA.

def on_cuda(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on CUDA with its strides and storage offset kept: ``.cuda()`` makes a view that is not dense (the
    ``"strided"`` layout: every other row, from an offset) contiguous, so the kernel would never read one."""
    storage = tensor.untyped_storage()
    whole = torch.empty(0, dtype=tensor.dtype).set_(storage, 0, (storage.nbytes() // tensor.element_size(),))
    return whole.cuda().as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def _cuda(steps):
    return [tuple(on_cuda(t) for t in step) for step in steps]


@gpu
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(settings_and_steps(BINARY_SHAPES | st.tuples(st.integers(100, 3000)), FEW_THRESHOLDS))
def test_on_cuda_equals_torchmetrics_and_the_plain_path(case):
    threshold, ignore_index, zero_division, inputs, steps = case
    steps = _cuda(steps)
    fused = FusedBinary(threshold, ignore_index=ignore_index, zero_division=zero_division, inputs=inputs).cuda()
    plain = FusedBinary(threshold, ignore_index=ignore_index, zero_division=zero_division, inputs=inputs).cuda()
    for step in steps:
        fused.update(*step)
        plain._plain_update(*step)
    for name in COUNTS:
        assert torch.equal(getattr(fused, name), getattr(plain, name)), name
    assert fused._launchers, "the kernel path was not taken"
    assert_same(fused.compute(), binary_reference(threshold, ignore_index, zero_division, steps))


def _batch(n: int = 32, seed: int = 0, dtype=torch.float32):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand((), device="cuda", generator=gen), (torch.randn(n, device="cuda", generator=gen) * 2).to(dtype),
            torch.randint(0, 2, (n,), device="cuda", generator=gen))


@gpu
@pytest.mark.parametrize("dtype", FLOATS)
def test_on_cuda_one_kernel_per_update_launched_directly(dtype):
    from mentor.lab.update_cost import _gpu_ops

    metric = FusedBinary(0.3, ignore_index=-1).cuda()
    batch = _batch(dtype=dtype)
    metric.update(*batch)
    torch.cuda.synchronize()
    assert _gpu_ops(lambda: metric.update(*batch), 10) == (1, 0)
    (run,) = metric._launchers.values()
    assert isinstance(run, kernel.ThresholdLauncher) and run.bound == 1 and run.direct == 10


@gpu
def test_on_cuda_no_sync_over_many_updates_and_compute():
    metric = FusedBinary(ignore_index=-1).cuda()
    batches = [_batch(seed=s) for s in range(20)]
    metric.update(*batches[0])  # the first update compiles the kernel
    torch.cuda.synchronize()
    with sync_guard(strict=True) as report:
        for batch in batches[1:]:
            metric.update(*batch)
        out = metric.compute()
    assert report.count == 0
    assert_same(out, binary_reference(0.5, -1, 0, batches))


@gpu
def test_on_cuda_a_compiled_step_has_no_graph_break_and_equals_eager():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled_metric, eager = FusedBinary(0.4).cuda(), FusedBinary(0.4).cuda()

    def step(loss, preds, target):
        compiled_metric.update(loss, preds, target)

    compiled = torch.compile(step, fullgraph=True)
    batches = [_batch(seed=s) for s in range(6)]
    for batch in batches:
        compiled(*batch)
        eager.update(*batch)
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
    for name in COUNTS:
        assert torch.equal(getattr(compiled_metric, name), getattr(eager, name)), name


@gpu
def test_on_cuda_a_cuda_graph_replays_the_update():
    metric, eager = FusedBinary(ignore_index=-1).cuda(), FusedBinary(ignore_index=-1).cuda()
    loss, preds, target = (t.clone() for t in _batch())  # the graph reads these addresses
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        metric.update(loss, preds, target)  # warm up: the launcher and the compiled kernel
    torch.cuda.current_stream().wait_stream(side)
    eager.update(loss, preds, target)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        metric.update(loss, preds, target)
    for seed in range(1, 6):
        new = _batch(seed=seed)
        for buffer, value in zip((loss, preds, target), new):
            buffer.copy_(value)
        graph.replay()
        eager.update(*new)
    torch.cuda.synchronize()
    for name in COUNTS:
        assert torch.equal(getattr(metric, name), getattr(eager, name)), name
    assert int(metric.loss_count) == 6
    assert_same(metric.compute(), eager.compute())
    metric.reset()  # in place: the graph keeps counting into the same memory
    graph.replay()
    assert int(metric.loss_count) == 1 and int(metric.tp + metric.fp + metric.tn + metric.fn) == 32


def test_after_compiled_updates_only_compute_reads_nothing_back_and_reset_clears_the_flag() -> None:
    from fakes import tensor_reads
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    metric = FusedBinary()
    compiled = torch.compile(lambda loss, p, t: metric.update(loss, p, t), backend="eager", fullgraph=True)
    for i in range(3):
        compiled(torch.tensor(float(i)), torch.tensor([2.0, -1.0]), torch.tensor([1, 1]))
    assert metric._update_count == 0 and counters["stats"]["unique_graphs"] == 1
    with warnings.catch_warnings(), tensor_reads() as reads:
        warnings.simplefilter("error")  # no "compute called before update" warning
        values = metric.compute()
    assert reads == []
    assert float(values["loss"]) == 1.0 and float(values["accuracy"]) == 0.5 and float(values["recall"]) == 0.5
    metric.reset()
    assert not metric.update_called
