"""mentor.lab.configs: Config, the configuration builders and catalogues, operating points and point_setup; what each
passes on to the metrics, setups and batches it makes."""

import re

import pytest
import torch

import mentor.lab.configs as configs
from exact import whole
from mentor.lab.configs import (
    OPERATING_POINTS,
    SWEEP_CONFIGS,
    Config,
    OperatingPoint,
    article_configs,
    available_configs,
    catalogue,
    metrics_config,
    operating_points,
    point_setup,
    step_time_config,
    suite_config,
)
from mentor.lab.env import get_profile
from mentor.lab.metric_sets import ARTICLE_SETS, METRIC_SETS

CUDA = torch.device("cuda")




def cuda_profile():
    """The smoke profile with a CUDA device: only passed on (builders are faked), nothing runs on it."""
    return get_profile("smoke").with_(device=CUDA)


# ----------------------------------------------------------------------------------------------------------
# Config


def test_config_defaults():
    c = Config("no metrics")
    assert c.make() == (None, None) and c.description == "" and c.batches is None


@pytest.mark.parametrize("bad", ["", None, 3])
def test_config_rejects_bad_names(bad):
    with pytest.raises(ValueError, match=f"Config name must be a non-empty string, got {bad!r}"):
        Config(bad)


def test_config_rejects_non_callable_make():
    with pytest.raises(TypeError, match=r"Config.make must be a function returning \(on_step, on_report\)"):
        Config("x", make=(None, None))


# ----------------------------------------------------------------------------------------------------------
# the configuration builders: what they pass on to the metrics


def test_metrics_config_feeds_and_reports_a_metric_set(setup, batches):
    cfg = metrics_config("optimized", num_classes=10, device="cpu", name="opt")
    assert cfg.name == "opt" and cfg.description == METRIC_SETS["optimized"]
    on_step, on_report = cfg.make()
    from mentor.lab.train import train

    reported = []
    train(setup, batches, steps=2, on_step=on_step, on_report=lambda n: reported.append(on_report(n)),
          report_every=2)
    assert len(reported) == 1 and reported[0]["step"] == 2
    assert set(reported[0]) == {"step", "loss", "accuracy", "precision", "recall", "f1_score"}
    assert 0.0 <= reported[0]["accuracy"] <= 1.0 and reported[0]["loss"] > 0


def test_metrics_config_fresh_hooks_per_make():
    cfg = metrics_config("naive", num_classes=10, device="cpu")
    (_, report_a), (_, report_b) = cfg.make(), cfg.make()
    assert report_a.__self__ is not report_b.__self__  # a new LossAndScores for every run


def test_metrics_config_rejects_unknown_variant():
    with pytest.raises(ValueError, match=r"Unknown metric set 'x': pass one of"):
        metrics_config("x", num_classes=10, device="cpu")


def recording_metric_set(monkeypatch):
    """Replace mentor.lab.configs.metric_set by one that records its keyword arguments and builds the set on the CPU."""
    calls = []
    real = configs.metric_set

    def fake(variant, **kwargs):
        calls.append((variant, kwargs))
        return real(variant, **{**kwargs, "device": "cpu"})

    monkeypatch.setattr(configs, "metric_set", fake)
    return calls


def test_metrics_config_checks_its_options_at_once_and_passes_them_on(monkeypatch):
    calls = recording_metric_set(monkeypatch)
    cfg = metrics_config("optimized", 7, CUDA, compute_groups=True, forward=True)
    (variant, check), = calls  # the options are checked at once, on a throw-away set
    assert variant == "optimized" and (check["compute_groups"], check["forward"]) == (True, True)
    cfg.make()
    assert calls[1] == ("optimized", dict(num_classes=7, device=CUDA, compute_groups=True, forward=True))
    with pytest.raises(ValueError, match=whole("forward must be True or False, got 'yes'.")):
        metrics_config("optimized", 7, "cpu", forward="yes")  # refused when the config is made


def test_metrics_config_names_unknown_options():
    with pytest.raises(TypeError, match=whole("metrics_config got unknown option(s) ['bogus', 'x']; it takes "
                                              "compute_groups and forward.")):
        metrics_config("naive", 10, "cpu", x=1, bogus=2)


@pytest.mark.parametrize("update,kind", [("float", float), ("tensor", torch.Tensor)])
def test_step_time_config_averages_host_seconds(monkeypatch, update, kind):
    import torchmetrics

    made = []

    class Recording(torchmetrics.MeanMetric):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen, self.computed = [], []
            made.append(self)

        def update(self, value, weight=None):
            self.seen.append(value)
            super().update(value)

        def compute(self):
            value = super().compute()
            self.computed.append(float(value))
            return value

    monkeypatch.setattr(torchmetrics, "MeanMetric", Recording)  # step_time_config imports it when called
    cfg = step_time_config("t", "cpu", update, sync_on_compute=False)
    on_step, on_report = cfg.make()

    class FakeStep:
        def __init__(self, s):
            self.host_seconds = s

    for s in (0.5, 1.5):
        on_step(FakeStep(s))
    on_report(2)
    on_step(FakeStep(4.0))
    on_report(3)
    (metric,) = made
    assert all(isinstance(v, kind) for v in metric.seen)
    assert metric.computed == [1.0, 4.0]  # mean of the first two, then reset: the third alone
    assert not metric.sync_on_compute
    assert "CPU" in cfg.description and update in cfg.description


