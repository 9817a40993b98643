"""mentor.syncs: sync reports built by hand, the interceptor behind sync_guard (gloo collectives and fakes of the
CUDA calls, on CPU), the pageable-copy decision and the parts that pick a sync's file:line; on CUDA (``@gpu``,
run with `pytest -m gpu`): exact sync counts, file:line of each site, strict mode and what the guard adds to
torch's sync debug mode."""

import functools
import inspect
import re
import sys
import threading
import traceback
import types
import warnings

import pytest
import torch
import torch.distributed as dist
from torchmetrics import MeanMetric

import mentor.syncs as syncs
from marks import gpu, warm
from mentor.lab.ddp import single_rank_group
from mentor.syncs import (
    COLLECTIVES,
    DEBUG_MODE,
    PAGEABLE_COPY,
    SyncError,
    SyncReport,
    SyncSite,
    _copy_waits,
    _intercept,
    _targets,
    count_syncs,
    is_pageable_d2h_copy,
    short_path,
    sync_guard,
)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


# ----------------------------------------------------------------------------------------------------------
# Sync reports (built by hand: recording them needs CUDA)


@pytest.mark.parametrize("path,expected", [
    ("/x/lib/python3.11/site-packages/torchmetrics/aggregation.py", "torchmetrics/aggregation.py"),
    ("/usr/lib/python3/dist-packages/torch/cuda/__init__.py", "torch/cuda/__init__.py"),
    ("/work/main/mentor/syncs.py", "mentor/syncs.py"),
    ("/work/main/mentor/lab/metric_sets.py", "mentor/lab/metric_sets.py"),
    ("/home/u/book/ch1/notebook.py", "book/ch1/notebook.py"),
    ("/a/tests/b/tests/test_x.py", "tests/test_x.py"),  # the innermost anchor
    ("/home/u/elsewhere/script.py", "/home/u/elsewhere/script.py"),
    ("/tmp/ipykernel_759/1813045355.py", "<cell>"),  # a Jupyter cell's temporary file
    ("/tmp/ipykernel_759/helpers.py", "/tmp/ipykernel_759/helpers.py"),  # a real file in such a folder
    # only the first marker splits: a package folder inside site-packages keeps its own site-packages/
    ("/venv/site-packages/pkg/site-packages/mod.py", "pkg/site-packages/mod.py"),
    (r"C:\Users\u\AppData\Local\Temp\ipykernel_759\1813045355.py", "<cell>"),  # a cell on Windows
])
def test_short_path(path, expected):
    assert short_path(path) == expected


TM = "/x/site-packages/torchmetrics/aggregation.py"

USER = "/home/u/proj/loop.py"


def _site(line=93, user_line=10):
    stack = ((USER, user_line, "main"), ("/x/site-packages/torchmetrics/metric.py", 500, "wrapped_func"),
             (TM, line, "_cast_and_nan_check_input"))
    return SyncSite(TM, line, "_cast_and_nan_check_input", stack)


def test_sync_site_where_and_caller():
    site = _site()
    assert site.where == "torchmetrics/aggregation.py:93"
    assert site.caller == f"{USER}:10"  # innermost frame outside torch, torchmetrics and mentor.syncs


def test_sync_site_caller_falls_back_to_where():
    site = SyncSite(TM, 93, "f", ((TM, 93, "f"),))
    assert site.caller == site.where


