"""mentor.lab.compiled_loop: the in-loop cost with the model eager or compiled, with an A/A copy of the baseline;
pinned on the CPU with a tiny point and dynamo's eager backend (no code generated)."""

from __future__ import annotations

import pytest
import torch

from mentor.lab.comparison import Comparison
from mentor.lab.compiled_loop import AA, MODES, aa_resolved, compiled_setup, cost_table, loop_costs
from mentor.lab.configs import Config, OperatingPoint
from mentor.lab.env import get_profile
from mentor.lab.stats import Result
from mentor.lab.train import build_setup

TINY = OperatingPoint("tiny", 2, 32)
PROFILE = get_profile("smoke").with_(num_classes=10)


def test_compiled_setup_wraps_the_model_and_keeps_the_optimizer():
    setup = build_setup(num_classes=10)
    compiled = compiled_setup(setup, "default", backend="eager")
    assert type(compiled.model).__name__ == "OptimizedModule" and compiled.model._orig_mod is setup.model
    assert compiled.optimizer is setup.optimizer and compiled.autocast is setup.autocast
    assert compiled_setup(setup, "eager") is setup
    with pytest.raises(ValueError, match=r"mode must be one of \['eager', 'default', 'reduce-overhead'\], got 'max'."):
        compiled_setup(setup, "max")


def test_loop_costs_adds_the_aa_copy_warms_up_and_resets_dynamo_per_pair(monkeypatch):
    resets, calls = [], {"n": 0}
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))

    def make():
        def on_step(step):
            calls["n"] += 1
        return on_step, None

    costs = loop_costs([TINY, TINY.__class__("tiny2", 2, 32)], PROFILE, [Config("none"), Config("counted", make)],
                       modes=["eager", "default"], rounds=2, block=2, settle=0, report_every=0, warmup_rounds=1,
                       count_syncs=False, backend="eager")
    assert list(costs) == ["tiny", "tiny2"] and all(list(m) == ["eager", "default"] for m in costs.values())
    assert [r.name for r in costs["tiny"]["default"].results] == ["none", AA, "counted"]
    assert len(resets) == 4
    assert calls["n"] == 4 * (1 + 2) * 2  # 4 pairs, (1 warm-up + 2 timed) rounds, 2 steps per block
    assert costs["tiny"]["eager"].rounds == 2


@pytest.mark.parametrize("kwargs, error, message", [
    ({"configs": []}, TypeError, "configs must be a non-empty sequence of mentor.lab.configs.Config, the baseline"),
    ({"modes": ["fast"]}, ValueError, r"modes must be a non-empty selection of \['eager', 'default', 'reduce-ove"),
    ({"modes": []}, ValueError, "modes must be a non-empty selection"),
    ({"warmup_rounds": -1}, ValueError, "warmup_rounds must be an int >= 0, got -1."),
])
def test_bad_arguments_are_refused(kwargs, error, message):
    args = {"configs": [Config("none")], "modes": ["eager"], "warmup_rounds": 0, **kwargs}
    with pytest.raises(error, match=message):
        loop_costs([TINY], PROFILE, args.pop("configs"), rounds=1, **args)


def test_an_aa_copy_given_is_not_added_twice():
    costs = loop_costs([TINY], PROFILE, [Config("none"), Config(AA)], modes=["eager"], rounds=1, block=1, settle=0,
                       report_every=0, warmup_rounds=0, count_syncs=False)
    assert [r.name for r in costs["tiny"]["eager"].results] == ["none", AA]


def _comparison(aa_rounds):
    return Comparison([Result("none", "", [[10.0], [20.0], [15.0]]), Result(AA, "", aa_rounds),
                       Result("suite", "", [[10.5], [21.0], [15.75]])], "none", 1)


