"""mentor.lab.bench, the command line ``python -m mentor.lab.bench``: its options, what it passes to compare, what it
prints and writes, and the errors it gives before any run starts."""

import json
import sys

import pytest
import torch

from mentor.lab import bench
from mentor.lab.comparison import Comparison
from mentor.lab.data import device_batches
from mentor.lab.env import get_profile
from mentor.lab.stats import Result
from fakes import expected_orders, FlushRecorder

CUDA = torch.device("cuda")


def result(name, rounds, report_steps=(), syncs=None, report_syncs=None, note=None):
    return Result(name, f"{name} config", [list(r) for r in rounds], list(report_steps), syncs, report_syncs, note)


def comparison(*results, batch_size=4, seed=0):
    return Comparison(list(results), baseline=results[0].name, batch_size=batch_size, settings={"seed": seed})




def cuda_profile():
    """The smoke profile with a CUDA device: only passed on (builders are faked), nothing runs on it."""
    return get_profile("smoke").with_(device=CUDA)




def fake_run(monkeypatch, profile=None):
    """Fake the profile (optional), the setup, the batches and compare of bench.main; returns what they got."""
    import mentor.lab.data

    seen = {}
    if profile is not None:
        monkeypatch.setattr(bench, "get_profile", lambda name=None: seen.setdefault("profile_name", name) and profile)

    def fake_batches(*args, **kwargs):
        seen["batches"] = (args, kwargs)
        return device_batches(2, 32, 10)

    def fake_compare(configs, setup, batches, **kwargs):
        seen["names"] = [c.name for c in configs]
        return Comparison([Result(c.name, "", [[1.0]]) for c in configs], configs[0].name, 2)

    monkeypatch.setattr(mentor.lab.data, "device_batches", fake_batches)
    monkeypatch.setattr(bench, "build_setup", lambda *args, **kwargs: seen.setdefault("setup", (args, kwargs)))
    monkeypatch.setattr(bench, "compare", fake_compare)
    return seen


# ----------------------------------------------------------------------------------------------------------
# a run


def test_cli_smoke_run_writes_json(tmp_path, monkeypatch, capsys):
    # `python -m mentor.lab.bench ...` run as python -m runs it (runpy, as __main__, exit status from sys.exit), in this
    # process: a second interpreter spent most of its time importing torch and torchmetrics again
    import runpy

    out = tmp_path / "bench.json"
    monkeypatch.setattr(sys, "argv", ["python -m mentor.lab.bench", "--profile", "smoke", "--rounds", "2",
                                      "--steps", "1", "--warmup", "0", "--seed", "3", "--json", str(out)])
    monkeypatch.delitem(sys.modules, "mentor.lab.bench")  # runpy warns when the module it runs was imported
    # pytest's assertion rewriter claims mentor's modules (an installed plugin's distribution) but cannot give runpy
    # their code: find the module as python -m does
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "AssertionRewritingHook"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("mentor.lab.bench", run_name="__main__", alter_sys=True)
    stdout, stderr = capsys.readouterr()
    assert exc.value.code == 0, stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["rows"]] == ["no metrics", "naive", "optimized"]
    assert data["settings"]["rounds"] == 2 and data["settings"]["steps"] == 1 and data["settings"]["warmup"] == 0
    assert data["settings"]["seed"] == 3
    assert data["settings"]["orders"] == expected_orders(["no metrics", "naive", "optimized"], 2, 3)
    assert all(len(r["round_step_ms"]) == 2 and len(r["round_step_ms"][0]) == 1 for r in data["results"])
    loaded = Comparison.load_json(out)
    table = loaded.table()
    assert table in stdout  # the printed table is the saved comparison's
    assert all(len(line) <= 80 for line in table.splitlines())
    assert f"wrote {out}" in stdout
    assert "profile smoke on cpu" in stdout


def test_cli_passes_the_seed(monkeypatch, capsys):
    seen = {}

    def fake_compare(configs, setup, batches, **kwargs):
        seen.update(kwargs)
        return comparison(result("base", [[1.0]]), result("x", [[2.0]]))

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda *a, **k: None)
    assert bench.main(["--profile", "smoke", "--seed", "11"]) == 0
    assert seen["seed"] == 11
    assert "+100.0  " in capsys.readouterr().out  # the table shows x at twice the baseline