def test_sync_site_code_reads_the_line(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("a = 1\nflag = bool(x.any())\n")
    assert SyncSite(str(source), 2, "f", ()).code == "flag = bool(x.any())"


def test_sync_report_table_and_counts():
    report = SyncReport([_site(), _site(), _site(line=95, user_line=12)])
    assert report.count == 3
    assert report.by_line() == {"torchmetrics/aggregation.py:93": 2, "torchmetrics/aggregation.py:95": 1}
    assert report.table().splitlines() == [
        f"  2x  torchmetrics/aggregation.py:93  in _cast_and_nan_check_input()  <- {USER}:10",
        f"  1x  torchmetrics/aggregation.py:95  in _cast_and_nan_check_input()  <- {USER}:12",
    ]
    assert SyncReport().table() == "no synchronizing calls"


@no_cuda
def test_sync_guard_needs_cuda():
    with pytest.raises(RuntimeError, match=r"torch sees no CUDA device here; run it on a GPU machine.*needs_cuda"):
        with sync_guard():
            pass


def test_sync_guard_rejects_non_bool_strict():
    with pytest.raises(TypeError, match="strict must be True or False, not 1"):
        with sync_guard(strict=1):  # type: ignore[arg-type]
            pass


@no_cuda
def test_count_syncs_needs_cuda():
    calls = []
    with pytest.raises(RuntimeError, match="no CUDA device"):
        count_syncs(calls.append, 1)
    assert calls == []  # refused before running the function


def test_count_syncs_rejects_non_callable():
    with pytest.raises(TypeError, match=r"count_syncs takes a callable \(e.g. metric.update\), not int"):
        count_syncs(3)


def test_sync_site_kind_defaults_to_debug_mode_and_shows_in_the_table():
    assert _site().kind == DEBUG_MODE == "debug mode"
    extra = SyncSite(USER, 7, "main", ((USER, 7, "main"),), "torch.cuda.synchronize")
    report = SyncReport([_site(), extra])
    assert report.table().splitlines() == [
        f"  1x  torchmetrics/aggregation.py:93  in _cast_and_nan_check_input()  <- {USER}:10",
        f"  1x  {USER}:7  in main()  <- {USER}:7  [torch.cuda.synchronize]",
    ]
    assert report.by_kind() == {"debug mode": 1, "torch.cuda.synchronize": 1}


# ----------------------------------------------------------------------------------------------------------
# The interceptor behind sync_guard: wrapped Python-level calls, checked on CPU (gloo, fakes)


def _here() -> int:
    """The line number of the caller's current line."""
    return sys._getframe(1).f_lineno


def _attributes():
    """Every attribute the interceptor replaces, with its current value (``None`` when it is inherited)."""
    return {(id(owner), name): vars(owner).get(name) for owner, name, _ in _targets()} | {
        (id(torch.Tensor), "copy_"): vars(torch.Tensor).get("copy_")}


@pytest.fixture
def originals():
    before = _attributes()
    named = (torch.cuda.synchronize, torch.cuda.empty_cache, torch.cuda.Event.synchronize,
             torch.cuda.Stream.synchronize, dist.all_reduce, dist.barrier, dist.distributed_c10d.all_gather,
             torch.Tensor.copy_)
    yield before, named
    after = (torch.cuda.synchronize, torch.cuda.empty_cache, torch.cuda.Event.synchronize,
             torch.cuda.Stream.synchronize, dist.all_reduce, dist.barrier, dist.distributed_c10d.all_gather,
             torch.Tensor.copy_)
    assert all(a is b for a, b in zip(after, named))
    assert _attributes() == before


def test_targets_cover_the_documented_calls():
    kinds = {kind for _, _, kind in _targets()}
    assert {"torch.cuda.synchronize", "Event.synchronize", "Stream.synchronize", "empty_cache"} <= kinds
    assert {f"collective: {name}" for name in COLLECTIVES} <= kinds
    assert {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
            "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter",
            "all_to_all", "all_to_all_single", "barrier", "monitored_barrier"} <= set(COLLECTIVES)
    # both the public module and distributed_c10d (whose functions call each other by global name)
    assert {(owner.__name__, name) for owner, name, kind in _targets() if kind == "collective: all_gather"} == {
        ("torch.distributed", "all_gather"), ("torch.distributed.distributed_c10d", "all_gather")}


def test_interceptor_records_gloo_collectives_with_kind_and_line(originals):
    report = SyncReport()
    with single_rank_group("gloo"):
        t = torch.tensor([1.0, 2.0])
        out = [torch.zeros(2)]
        with _intercept(report):
            dist.all_reduce(t); line_reduce = _here()  # noqa: E702 - the call and its line number together
            dist.barrier(); line_barrier = _here()  # noqa: E702
            dist.all_gather(out, t); line_gather = _here()  # noqa: E702
            dist.all_gather_object([None], {"a": 1}); line_object = _here()  # noqa: E702
    assert [s.kind for s in report.sites] == ["collective: all_reduce", "collective: barrier",
                                              "collective: all_gather", "collective: all_gather_object"]
    assert [s.line for s in report.sites] == [line_reduce, line_barrier, line_gather, line_object]
    assert all(s.file == __file__ for s in report.sites)
    assert all(s.function == "test_interceptor_records_gloo_collectives_with_kind_and_line" for s in report.sites)
    assert report.sites[0].where == f"tests/test_syncs.py:{line_reduce}"
    assert report.sites[0].caller == report.sites[0].where
    assert report.sites[0].code.startswith("dist.all_reduce(t)")
    # the originals ran: the gather filled its output
    assert torch.equal(out[0], torch.tensor([1.0, 2.0]))
    # all_gather_object calls all_gather inside: counted once, as the outer call
    assert report.by_kind()["collective: all_gather"] == 1


def test_interceptor_strict_raises_before_the_collective(originals, monkeypatch):
    report = SyncReport()
    with single_rank_group("gloo"):
        t = torch.tensor([1.0, 2.0])
        out = [torch.zeros(2)]
        with pytest.raises(SyncError) as raised:
            with _intercept(report, strict=True):
                line = _here() + 1
                dist.all_gather(out, t)
        assert torch.equal(out[0], torch.zeros(2))  # not gathered: the original was not called
        assert str(raised.value).startswith(f"collective: all_gather at tests/test_syncs.py:{line} ")
        calls = []
        monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: calls.append(a))
        with pytest.raises(SyncError, match=r"collective: all_reduce at tests/test_syncs.py:\d+ "):
            with _intercept(SyncReport(), strict=True):
                dist.all_reduce(t)
        assert calls == []
    assert [s.kind for s in report.sites] == ["collective: all_gather"]  # recorded, then raised


