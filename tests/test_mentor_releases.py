"""mentor.releases: the case list, the child process that imports another torchmetrics, and the table."""

import inspect
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torchmetrics
import torchmetrics.classification
from torchmetrics import MeanMetric

import mentor.profiling
import mentor.suite
from mentor import metrics, releases
from mentor.releases import CASES, ReleaseSyncs, measure, old_release_site, release_syncs, release_table


def test_measure_builds_every_case_on_the_installed_release_and_counts_nothing_without_cuda():
    r = measure("cpu", batch_size=4, num_classes=5, calls=2)
    assert r.errors == {}
    assert r.syncs == r.stream_syncs == {name: None for name in CASES}
    assert (r.device, r.calls) == ("cpu", 2)
    import torchmetrics
    assert r.version == torchmetrics.__version__


def test_measure_records_a_case_the_release_cannot_build(monkeypatch):
    def lacks_option(x, device, c):
        raise TypeError("unexpected keyword 'fancy'\nsecond line")
    monkeypatch.setattr(releases, "CASES", {"fancy": lacks_option, **CASES})
    r = measure("cpu", batch_size=4, num_classes=5, calls=1)
    assert r.errors == {"fancy": "TypeError: unexpected keyword 'fancy'"}
    assert "fancy" not in r.syncs and len(r.syncs) == len(CASES)


@pytest.mark.parametrize("calls", [0, -1, 1.5, True])
def test_measure_refuses_a_bad_number_of_calls(calls):
    with pytest.raises(ValueError, match=f"calls must be an int >= 1, got {calls!r}"):
        measure("cpu", calls=calls)


@pytest.mark.subprocess
def test_the_child_imports_the_old_release_from_its_site_and_reports_what_it_lacks():
    site = old_release_site()
    assert site is not None, "make test installs torchmetrics 1.6.1 into .venv/torchmetrics-1.6.1 (make old-torchmetrics)"
    old = release_syncs(site, "cpu", batch_size=4, num_classes=5, calls=1)
    new = release_syncs(None, "cpu", batch_size=4, num_classes=5, calls=1)
    assert old.version == "1.6.1" and Path(old.location) == site.resolve() / "torchmetrics"
    assert new.version != "1.6.1" and not new.location.startswith(str(site.resolve()))
    assert list(old.errors) == ["MeanMetric, disable"]
    assert "nan_strategy" in old.errors["MeanMetric, disable"] and "disable" in old.errors["MeanMetric, disable"]
    assert new.errors == {}
    table = release_table([old, new]).splitlines()
    assert table[0].split() == ["update", "1.6.1", new.version]
    assert [line.split()[-2:] for line in table[1:]] == [["-", "n/a"] if "disable" in line else ["n/a", "n/a"]
                                                         for line in table[1:]]


def test_release_syncs_names_a_site_without_torchmetrics(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"site={str(tmp_path)!r} holds no torchmetrics package"):
        release_syncs(tmp_path)


def test_old_release_site_reads_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(releases.SITE_VARIABLE, str(tmp_path))
    assert old_release_site() is None
    (tmp_path / "torchmetrics").mkdir()
    (tmp_path / "torchmetrics" / "__init__.py").write_text("")
    assert old_release_site() == tmp_path