@pytest.mark.parametrize("argv, expected", [
    ([], None),  # the smoke profile's own values
    (["--steps", "7", "--warmup", "0", "--rounds", "3", "--batch", "3", "--image-size", "40", "--precision", "bf16",
      "--channels-last", "--configs", "no metrics, fused suite,naive"],
     {"steps": 7, "warmup": 0, "rounds": 3, "batch": 3, "image_size": 40, "precision": "bf16", "channels_last": True,
      "names": ["no metrics", "fused suite", "naive"]}),
])
def test_cli_passes_every_setting_and_prints_the_run(monkeypatch, capsys, tmp_path, argv, expected):
    from mentor.lab.env import get_profile

    smoke = get_profile("smoke")
    expected = {"steps": smoke.steps, "warmup": smoke.warmup, "rounds": smoke.rounds, "batch": smoke.batch_size,
                "image_size": smoke.image_size, "precision": "fp32", "channels_last": False,
                "names": ["no metrics", "naive", "optimized"], **(expected or {})}
    seen = {}

    def fake_compare(configs, setup, batches, **kwargs):
        images, labels = next(iter(batches))
        seen.update(kwargs, names=[c.name for c in configs], setup=setup, images=tuple(images.shape))
        return comparison(result("no metrics", [[1.0]]), result("x", [[2.0]]))

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda classes, device, precision, channels_last:
                        ("setup", classes, device.type, precision, channels_last))
    out = tmp_path / "cmp.json"
    assert bench.main(["--profile", "smoke", *argv, "--json", str(out)]) == 0
    assert seen == {"steps": expected["steps"], "warmup": expected["warmup"], "rounds": expected["rounds"],
                    "report_every": smoke.report_every, "seed": 0, "names": expected["names"],
                    "setup": ("setup", smoke.num_classes, "cpu", expected["precision"], expected["channels_last"]),
                    "images": (expected["batch"], 3, expected["image_size"], expected["image_size"])}
    lines = capsys.readouterr().out.splitlines()
    layout = ", channels-last" if expected["channels_last"] else ""
    assert lines[0] == (f"profile smoke on cpu: batch {expected['batch']}, {expected['image_size']} px, "
                        f"{expected['precision']}{layout}, {expected['rounds']} rounds of "
                        f"{expected['warmup']}+{expected['steps']} steps")
    assert lines[-1] == f"wrote {out}" and [r.name for r in Comparison.load_json(out).results] == ["no metrics", "x"]


def test_cli_runs_two_configurations_on_the_profile_s_device(monkeypatch, capsys):
    profile = cuda_profile()
    seen = fake_run(monkeypatch, profile)
    assert bench.main(["--profile", "smoke", "--configs", "no metrics,naive"]) == 0  # two is enough
    assert seen["profile_name"] == "smoke" and seen["names"] == ["no metrics", "naive"]
    assert seen["batches"] == ((profile.batch_size, profile.image_size, profile.num_classes, CUDA), {})
    assert seen["setup"] == ((profile.num_classes, CUDA), dict(precision="fp32", channels_last=False))


def test_cli_flushes_the_run_line_before_the_run(monkeypatch):
    fake_run(monkeypatch)
    out = FlushRecorder()
    monkeypatch.setattr(sys, "stdout", out)
    bench.main(["--profile", "smoke", "--steps", "1"])
    monkeypatch.undo()
    assert out.events[1:3] == ["\n", "<flush>"] and out.events[0].startswith("profile smoke on cpu: ")
    assert "<flush>" not in out.events[3:]  # the table is printed after the run, no flush needed


def test_cli_precision_takes_fp32_or_bf16_only(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(bench, "compare", lambda configs, setup, batches, **kwargs:
                        seen.append(setup) or comparison(result("no metrics", [[1.0]]), result("x", [[2.0]])))
    monkeypatch.setattr(bench, "build_setup", lambda classes, device, precision, channels_last: precision)
    assert bench.main(["--profile", "smoke", "--precision", "fp32"]) == 0  # the default, also given by name
    assert seen == ["fp32"]
    assert ", fp32, " in capsys.readouterr().out.splitlines()[0]
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--precision", "fp16"])
    assert exc.value.code == 2
    assert "argument --precision: invalid choice: 'fp16'" in capsys.readouterr().err  # quoting varies by Python
    assert seen == ["fp32"]  # refused before building anything


def test_cli_full_profile_without_cuda_fails_clearly():
    if torch.cuda.is_available():
        pytest.skip("checks the behaviour without CUDA")
    with pytest.raises(RuntimeError, match="smoke"):
        bench.main(["--profile", "full"])


# ----------------------------------------------------------------------------------------------------------
# --list and --help


def test_cli_lists_the_configurations(capsys):
    assert bench.main(["--profile", "smoke", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:24].rstrip() for line in lines] == list(bench.available_configs(get_profile("smoke")))
    assert lines[-1] == (f"{'fused suite':<24}mentor.suite.FusedMetrics: the loss mean and every score in one update "
                         "per step")


def test_cli_list_uses_the_profile_asked_for(monkeypatch, capsys):
    asked = []
    real = bench.get_profile
    monkeypatch.setattr(bench, "get_profile", lambda name=None: asked.append(name) or real("smoke"))
    assert bench.main(["--profile", "smoke", "--list"]) == 0
    assert asked == ["smoke"]


def test_cli_help_names_the_program_and_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal width: compare words
    assert text.startswith(
        "usage: python -m mentor.lab.bench [-h] [--list] [--configs CONFIGS] [--profile {full,smoke}] [--batch BATCH] "
        "[--image-size IMAGE_SIZE] [--precision {fp32,bf16}] [--channels-last] [--steps STEPS] [--warmup WARMUP] "
        "[--rounds ROUNDS] [--seed SEED] [--json JSON] "
        "Time ResNet-18 training steps under metric configurations (by default: no metrics, the article's naive "
        "TorchMetrics set and its optimized set), in rounds run in a seeded random order, and count syncs per step; "
        "overheads over the first configuration come with paired bootstrap intervals over rounds. ")
    for line in [
        "--list list the configurations and exit",
        "--configs CONFIGS comma-separated configuration names, the first is the baseline "
        "(default: no metrics,naive,optimized)",
        "--profile {full,smoke} run profile (default: full with CUDA, smoke without)",
        "--batch BATCH images per step (default: the profile's)",
        "--image-size IMAGE_SIZE image height and width in pixels (default: the profile's)",
        "--precision {fp32,bf16} fp32, or bf16 autocast around the forward pass and the loss (default: fp32)",
        "--channels-last channels-last weights and images --steps",  # followed by the next option: no text lost
        "--steps STEPS timed steps per run (default: the profile's)",
        "--warmup WARMUP untimed steps per run (default: the profile's)",
        "--rounds ROUNDS rounds, each running every configuration once in a seeded random order "
        "(default: the profile's)",
        "--seed SEED seed of the per-round random order of the configurations (default: 0)",
        "--json JSON also write the results to this JSON file",
    ]:
        assert line in text


# ----------------------------------------------------------------------------------------------------------
# bad options: refused before the run


def test_cli_rejects_unknown_profile(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "fast"])
    assert exc.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--steps", "--rounds"])