def test_interceptor_restores_after_an_exception(originals):
    report = SyncReport()
    with pytest.raises(ZeroDivisionError):
        with _intercept(report):
            assert torch.cuda.synchronize is not originals[1][0]
            assert "copy_" in vars(torch.Tensor)
            1 / 0
    assert "copy_" not in vars(torch.Tensor) and torch.Tensor.copy_ is torch._C.TensorBase.copy_
    assert torch.cuda.synchronize is originals[1][0] and dist.all_reduce is originals[1][4]


def test_interceptor_restores_after_a_sync_error(originals, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    fake = torch.cuda.synchronize
    with pytest.raises(SyncError, match="torch.cuda.synchronize at tests/test_syncs.py"):
        with _intercept(SyncReport(), strict=True):
            torch.cuda.synchronize()
    assert torch.cuda.synchronize is fake


def test_interceptor_wraps_fakes_of_the_cuda_calls(originals, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: calls.append("stream"))
    if hasattr(torch, "accelerator"):
        monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: calls.append("accelerator"))
    report = SyncReport()
    event = torch.cuda.Event()  # never recorded: its real synchronize() returns at once, also without CUDA
    with _intercept(report):
        torch.cuda.synchronize(); first = _here()  # noqa: E702
        torch.cuda.empty_cache()
        torch.cuda.Stream.synchronize(object())
        event.synchronize(); last = _here()  # noqa: E702
        if hasattr(torch, "accelerator"):
            torch.accelerator.synchronize()
    expected = ["torch.cuda.synchronize", "empty_cache", "Stream.synchronize", "Event.synchronize"]
    expected += ["torch.accelerator.synchronize"] if hasattr(torch, "accelerator") else []
    assert [s.kind for s in report.sites] == expected
    assert calls == ["sync", "empty", "stream"] + (["accelerator"] if hasattr(torch, "accelerator") else [])
    assert (report.sites[0].line, report.sites[3].line) == (first, last)
    assert report.table().splitlines()[0].endswith("  [torch.cuda.synchronize]")


def test_interceptor_counts_a_wrapped_call_inside_another_once(originals, monkeypatch):
    # a fake synchronize that empties the cache, looked up at call time: one site, the outer call
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: torch.cuda.empty_cache())
    report = SyncReport()
    with _intercept(report):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    assert [s.kind for s in report.sites] == ["torch.cuda.synchronize", "empty_cache"]


