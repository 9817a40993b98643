"""mentor.lab.train: build_setup, train (timing, hooks, reports, progress, profiler), RunStats and the refusals of
bad batches and step times; on CUDA (``@gpu``, run with `pytest -m gpu`): the step timer adds no sync."""

import pytest
import torch

from exact import whole
from marks import gpu
from mentor.lab.data import device_batches
from mentor.lab.train import RunStats, Setup, Step, build_setup, train
from mentor.syncs import sync_guard

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def setup():
    return build_setup(num_classes=NUM_CLASSES)


@pytest.fixture
def batches():
    return device_batches(2, image_size=32, num_classes=NUM_CLASSES)


def test_build_setup():
    s = build_setup(num_classes=NUM_CLASSES)
    assert isinstance(s, Setup)
    assert type(s.model).__name__ == "ResNet"
    assert s.model.fc.out_features == NUM_CLASSES
    assert isinstance(s.criterion, torch.nn.CrossEntropyLoss)
    assert isinstance(s.optimizer, torch.optim.SGD)
    assert s.device == torch.device("cpu")


def _weights(setup):
    return [p.detach().clone() for p in setup.model.parameters()]


def test_build_setup_is_seeded():
    a, b, c = build_setup(NUM_CLASSES, seed=0), build_setup(NUM_CLASSES, seed=0), build_setup(NUM_CLASSES, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b)))
    assert not all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(c)))


@pytest.mark.parametrize("bad", [1, 0, True, 2.0, "10"])
def test_build_setup_rejects_bad_num_classes(bad):
    with pytest.raises(ValueError, match=f"num_classes must be an int >= 2, got {bad!r}"):
        build_setup(num_classes=bad)


@pytest.mark.parametrize("steps,warmup", [(1, 0), (3, 2)])
def test_train_times_each_step(setup, batches, steps, warmup):
    stats = train(setup, batches, steps=steps, warmup=warmup)
    assert isinstance(stats, RunStats)
    assert len(stats.step_ms) == steps
    assert all(t > 0 for t in stats.step_ms)
    assert stats.batch_size == 2 and stats.device == "cpu"


def test_train_updates_the_weights(setup, batches):
    before = _weights(setup)
    train(setup, batches, steps=1)
    assert not all(torch.equal(x, y) for x, y in zip(before, _weights(setup)))


def test_on_step_sees_every_step_with_its_index(setup, batches):
    seen: list[Step] = []
    train(setup, batches, steps=3, warmup=2, on_step=seen.append)
    assert [s.index for s in seen] == [0, 1, 2, 3, 4]  # warm-up steps included, 0-based
    for s in seen:
        assert tuple(s.images.shape) == (2, 3, 32, 32)
        assert tuple(s.labels.shape) == (2,)
        assert tuple(s.output.shape) == (2, NUM_CLASSES)
        assert s.loss.shape == () and torch.isfinite(s.loss)
        assert s.host_seconds > 0


def test_on_step_gets_the_loss_of_its_batch(setup):
    # the loss handed to the hook is the criterion of this step's output and labels
    def check(s: Step):
        torch.testing.assert_close(s.loss, setup.criterion(s.output, s.labels))

    train(setup, device_batches(2, 32, NUM_CLASSES), steps=2, on_step=check)


@pytest.mark.parametrize("warmup,steps,every,expected", [
    (0, 4, 2, [2, 4]),
    (1, 4, 2, [2, 4]),        # 5 steps in all: reports after steps 2 and 4
    (0, 5, 3, [3]),
    (2, 4, 1, [1, 2, 3, 4, 5, 6]),
])
def test_on_report_every_n_steps_one_based(setup, batches, warmup, steps, every, expected):
    reports: list[int] = []
    train(setup, batches, steps=steps, warmup=warmup, on_report=reports.append, report_every=every)
    assert reports == expected