def test_cli_rejects_zero(monkeypatch, flag):
    def fake_compare(configs, setup, batches, **kwargs):
        raise AssertionError(f"compare was called with steps={kwargs['steps']}, rounds={kwargs['rounds']} "
                             f"for {flag} 0")

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "build_setup", lambda *a, **k: None)
    with pytest.raises((SystemExit, ValueError)):
        bench.main(["--profile", "smoke", flag, "0"])


@pytest.mark.parametrize("flag, value, low", [("--steps", "0", 1), ("--warmup", "-1", 0), ("--rounds", "0", 1),
                                             ("--batch", "0", 1), ("--image-size", "31", 32)])
def test_cli_names_the_bad_flag(monkeypatch, capsys, flag, value, low):
    monkeypatch.setattr(bench, "compare", lambda *a, **k: pytest.fail("compare ran with a bad flag"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", flag, value])
    assert exc.value.code == 2
    assert f"{flag} must be at least {low}, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("configs, detail", [
    ("no metrics,nonsense", " (unknown: nonsense)"),
    ("no metrics", ""),
    ("naive,naive", ""),
])
def test_cli_refuses_bad_configs(monkeypatch, capsys, configs, detail):
    monkeypatch.setattr(bench, "compare", lambda *a, **k: pytest.fail("compare ran with bad --configs"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--configs", configs])
    assert exc.value.code == 2
    assert (f"--configs takes two or more different names from --list, got {configs!r}{detail}"
            in capsys.readouterr().err)


@pytest.mark.parametrize("configs, detail", [
    ("no metrics,nonsense,bogus", " (unknown: nonsense, bogus)"),
    ("no metrics", ""),
])
def test_cli_bad_configs_error_is_the_whole_last_line(monkeypatch, capsys, configs, detail):
    fake_run(monkeypatch)
    with pytest.raises(SystemExit):
        bench.main(["--profile", "smoke", "--configs", configs])
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m mentor.lab.bench: error: --configs takes two or more different names from --list, got {configs!r}"
        f"{detail}")


def test_cli_error_usage_names_the_program(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--steps", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m mentor.lab.bench [-h]")
    assert err.rstrip().endswith("python -m mentor.lab.bench: error: argument --steps: invalid int value: 'x'")


# ----------------------------------------------------------------------------------------------------------
# --json


def test_cli_refuses_an_empty_json_name_before_the_run(monkeypatch, capsys):
    # Path("") is Path("."): an empty --json used to pass, run every configuration, then fail to write to the folder
    seen = fake_run(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--json", ""])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m mentor.lab.bench: error: --json needs a file name, got an empty one: pass the JSON file to write, "
        "e.g. --json results.json")
    assert "names" not in seen and "setup" not in seen  # refused before anything was built or run


@pytest.mark.parametrize("name", ["folder", "folder/", "."])
def test_cli_refuses_a_json_that_names_a_folder_before_the_run(monkeypatch, capsys, tmp_path, name):
    seen = fake_run(monkeypatch)
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--profile", "smoke", "--json", name])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m mentor.lab.bench: error: --json {name!r} names a folder: pass a file name to write, "
        f"e.g. --json {name.rstrip('/') or '.'}/results.json")
    assert "names" not in seen and "setup" not in seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]  # nothing written


def test_cli_writes_the_json_to_a_new_file_in_a_new_folder(monkeypatch, capsys, tmp_path):
    fake_run(monkeypatch)
    out = tmp_path / "new" / "cmp.json"
    assert bench.main(["--profile", "smoke", "--json", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"
    assert [r.name for r in Comparison.load_json(out).results] == ["no metrics", "naive", "optimized"]
