"""Bad inputs get a clear error that names the input and says what to pass instead, one table per module area.

Each row is ``(call, exception type, regex)``; ``call`` takes pytest's ``tmp_path`` (for the rows that need a
file) and must raise that exception with a message that ``re.search``-matches the regex.
"""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest
import torch

from mentor.env import get_profile
from mentor.profiling import profiling_session, step_syncs
from mentor.train import RunStats, Setup, train
from mentor.trace import Event, Trace, gpu_busy_intervals, gpu_idle_fraction, load_trace

# ----------------------------------------------------------------------------------------------------------
# mentor.trace


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _trace_file(path: Path, bad: dict) -> Path:
    """A .json trace whose event 1 (after a good event 0) has the fields of ``bad``."""
    events = [{"ph": "X", "name": "ok", "cat": "cpu_op", "ts": 0, "dur": 1},
              {"ph": "X", "name": "bad", "cat": "cpu_op", **bad}]
    path.write_text(json.dumps({"traceEvents": events}))  # json.dumps writes NaN as the bare token NaN
    return path


GOOD_JSON = json.dumps({"traceEvents": [{"ph": "X", "name": "a", "cat": "kernel", "ts": 1, "dur": 2}]}).encode()
PASS_A_TRACE = r"pass a \.json or \.json\.gz file written by torch\.profiler \(export_chrome_trace\)\.$"


def _zero_length_step() -> Trace:
    return Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
                  Event("cudaLaunchKernel", "cuda_runtime", 1, 1, 1, 1, 1), Event("k", "kernel", 3, 0, 0, 7, 1)])


TRACE_CASES = [
    pytest.param(lambda d: load_trace(_write(d / "noise.json.gz", b"this is not gzip at all")), ValueError,
                 r"'.*noise\.json\.gz' is named \.gz but is not gzip data \(Not a gzipped file .*\); gzip it, "
                 r"rename a plain JSON trace to \.json, or " + PASS_A_TRACE, id="load_trace-not-gzip"),
    pytest.param(lambda d: load_trace(_write(d / "garbage.json.gz", b"\x1f\x8b\x08\x00" + b"\x07garbage" * 8)),
                 ValueError, r"'.*garbage\.json\.gz' is a truncated or damaged gzip file \(error: .*\); "
                 r"record the trace again or " + PASS_A_TRACE, id="load_trace-gzip-garbage"),
    pytest.param(lambda d: load_trace(_write(d / "cut.json.gz", gzip.compress(GOOD_JSON)[:-12])), ValueError,
                 r"'.*cut\.json\.gz' is a truncated or damaged gzip file \(EOFError: Compressed file ended before "
                 r"the end-of-stream marker was reached\); record the trace again or " + PASS_A_TRACE,
                 id="load_trace-truncated-gzip"),
    pytest.param(lambda d: load_trace(_write(d / "plain.json.gz", GOOD_JSON)), ValueError,
                 r"'.*plain\.json\.gz' is named \.gz but is not gzip data \(Not a gzipped file \(b'\{\"'\)\); "
                 r"gzip it, rename a plain JSON trace to \.json, or " + PASS_A_TRACE,
                 id="load_trace-plain-json-as-gz"),
    pytest.param(lambda d: load_trace(_write(d / "latin.json", b'{"traceEvents": [\xff]}')), ValueError,
                 r"'.*latin\.json' is not UTF-8 text \(.*\); " + PASS_A_TRACE, id="load_trace-not-utf8"),
    pytest.param(lambda d: load_trace(_trace_file(d / "ts.json", {"ts": "abc", "dur": 1})), ValueError,
                 r"'.*ts\.json': event 1 \('bad'\) has ts='abc', but ts must be a finite number of microseconds; "
                 + PASS_A_TRACE, id="load_trace-ts-string"),
    pytest.param(lambda d: load_trace(_trace_file(d / "dur.json", {"ts": 5, "dur": [1]})), ValueError,
                 r"'.*dur\.json': event 1 \('bad'\) has dur=\[1\], but dur must be a finite number >= 0 of "
                 r"microseconds; " + PASS_A_TRACE, id="load_trace-dur-list"),
    pytest.param(lambda d: load_trace(_trace_file(d / "neg.json", {"ts": 5, "dur": -3})), ValueError,
                 r"'.*neg\.json': event 1 \('bad'\) has dur=-3, but dur must be a finite number >= 0 of "
                 r"microseconds; " + PASS_A_TRACE, id="load_trace-negative-dur"),
    pytest.param(lambda d: load_trace(_trace_file(d / "nan.json", {"ts": float("nan"), "dur": 1})), ValueError,
                 r"'.*nan\.json': event 1 \('bad'\) has ts=nan, but ts must be a finite number of microseconds; "
                 + PASS_A_TRACE, id="load_trace-nan-ts"),
    pytest.param(lambda d: load_trace(_trace_file(d / "inf.json", {"ts": 5, "dur": float("inf")})), ValueError,
                 r"'.*inf\.json': event 1 \('bad'\) has dur=inf, but dur must be a finite number >= 0",
                 id="load_trace-inf-dur"),
    pytest.param(lambda d: load_trace(_trace_file(d / "bool.json", {"ts": True, "dur": 1})), ValueError,
                 r"'.*bool\.json': event 1 \('bad'\) has ts=True, but ts must be a finite number",
                 id="load_trace-bool-ts"),
    pytest.param(lambda d: gpu_idle_fraction(_zero_length_step()), ValueError,
                 r"the GPU span of ProfilerStep#1 has zero length \(3 to 3 us\): there is no time to measure an "
                 r"idle share in; pass a trace recorded on a CUDA device whose steps run GPU work of nonzero "
                 r"duration\.",
                 id="gpu_idle_fraction-zero-length-step"),
    pytest.param(lambda d: gpu_busy_intervals(Trace([Event("k", "kernel", 0, 5, 0, 7)]), 5, 1), ValueError,
                 r"gpu_busy_intervals needs start <= end, got start=5 and end=1; pass the earlier time first\.",
                 id="gpu_busy_intervals-start-after-end"),
]