def test_step_time_config_rejects_unknown_update():
    with pytest.raises(ValueError, match="update must be 'float' or 'tensor', got 'int'"):
        step_time_config("t", "cpu", "int")


def test_step_time_config_syncs_on_compute_by_default_and_moves_to_its_device(monkeypatch):
    import torchmetrics

    made = []

    class Recording(torchmetrics.MeanMetric):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def to(self, *args, **kwargs):
            self.moved_to = args
            return self

    monkeypatch.setattr(torchmetrics, "MeanMetric", Recording)
    step_time_config("t", "cuda:1", "float").make()
    (metric,) = made
    assert metric.sync_on_compute is True and metric.moved_to == ("cuda:1",)
    assert step_time_config("t", "cuda:1", "tensor").description == (
        "MeanMetric of the step time on the GPU, updated with a tensor")
    assert step_time_config("t", "cpu", "float").description == (
        "MeanMetric of the step time on the CPU, updated with a float")


def test_suite_config_updates_each_step_and_resets_at_each_report():
    from mentor.lab.train import Step

    on_step, on_report = suite_config(3, "cpu").make()
    step = Step(0, torch.zeros(2, 3, 8, 8), torch.tensor([0, 2]), torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
                torch.tensor(0.5), 0.01)
    on_step(step)
    on_step(step)
    suite = on_step.__closure__[0].cell_contents if on_step.__closure__ else None
    assert suite is not None and suite.tp.tolist() == [2, 0, 0] and suite.fn.tolist() == [0, 0, 2]
    on_report(2)
    assert suite.tp.tolist() == [0, 0, 0] and suite.loss_count.item() == 0


def test_suite_config_moves_the_suite_to_its_device(monkeypatch):
    import mentor.suite

    moved = []

    class Recording(mentor.suite.FusedMetrics):
        def to(self, *args, **kwargs):
            moved.append(args)
            return self

    monkeypatch.setattr(mentor.suite, "FusedMetrics", Recording)
    suite_config(3, CUDA).make()
    assert moved == [(CUDA,)]


# ----------------------------------------------------------------------------------------------------------
# the catalogues


def test_catalogue_and_article_configs():
    profile = get_profile("smoke")
    cat = catalogue(profile)
    assert all(name == c.name for name, c in cat.items())
    assert list(cat) == ["no metrics", *ARTICLE_SETS, "step time: CPU", "step time: GPU float",
                         "step time: GPU tensor"]
    assert all(c.description for c in cat.values())
    assert [c.name for c in article_configs(profile)] == ["no metrics", "naive", "optimized"]


def test_catalogue_passes_the_profile_s_classes_and_device(monkeypatch):
    import torchmetrics

    calls = recording_metric_set(monkeypatch)
    moved = []

    class Recording(torchmetrics.MeanMetric):
        def to(self, *args, **kwargs):
            moved.append(args)
            return self

    monkeypatch.setattr(torchmetrics, "MeanMetric", Recording)
    profile = cuda_profile()
    cat = catalogue(profile)
    assert cat["no metrics"].description == "the training step alone"
    assert cat["step time: CPU"].description == "MeanMetric of the step time on the CPU, updated with a float"
    assert cat["step time: GPU float"].description == "MeanMetric of the step time on the GPU, updated with a float"
    assert cat["step time: GPU tensor"].description == "MeanMetric of the step time on the GPU, updated with a tensor"
    del calls[:]
    for name in ARTICLE_SETS:
        cat[name].make()
    assert calls == [(name, dict(num_classes=profile.num_classes, device=CUDA)) for name in ARTICLE_SETS]
    for name in ("step time: CPU", "step time: GPU float", "step time: GPU tensor"):
        cat[name].make()
    assert moved == [("cpu",), ("cuda",), ("cuda",)]


def test_available_configs_add_the_macro_sets_and_the_suite():
    names = list(available_configs(get_profile("smoke")))
    assert names == [*catalogue(get_profile("smoke")), "macro", "macro sync-free", "fused suite"]
    assert set(SWEEP_CONFIGS) <= set(names) and SWEEP_CONFIGS[0] == "no metrics"