def test_release_table_orders_rows_as_the_cases_and_marks_what_is_missing():
    a = ReleaseSyncs("1.6.1", "", "cuda:0", 3, syncs={"naive set": 8, "MeanMetric(loss)": 3, "zzz": 1},
                     errors={"MeanMetric, disable": "ValueError: no"})
    b = ReleaseSyncs("1.9.0", "", "cuda:0", 3, syncs={"MeanMetric, disable": 0, "naive set": 2,
                                                      "MeanMetric(loss)": None})
    assert release_table([a, b], width=30).splitlines() == [
        "update                 1.6.1  1.9.0",
        "MeanMetric(loss)           3    n/a",
        "MeanMetric, disable        -      0",
        "naive set                  8      2",
        "zzz                        1      -",
    ]
    with pytest.raises(ValueError, match="at least one ReleaseSyncs"):
        release_table([])
    a.stream_syncs, b.stream_syncs = {"naive set": 4}, {"naive set": 2, "MeanMetric, disable": 1}
    assert release_table([a, b], width=30, probe="trace").splitlines()[2:4] == [
        "MeanMetric, disable        -      1",
        "naive set                  4      2",
    ]
    with pytest.raises(ValueError, match="probe must be 'guard' or 'trace', got 'both'"):
        release_table([a, b], probe="both")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_syncs_per_update_on_the_installed_release_match_the_update_cost_table():
    import torchmetrics
    if torchmetrics.__version__ != "1.9.0":
        pytest.skip(f"the pinned counts are torchmetrics 1.9.0's, this is {torchmetrics.__version__}")
    r = measure("cuda", calls=3)
    assert r.errors == {}
    expected = {"MeanMetric(loss)": 2, "MeanMetric, w=1.0": 3, "MeanMetric, w=tensor": 2, "MeanMetric, disable": 0,
                "NoNanCheckMeanMetric": 0, "Accuracy (micro)": 0, "Precision, ignore_idx": 2,
                "Precision (macro)": 2, "ScatterPrecision": 0, "naive set": 2, "optimized set": 0, "macro set": 8,
                "FusedMetrics": 0}
    assert {k: r.syncs[k] for k in expected} == expected
    # each sync the guard sees here is a read of one value (cudaStreamSynchronize) or a pageable copy (also one)
    assert {k: r.stream_syncs[k] for k in expected} == expected
    assert sum(r.sites["macro set"].values()) == 8


@pytest.mark.parametrize("where, shown", [
    ("/tmp/tm161/torchmetrics/aggregation.py:563", "torchmetrics/aggregation.py:563"),
    ("torchmetrics/aggregation.py:93", "torchmetrics/aggregation.py:93"),
    ("/a/torchmetrics/b/torchmetrics/functional/x.py:1", "torchmetrics/functional/x.py:1"),
    ("mentor/metrics.py:12", "mentor/metrics.py:12"),
])
def test_sites_are_shown_from_the_package_down(where, shown):
    assert releases._in_package(where) == shown


# The builders are called here at test time (not through CASES, whose entries were made at import), with
# hand-made inputs: three classes, predictions 0, 1, 2, 2 (argmax of the logits) for labels 0, 1, 1, 2.
# Micro accuracy and precision are 3/4. Per class, precision is 1, 1, 1/2 (macro 5/6), recall 1, 1/2, 1
# (macro 5/6) and F1 1, 2/3, 2/3 (macro 7/9). With the first label padded to -100 and ignored, the
# predictions 1, 2, 2 for labels 1, 1, 2 have micro precision 2/3.
# Each builder is also called with the meta device (no update there): its metric must end up on that device.
CPU, META = torch.device("cpu"), torch.device("meta")


def _hand_inputs() -> dict[str, torch.Tensor]:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [0.0, 1.0, 2.0]])
    return {"logits": logits, "target": torch.tensor([0, 1, 1, 2]), "padded": torch.tensor([-100, 1, 1, 2]),
            "loss": torch.tensor(0.25)}