def test_a_missed_aa_makes_every_overhead_unresolved():
    missed = _comparison([[11.0], [22.0], [16.5]])
    assert aa_resolved(missed) is False
    assert cost_table({"p": {"eager": missed}}).splitlines()[1:] == [
        "p, eager: unresolved, its A/A interval missed 0",
        "  no metrics, again  +10.0 % [10.0, 10.0]",
        "  suite              +5.0 % [5.0, 5.0]"]
    held = _comparison([[10.0], [20.0], [15.0]])
    assert aa_resolved(held) is True
    assert cost_table({"p": {"eager": held}}).splitlines()[1:] == [
        "p, eager", "  no metrics, again  +0.0 % [0.0, 0.0]", "  suite              +5.0 % [5.0, 5.0]"]


def test_one_round_has_no_interval_and_is_not_resolved():
    one = Comparison([Result("none", "", [[10.0]]), Result(AA, "", [[10.0]])], "none", 1)
    assert aa_resolved(one) is False


def test_the_modes():
    assert MODES == {"eager": None, "default": {}, "reduce-overhead": {"mode": "reduce-overhead"}}


def test_compiled_setup_passes_exactly_these_options(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: seen.append(kwargs) or model)
    setup = build_setup(num_classes=10)
    compiled_setup(setup, "default", backend="eager")
    compiled_setup(setup, "reduce-overhead")
    assert seen == [{"dynamic": False, "backend": "eager"}, {"dynamic": False, "mode": "reduce-overhead"}]


def test_loop_costs_defaults_and_what_it_passes_on(monkeypatch):
    import mentor.lab.compiled_loop as cl

    calls, compiled = [], []
    monkeypatch.setattr(cl, "point_setup", lambda point, profile: (f"setup of {point.name}", "batches"))
    monkeypatch.setattr(cl, "compiled_setup", lambda setup, mode, **options: compiled.append((setup, mode, options))
                        or setup)
    monkeypatch.setattr(cl, "compare_blocks", lambda configs, setup, batches, **kw: calls.append(
        ([(c.name, c.description) for c in configs], setup, batches, kw)) or len(calls))
    out = loop_costs([TINY], PROFILE, [Config("none")], modes=["reduce-overhead"], rounds=3, backend="eager")
    aa = (AA, "the baseline again: an A/A comparison, whose interval must contain 0")
    # the warm-up reports every 7 timed steps: due before the last of a block's 8, so once in every block
    assert calls == [
        ([("none", ""), aa], "setup of tiny", "batches",
         {"rounds": 2, "block": 10, "settle": 2, "report_every": 7, "count_syncs": False, "seed": 0}),
        ([("none", ""), aa], "setup of tiny", "batches",
         {"rounds": 3, "block": 10, "settle": 2, "report_every": 50, "count_syncs": True, "seed": 0})]
    calls.clear()
    loop_costs([TINY], PROFILE, [Config("none")], modes=["eager"], rounds=3, report_every=0, block=6, settle=1)
    assert [kw["report_every"] for *_, kw in calls] == [0, 0]  # no reports: none in the warm-up either
    calls.clear()
    loop_costs([TINY], PROFILE, [Config("none")], modes=["eager"], rounds=3, report_every=3, block=6, settle=1)
    assert [kw["report_every"] for *_, kw in calls] == [3, 3]  # reports every 3 steps: already inside a block
    assert compiled[0] == ("setup of tiny", "reduce-overhead", {"backend": "eager"})
    assert out == {"tiny": {"reduce-overhead": 2}}


def test_configs_and_warmup_rounds_are_checked_whole():
    with pytest.raises(TypeError, match=r"^configs must be a non-empty sequence of mentor\.lab\.configs\.Config, the "
                                        r"baseline first\.$"):
        loop_costs([TINY], PROFILE, ["none"], rounds=1)
    with pytest.raises(ValueError, match=r"^warmup_rounds must be an int >= 0, got True\.$"):
        loop_costs([TINY], PROFILE, [Config("none")], rounds=1, warmup_rounds=True)


