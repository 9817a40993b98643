"""mentor.lab.env: profile selection, Profile.with_ and its checks, needs_cuda, pick_device, environment_report,
chapter_run and the stored runs of the notebooks with their table."""

import dataclasses
import json

import pytest
import torch

from marks import gpu
from mentor.lab import env
from mentor.lab.env import PROFILE_VARIABLE, PROFILES, Profile, environment_report, get_profile, needs_cuda, pick_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="expects a machine without CUDA")


def test_profiles_listed():
    assert set(PROFILES) == {"full", "smoke"}


def test_smoke_profile_runs_on_cpu():
    p = get_profile("smoke")
    assert p.name == "smoke"
    assert p.device == torch.device("cpu")
    assert not p.is_cuda


@no_cuda
def test_default_without_cuda_and_without_variable_is_smoke(monkeypatch):
    monkeypatch.delenv(PROFILE_VARIABLE, raising=False)
    assert get_profile().name == "smoke"


@no_cuda
def test_empty_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv(PROFILE_VARIABLE, "")
    assert get_profile().name == "smoke"


def test_variable_selects_profile(monkeypatch):
    monkeypatch.setenv(PROFILE_VARIABLE, "smoke")
    assert get_profile().name == "smoke"


def test_explicit_name_beats_variable(monkeypatch):
    monkeypatch.setenv(PROFILE_VARIABLE, "bogus")
    assert get_profile("smoke").name == "smoke"


def test_variable_with_unknown_profile_is_rejected(monkeypatch):
    monkeypatch.setenv(PROFILE_VARIABLE, "fast")
    with pytest.raises(ValueError, match=r"Unknown profile 'fast'.*'full', 'smoke'.*MENTOR_PROFILE"):
        get_profile()


@no_cuda
def test_variable_full_without_cuda_is_rejected(monkeypatch):
    monkeypatch.setenv(PROFILE_VARIABLE, "full")
    with pytest.raises(RuntimeError, match=r"get_profile\('smoke'\)|MENTOR_PROFILE=smoke"):
        get_profile()


def test_unknown_profile_name():
    with pytest.raises(ValueError, match=r"Unknown profile 'fast': pass one of \['full', 'smoke'\]"):
        get_profile("fast")


@no_cuda
def test_full_without_cuda_mentions_smoke():
    with pytest.raises(RuntimeError, match="smoke"):
        get_profile("full")


def test_with_changes_fields_and_keeps_the_rest():
    p = get_profile("smoke")
    q = p.with_(steps=p.steps + 7, batch_size=3)
    assert (q.steps, q.batch_size) == (p.steps + 7, 3)
    assert (q.name, q.image_size, q.device, q.rounds) == (p.name, p.image_size, p.device, p.rounds)
    assert p.steps != q.steps  # the original is unchanged (frozen dataclass)


def test_with_rejects_unknown_fields():
    p = get_profile("smoke")
    with pytest.raises(TypeError, match=r"Profile has no field\(s\) \['stepz'\]; fields are .*'steps'"):
        p.with_(stepz=3)


def test_profile_is_frozen():
    p = get_profile("smoke")
    with pytest.raises(Exception):  # dataclasses.FrozenInstanceError
        p.steps = 1  # type: ignore[misc]


def test_needs_cuda_prints_and_returns_true_on_smoke(capsys):
    assert needs_cuda(get_profile("smoke"), "sync counts") is True
    out = capsys.readouterr().out
    assert "sync counts need a CUDA device" in out
    assert out.startswith("[smoke profile on cpu]")


def test_needs_cuda_false_for_a_cuda_profile(capsys):
    # A Profile on a CUDA device can be built without a GPU: needs_cuda only looks at the device.
    p = get_profile("smoke").with_(device=torch.device("cuda"))
    assert needs_cuda(p, "anything") is False
    assert capsys.readouterr().out == ""


def test_needs_cuda_rejects_non_profile():
    with pytest.raises(TypeError, match=r"mentor.lab.env.Profile \(from get_profile\(\)\), not str"):
        needs_cuda("smoke", "x")  # type: ignore[arg-type]


@no_cuda
def test_pick_device():
    assert pick_device() == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")