def _recording(make: Any, made: list[Any]) -> Any:
    """``make`` that also appends ``(args, kwargs, what it returned)`` to ``made``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        made.append((args, kwargs, make(*args, **kwargs)))
        return made[-1][2]
    return call


def _spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Any]:
    made: list[Any] = []
    monkeypatch.setattr(owner, name, _recording(getattr(owner, name), made))
    return made


class _RecordedMean(MeanMetric):
    """MeanMetric that keeps its instances and the arguments of each update (suppress_nan_check can derive from it)."""

    made: list["_RecordedMean"] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        _RecordedMean.made.append(self)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))
        super().update(*args, **kwargs)


@pytest.fixture
def recorded_mean(monkeypatch: pytest.MonkeyPatch) -> list[_RecordedMean]:
    _RecordedMean.made.clear()
    monkeypatch.setattr(torchmetrics, "MeanMetric", _RecordedMean)
    return _RecordedMean.made


@pytest.mark.parametrize("options", [{}, {"weight": 1.0}, {"weight": "tensor"},
                                     {"nan_strategy": "disable", "weight": "tensor"}])
def test_mean_cases_pass_the_loss_with_the_weight_they_name(recorded_mean: list[_RecordedMean],
                                                            options: dict[str, Any]) -> None:
    """No weight argument, the float 1.0, or ``torch.ones_like(loss)``; the other options go to MeanMetric."""
    x = _hand_inputs()
    releases._mean(**options)(x, CPU, 3)()
    [m] = recorded_mean
    assert m.nan_strategy == options.get("nan_strategy", "warn")
    [(args, kwargs)] = m.calls
    assert len(args) == 1 and args[0] is x["loss"]
    assert list(kwargs) == (["weight"] if "weight" in options else [])
    if options.get("weight") == 1.0:
        assert type(kwargs["weight"]) is float and kwargs["weight"] == 1.0
    elif "weight" in options:
        assert isinstance(kwargs["weight"], torch.Tensor) and torch.equal(kwargs["weight"], torch.ones(()))
    assert float(m.compute()) == 0.25
    releases._mean(**options)(x, META, 3)
    assert recorded_mean[-1].device == META


def test_no_nan_check_case_passes_a_tensor_weight_of_ones(recorded_mean: list[_RecordedMean]) -> None:
    x = _hand_inputs()
    releases._no_nan_check(x, CPU, 3)()
    [m] = recorded_mean
    assert type(m).__name__ == "NoNanCheck_RecordedMean"
    [(args, kwargs)] = m.calls
    assert len(args) == 1 and args[0] is x["loss"] and list(kwargs) == ["weight"]
    assert isinstance(kwargs["weight"], torch.Tensor) and torch.equal(kwargs["weight"], torch.ones(()))
    assert float(m.compute()) == 0.25
    releases._no_nan_check(x, META, 3)
    assert recorded_mean[-1].device == META


@pytest.mark.parametrize("name, options, average, ignore_index, value", [
    ("Accuracy", {}, "micro", None, 3 / 4),
    ("Precision", {}, "micro", None, 3 / 4),
    ("Precision", {"target": "padded", "ignore_index": -100}, "micro", -100, 2 / 3),
    ("Precision", {"average": "macro"}, "macro", None, 5 / 6),
])
def test_classifier_cases_update_a_multiclass_metric_with_the_logits_and_labels(
        monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, Any], average: str,
        ignore_index: int | None, value: float) -> None:
    made = _spy(monkeypatch, torchmetrics, name)
    releases._classifier(name, **options)(_hand_inputs(), CPU, 3)()
    [(_, _, m)] = made
    assert type(m).__name__ == f"Multiclass{name}"
    assert (m.num_classes, m.average, m.ignore_index) == (3, average, ignore_index)
    assert float(m.compute()) == pytest.approx(value)
    releases._classifier(name, **options)(_hand_inputs(), META, 3)
    assert made[-1][2].device == META


def test_scatter_case_updates_a_scatter_macro_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = metrics.scatter_stat_scores
    monkeypatch.setattr(metrics, "scatter_stat_scores", lambda cls: _recording(real(cls), made))
    releases._scatter(_hand_inputs(), CPU, 3)()
    [(_, _, m)] = made
    assert type(m).__name__ == "ScatterMulticlassPrecision" and (m.num_classes, m.average) == (3, "macro")
    assert float(m.compute()) == pytest.approx(5 / 6)
    releases._scatter(_hand_inputs(), META, 3)
    assert made[-1][2].device == META


@pytest.mark.parametrize("variant, scores", [
    ("naive", {"accuracy": 3 / 4, "f1_score": 3 / 4, "precision": 3 / 4, "recall": 3 / 4}),
    ("optimized", {"accuracy": 3 / 4, "f1_score": 3 / 4, "precision": 3 / 4, "recall": 3 / 4}),
    ("macro", {"accuracy": 5 / 6, "f1_score": 7 / 9, "precision": 5 / 6, "recall": 5 / 6}),
])
def test_set_cases_update_the_named_metric_set_on_the_device(monkeypatch: pytest.MonkeyPatch, variant: str,
                                                             scores: dict[str, float]) -> None:
    signature = inspect.signature(metrics.metric_set)
    made = _spy(monkeypatch, metrics, "metric_set")
    releases._set(variant)(_hand_inputs(), CPU, 3)()
    [(args, kwargs, s)] = made
    assert signature.bind(*args, **kwargs).arguments == {"variant": variant, "num_classes": 3, "device": CPU}
    assert s.read() == pytest.approx({"loss": 0.25, **scores})
    releases._set(variant)(_hand_inputs(), META, 3)
    assert signature.bind(*made[-1][0], **made[-1][1]).arguments["device"] == META


def test_suite_case_updates_fused_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _spy(monkeypatch, mentor.suite, "FusedMetrics")
    releases._suite(_hand_inputs(), CPU, 3)()
    [(_, _, s)] = made
    assert s.num_classes == 3
    values = {k: float(v) for k, v in s.compute().items()}
    assert {k: values[k] for k in ("loss", "accuracy_micro", "precision_macro", "f1_macro")} == pytest.approx(
        {"loss": 0.25, "accuracy_micro": 3 / 4, "precision_macro": 5 / 6, "f1_macro": 7 / 9})
    releases._suite(_hand_inputs(), META, 3)
    assert made[-1][2].device == META


def test_inputs_come_from_the_seed_alone_with_every_eighth_label_padded() -> None:
    """logits, target (labels 0..c-1) and loss are drawn in that order from a generator seeded with ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)  # the global generator must not matter
        x = releases._inputs(CPU, 17, 5, seed=7)
    gen = torch.Generator().manual_seed(7)
    assert torch.equal(x["logits"], torch.randn(17, 5, generator=gen))
    assert torch.equal(x["target"], torch.randint(0, 5, (17,), generator=gen))
    assert torch.equal(x["loss"], torch.rand((), generator=gen))
    assert torch.equal(x["padded"], torch.where(torch.arange(17) % 8 == 0, -100, x["target"]))
    assert x["padded"].tolist().count(-100) == 3  # rows 0, 8, 16
    assert {k: v.device for k, v in releases._inputs(META, 4, 3, seed=0).items()} == dict.fromkeys(x, META)