def test_on_report_without_report_every_is_never_called(setup, batches):
    reports: list[int] = []
    train(setup, batches, steps=2, on_report=reports.append)
    assert reports == []


def test_progress_prints_whole_lines(setup, batches, capsys):
    train(setup, batches, steps=3, warmup=1, progress="run x")
    out = capsys.readouterr().out
    assert "\r" not in out
    assert out.endswith("\n")
    lines = out.splitlines()
    assert len(lines) == 4  # a line at each quarter of 4 steps
    assert all(line.startswith("run x") for line in lines)
    assert "4/4" in lines[-1]


def test_no_progress_prints_nothing(setup, batches, capsys):
    train(setup, batches, steps=2)
    assert capsys.readouterr().out == ""


class FakeProfiler:
    def __init__(self):
        self.calls = 0

    def step(self):
        self.calls += 1


def test_profiler_step_called_once_per_step(setup, batches):
    prof = FakeProfiler()
    train(setup, batches, steps=3, warmup=2, profiler=prof)
    assert prof.calls == 5


def test_profiler_step_after_each_hook(setup, batches):
    events: list[str] = []

    class Recorder:
        def step(self):
            events.append("profiler")

    train(setup, batches, steps=2, on_step=lambda s: events.append(f"step {s.index}"), profiler=Recorder())
    assert events == ["step 0", "profiler", "step 1", "profiler"]


def test_train_rejects_non_setup(batches):
    with pytest.raises(TypeError, match=r"setup must be a mentor.lab.train.Setup from build_setup\(\), not dict"):
        train({}, batches, steps=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=0), r"steps must be an int >= 1, got 0"),
    (dict(steps=True), r"steps must be an int >= 1, got True"),
    (dict(steps=1.5), r"steps must be an int >= 1, got 1.5"),
    (dict(steps=1, warmup=-1), r"warmup must be an int >= 0, got -1"),
    (dict(steps=1, report_every=-2), r"report_every must be an int >= 0, got -2"),
    (dict(steps=1, report_every=2), r"report_every is set but on_report is None"),
])
def test_train_rejects_bad_counts(setup, batches, kwargs, message):
    with pytest.raises(ValueError, match=message):
        train(setup, batches, **kwargs)


@pytest.mark.parametrize("hook", ["on_step", "on_report"])
def test_train_rejects_non_callable_hooks(setup, batches, hook):
    with pytest.raises(TypeError, match=f"{hook} must be callable or None, not int"):
        train(setup, batches, steps=1, **{hook: 3})


def test_train_with_too_few_batches_says_so(setup):
    batch = next(device_batches(2, 32, NUM_CLASSES))
    with pytest.raises(ValueError, match=whole(
            "batches ran out after 1 of 2 steps (warmup 0 + steps 2); pass an endless stream such as "
            "mentor.lab.data.device_batches(...) or a loader with enough batches.")):
        train(setup, [batch], steps=2)


def test_run_stats_from_a_list():
    stats = RunStats([1.0, 4.0, 2.0], batch_size=4, device="cpu")
    assert stats.step_ms == [1.0, 4.0, 2.0]
    assert stats.median_ms == 2.0
    assert stats.images_per_s == 4 * 1000.0 / 2.0  # batch over median seconds
    assert repr(stats) == "RunStats(3 steps, median 2.00 ms, batch 4)"


# ----------------------------------------------------------------------------------------------------------
# Exact timing with a fake clock, and the training step itself against a hand-written loop, on a tiny model


