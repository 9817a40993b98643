"""mentor.releases: the case list, the child process that imports another torchmetrics, and the table."""

import os
from pathlib import Path

import pytest
import torch

from mentor import releases
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