def test_interceptor_nested_inner_records_and_restores_the_outer(originals, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    fake = torch.cuda.synchronize
    outer, inner = SyncReport(), SyncReport()
    with _intercept(outer):
        outer_state = _attributes()
        outer_sync = torch.cuda.synchronize
        torch.cuda.synchronize()
        with _intercept(inner, strict=True):
            with pytest.raises(SyncError):
                torch.cuda.synchronize()
        assert _attributes() == outer_state and torch.cuda.synchronize is outer_sync
        torch.cuda.synchronize()
    assert torch.cuda.synchronize is fake
    assert (outer.count, inner.count) == (2, 1)  # the inner guard's call is in its own report only


def test_interceptor_records_calls_from_other_threads(originals, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    report = SyncReport()

    def worker():
        torch.cuda.synchronize()

    with _intercept(report):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert [(s.kind, s.function) for s in report.sites] == [("torch.cuda.synchronize", "worker")]


def test_interceptor_copy_passes_through_on_cpu(originals):
    report = SyncReport()
    dst = torch.zeros(3)
    with _intercept(report):
        dst.copy_(torch.ones(3), non_blocking=True)
        torch.Tensor.copy_(dst, torch.full((3,), 2.0), True)
    assert report.count == 0 and torch.equal(dst, torch.full((3,), 2.0))


@pytest.mark.parametrize("strict", [False, True])
def test_interceptor_reports_a_pageable_copy(originals, monkeypatch, strict):
    # the decision needs a CUDA source; on CPU the test makes every copy count to check the wrapper
    seen = []
    monkeypatch.setattr(syncs, "_copy_waits", lambda dst, src, nb: seen.append(nb) or True)
    report = SyncReport()
    dst = torch.zeros(2)
    if strict:
        with pytest.raises(SyncError, match=r"pageable non_blocking copy at tests/test_syncs.py:\d+ "):
            with _intercept(report, strict=True):
                dst.copy_(torch.ones(2), non_blocking=True)
        assert torch.equal(dst, torch.zeros(2))  # not copied
    else:
        with _intercept(report):
            dst.copy_(torch.ones(2), non_blocking=True); line = _here()  # noqa: E702
        assert torch.equal(dst, torch.ones(2)) and report.sites[0].line == line
    assert [s.kind for s in report.sites] == [PAGEABLE_COPY] and seen == [True]


def test_debug_mode_warning_under_the_copy_wrapper_points_at_the_caller(originals):
    # a warning raised inside copy_ is attributed by Python to the innermost Python frame, the wrapper;
    # the guard's handler moves it to the caller. A CPU copy_ that warns stands in for a blocking D2H copy.
    report = SyncReport()
    dst = torch.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = functools.partial(syncs._record_warning, report)  # no frame of its own
        with _intercept(SyncReport()):
            dst.copy_(torch.ones(2, dtype=torch.complex64)); line = _here()  # noqa: E702 - warns: complex to real
    assert [(s.file, s.line, s.function, s.kind) for s in report.sites] == [
        (__file__, line, "test_debug_mode_warning_under_the_copy_wrapper_points_at_the_caller", DEBUG_MODE)]
    assert report.sites[0].stack[-1] == (
        __file__, line, "test_debug_mode_warning_under_the_copy_wrapper_points_at_the_caller")


SRC = ["cuda", "cpu"]

DST = ["cuda", "cpu"]


@pytest.mark.parametrize("src", SRC)
@pytest.mark.parametrize("dst", DST)
@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_pageable_copy_decision_table(src, dst, pinned, non_blocking):
    expected = (src, dst, pinned, non_blocking) == ("cuda", "cpu", False, True)  # the only waiting combination
    assert is_pageable_d2h_copy(src, dst, pinned, non_blocking) is expected
    assert is_pageable_d2h_copy(torch.device(src), torch.device(dst), pinned, non_blocking) is expected


def test_pageable_copy_decision_with_indexed_devices():
    assert is_pageable_d2h_copy("cuda:1", "cpu", False, True) is True
    assert is_pageable_d2h_copy("cuda:1", "cuda:0", False, True) is False
    assert is_pageable_d2h_copy("meta", "cpu", False, True) is False


@pytest.mark.parametrize("args,error,message", [
    (("cuda", "cpu", 0, True), TypeError, "dst_pinned must be True or False, not 0"),
    (("cuda", "cpu", False, None), TypeError, "non_blocking must be True or False, not None"),
    (("gpu", "cpu", False, True), ValueError, "src_device must be a device such as 'cuda:0'"),
    (("cuda", 3.5, False, True), ValueError, "dst_device must be a device such as 'cuda:0'"),
])
def test_pageable_copy_decision_rejects_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        is_pageable_d2h_copy(*args)


def test_copy_waits_on_cpu_tensors_is_false():
    a, b = torch.zeros(2), torch.ones(2)
    assert _copy_waits(a, b, True) is False  # CPU source
    assert _copy_waits(a, b, False) is False
    assert _copy_waits(a, 1.0, True) is False  # not a tensor: left to copy_ to reject


# ----------------------------------------------------------------------------------------------------------
# Pinned values of the interceptor's parts, independent of the real call stack and of CUDA


TORCH_FILE = "/x/site-packages/torch/cuda/__init__.py"

HERE = syncs.__file__  # frames of mentor.syncs itself


def _fake_stack(monkeypatch, frames):
    """Make ``traceback.extract_stack`` return ``frames`` ((file, line, function), outermost first)."""
    summaries = [traceback.FrameSummary(file, line, name, lookup_line=False) for file, line, name in frames]
    monkeypatch.setattr(traceback, "extract_stack", lambda *a, **k: list(summaries))


@pytest.mark.parametrize("frames, expected", [
    # the innermost frame outside torch, torchmetrics and this module; this module's inner frames are dropped
    ([(USER, 10, "main"), (TM, 93, "update"), (TORCH_FILE, 20, "synchronize"), (HERE, 400, "intercepted"),
      (HERE, 390, "_seen"), (HERE, 380, "_site_here")],
     (USER, 10, "main", ((USER, 10, "main"), (TM, 93, "update"), (TORCH_FILE, 20, "synchronize")))),
    # a frame without a line number reads as line 0
    ([(USER, None, "<module>"), (HERE, 380, "_site_here")], (USER, 0, "<module>", ((USER, 0, "<module>"),))),
    # only library frames left: the innermost of them
    ([("/x/site-packages/torch/a.py", 1, "f"), (TM, 2, "g"), (TORCH_FILE, 3, "h"), (HERE, 4, "_site_here")],
     (TORCH_FILE, 3, "h", (("/x/site-packages/torch/a.py", 1, "f"), (TM, 2, "g"), (TORCH_FILE, 3, "h")))),
    # nothing but this module: an unknown site
    ([(HERE, 1, "a"), (HERE, 2, "_site_here")], ("?", 0, "?", ())),
])
def test_site_here_picks_the_caller_from_the_stack(monkeypatch, frames, expected):
    _fake_stack(monkeypatch, frames)
    site = syncs._site_here("torch.cuda.synchronize")
    assert site == SyncSite(*expected, kind="torch.cuda.synchronize")
    assert (site.file, site.line, site.function, site.stack) == expected


def test_seen_records_the_site_and_strict_raises_naming_it(monkeypatch):
    _fake_stack(monkeypatch, [(USER, 12, "train"), (TORCH_FILE, 20, "synchronize"), (HERE, 390, "_seen")])
    report = SyncReport()
    assert syncs._seen(report, False, "empty_cache") is None
    with pytest.raises(SyncError) as raised:
        syncs._seen(report, True, "collective: all_reduce")
    assert str(raised.value) == (f"collective: all_reduce at {USER}:12 (in train()): sync_guard(strict=True) forbids "
                                 "synchronizing calls; the call was not made.")
    stack = ((USER, 12, "train"), (TORCH_FILE, 20, "synchronize"))
    assert report.sites == [SyncSite(USER, 12, "train", stack, "empty_cache"),
                            SyncSite(USER, 12, "train", stack, "collective: all_reduce")]  # recorded, then raised


def test_is_library_reads_windows_paths():
    assert syncs._is_library(r"C:\env\Lib\site-packages\torch\cuda\__init__.py") is True
    assert syncs._is_library(r"C:\env\Lib\site-packages\torchmetrics\metric.py") is True
    assert syncs._is_library(r"C:\proj\mentor\syncs.py") is True
    assert syncs._is_library(r"C:\proj\loop.py") is False
    site = SyncSite(r"C:\env\Lib\site-packages\torchmetrics\metric.py", 5, "f",
                    ((r"C:\proj\loop.py", 10, "main"), (r"C:\env\Lib\site-packages\torchmetrics\metric.py", 5, "f")))
    assert site.caller == r"C:\proj\loop.py:10"


class _OnDevice(torch.Tensor):
    """A CPU tensor that reports the device type it is given and records when its pinning is asked."""

    @property
    def device(self):
        return torch.device(self.fake_device)

    def is_pinned(self, *args, **kwargs):
        self.asked.append("is_pinned")
        return self.fake_pinned


def _on(device, pinned=False):
    t = torch.zeros(2).as_subclass(_OnDevice)
    t.fake_device, t.fake_pinned, t.asked = device, pinned, []
    return t


@pytest.mark.parametrize("src, dst, pinned, non_blocking, waits", [
    ("cuda", "cpu", False, True, True),  # the only copy that waits
    ("cuda:1", "cpu", False, True, True),
    ("cuda", "cpu", True, True, False),  # pinned memory: no wait
    ("cuda", "cpu", False, False, False),  # blocking: the debug mode flags it
    ("cuda", "cpu", False, 1, False),  # only True itself counts
    ("cuda", "cpu", False, None, False),
    ("cuda", "cuda", False, True, False),
    ("cpu", "cpu", False, True, False),
    ("cpu", "cuda", False, True, False),
    ("meta", "cpu", False, True, False),
])
def test_copy_waits_decides_on_device_types_and_asks_pinning_last(src, dst, pinned, non_blocking, waits):
    d, s = _on(dst, pinned), _on(src)
    assert _copy_waits(d, s, non_blocking) is waits
    # pinning is asked only of a non-blocking copy from CUDA to the host
    expected = ["is_pinned"] if src.startswith("cuda") and dst == "cpu" and non_blocking is True else []
    assert d.asked == expected and s.asked == []


def test_copy_waits_needs_two_tensors():
    src = _on("cuda")
    assert _copy_waits(3.0, src, True) is False
    assert _copy_waits(_on("cpu"), [1.0], True) is False
    assert src.asked == []


def _accelerator_targets():
    return [(owner, name, kind) for owner, name, kind in _targets() if kind == "torch.accelerator.synchronize"]


def test_targets_list_the_cuda_calls_and_the_accelerator_when_it_has_synchronize(monkeypatch):
    import torch.cuda.memory

    calls = [(owner, name, kind) for owner, name, kind in _targets() if not kind.startswith("collective: ")]
    expected = [(torch.cuda, "synchronize", "torch.cuda.synchronize"),
                (torch.cuda.Event, "synchronize", "Event.synchronize"),
                (torch.cuda.Stream, "synchronize", "Stream.synchronize"),
                (torch.cuda, "empty_cache", "empty_cache"),
                (torch.cuda.memory, "empty_cache", "empty_cache")]
    if hasattr(getattr(torch, "accelerator", None), "synchronize"):
        expected.append((torch.accelerator, "synchronize", "torch.accelerator.synchronize"))
    assert [(id(o), n, k) for o, n, k in calls] == [(id(o), n, k) for o, n, k in expected]
    fake = types.SimpleNamespace(synchronize=lambda device=None: None)
    monkeypatch.setattr(torch, "accelerator", fake, raising=False)
    assert [(id(o), n, k) for o, n, k in _accelerator_targets()] == [
        (id(fake), "synchronize", "torch.accelerator.synchronize")]
    monkeypatch.setattr(torch, "accelerator", types.SimpleNamespace())  # a torch.accelerator without synchronize
    assert _accelerator_targets() == []
    monkeypatch.delattr(torch, "accelerator")  # a torch without torch.accelerator
    assert _accelerator_targets() == []


# ----------------------------------------------------------------------------------------------------------
# On CUDA: exact sync counts of torchmetrics' MeanMetric, and file:line of each site




@gpu
def test_default_mean_update_syncs_twice(loss):
    # torchmetrics 1.9.0: `if nans.any() or nans_weight.any()` reads two booleans back.
    m = warm(MeanMetric().cuda(), loss)
    report = count_syncs(m.update, loss)
    assert report.count == 2
    assert all(s.where.startswith("torchmetrics/aggregation.py:") for s in report.sites)


@gpu
def test_float_weight_adds_a_copy(loss):
    # a Python float weight is copied to the GPU (blocking): one more sync than the default
    m = warm(MeanMetric().cuda(), loss)
    assert count_syncs(m.update, loss, weight=1.0).count == 3


@gpu
def test_builtin_disable_does_not_sync(loss):
    m = warm(MeanMetric(nan_strategy="disable").cuda(), loss)
    assert count_syncs(m.update, loss).count == 0


def _read_back(t):
    return t.item()  # the sync under test


@gpu
def test_sync_guard_reports_file_and_line():
    t = torch.ones((), device="cuda")
    line = inspect.getsourcelines(_read_back)[1] + 1
    with sync_guard() as report:
        _read_back(t)
    assert report.count == 1
    assert report.sites[0].line == line
    assert report.sites[0].file == __file__
    assert report.sites[0].function == "_read_back"


@gpu
def test_sync_guard_strict_raises_and_restores():
    before = torch.cuda.get_sync_debug_mode()
    with pytest.raises(SyncError, match="test_syncs.py"):
        with sync_guard(strict=True):
            _read_back(torch.ones((), device="cuda"))
    assert torch.cuda.get_sync_debug_mode() == before


# ----------------------------------------------------------------------------------------------------------
# On CUDA: sync_guard beyond torch's sync debug mode (the wrapped calls)


def _recorded_event():
    event = torch.cuda.Event()
    event.record()
    return event


NEW_CALLS = {
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize(),
    "Event.synchronize": lambda: _recorded_event().synchronize(),
    "Stream.synchronize": lambda: torch.cuda.current_stream().synchronize(),
    "empty_cache": lambda: torch.cuda.empty_cache(),
    PAGEABLE_COPY: lambda: torch.empty(1024).copy_(torch.ones(1024, device="cuda"), non_blocking=True),
}
if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
    NEW_CALLS["torch.accelerator.synchronize"] = lambda: torch.accelerator.synchronize()


def _warm(call):
    call()  # first-call allocations and lazy initialisation happen outside the guard
    torch.cuda.synchronize()


@gpu
@pytest.mark.parametrize("kind", list(NEW_CALLS))
def test_sync_guard_sees_a_call_the_debug_mode_misses(kind):
    call = NEW_CALLS[kind]
    _warm(call)
    with sync_guard() as report:
        call()
    torch.cuda.synchronize()
    # exactly one site: for Stream.synchronize the debug mode's own warning is folded into the wrapped call
    assert [s.kind for s in report.sites] == [kind], report.table()
    site = report.sites[0]
    assert site.file == __file__
    assert site.line == call.__code__.co_firstlineno
    assert site.where == f"tests/test_syncs.py:{site.line}"


@gpu
@pytest.mark.parametrize("kind", list(NEW_CALLS))
def test_sync_guard_strict_raises_for_a_call_the_debug_mode_misses(kind):
    call = NEW_CALLS[kind]
    _warm(call)
    before = torch.cuda.get_sync_debug_mode()
    line = call.__code__.co_firstlineno
    with pytest.raises(SyncError, match=rf"^{re.escape(kind)} at tests/test_syncs.py:{line} "):
        with sync_guard(strict=True):
            call()
    torch.cuda.synchronize()
    assert torch.cuda.get_sync_debug_mode() == before


@gpu
def test_sync_guard_sees_collectives_in_a_one_rank_nccl_group():
    with single_rank_group("nccl"):
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)  # warm: the communicator
        dist.barrier()
        torch.cuda.synchronize()
        calls = {
            "all_reduce": lambda: dist.all_reduce(t),
            "barrier": lambda: dist.barrier(),
            "all_gather_object": lambda: dist.all_gather_object([None], {"a": 1}),
        }
        for name, call in calls.items():
            call()
            torch.cuda.synchronize()
            with sync_guard() as report:
                call()
            torch.cuda.synchronize()
            # one site per call, whatever the call syncs inside (all_gather_object reads sizes back)
            assert [s.kind for s in report.sites] == [f"collective: {name}"], report.table()
            assert (report.sites[0].file, report.sites[0].line) == (__file__, call.__code__.co_firstlineno)
            with pytest.raises(SyncError, match=rf"^collective: {name} at tests/test_syncs.py:\d+ "):
                with sync_guard(strict=True):
                    call()
        out = [torch.zeros(4, device="cuda")]
        with pytest.raises(SyncError, match=r"^collective: all_gather at tests/test_syncs.py:\d+ "):
            with sync_guard(strict=True):
                dist.all_gather(out, t)
        torch.cuda.synchronize()
        assert torch.equal(out[0], torch.zeros(4, device="cuda"))  # the original collective was not called


@gpu
def test_sync_guard_ignores_pinned_and_to_cpu_non_blocking_copies():
    src = torch.ones(1024, device="cuda")
    pinned = torch.empty(1024, pin_memory=True)
    pinned.copy_(src, non_blocking=True)
    src.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    with sync_guard() as report:
        pinned.copy_(src, non_blocking=True)
        out = src.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    assert PAGEABLE_COPY not in report.by_kind(), report.table()
    assert out.is_pinned()  # _to_copy allocates a pinned output for a non_blocking CUDA-to-CPU copy


@gpu
def test_torch_debug_mode_alone_misses_device_and_event_synchronize():
    # the gap that the wrappers fill: c10::cuda::device_synchronize and CUDAEvent::synchronize have no
    # warn_or_error_on_sync check, stream_synchronize (behind .item() and Stream.synchronize) has
    x = torch.ones((), device="cuda")
    event = _recorded_event()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.synchronize()
            event.synchronize()
            missed = [str(w.message) for w in caught]
            x.item()
            torch.cuda.current_stream().synchronize()
            flagged = [str(w.message) for w in caught][len(missed):]
        torch.cuda.set_sync_debug_mode("error")
        torch.cuda.synchronize()  # no error in error mode either
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert not [m for m in missed if "synchroniz" in m.lower()], missed
    assert len([m for m in flagged if "synchroniz" in m.lower()]) == 2, flagged


@gpu
def test_sync_guard_still_sees_item_once_as_debug_mode():
    t = torch.ones((), device="cuda")
    with sync_guard() as report:
        _read_back(t)
        torch.cuda.synchronize(); line = _here()  # noqa: E702
    assert [s.kind for s in report.sites] == [DEBUG_MODE, "torch.cuda.synchronize"], report.table()
    assert report.sites[0].function == "_read_back"
    assert report.sites[1].line == line
    assert report.table().splitlines()[1].endswith("  [torch.cuda.synchronize]")


@gpu
def test_nested_sync_guards_restore_the_outer_guard():
    original = torch.cuda.synchronize
    with sync_guard() as outer:
        torch.cuda.synchronize()
        with sync_guard(strict=True) as inner:
            with pytest.raises(SyncError, match="torch.cuda.synchronize at tests/test_syncs.py"):
                torch.cuda.synchronize()
        assert torch.cuda.get_sync_debug_mode() == 1  # "warn", the outer guard's mode
        torch.cuda.synchronize()
    assert torch.cuda.synchronize is original
    assert (outer.count, inner.count) == (2, 1)


@gpu
def test_sync_guard_restores_the_wrapped_calls_when_the_body_raises():
    originals = (torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.empty_cache, torch.Tensor.copy_)
    with pytest.raises(KeyError):
        with sync_guard():
            raise KeyError("body")
    assert (torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.empty_cache,
            torch.Tensor.copy_) == originals


@gpu
def test_blocking_copy_under_the_copy_wrapper_points_at_the_caller():
    # copy_ is wrapped while the guard is on; the debug mode's warning for a blocking D2H copy still names
    # the line that called copy_, not the wrapper
    src = torch.ones(4, device="cuda")
    dst = torch.empty(4)
    dst.copy_(src)
    with sync_guard() as report:
        dst.copy_(src); line = _here()  # noqa: E702
    assert [(s.kind, s.file, s.line) for s in report.sites] == [(DEBUG_MODE, __file__, line)], report.table()
    with pytest.raises(SyncError, match=r"synchronizing CUDA call at tests/test_syncs.py:\d+"):
        with sync_guard(strict=True):
            dst.copy_(src)


def test_sync_site_caller_is_the_innermost_user_frame():
    # Several user frames around library frames: the caller is the user frame nearest to the sync, not the
    # script's entry point. Fails if caller walks the stack from the outermost end.
    stack = (
        ("<frozen runpy>", 88, "_run_code"),
        ("/home/u/proj/run.py", 3, "<module>"),
        ("/home/u/proj/book/loop.py", 40, "train_epoch"),
        ("/x/site-packages/torch/nn/modules/module.py", 1750, "_call_impl"),
        ("/home/u/proj/book/metrics_user.py", 17, "update_metrics"),
        ("/x/site-packages/torchmetrics/metric.py", 500, "wrapped_func"),
        ("/work/main/mentor/syncs.py", 330, "wrapper"),
        ("/x/site-packages/torchmetrics/aggregation.py", 93, "_cast_and_nan_check_input"),
    )
    site = SyncSite("/x/site-packages/torchmetrics/aggregation.py", 93, "_cast_and_nan_check_input", stack)
    assert site.kind == "debug mode"
    assert site.where == "torchmetrics/aggregation.py:93"
    assert site.caller == "book/metrics_user.py:17"