class FakeTime:
    """Stands in for the ``time`` module of mentor.lab.train: ``perf_counter`` reads a clock that only the test
    advances."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class Tiny(torch.nn.Module):
    """``Linear(3, 2)`` that records ``self.training`` at each forward and advances a fake clock by ``costs[i]``."""

    def __init__(self, clock=None, costs=()):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.clock, self.costs = clock, list(costs)
        self.modes: list[bool] = []

    def forward(self, x):
        if self.clock is not None:
            self.clock.advance(self.costs[len(self.modes)])
        self.modes.append(self.training)
        return self.fc(x)


def tiny_setup(model, lr=0.5):
    with torch.no_grad():
        model.fc.weight.copy_(torch.tensor([[0.5, -1.0, 0.25], [-0.5, 0.75, 1.0]]))
        model.fc.bias.copy_(torch.tensor([0.125, -0.25]))
    return Setup(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=lr), torch.device("cpu"))


TINY_BATCHES = [
    (torch.tensor([[1.0, 2.0, 0.0], [0.0, -1.0, 3.0]]), torch.tensor([0, 1])),
    (torch.tensor([[2.0, 0.0, -1.0], [1.0, 1.0, 1.0]]), torch.tensor([1, 1])),
    (torch.tensor([[-1.0, 0.5, 2.0], [3.0, 0.0, 0.0]]), torch.tensor([0, 0])),
    (torch.tensor([[0.0, 0.0, 1.0], [1.0, -2.0, 0.5]]), torch.tensor([1, 0])),
]

FETCH_S = [0.125, 0.25, 0.375, 0.5]  # what reading batch i costs
FORWARD_S = [1.0, 2.0, 4.0, 8.0]     # what the forward of step i costs
HOOK_S = 0.5                         # what on_step costs at every step (a metric update, say)


@pytest.fixture
def fake_time(monkeypatch):
    import mentor.lab.train

    clock = FakeTime()
    monkeypatch.setattr(mentor.lab.train, "time", clock)
    return clock


def _timed_run(clock, warmup, steps):
    def fetched():
        for i, batch in enumerate(TINY_BATCHES):
            clock.advance(FETCH_S[i])
            yield batch

    seen: list[Step] = []

    def hook(step):
        seen.append(step)
        clock.advance(HOOK_S)

    stats = train(tiny_setup(Tiny(clock, FORWARD_S)), fetched(), steps=steps, warmup=warmup, on_step=hook)
    return stats, seen


def test_step_times_are_exact_per_step_and_exclude_the_warmup(fake_time):
    # A timed step runs from the end of the previous one: reading its batch, forward/backward/step and on_step.
    # Fails if the first timed step includes the warm-up step (2750 would be 4375 or more) or if the times
    # add up across steps (cumulative: 2750, 7625, 16625).
    stats, _ = _timed_run(fake_time, warmup=1, steps=3)
    assert stats.step_ms == [
        (FETCH_S[1] + FORWARD_S[1] + HOOK_S) * 1000,
        (FETCH_S[2] + FORWARD_S[2] + HOOK_S) * 1000,
        (FETCH_S[3] + FORWARD_S[3] + HOOK_S) * 1000,
    ] == [2750.0, 4875.0, 9000.0]
    assert stats.median_ms == 4875.0
    assert stats.images_per_s == 2 * 1000.0 / 4875.0


def test_step_times_without_warmup_start_at_the_first_step(fake_time):
    stats, _ = _timed_run(fake_time, warmup=0, steps=2)
    assert stats.step_ms == [(0.125 + 1.0 + 0.5) * 1000, (0.25 + 2.0 + 0.5) * 1000] == [1625.0, 2750.0]


def test_host_seconds_is_the_time_since_the_previous_step(fake_time):
    # step 0: from the start of train(); later steps: from the previous step's end of optimizer.step(),
    # so the previous on_step is included. Fails if host_seconds adds up (1.125, 3.875, 8.75, 17.75).
    _, seen = _timed_run(fake_time, warmup=1, steps=3)
    assert [s.index for s in seen] == [0, 1, 2, 3]
    assert [s.host_seconds for s in seen] == [0.125 + 1.0, 0.5 + 0.25 + 2.0, 0.5 + 0.375 + 4.0, 0.5 + 0.5 + 8.0]
    assert [s.host_seconds for s in seen] == [1.125, 2.75, 4.875, 9.0]


def _reference_loop(model, lr, batches):
    """The training step written out by hand: what train() must do."""
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    losses = []
    for images, labels in batches:
        optimizer.zero_grad()
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return losses


def test_train_matches_a_hand_written_loop():
    # Fails if optimizer.zero_grad is missing: the second step would use the sum of both steps' gradients.
    setup = tiny_setup(Tiny())
    losses: list[torch.Tensor] = []
    train(setup, iter(TINY_BATCHES[:2]), steps=1, warmup=1, on_step=lambda s: losses.append(s.loss.detach().clone()))
    reference = tiny_setup(Tiny())
    expected_losses = _reference_loop(reference.model, 0.5, TINY_BATCHES[:2])
    for got, want in zip(setup.model.parameters(), reference.model.parameters()):
        assert torch.equal(got, want)
    assert [float(x) for x in losses] == [float(x) for x in expected_losses]


def test_train_first_step_by_hand():
    # One step, gradient worked out by hand: logits of the first batch are [-1.375, 0.75] and [1.875, 2.0];
    # the update is the exact SGD step of lr 0.5 on the mean cross-entropy (checked against autograd below).
    setup = tiny_setup(Tiny())
    w0, b0 = setup.model.fc.weight.detach().clone(), setup.model.fc.bias.detach().clone()
    train(setup, iter(TINY_BATCHES[:1]), steps=1)
    x, y = TINY_BATCHES[0]
    logits = x @ w0.T + b0
    torch.testing.assert_close(logits, torch.tensor([[-1.375, 0.75], [1.875, 2.0]]), rtol=0, atol=0)
    dlogits = (torch.softmax(logits, dim=1) - torch.nn.functional.one_hot(y, 2).float()) / 2
    torch.testing.assert_close(setup.model.fc.weight, w0 - 0.5 * dlogits.T @ x)
    torch.testing.assert_close(setup.model.fc.bias, b0 - 0.5 * dlogits.sum(0))


def test_train_puts_the_model_in_training_mode():
    # Fails if train() leaves the model in eval() mode (BatchNorm would use running stats, Dropout would be off).
    model = Tiny()
    setup = tiny_setup(model)
    model.eval()
    train(setup, iter(TINY_BATCHES[:3]), steps=2, warmup=1)
    assert model.modes == [True, True, True]


def test_train_switches_batchnorm_to_batch_statistics():
    # the same point with a real BatchNorm: in training mode it normalizes with the batch's own statistics
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    setup = Setup(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
    model.eval()
    train(setup, iter(TINY_BATCHES[:1]), steps=1)
    assert model[1].num_batches_tracked.item() == 1  # only a BatchNorm in training mode counts batches


def test_bf16_and_channels_last_reach_the_step():
    from mentor.lab.data import device_batches

    setup = build_setup(num_classes=10, precision="bf16", channels_last=True)
    seen = []
    train(setup, device_batches(2, image_size=32, num_classes=10), steps=1,
          on_step=lambda s: seen.append((s.output.dtype, s.loss.dtype,
                                         s.images.is_contiguous(memory_format=torch.channels_last))))
    assert seen == [(torch.bfloat16, torch.float32, True)]
    assert next(setup.model.parameters()).dtype == torch.float32  # autocast leaves the weights in fp32
    plain = build_setup(num_classes=10)
    train(plain, device_batches(2, image_size=32, num_classes=10), steps=1,
          on_step=lambda s: seen.append((s.output.dtype, s.images.is_contiguous())))
    assert seen[-1] == (torch.float32, True)


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "fp16"}, r"precision must be one of \['fp32', 'bf16'\], got 'fp16'\."),
    ({"channels_last": "yes"}, r"channels_last must be True or False, got 'yes'\."),
])
def test_build_setup_refuses_bad_precision_and_layout(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_setup(num_classes=10, **kwargs)


def test_channels_last_needs_image_batches():
    setup = build_setup(num_classes=10, channels_last=True)
    batches = iter([(torch.randn(2, 3, 32), torch.tensor([0, 1]))])
    with pytest.raises(ValueError,
                       match=r"batch of step 0 has images of shape \(2, 3, 32\); channels_last needs 4-dim"):
        train(setup, batches, steps=1)


# ----------------------------------------------------------------------------------------------------------
# build_setup's defaults and arguments, the copies and zero_grad of each step, the CUDA clock, exact messages
# and the progress lines


def test_build_setup_defaults_are_1000_classes_seed_0_and_sgd_at_lr_0_01():
    s = build_setup()
    assert s.model.fc.out_features == 1000
    assert all(torch.equal(x, y) for x, y in zip(_weights(s), _weights(build_setup(1000, seed=0))))
    assert [(g["lr"], g["momentum"], g["weight_decay"]) for g in s.optimizer.param_groups] == [(0.01, 0, 0)]
    assert (s.autocast, s.channels_last) == (None, False)


def test_build_setup_accepts_two_classes():
    assert build_setup(num_classes=2).model.fc.out_features == 2


def test_build_setup_puts_the_model_on_its_device():
    # the meta device stands in for a GPU: a model left on the CPU would show
    s = build_setup(num_classes=NUM_CLASSES, device="meta")
    assert s.device == torch.device("meta")
    assert {p.device for p in s.model.parameters()} == {torch.device("meta")}


def test_channels_last_setup_stores_the_conv_weights_channels_last():
    convs = [p for p in build_setup(NUM_CLASSES, channels_last=True).model.parameters() if p.dim() == 4]
    assert len(convs) == 20  # ResNet-18: the stem, 16 convolutions in the blocks, 3 downsampling 1x1
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    # a 1x1 kernel is laid out the same in both formats; the 17 larger ones are no longer in the default layout
    assert [p.is_contiguous() for p in convs if p.shape[-1] > 1] == [False] * 17
    assert all(p.is_contiguous() for p in build_setup(NUM_CLASSES).model.parameters())


def test_train_moves_images_and_labels_to_the_setup_device():
    # the model and the optimizer on the meta device, the batches on the CPU: the step sees them on meta
    model = torch.nn.Linear(3, 2).to("meta")
    setup = Setup(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.5),
                  torch.device("meta"))
    seen = []
    train(setup, iter(TINY_BATCHES[:2]), steps=1, warmup=1,
          on_step=lambda s: seen.append((s.images.device.type, s.labels.device.type, s.output.device.type)))
    assert seen == [("meta", "meta", "meta")] * 2


def test_train_copies_images_and_labels_without_blocking():
    # non_blocking=True: from pinned host memory the copy to the GPU does not wait for the host (no sync)
    calls = []

    class Recorded(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.to:
                calls.append(("images" if args[0].dim() == 2 else "labels", kwargs.get("non_blocking")))
            return super().__torch_function__(func, types, args, kwargs)

    images, labels = TINY_BATCHES[0]
    train(tiny_setup(Tiny()), iter([(images.as_subclass(Recorded), labels.as_subclass(Recorded))]), steps=1)
    assert calls == [("images", True), ("labels", True)]


def test_train_runs_the_forward_under_the_setup_autocast_dtype():
    # float16, not the CPU's default autocast dtype (bfloat16): train() passes the dtype that the setup names
    setup = tiny_setup(Tiny())
    setup.autocast = torch.float16
    seen = []
    train(setup, iter(TINY_BATCHES[:1]), steps=1, on_step=lambda s: seen.append(s.output.dtype))
    assert seen == [torch.float16]


def test_each_step_starts_with_no_gradients():
    # zero_grad(set_to_none=True): the forward of every step sees .grad None, not a tensor of zeros
    class GradSpy(Tiny):
        def forward(self, x):
            self.grads_at_forward = getattr(self, "grads_at_forward", []) + [self.fc.weight.grad]
            return super().forward(x)

    model = GradSpy()
    train(tiny_setup(model), iter(TINY_BATCHES[:3]), steps=2, warmup=1)
    assert model.grads_at_forward == [None, None, None]


class FakeEvent:
    """Stands in for ``torch.cuda.Event``: ``record()`` stamps the next of the test's times (in ms)."""

    times: list[float] = []
    synchronized: list[float] = []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.ms = None

    def record(self):
        self.ms = FakeEvent.times.pop(0)

    def synchronize(self):
        FakeEvent.synchronized.append(self.ms)

    def elapsed_time(self, end):
        return end.ms - self.ms