def test_available_configs_pass_the_profile_to_the_macro_sets_and_the_suite(monkeypatch):
    import mentor.suite

    calls = recording_metric_set(monkeypatch)
    made = []

    class Recording(mentor.suite.FusedMetrics):
        def __init__(self, num_classes):
            super().__init__(num_classes)
            made.append(num_classes)

        def to(self, *args, **kwargs):
            made.append(args)
            return self

    monkeypatch.setattr(mentor.suite, "FusedMetrics", Recording)
    profile = cuda_profile().with_(num_classes=6)
    available = available_configs(profile)
    del calls[:]
    for name in ("macro", "macro sync-free", "fused suite"):
        available[name].make()
    assert calls == [(v, dict(num_classes=6, device=CUDA)) for v in ("macro", "macro sync-free")]
    assert made == [6, (CUDA,)]


# ----------------------------------------------------------------------------------------------------------
# operating points and point_setup


def test_operating_point_label_and_checks():
    p = OperatingPoint("x", 16, 64, "bf16", True)
    assert p.label == "x: batch 16, 64 px, bf16, channels-last"
    assert OperatingPoint("y", 8).label == "y: batch 8, 224 px, fp32"
    for kw, message in ((dict(batch_size=0), "batch_size must be an int >= 1, got 0"),
                        (dict(batch_size=True), "batch_size must be an int >= 1, got True"),
                        (dict(image_size=2.5), "image_size must be an int >= 1, got 2.5"),
                        (dict(precision="fp16"), "precision must be 'fp32' or 'bf16', got 'fp16'")):
        with pytest.raises(ValueError, match=re.escape(message)):
            OperatingPoint("bad", **{"batch_size": 4, **kw})


def test_operating_point_accepts_one():
    p = OperatingPoint("tiny", 1, 1)  # the smallest batch and image the checks allow (>= 1)
    assert (p.batch_size, p.image_size) == (1, 1)


def test_operating_points_are_the_real_ones_on_cuda_and_shrunk_on_the_cpu():
    smoke = get_profile("smoke")
    assert operating_points(smoke.with_(device=torch.device("cuda"))) == OPERATING_POINTS
    shrunk = operating_points(smoke)
    assert [(p.name, p.batch_size, p.image_size, p.precision, p.channels_last) for p in shrunk] == [
        (p.name, min(p.batch_size, smoke.batch_size), smoke.image_size, p.precision, p.channels_last)
        for p in OPERATING_POINTS]
    full = [(p.batch_size, p.image_size, p.precision, p.channels_last) for p in OPERATING_POINTS]
    assert full == [(128, 224, "fp32", False), (64, 224, "fp32", False), (32, 224, "fp32", False),
                    (128, 224, "bf16", True), (32, 224, "bf16", True), (32, 96, "bf16", True)]


def test_point_setup_passes_the_point_and_the_profile_on(monkeypatch):
    import mentor.lab.data

    built = []
    monkeypatch.setattr(configs, "build_setup", lambda *args, **kwargs: built.append((args, kwargs)) or "setup")
    monkeypatch.setattr(mentor.lab.data, "device_batches",
                        lambda *args, **kwargs: built.append((args, kwargs)) or "data")
    profile = cuda_profile().with_(num_classes=6)
    assert point_setup(OperatingPoint("p", 3, 40, "bf16", True), profile) == ("setup", "data")
    # the model: the profile's classes and device, the point's precision and memory format; the data: the point's
    # batch and image size, the profile's classes and device
    assert built == [((6, CUDA), dict(precision="bf16", channels_last=True)), ((3, 40, 6, CUDA), {})]
    del built[:]
    point_setup(OperatingPoint("q", 2, 32), profile)
    assert built == [((6, CUDA), dict(precision="fp32", channels_last=False)), ((2, 32, 6, CUDA), {})]


def test_point_setup_builds_a_fresh_model_and_batches_of_the_point_on_the_cpu():
    profile = get_profile("smoke").with_(num_classes=5)
    point = OperatingPoint("p", 3, 40, "bf16", True)
    setup, batches = point_setup(point, profile)
    again, _ = point_setup(point, profile)
    assert (setup.device.type, setup.autocast, setup.channels_last) == ("cpu", torch.bfloat16, True)
    assert setup.model.fc.out_features == 5 and again.model is not setup.model  # a fresh model for every call
    images, labels = next(iter(batches))
    assert tuple(images.shape) == (3, 3, 40, 40) and tuple(labels.shape) == (3,)
    assert images.device.type == labels.device.type == "cpu" and 0 <= int(labels.min()) <= int(labels.max()) < 5


@pytest.mark.parametrize("bad, kind", [("fp32 b128", "str"), ({"name": "p", "batch_size": 2}, "dict"),
                                       (None, "NoneType")])
def test_point_setup_refuses_what_is_not_a_point_before_building_anything(monkeypatch, bad, kind):
    monkeypatch.setattr(configs, "build_setup", lambda *a, **k: pytest.fail("a model was built for a bad point"))
    message = f"point must be an OperatingPoint, e.g. OPERATING_POINTS[0], not {kind}."
    with pytest.raises(TypeError, match=whole(message)):
        point_setup(bad, get_profile("smoke"))
