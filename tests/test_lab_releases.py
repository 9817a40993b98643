"""mentor.lab.releases: measure() with the torchmetrics imported here (stand-ins for the CUDA counts), the child
process that imports another torchmetrics, the old release's site and the table; on CUDA (``@gpu``, run with
`pytest -m gpu`): the syncs per update of the installed release. The updates themselves are tested in
test_lab_updates.py."""

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

import mentor.syncs
from marks import gpu
from mentor.lab import releases
from mentor.lab.releases import ReleaseSyncs, measure, old_release_site, release_syncs, release_table
from mentor.lab.updates import UPDATES

REPO = Path(__file__).resolve().parent.parent
CPU, META = torch.device("cpu"), torch.device("meta")


def _hand_inputs() -> dict[str, torch.Tensor]:
    """Three classes, predictions 0, 1, 2, 2 (argmax of the logits) for labels 0, 1, 1, 2; the first one padded."""
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [0.0, 1.0, 2.0]])
    return {"logits": logits, "target": torch.tensor([0, 1, 1, 2]), "padded": torch.tensor([-100, 1, 1, 2]),
            "loss": torch.tensor(0.25)}


def test_measure_records_a_case_the_release_cannot_build(monkeypatch):
    def lacks_option(x, device, c):
        raise TypeError("unexpected keyword 'fancy'\nsecond line")
    monkeypatch.setattr(releases, "UPDATES", {"fancy": lacks_option, **UPDATES})
    r = measure("cpu", batch_size=4, num_classes=5, calls=1)
    assert r.errors == {"fancy": "TypeError: unexpected keyword 'fancy'"}
    assert "fancy" not in r.syncs and list(r.syncs) == list(UPDATES)


@pytest.mark.parametrize("calls", [0, -1, 1.5, True])
def test_measure_refuses_a_bad_number_of_calls(calls):
    with pytest.raises(ValueError, match=f"calls must be an int >= 1, got {calls!r}"):
        measure("cpu", calls=calls)


def test_measure_defaults_and_calls_each_update_once_unwatched_then_calls_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults: cpu, 32 x 1000 inputs of seed 0, 3 counted calls after the unwatched one; the import's location."""
    seen: list[Any] = []

    def probe(x: dict[str, torch.Tensor], device: torch.device, c: int) -> Any:
        seen.append((x, device, c))
        return lambda: seen.append("update")
    monkeypatch.setattr(releases, "UPDATES", {"probe": probe})
    r = measure()
    (x, device, c), *updates = seen
    assert (device, c, updates) == (CPU, 1000, ["update"] * 4)
    expected = releases.update_inputs(CPU, 32, 1000, 0)
    assert x["logits"].shape == (32, 1000) and all(torch.equal(x[k], expected[k]) for k in expected)
    assert (r.version, r.device, r.calls) == (torchmetrics.__version__, "cpu", 3)
    assert r.location == str(Path(torchmetrics.__file__).parent)
    assert (r.syncs, r.stream_syncs, r.errors, r.sites) == ({"probe": None}, {"probe": None}, {}, {})


def test_measure_builds_the_inputs_and_the_cases_on_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(releases, "UPDATES", {"probe": lambda x, device, c: seen.append((x, device)) or (lambda: None)})
    assert measure("meta", batch_size=4, num_classes=5, calls=1).syncs == {"probe": None}
    [(x, device)] = seen
    assert device == META and {v.device for v in x.values()} == {META}


def test_measure_records_an_error_without_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception with an empty message is recorded as its type and ``": "``, not a crash of the child."""
    def bare(x: Any, device: torch.device, c: int) -> Any:
        raise RuntimeError()
    monkeypatch.setattr(releases, "UPDATES", {"bare": bare})
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
    monkeypatch.setattr(releases, "update_inputs", lambda device, *args: _hand_inputs())
    monkeypatch.setattr(releases, "UPDATES", {"probe": lambda x, device, c: lambda: log.extend(
        ["/opt/tm161/torchmetrics/aggregation.py:563", "mentor/lab/metric_sets.py:98"])})
    monkeypatch.setattr(mentor.syncs, "count_syncs", count_syncs)
    monkeypatch.setattr(releases, "_stream_syncs", lambda update, calls: 5 * calls)
    r = measure("cuda", calls=3)
    assert (r.device, r.errors, r.syncs, r.stream_syncs) == ("cuda", {}, {"probe": 2}, {"probe": 5})
    assert r.sites == {"probe": {"torchmetrics/aggregation.py:563": 1, "mentor/lab/metric_sets.py:98": 1}}
    assert len(log) == 2 * (1 + 3)  # once unwatched, then 3 counted


@pytest.mark.parametrize("where, shown", [
    ("/tmp/tm161/torchmetrics/aggregation.py:563", "torchmetrics/aggregation.py:563"),
    ("torchmetrics/aggregation.py:93", "torchmetrics/aggregation.py:93"),
    ("/a/torchmetrics/b/torchmetrics/functional/x.py:1", "torchmetrics/functional/x.py:1"),
    ("mentor/lab/metric_sets.py:12", "mentor/lab/metric_sets.py:12"),
])
def test_sites_are_shown_from_the_package_down(where, shown):
    assert releases._in_package(where) == shown


@pytest.mark.subprocess
def test_the_child_imports_the_old_release_from_its_site_and_reports_what_it_lacks():
    site = old_release_site()
    assert site is not None, ("make test installs torchmetrics 1.6.1 into .venv/torchmetrics-1.6.1 "
                              "(make old-torchmetrics)")
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


def test_old_release_site_defaults_to_the_repository_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset or empty ``$MENTOR_OLD_TORCHMETRICS``: ``<repo>/.venv/torchmetrics-1.6.1``, the repo above mentor/."""
    assert releases.REPO == REPO  # the folder that holds mentor/lab/releases.py's package, not mentor/
    root = tmp_path.resolve()
    monkeypatch.setattr(releases, "REPO", root)
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
    root = str(REPO)  # the repository, whose mentor/ the child imports
    assert release_syncs(site, batch_size=4, num_classes=5) == sent
    [(args, kwargs)] = runs
    assert args == [sys.executable, "-m", "mentor.lab.releases", "--device", "cpu", "--batch-size=4", "--num-classes=5"]
    assert (kwargs["timeout"], kwargs["capture_output"], kwargs["text"]) == (600.0, True, True)
    assert kwargs["env"]["PYTHONPATH"] == os.pathsep.join([str(site.resolve()), root, "/p/one", "/p/two"])
    monkeypatch.delenv("PYTHONPATH")
    release_syncs(None, "cuda", timeout=5)
    assert runs[-1][0][-2:] == ["--device", "cuda"] and runs[-1][1]["timeout"] == 5
    assert runs[-1][1]["env"]["PYTHONPATH"] == root


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


# ----------------------------------------------------------------------------------------------------------
# On CUDA


@gpu
def test_syncs_per_update_on_the_installed_release_match_the_update_cost_table():
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