def test_the_step_clock_on_cuda_records_events_and_waits_only_for_the_last(monkeypatch, fake_time):
    # on a CUDA device the marks are events (the host clock, which fake_time stops, is not read); the durations
    # are the differences of consecutive events, and reading them waits for the last event only
    from mentor.lab.train import _StepClock

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(FakeEvent, "times", [10.0, 12.5, 20.0])
    monkeypatch.setattr(FakeEvent, "synchronized", [])
    clock = _StepClock(torch.device("cuda", 0))
    for _ in range(3):
        clock.mark()
    stats = RunStats(clock, batch_size=2, device="cuda:0")
    assert FakeEvent.synchronized == []  # nothing is read before step_ms is used
    assert stats.step_ms == [2.5, 7.5]
    assert FakeEvent.synchronized == [20.0]


def test_an_image_batch_of_zero_dimensions_is_refused_with_the_whole_message():
    with pytest.raises(ValueError) as exc:
        train(tiny_setup(Tiny()), iter([(torch.tensor(1.0), torch.tensor([0]))]), steps=1)
    assert str(exc.value) == ("batch of step 0 has 0 images (images shape ()); pass non-empty batches "
                              "(drop empty ones, or use drop_last=True in the DataLoader).")


def test_whole_messages_of_an_empty_run_stats_and_a_report_without_hook():
    with pytest.raises(ValueError) as exc:
        RunStats([], batch_size=1, device="cpu")
    assert str(exc.value) == ("RunStats needs at least one step time; pass a list with one time in ms "
                              "per timed step.")
    with pytest.raises(ValueError) as exc:
        train(tiny_setup(Tiny()), iter(TINY_BATCHES), steps=1, report_every=1)
    assert str(exc.value) == ("report_every is set but on_report is None: pass a function that takes the "
                              "step number.")