def test_measure_defaults_and_calls_each_update_once_unwatched_then_calls_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults: cpu, 32 x 1000 inputs of seed 0, 3 counted calls after the unwatched one; the import's location."""
    seen: list[Any] = []

    def probe(x: dict[str, torch.Tensor], device: torch.device, c: int) -> Any:
        seen.append((x, device, c))
        return lambda: seen.append("update")
    monkeypatch.setattr(releases, "CASES", {"probe": probe})
    r = measure()
    (x, device, c), *updates = seen
    assert (device, c, updates) == (CPU, 1000, ["update"] * 4)
    expected = releases._inputs(CPU, 32, 1000, 0)
    assert x["logits"].shape == (32, 1000) and all(torch.equal(x[k], expected[k]) for k in expected)
    assert (r.version, r.device, r.calls) == (torchmetrics.__version__, "cpu", 3)
    assert r.location == str(Path(torchmetrics.__file__).parent)
    assert (r.syncs, r.stream_syncs, r.errors, r.sites) == ({"probe": None}, {"probe": None}, {}, {})


def test_measure_builds_the_inputs_and_the_cases_on_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(releases, "CASES", {"probe": lambda x, device, c: seen.append((x, device)) or (lambda: None)})
    assert measure("meta", batch_size=4, num_classes=5, calls=1).syncs == {"probe": None}
    [(x, device)] = seen
    assert device == META and {v.device for v in x.values()} == {META}


def test_measure_records_an_error_without_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception with an empty message is recorded as its type and ``": "``, not a crash of the child."""
    def bare(x: Any, device: torch.device, c: int) -> Any:
        raise RuntimeError()
    monkeypatch.setattr(releases, "CASES", {"bare": bare})
    r = measure("cpu", batch_size=4, num_classes=5, calls=1)
    assert (r.errors, r.syncs) == ({"bare": "RuntimeError: "}, {})


def test_measure_counts_syncs_per_update_where_the_device_is_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counting path without a GPU: the inputs, the case, count_syncs and the trace probe are stand-ins.

    Each update makes two syncs (one in a torchmetrics release under --target, one in mentor) and the
    trace probe sees 5 per update, so 3 calls give 6 and 15."""
    log: list[str] = []

    def count_syncs(fn: Any) -> SimpleNamespace:
        start = len(log)
        fn()
        return SimpleNamespace(count=len(log) - start, by_line=lambda: Counter(log[start:]))
    monkeypatch.setattr(releases, "_inputs", lambda device, *args: _hand_inputs())
    monkeypatch.setattr(releases, "CASES", {"probe": lambda x, device, c: lambda: log.extend(
        ["/opt/tm161/torchmetrics/aggregation.py:563", "mentor/metrics.py:98"])})
    monkeypatch.setattr(mentor.profiling, "count_syncs", count_syncs)
    monkeypatch.setattr(releases, "_stream_syncs", lambda update, calls: 5 * calls)
    r = measure("cuda", calls=3)
    assert (r.device, r.errors, r.syncs, r.stream_syncs) == ("cuda", {}, {"probe": 2}, {"probe": 5})
    assert r.sites == {"probe": {"torchmetrics/aggregation.py:563": 1, "mentor/metrics.py:98": 1}}
    assert len(log) == 2 * (1 + 3)  # once unwatched, then 3 counted