@no_cuda
def test_pick_device_rejects_cuda_without_gpu():
    with pytest.raises(RuntimeError, match="pass 'cpu' or None"):
        pick_device("cuda")


def test_pick_device_rejects_non_string():
    with pytest.raises(TypeError, match="prefer must be a device string such as 'cuda' or 'cpu', not int"):
        pick_device(0)  # type: ignore[arg-type]


EXPECTED_KEYS = {"date", "python", "platform", "torch", "torchvision", "torchmetrics", "cuda", "gpu",
                 "gpu_count", "driver", "cpu_count"}


@no_cuda
def test_environment_report_keys_and_json():
    report = environment_report()
    assert set(report) == EXPECTED_KEYS
    assert json.loads(json.dumps(report)) == report
    assert report["torch"] == torch.__version__
    assert report["gpu"] is None and report["gpu_count"] == 0 and report["driver"] is None


def test_version_of_missing_package():
    assert env._version("surely-not-an-installed-package-xyz") is None


def test_profile_sizes_are_positive():
    for name in PROFILES:
        sizes = env._SIZES[name]
        assert set(sizes) == {f for f in Profile.__dataclass_fields__ if f not in ("name", "device")}
        assert all(isinstance(v, int) and v > 0 for v in sizes.values()), name


@gpu
def test_default_with_cuda_is_full_on_the_gpu(monkeypatch):
    monkeypatch.delenv(PROFILE_VARIABLE, raising=False)
    p = get_profile()
    assert (p.name, p.device.type, p.batch_size, p.image_size) == ("full", "cuda", 128, 224)
    assert pick_device() == torch.device("cuda")


@gpu
def test_environment_report_names_the_gpu():
    report = environment_report()
    assert report["gpu"] == torch.cuda.get_device_name() and report["gpu_count"] == torch.cuda.device_count()
    assert report["driver"]


def test_chapter_run_glues_the_hardware_and_the_seconds(monkeypatch):
    import myst_nb

    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: glued.update({name: (value, display)}))
    monkeypatch.delenv(PROFILE_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    clock = iter([100.0, 162.4])
    monkeypatch.setattr(env.time, "perf_counter", lambda: next(clock))
    run = env.chapter_run()
    assert glued == {"run_hardware": ("the CPU (smoke profile, not a measurement)", False)}
    assert run.started == 100.0
    assert run.finish() == pytest.approx(62.4)
    assert glued["run_seconds"] == (62, False)


def test_chapter_run_names_the_gpu(monkeypatch):
    import myst_nb

    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: glued.update({name: value}))
    full_on_cuda = dataclasses.replace(get_profile("smoke"), name="full", device=torch.device("cuda", 0))
    monkeypatch.setattr(env, "get_profile", lambda: full_on_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    env.chapter_run()
    assert glued["run_hardware"] == "one NVIDIA H200 (full profile)"


@pytest.mark.parametrize("name", ["smoke", "a profile name, with spaces and commas, longer than the others"])
def test_profile_repr_wraps_at_80_columns_and_evaluates_back(name):
    profile = get_profile("smoke").with_(name=name, device=torch.device("cuda"), batch_size=128, num_classes=1000)
    text = repr(profile)
    assert max(map(len, text.splitlines())) <= 80 and len(text.splitlines()) >= 2, text
    assert eval(text, {"Profile": Profile, "device": torch.device}) == profile


def _notebook(path, mentor=None):
    meta = {} if mentor is None else {"mentor": mentor}
    path.write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))