def test_progress_lines_are_exact_at_each_quarter(fake_time, capsys):
    # 8 steps of 1 s each (the forward), the clock starting at 100 s: lines after steps 2, 4, 6 and 8 only.
    # Each line is 72 columns: "run x:  25%|" (12) and "| 2/8 [00:02<00:06,  1.00step/s]" (32) leave a bar of
    # 28 cells, a quarter of them (7) '#' per quarter done; elapsed n s, remaining 8 - n s at 1 step/s.
    fake_time.now = 100.0
    train(tiny_setup(Tiny(fake_time, [1.0] * 8)), iter(TINY_BATCHES * 2), steps=8, progress="run x")
    expected = [f"run x: {25 * q:3d}%|" + "#" * (7 * q) + " " * (28 - 7 * q)
                + f"| {2 * q}/8 [00:0{2 * q}<00:0{8 - 2 * q},  1.00step/s]" for q in (1, 2, 3, 4)]
    assert capsys.readouterr().out.splitlines() == expected
    assert all(len(line) == 72 for line in expected)


def test_progress_flushes_each_line(monkeypatch, fake_time):
    # each line reaches the output at once (a notebook or a log file shows it during the run)
    import sys

    events: list = []

    class Recorder:
        def write(self, text):
            events.append(("write", text))

        def flush(self):
            events.append("flush")

    monkeypatch.setattr(sys, "stdout", Recorder())
    train(tiny_setup(Tiny(fake_time, [1.0] * 4)), iter(TINY_BATCHES), steps=4, progress="p")
    kinds = [e if e == "flush" else "newline" if e[1] == "\n" else "line" for e in events]
    assert kinds == ["line", "newline", "flush"] * 4  # 4 steps: a line after each