def test_the_kind_of_overhead_is_passed_on():
    """Equal median steps, but a slow step in every A/A round: resolved by the median, not by the total time."""
    base = [[10.0, 10.0, 10.0]] * 3
    cmp = Comparison([Result("none", "", base), Result(AA, "", [[10.0, 10.0, 40.0]] * 3),
                      Result("suite", "", [[11.0, 11.0, 22.0]] * 3)], "none", 1)
    assert (aa_resolved(cmp), aa_resolved(cmp, "median")) == (False, True)
    assert cost_table({"p": {"eager": cmp}}, "median").splitlines() == [
        "configuration        overhead [95 % interval]",
        "p, eager",
        "  no metrics, again  +0.0 % [0.0, 0.0]",
        "  suite              +10.0 % [10.0, 10.0]"]
    assert cost_table({"p": {"eager": cmp}}).splitlines()[1] == "p, eager: unresolved, its A/A interval missed 0"


def test_the_table_shows_the_kind_it_is_asked_for():
    base = [[10.0, 10.0, 10.0]] * 3
    cmp = Comparison([Result("none", "", base), Result(AA, "", base),
                      Result("suite", "", [[11.0, 11.0, 22.0]] * 3)], "none", 1)
    assert cost_table({"p": {"eager": cmp}}).splitlines()[3] == "  suite              +46.7 % [46.7, 46.7]"
    assert cost_table({"p": {"eager": cmp}}, "median").splitlines()[3].endswith("+10.0 % [10.0, 10.0]")


# --- the suite inside the compiled step ------------------------------------------------------------------------

def test_step_function_updates_the_metric_inside_with_the_step_values():
    from mentor.lab.compiled_loop import step_function
    from mentor.suite import FusedMetrics

    setup = build_setup(num_classes=10)
    suite, reference = FusedMetrics(10), FusedMetrics(10)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([1, 2, 3, 9])
    for mode in ("eager", "default"):
        loss, out = step_function(setup, suite, mode, backend="eager")(images, labels)
        with torch.no_grad():
            logits = setup.model(images)
        reference.update(torch.nn.functional.cross_entropy(logits, labels), logits, labels)
        assert loss.requires_grad and torch.allclose(loss, torch.nn.functional.cross_entropy(logits, labels))
        assert torch.allclose(out, logits)
    for name in ("tp", "fp", "fn", "loss_count", "invalid_labels"):
        assert torch.equal(getattr(suite, name), getattr(reference, name)), name
    assert torch.allclose(suite.loss_sum, reference.loss_sum)
    assert int(suite.loss_count) == 2
    plain = step_function(setup, None, "eager")
    assert torch.allclose(plain(images, labels)[0], loss) and int(suite.loss_count) == 2  # no metric: untouched


def test_step_function_runs_under_the_setup_autocast_and_compiles_as_asked(monkeypatch):
    from mentor.lab.compiled_loop import step_function

    setup = build_setup(num_classes=10, precision="bf16")
    seen = {}
    original = setup.model.forward

    def forward(x):
        seen["autocast"] = torch.is_autocast_enabled("cpu")
        return original(x)

    monkeypatch.setattr(setup.model, "forward", forward)
    step_function(setup, None, "eager")(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))
    assert seen["autocast"] is True
    passed = {}
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: passed.update(kw) or fn)
    step_function(setup, None, "reduce-overhead", backend="eager")
    assert passed == {"dynamic": False, "mode": "reduce-overhead", "backend": "eager"}
    step_function(setup, None, "default")
    assert passed == {"dynamic": False, "mode": "reduce-overhead", "backend": "eager"}  # eager: not compiled again
    with pytest.raises(ValueError, match=r"mode must be one of \['eager', 'default', 'reduce-overhead'\], got 'x'."):
        step_function(setup, None, "x")