def test_stored_runs_reads_each_notebooks_metadata_and_tabulates_it(tmp_path):
    from mentor.lab.env import StoredRun, stored_runs, stored_runs_table

    h200 = {"gpu": "NVIDIA H200", "torch": "2.11.0", "torchmetrics": "1.9.0", "driver": "580"}
    _notebook(tmp_path / "b.ipynb", {"executed": "2026-11-30T23:38:15+00:00", "duration_s": 43.04,
                                     "mentor_sha256": "0123456789abcdef", "provenance": h200})
    _notebook(tmp_path / "a.ipynb", {"executed": "2026-11-30T23:37:04+00:00", "duration_s": 70.46,
                                     "mentor_sha256": "fedcba9876543210", "provenance": {"torch": "2.9.0"}})
    _notebook(tmp_path / "c.ipynb")
    _notebook(tmp_path / "reproducibility.ipynb")
    runs = stored_runs(tmp_path, skip=("reproducibility.ipynb",))
    assert runs == [
        StoredRun("a.ipynb", "2026-11-30T23:37:04+00:00", 70.46, "fedcba9876543210", {"torch": "2.9.0"}),
        StoredRun("b.ipynb", "2026-11-30T23:38:15+00:00", 43.04, "0123456789abcdef", h200),
        StoredRun("c.ipynb", None, None, None, {}),
    ]
    assert stored_runs_table(runs).splitlines() == [
        "notebook                   executed (UTC)    seconds  mentor",
        "a.ipynb                    2026-11-30 23:37     70.5  fedcba987654",
        "b.ipynb                    2026-11-30 23:38     43.0  0123456789ab",
        "c.ipynb                    not executed by make gpu-run",
        "a.ipynb: CPU, torch 2.9.0, torchmetrics None",
        "b.ipynb: NVIDIA H200, torch 2.11.0, torchmetrics 1.9.0",
    ]
    same = [runs[1], StoredRun("d.ipynb", "2026-11-30T23:39:00+00:00", 1.0, "0123456789abcdef", h200)]
    assert stored_runs_table(same).splitlines()[-1] == "every run above: NVIDIA H200, torch 2.11.0, torchmetrics 1.9.0"


def test_stored_runs_names_a_file_that_is_not_a_notebook(tmp_path):
    from mentor.lab.env import stored_runs

    (tmp_path / "broken.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match=r"broken.ipynb is not a notebook \(JSON with a metadata object\)"):
        stored_runs(tmp_path)


def test_chapter_run_asks_for_the_name_of_the_profiles_gpu_and_keeps_the_hardware(monkeypatch):
    """The name is that of the profile's device (cuda:1 here), not the current one; the run keeps the same text."""
    import myst_nb

    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: glued.update({name: value}))
    on_second_gpu = dataclasses.replace(get_profile("smoke"), name="full", device=torch.device("cuda", 1))
    monkeypatch.setattr(env, "get_profile", lambda: on_second_gpu)
    asked = []
    names = {None: "NVIDIA A100 (current device)", torch.device("cuda", 1): "NVIDIA H200"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or names[device])
    monkeypatch.setattr(env.time, "perf_counter", lambda: 7.5)
    run = env.chapter_run()
    assert asked == [torch.device("cuda", 1)]
    assert glued == {"run_hardware": "one NVIDIA H200 (full profile)"}
    assert run == env.ChapterRun("one NVIDIA H200 (full profile)", 7.5)


def test_chapter_run_on_the_cpu_keeps_the_hardware_it_glued(monkeypatch):
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: None)
    monkeypatch.delenv(PROFILE_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert env.chapter_run().hardware == "the CPU (smoke profile, not a measurement)"


# --- the CUDA branches with a faked torch.cuda, whole messages, the stored-runs table's edge rows, the repr ---


def test_environment_report_with_cuda_names_device_0_and_counts_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(env, "_driver_version", lambda: "580.95.05")
    report = environment_report()
    assert (report["gpu"], report["gpu_count"], report["driver"]) == ("NVIDIA H200", 2, "580.95.05")
    assert asked == [0]  # the first GPU names the machine


def test_full_profile_with_cuda_is_the_articles_sizes_on_the_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    p = get_profile("full")
    assert (p.name, p.device) == ("full", torch.device("cuda"))
    assert (p.image_size, p.batch_size, p.num_classes, p.warmup, p.steps, p.rounds, p.report_every) == (
        224, 128, 1000, 10, 60, 5, 50)


def test_pick_device_defaults_to_cuda_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == torch.device("cuda")
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device("cpu") == torch.device("cpu")  # an explicit preference wins


def test_pick_device_cuda_without_gpu_whole_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as raised:
        pick_device("cuda")
    assert str(raised.value) == "prefer='cuda' was asked for but torch sees no CUDA device; pass 'cpu' or None."


def test_chapter_run_seconds_uses_the_given_now_else_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env.time, "perf_counter", lambda: 1000.0)
    run = env.ChapterRun("the CPU", started=100.0)
    assert run.seconds(now=162.5) == 62.5
    assert run.seconds() == 900.0