# ----------------------------------------------------------------------------------------------------------
# Bad batches and step times: each refused with a message that names the input and says what to pass


def _tiny_setup() -> Setup:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return Setup(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(n, 3), torch.zeros(n, dtype=torch.long)


TRAIN_CASES = [
    pytest.param(lambda: RunStats([1.0, float("nan"), 2.0], batch_size=4, device="cpu"), ValueError,
                 r"step time 1 is nan: each step time must be a finite number of milliseconds > 0; pass the "
                 r"measured times", id="RunStats-nan"),
    pytest.param(lambda: RunStats([1.0, 2.0, -0.5], batch_size=4, device="cpu"), ValueError,
                 r"step time 2 is -0\.5: each step time must be a finite number of milliseconds > 0",
                 id="RunStats-negative"),
    pytest.param(lambda: RunStats([0.0], batch_size=4, device="cpu"), ValueError,
                 r"step time 0 is 0\.0: each step time must be a finite number of milliseconds > 0",
                 id="RunStats-zero"),
    pytest.param(lambda: RunStats([1.0, "2"], batch_size=4, device="cpu"), ValueError,
                 r"step time 1 is '2': each step time must be a finite number", id="RunStats-string"),
    pytest.param(lambda: RunStats([], batch_size=4, device="cpu"), ValueError,
                 r"RunStats needs at least one step time; pass a list with one time in ms per timed step\.",
                 id="RunStats-empty"),
    pytest.param(lambda: RunStats([1.0], batch_size=0, device="cpu"), ValueError,
                 r"batch_size must be an int >= 1, got 0\.", id="RunStats-batch-size-0"),
    pytest.param(lambda: train(_tiny_setup(), [_batch(2), _batch(0), _batch(2)], steps=2, warmup=1), ValueError,
                 r"batch of step 1 has 0 images \(images shape \(0, 3\)\); pass non-empty batches",
                 id="train-empty-batch"),
    pytest.param(lambda: train(_tiny_setup(), [(torch.ones(2, 3), torch.zeros(3, dtype=torch.long))], steps=1),
                 ValueError, r"batch of step 0 has 2 images but labels of shape \(3,\); pass one label per image\.",
                 id="train-label-count"),
    pytest.param(lambda: train(_tiny_setup(), [torch.ones(2, 3)], steps=1), TypeError,
                 whole("batch of step 0 is a Tensor, not an (images, labels) pair of tensors; pass batches such as "
                       "mentor.lab.data.device_batches(...) yields."), id="train-not-a-pair"),
]


@pytest.mark.parametrize("call,error,message", TRAIN_CASES)
def test_train_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_train_stops_at_the_empty_batch_before_updating():
    # the empty batch of step 1 raises before step 1 touches the weights: only step 0 has changed them
    setup, reference = _tiny_setup(), _tiny_setup()
    with pytest.raises(ValueError):
        train(setup, [_batch(2), _batch(0)], steps=1, warmup=1)
    train(reference, [_batch(2)], steps=1)
    assert torch.equal(setup.model.weight, reference.model.weight)


# ----------------------------------------------------------------------------------------------------------
# On CUDA


@gpu
def test_step_timer_adds_no_sync():
    setup = build_setup(num_classes=10, device="cuda")
    batches = device_batches(4, image_size=32, num_classes=10, device="cuda")
    train(setup, batches, steps=2)
    with sync_guard() as report:
        stats = train(setup, batches, steps=3, warmup=1)
    assert report.count == 0, report.table()
    assert len(stats.step_ms) == 3 and all(t > 0 for t in stats.step_ms)