@pytest.mark.parametrize("call,error,message", TRACE_CASES)
def test_trace_bad_inputs(tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(tmp_path)


# ----------------------------------------------------------------------------------------------------------
# mentor.profiling


def _short_session(path: Path, steps: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own "Incorrect schedule" warning: the error below says more
        with profiling_session(path, wait=0, warmup=2, active=1) as prof:
            for _ in range(steps):
                torch.ones(4) + 1
                prof.step()


PROFILING_CASES = [
    pytest.param(lambda d: _short_session(d / "short.json", steps=1), RuntimeError,
                 r"profiling_session recorded nothing and wrote no trace to '.*short\.json': the block called "
                 r"prof\.step\(\) 1 time\(s\), but the schedule needs 3 steps \(wait 0 \+ warmup 2 \+ active 1\) "
                 r"and records only from step 3 on\. Call prof\.step\(\) once per training step and run at least 3 "
                 r"steps", id="profiling_session-ends-before-recording"),
    pytest.param(lambda d: _short_session(d / "none.json.gz", steps=0), RuntimeError,
                 r"wrote no trace to '.*none\.json\.gz': the block called prof\.step\(\) 0 time\(s\), but the "
                 r"schedule needs 3 steps", id="profiling_session-no-step-at-all"),
    pytest.param(lambda d: step_syncs(Trace([Event("cudaStreamSynchronize", "cuda_runtime", 5, 1, 1, 1)],
                                            path="run.json")), ValueError,
                 r"the trace 'run\.json' has no ProfilerStep windows, so there are no steps to count syncs in; "
                 r"record it with mentor\.profiling\.profiling_session \(or record_steps\) and call prof\.step\(\) "
                 r"once per training step\.", id="step_syncs-no-profiler-step"),
]


@pytest.mark.parametrize("call,error,message", PROFILING_CASES)
def test_profiling_bad_inputs(tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(tmp_path)
    assert not (tmp_path / "short.json").exists() and not (tmp_path / "none.json.gz").exists()


def test_profiling_session_does_not_mask_the_blocks_own_error(tmp_path):
    # the block failed before its first step: that error, not "recorded nothing", is what the user must see
    with pytest.raises(KeyError, match="the block's own error"):
        with profiling_session(tmp_path / "t.json", wait=0, warmup=2, active=1):
            raise KeyError("the block's own error")


def test_profiling_session_that_reaches_its_active_steps_writes_the_trace(tmp_path):
    # the check does not fire when the schedule was run through (so the error above cannot be unconditional)
    _short_session(tmp_path / "full.json", steps=3)
    assert (tmp_path / "full.json").is_file()


# ----------------------------------------------------------------------------------------------------------
# mentor.train


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
                 r"batch of step 0 is a Tensor, not an \(images, labels\) pair of tensors; pass batches such as "
                 r"mentor\.data\.device_batches\(\.\.\.\) yields\.", id="train-not-a-pair"),
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
# mentor.env


def _with(**changes):
    return lambda: get_profile("smoke").with_(**changes)


ENV_CASES = [
    pytest.param(_with(steps=-1), ValueError,
                 r"Profile\.steps must be an int >= 1, got -1; pass e\.g\. steps=3\.", id="steps-negative"),
    pytest.param(_with(steps=0), ValueError,
                 r"Profile\.steps must be an int >= 1, got 0; pass e\.g\. steps=3\.", id="steps-zero"),
    pytest.param(_with(batch_size=True), ValueError,
                 r"Profile\.batch_size must be an int >= 1, got True; pass e\.g\. batch_size=8\.", id="batch_size-bool"),
    pytest.param(_with(rounds=2.0), ValueError,
                 r"Profile\.rounds must be an int >= 1, got 2\.0; pass e\.g\. rounds=2\.", id="rounds-float"),
    pytest.param(_with(image_size="32"), ValueError,
                 r"Profile\.image_size must be an int >= 1, got '32'; pass e\.g\. image_size=32\.",
                 id="image_size-string"),
    pytest.param(_with(num_classes=1), ValueError,
                 r"Profile\.num_classes must be an int >= 2, got 1; pass e\.g\. num_classes=1000\.",
                 id="num_classes-one"),
    pytest.param(_with(warmup=-1), ValueError,
                 r"Profile\.warmup must be an int >= 0, got -1; pass e\.g\. warmup=1\.", id="warmup-negative"),
    pytest.param(_with(report_every=None), ValueError,
                 r"Profile\.report_every must be an int >= 0, got None; pass e\.g\. report_every=2\.",
                 id="report_every-None"),
    pytest.param(_with(device="cuda"), ValueError,
                 r"Profile\.device must be a torch\.device, got 'cuda'; pass e\.g\. "
                 r"torch\.device\('cuda'\) or torch\.device\('cpu'\)\.", id="device-string"),
    pytest.param(_with(name=None), ValueError,
                 r"Profile\.name must be a str such as 'smoke', got None\.", id="name-None"),
]


@pytest.mark.parametrize("call,error,message", ENV_CASES)
def test_env_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_env_zero_warmup_and_reports_are_valid():
    # 0 means "no warm-up" and "no periodic report" (train() accepts both), so with_ must not reject them
    p = get_profile("smoke").with_(warmup=0, report_every=0)
    assert (p.warmup, p.report_every) == (0, 0)