def test_stored_runs_defaults_to_the_current_folder(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mentor.lab.env import StoredRun, stored_runs

    _notebook(tmp_path / "a.ipynb")
    monkeypatch.chdir(tmp_path)
    assert stored_runs() == [StoredRun("a.ipynb", None, None, None, {})]


def test_stored_runs_skips_only_the_named_notebooks_wherever_they_sort(tmp_path) -> None:
    from mentor.lab.env import stored_runs

    for name in ("a.ipynb", "b.ipynb", "c.ipynb"):
        _notebook(tmp_path / name)
    assert [run.notebook for run in stored_runs(tmp_path, skip=("a.ipynb",))] == ["b.ipynb", "c.ipynb"]


def test_stored_runs_a_notebook_without_metadata_has_no_stored_run(tmp_path) -> None:
    from mentor.lab.env import StoredRun, stored_runs

    (tmp_path / "bare.ipynb").write_text(json.dumps({"cells": [], "nbformat": 4, "nbformat_minor": 5}))
    assert stored_runs(tmp_path) == [StoredRun("bare.ipynb", None, None, None, {})]


def test_stored_runs_reads_utf8_notebooks_even_in_the_c_locale(tmp_path) -> None:
    """Jupyter writes notebooks as UTF-8 with non-ASCII text as is; the C locale would read them as ASCII."""
    import locale

    from mentor.lab.env import stored_runs

    meta = {"executed": "2026-11-30T23:37:04+00:00", "provenance": {"gpu": "GPU µ", "torch": "2.11.0"}}
    text = json.dumps({"cells": [], "metadata": {"mentor": meta}}, ensure_ascii=False)
    (tmp_path / "a.ipynb").write_bytes(text.encode("utf-8"))
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        runs = stored_runs(tmp_path)
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
    assert runs[0].provenance == {"gpu": "GPU µ", "torch": "2.11.0"}


def test_stored_runs_table_rows_without_seconds_or_hash_and_machines_shared_by_some_runs() -> None:
    from mentor.lab.env import StoredRun, stored_runs_table

    h200 = {"gpu": "NVIDIA H200", "torch": "2.11.0", "torchmetrics": "1.9.0"}
    runs = [
        StoredRun("a.ipynb", None, None, None, {}),
        StoredRun("b.ipynb", "2026-11-30T23:38:15+00:00", None, None, h200),
        StoredRun("c.ipynb", "2026-12-01T01:02:03+00:00", 5.0, "abc", h200),
        StoredRun("d.ipynb", "2026-12-01T04:05:06+00:00", 12.34, "0123456789abcdef0", {"torch": "2.9.0",
                                                                                        "torchmetrics": "1.8.0"}),
    ]
    assert stored_runs_table(runs).splitlines() == [
        "notebook                   executed (UTC)    seconds  mentor",
        "a.ipynb                    not executed by make gpu-run",
        "b.ipynb                    2026-11-30 23:38        -  -",
        "c.ipynb                    2026-12-01 01:02      5.0  abc",
        "d.ipynb                    2026-12-01 04:05     12.3  0123456789ab",
        "b.ipynb, c.ipynb: NVIDIA H200, torch 2.11.0, torchmetrics 1.9.0",
        "d.ipynb: CPU, torch 2.9.0, torchmetrics 1.8.0",
    ]
    # one run alone is named, not "every run above"
    assert stored_runs_table(runs[2:3]).splitlines()[-1] == "c.ipynb: NVIDIA H200, torch 2.11.0, torchmetrics 1.9.0"


@pytest.mark.parametrize("name, expected", [
    # 77 columns, and num_classes would make 95: it starts the second line under the first field
    ("smoke", "Profile(name='smoke', device=device(type='cpu'), image_size=32, batch_size=8,\n"
              "        num_classes=1000, warmup=1, steps=3, rounds=2, report_every=2)"),
    # an 8-letter name: batch_size ends the first line at exactly 80 columns and stays there
    ("abcdefgh", "Profile(name='abcdefgh', device=device(type='cpu'), image_size=32, batch_size=8,\n"
                 "        num_classes=1000, warmup=1, steps=3, rounds=2, report_every=2)"),
    # a 9-letter name: batch_size would end at 81, so it moves down; report_every would end at 84
    ("abcdefghi", "Profile(name='abcdefghi', device=device(type='cpu'), image_size=32,\n"
                  "        batch_size=8, num_classes=1000, warmup=1, steps=3, rounds=2,\n"
                  "        report_every=2)"),
    # a name longer than a line stays on the first line, after "Profile(" (a field never splits)
    ("x" * 70, "Profile(name='" + "x" * 70 + "',\n"
               "        device=device(type='cpu'), image_size=32, batch_size=8,\n"
               "        num_classes=1000, warmup=1, steps=3, rounds=2, report_every=2)"),
])
def test_profile_repr_is_exact(name: str, expected: str) -> None:
    assert repr(get_profile("smoke").with_(name=name)) == expected


# --- Profile's checks of each field: whole messages that name the field and say what to pass ---


def _with(**changes):
    return lambda: get_profile("smoke").with_(**changes)


ENV_CASES = [
    pytest.param(_with(steps=-1), ValueError,
                 r"Profile\.steps must be an int >= 1, got -1; pass e\.g\. steps=3\.", id="steps-negative"),
    pytest.param(_with(steps=0), ValueError,
                 r"Profile\.steps must be an int >= 1, got 0; pass e\.g\. steps=3\.", id="steps-zero"),
    pytest.param(_with(batch_size=True), ValueError,
                 r"Profile\.batch_size must be an int >= 1, got True; pass e\.g\. batch_size=8\.",
                 id="batch_size-bool"),
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


# --- the stored-runs table sized to the longest notebook name, within 80 columns ---


def test_stored_runs_table_widens_the_notebook_column_to_the_longest_name() -> None:
    """A 30-character name (chapter 10's) gets a 32-column notebook column: two spaces before the date."""
    from mentor.lab.env import StoredRun, stored_runs_table

    h200 = {"gpu": "NVIDIA H200", "torch": "2.11.0", "torchmetrics": "1.9.0"}
    runs = [StoredRun("10_macro_and_collections.ipynb", "2026-11-30T23:37:04+00:00", 70.46, "dfec03ca303d99", h200),
            StoredRun("b.ipynb", None, None, None, {})]
    assert stored_runs_table(runs).splitlines() == [
        "notebook                        executed (UTC)    seconds  mentor",
        "10_macro_and_collections.ipynb  2026-11-30 23:37     70.5  dfec03ca303d",
        "b.ipynb                         not executed by make gpu-run",
        "10_macro_and_collections.ipynb: NVIDIA H200, torch 2.11.0, torchmetrics 1.9.0",
    ]
    assert stored_runs_table([]) == "notebook                   executed (UTC)    seconds  mentor"  # no runs: 27


def test_stored_runs_table_cuts_a_name_too_long_for_80_columns() -> None:
    """A 51-character name would push a row past 80 columns: it is cut to 39 characters ending in "…", the
    column stays 41 wide and the row exactly 80; the machine's line names it whole."""
    from mentor.lab.env import StoredRun, stored_runs_table

    name = "11_a_notebook_name_far_longer_than_the_others.ipynb"
    runs = [StoredRun("a.ipynb", None, None, None, {}),
            StoredRun(name, "2026-12-01T01:02:03+00:00", 5.0, "0123456789abcdef", {"torch": "2.9.0"})]
    lines = stored_runs_table(runs).splitlines()
    assert lines == [
        "notebook                                 executed (UTC)    seconds  mentor",
        "a.ipynb                                  not executed by make gpu-run",
        "11_a_notebook_name_far_longer_than_the…  2026-12-01 01:02      5.0  0123456789ab",
        f"{name}: CPU, torch 2.9.0, torchmetrics None",
    ]
    assert max(len(line) for line in lines[:3]) == 80


def test_stored_runs_table_keeps_a_name_that_just_fits_whole() -> None:
    """39 characters is the longest name that fits: column 41, row 80, nothing cut; 40 characters are cut."""
    from mentor.lab.env import StoredRun, stored_runs_table

    fits, over = "f" * 33 + ".ipynb", "o" * 34 + ".ipynb"
    row = {n: stored_runs_table([StoredRun(n, "2026-12-01T01:02:03+00:00", 5.0, "abc", {})]).splitlines()[1]
           for n in (fits, over)}
    assert row[fits] == fits + "  2026-12-01 01:02      5.0  abc" and len(row[fits]) == 80 - 9
    assert row[over] == "o" * 34 + ".ipy…  2026-12-01 01:02      5.0  abc"


# --- cells marked '# needs CUDA: ...' (skip_without_cuda) and the transformer chapter_run installs ---

_SKIP_SYNC_COUNTS = (
    "print('[smoke profile on cpu] sync counts need a CUDA device: skipped here. The stored book shows the GPU run.')\n"
)


def test_skip_without_cuda_replaces_a_marked_cell_on_the_cpu():
    from mentor.lab.env import skip_without_cuda

    lines = ["\n", "# needs CUDA: sync counts\n", "x = 1 / 0\n"]
    assert skip_without_cuda(lines, get_profile("smoke")) == [_SKIP_SYNC_COUNTS]
    # what it prints is the same line needs_cuda prints
    namespace = {}
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_SKIP_SYNC_COUNTS, namespace)
        needs_cuda(get_profile("smoke"), "sync counts")
    first, second = out.getvalue().splitlines()
    assert first == second


def test_skip_without_cuda_keeps_unmarked_cells_and_every_cell_on_cuda():
    from mentor.lab.env import skip_without_cuda

    plain = ["x = 1\n", "# needs CUDA: not on the first line\n"]
    assert skip_without_cuda(plain, get_profile("smoke")) == plain
    marked = ["# needs CUDA: sync counts\n", "x = 1\n"]
    cuda = get_profile("smoke").with_(device=torch.device("cuda"))
    assert skip_without_cuda(marked, cuda) == marked
    assert skip_without_cuda([], get_profile("smoke")) == []


def test_skip_without_cuda_asks_what_needs_cuda_and_for_a_profile():
    from mentor.lab.env import skip_without_cuda

    with pytest.raises(ValueError, match=r"must say what needs CUDA, e.g. '# needs CUDA: sync counts'"):
        skip_without_cuda(["# needs CUDA:   \n"], get_profile("smoke"))
    with pytest.raises(TypeError, match=r"mentor.lab.env.Profile \(from get_profile\(\)\), not str"):
        skip_without_cuda(["x\n"], "smoke")  # type: ignore[arg-type]


class _Shell:
    def __init__(self):
        self.input_transformers_post = [len]


def test_chapter_run_installs_the_skipper_on_the_cpu_and_finish_removes_it(monkeypatch):
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: None)
    monkeypatch.delenv(PROFILE_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    shell = _Shell()
    monkeypatch.setattr(env, "_ipython", lambda: shell)
    run = env.chapter_run()
    assert shell.input_transformers_post[0] is len and len(shell.input_transformers_post) == 2
    skipper = shell.input_transformers_post[1]
    assert skipper(["# needs CUDA: sync counts\n"]) == [_SKIP_SYNC_COUNTS]
    assert skipper(["x = 1\n"]) == ["x = 1\n"]
    run.finish()
    assert shell.input_transformers_post == [len]
    run.finish()  # a second finish leaves the shell alone
    assert shell.input_transformers_post == [len]


def test_chapter_run_installs_nothing_on_cuda_or_outside_ipython(monkeypatch):
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: None)
    full_on_cuda = dataclasses.replace(get_profile("smoke"), name="full", device=torch.device("cuda", 0))
    monkeypatch.setattr(env, "get_profile", lambda: full_on_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    shell = _Shell()
    monkeypatch.setattr(env, "_ipython", lambda: shell)
    assert env.chapter_run().skipper is None and shell.input_transformers_post == [len]
    monkeypatch.setattr(env, "get_profile", lambda: get_profile("smoke"))
    monkeypatch.setattr(env, "_ipython", lambda: None)
    assert env.chapter_run().skipper is None