def test_old_release_site_defaults_to_the_repository_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset or empty ``$MENTOR_OLD_TORCHMETRICS``: ``<repo>/.venv/torchmetrics-1.6.1``, the repo above mentor/."""
    root = tmp_path.resolve()
    monkeypatch.setattr(releases, "__file__", str(root / "mentor" / "releases.py"))
    monkeypatch.delenv(releases.SITE_VARIABLE, raising=False)
    assert old_release_site() is None
    site = root / ".venv" / "torchmetrics-1.6.1"
    (site / "torchmetrics").mkdir(parents=True)
    (site / "torchmetrics" / "__init__.py").write_text("")
    assert old_release_site() == site
    monkeypatch.setenv(releases.SITE_VARIABLE, "")
    assert old_release_site() == site


def test_release_syncs_puts_the_site_then_the_repository_first_on_the_childs_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's command line, timeout and PYTHONPATH (empty entries dropped), and its last stdout line read back."""
    site = tmp_path / "tm161"
    (site / "torchmetrics").mkdir(parents=True)
    (site / "torchmetrics" / "__init__.py").write_text("")
    sent = ReleaseSyncs("1.6.1", "/x/torchmetrics", "cpu", 1, syncs={"x": None}, errors={"y": "TypeError: no"})
    runs: list[Any] = []

    def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        runs.append((args, kwargs))
        return subprocess.CompletedProcess(args, 0, stdout="a warning\n" + json.dumps(sent.__dict__) + "\n", stderr="")
    monkeypatch.setattr(releases.subprocess, "run", run)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/p/one", "", "/p/two", ""]))
    root = str(Path(releases.__file__).resolve().parent.parent)
    assert release_syncs(site, batch_size=4, num_classes=5) == sent
    [(args, kwargs)] = runs
    assert args == [sys.executable, "-m", "mentor.releases", "--device", "cpu", "--batch-size=4", "--num-classes=5"]
    assert (kwargs["timeout"], kwargs["capture_output"], kwargs["text"]) == (600.0, True, True)
    assert kwargs["env"]["PYTHONPATH"] == os.pathsep.join([str(site.resolve()), root, "/p/one", "/p/two"])
    monkeypatch.delenv("PYTHONPATH")
    release_syncs(None, "cuda", timeout=5)
    assert runs[-1][0][-2:] == ["--device", "cuda"] and runs[-1][1]["timeout"] == 5
    assert runs[-1][1]["env"]["PYTHONPATH"] == root


def test_release_table_fills_the_width_and_needs_a_result() -> None:
    """The name column takes what the 7-character release columns leave of ``width`` (80 by default)."""
    a = ReleaseSyncs("1.6.1", "", "cuda:0", 3, syncs={"x": 2})
    b = ReleaseSyncs("1.9.0", "", "cuda:0", 3, syncs={"x": 0})
    assert [len(line) for line in release_table([a, b]).splitlines()] == [80, 80]
    assert release_table([a, b], width=40).splitlines() == [
        "update" + " " * 20 + "  1.6.1  1.9.0",
        "x" + " " * 25 + "      2      0",
    ]
    assert release_table([ReleaseSyncs("1.9.0", "", "cpu", 1)], width=20) == "update" + " " * 7 + "  1.9.0"
    with pytest.raises(ValueError) as exc:
        release_table([])
    assert str(exc.value) == "release_table needs at least one ReleaseSyncs: pass the results of release_syncs."