def test_inside_costs_times_three_configurations_and_reports_inside_timed_steps(monkeypatch):
    from mentor.lab.compiled_loop import INSIDE, inside_costs
    from mentor.suite import FusedMetrics

    resets, computes = [], []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    original = FusedMetrics.compute
    monkeypatch.setattr(FusedMetrics, "compute", lambda self: computes.append(int(self.loss_count)) or original(self))
    costs = inside_costs([TINY, OperatingPoint("tiny2", 3, 32)], PROFILE, mode="default", rounds=4, block=3,
                         settle=1, report_every=3, warmup_rounds=1, seed=5, backend="eager")
    assert list(costs) == ["tiny", "tiny2"] and len(resets) == 2
    cmp = costs["tiny"]
    assert [r.name for r in cmp.results] == ["no metrics", AA, INSIDE] and cmp.baseline == "no metrics"
    assert cmp.rounds == 4 and all(len(ms) == 2 for r in cmp.results for ms in r.round_step_ms)
    assert cmp.batch_size == 2 and costs["tiny2"].batch_size == 3
    # 2 timed steps per block: the report due at the 3rd timed step runs there (round 1, position 0); the one due
    # at the 6th, the last of round 2's block, waits for the next timed step (round 3, position 0), so that the
    # step after a report is always timed
    assert cmp.settings["report_steps"] == {"no metrics": [], AA: [], INSIDE: [[1, 0], [3, 0]]}
    # one untimed report after the warm-up round (its block: 3 updates, settle steps update too); then the first
    # timed report reads 3 + 2 updates (two blocks) and the second, after its reset, 1 + 3 + 2
    assert computes[:3] == [3, 5, 6]
    assert cmp.settings["rounds"] == 4 and cmp.settings["mode"] == "default" and cmp.settings["hook_ms"] == {}
    assert len(cmp.settings["orders"]) == 4 and all(sorted(o) == sorted(["no metrics", AA, INSIDE])
                                                    for o in cmp.settings["orders"])
    assert all(r.syncs_per_step is None and r.syncs_note == "not counted" for r in cmp.results)


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "max"}, r"mode must be one of \['eager', 'default', 'reduce-overhead'\], got 'max'."),
    ({"rounds": 0}, "rounds must be an int >= 1, got 0."),
    ({"block": True}, "block must be an int >= 1, got True."),
    ({"settle": -1}, "settle must be an int >= 0, got -1."),
    ({"report_every": -1}, "report_every must be an int >= 0, got -1."),
    ({"warmup_rounds": 1.5}, "warmup_rounds must be an int >= 0, got 1.5."),
    ({"block": 2, "settle": 2}, r"settle \(2\) must be smaller than block \(2\): a block needs a timed step."),
    ({"block": 3, "settle": 2, "report_every": 4}, r"block - settle is 1 timed step with report_every=4: a report "
                                                   r"needs a timed step after it in its block"),
])
def test_inside_costs_refuses_bad_arguments(kwargs, message):
    from mentor.lab.compiled_loop import inside_costs

    args = {"rounds": 1, "mode": "eager", **kwargs}
    with pytest.raises(ValueError, match=message):
        inside_costs([TINY], PROFILE, **args)


# --- the matrix: updates outside and inside the compiled step, with what dynamo did in each block ---------------

def test_matrix_costs_runs_outside_hooks_with_the_step_values_and_counts_compiles_per_configuration(monkeypatch):
    from mentor.lab import compiled_loop
    from mentor.lab.compiled_loop import INSIDE, matrix_costs

    seen, reports = [], []

    def make():
        return (lambda s: seen.append((s.loss.detach().clone(), s.output.shape))), reports.append

    tick = {"n": 0}

    def counts():  # every read one graph, one break and one skip more than the last
        tick["n"] += 1
        return {"graphs": tick["n"], "breaks": 2 * tick["n"], "cudagraph_skips": 3 * tick["n"]}

    monkeypatch.setattr(compiled_loop, "_compile_counts", counts)
    costs = matrix_costs([TINY], PROFILE, [Config("outside", make)], modes=["eager", "default"], rounds=3, block=3,
                         settle=1, report_every=2, warmup_rounds=1, seed=2, backend="eager")
    assert list(costs["tiny"]) == ["eager", "default"]
    cmp = costs["tiny"]["default"]
    assert [r.name for r in cmp.results] == ["no metrics", AA, "outside", INSIDE]
    # the hook ran at every step (settle steps too) of both modes' warm-up and timed blocks: 2 modes x 4 rounds x 3
    assert len(seen) == 24 and all(shape == (2, 10) and loss.ndim == 0 for loss, shape in seen)
    # an untimed report after the warm-up (step 0), then, as in compare_blocks, each report gets the count of timed
    # steps: 2 timed steps a block, one due every 2, so each falls on a block's last timed step and runs at the next
    # block's first (3, 5); the one due at 6 waits for a block that never comes
    assert reports == [0, 3, 5, 0, 3, 5]
    assert cmp.settings["report_steps"]["outside"] == cmp.settings["report_steps"][INSIDE]
    assert set(cmp.settings["hook_ms"]) == {"outside"} and cmp.settings["hook_ms"]["outside"] >= 0
    # each block reads the counters twice: one more of each between its two reads is attributed to it
    compiled = cmp.settings["compile"]
    assert compiled["outside"] == {"warmup": {"graphs": 1, "breaks": 2, "cudagraph_skips": 3},
                                   "timed": {"graphs": 3, "breaks": 6, "cudagraph_skips": 9}}
    assert set(compiled) == {"no metrics", AA, "outside", INSIDE}


def test_matrix_costs_without_the_inside_configuration_and_its_refusals():
    from mentor.lab.compiled_loop import INSIDE, matrix_costs

    costs = matrix_costs([TINY], PROFILE, modes=["eager"], inside=False, rounds=1, block=2, settle=0,
                         report_every=0, warmup_rounds=0)
    assert [r.name for r in costs["tiny"]["eager"].results] == ["no metrics", AA]
    with pytest.raises(ValueError, match=r"configuration names must be unique and not \['no metrics', "):
        matrix_costs([TINY], PROFILE, [Config(INSIDE)], modes=["eager"], rounds=1)
    with pytest.raises(TypeError, match=r"configs must be a sequence of mentor.lab.configs.Config"):
        matrix_costs([TINY], PROFILE, ["optimized"], modes=["eager"], rounds=1)
    with pytest.raises(ValueError, match=r"modes must be a non-empty selection of \['eager', 'default', "
                                         r"'reduce-overhead'\], got \['eager', 'x'\]\."):
        matrix_costs([TINY], PROFILE, modes=["eager", "x"], rounds=1)
    with pytest.raises(ValueError, match=r"modes must be a non-empty selection"):
        matrix_costs([TINY], PROFILE, modes=[], rounds=1)


def test_the_tables_never_cut_a_name_and_grow_with_the_longest():
    """A point, mode or configuration name of any length is printed whole (chapter 14's 'bf16 b32 96px' once ran
    into its mode), and every block's columns line up with the header."""
    from mentor.lab.compiled_loop import compile_counts_table

    long = "fused suite, inside the step compiled with reduce-overhead"
    counts = {"warmup": {"graphs": 12, "breaks": 3, "cudagraph_skips": 1},
              "timed": {"graphs": 0, "breaks": 0, "cudagraph_skips": 45}}
    cmp = Comparison([Result("none", "", [[10.0], [20.0], [15.0]]), Result(AA, "", [[10.0], [20.0], [15.0]]),
                      Result(long, "", [[11.0], [22.0], [16.5]])], "none", 1,
                     settings={"compile": {"none": counts, long: counts}})
    costs = {"bf16 b32 96px, a long point": {"reduce-overhead": cmp}}
    lines = cost_table(costs).splitlines()
    assert lines[1] == "bf16 b32 96px, a long point, reduce-overhead"
    assert lines[3] == f"  {long}  +10.0 % [10.0, 10.0]"
    assert lines[0].index("overhead") == lines[3].index("+10.0")
    counted = compile_counts_table(costs).splitlines()
    assert counted[2] == "bf16 b32 96px, a long point, reduce-overhead"
    assert counted[4] == f"  {long}     12      3     1       0      0    45"
    assert counted[4][:counted[1].index("skips") + len("skips")].endswith("  3     1")
    assert counted[1].rindex("skips") + len("skips") == len(counted[4])
    assert counted[0].index("warm-up") == counted[1].index("graphs")
    assert counted[0].index("timed") == counted[1].rindex("graphs")
