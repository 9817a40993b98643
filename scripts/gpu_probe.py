"""Exploratory: sync counts of metric updates on the GPU, by variant. Not used by the book."""
import torch
from torchmetrics import MeanMetric, Accuracy, Precision, Recall, F1Score
from torchmetrics.classification import MulticlassPrecision, MulticlassAccuracy
from mentor.profiling import count_syncs
from mentor.metrics import suppress_nan_check, scatter_stat_scores, host_scalar

C = 1000
logits = torch.randn(128, C, device="cuda"); target = torch.randint(0, C, (128,), device="cuda")
loss = torch.nn.functional.cross_entropy(logits, target)

def show(label, metric, *args, **kw):
    metric.update(*args, **kw); torch.cuda.synchronize()
    r = count_syncs(metric.update, *args, **kw)
    print(f"{label:55s} {r.count}  {dict(r.by_line())}")

show("MeanMetric.update(loss)", MeanMetric().cuda(), loss)
show("MeanMetric.update(loss, weight=ones_like)", MeanMetric().cuda(), loss, weight=torch.ones_like(loss))
show("MeanMetric.update(loss, weight=1.0)", MeanMetric().cuda(), loss, weight=1.0)
show("MeanMetric(nan_strategy=disable).update(loss)", MeanMetric(nan_strategy="disable").cuda(), loss)
show("NoNan MeanMetric.update(loss, ones)", suppress_nan_check(MeanMetric)().cuda(), loss, weight=torch.ones_like(loss))
show("NoNan MeanMetric.update(loss)", suppress_nan_check(MeanMetric)().cuda(), loss)
show("GPU MeanMetric.update(float)", MeanMetric().cuda(), 0.25)
show("GPU MeanMetric.update(host_scalar)", MeanMetric().cuda(), host_scalar(0.25))
show("GPU NoNan.update(float)", suppress_nan_check(MeanMetric)().cuda(), 0.25)
show("CPU MeanMetric.update(float)", MeanMetric(), 0.25)
for cls in (Accuracy, Precision, Recall, F1Score):
    show(f"{cls.__name__} default", cls(task="multiclass", num_classes=C).cuda(), logits, target)
    show(f"{cls.__name__} validate_args=False", cls(task="multiclass", num_classes=C, validate_args=False).cuda(), logits, target)
show("Scatter precision", scatter_stat_scores(MulticlassPrecision)(num_classes=C, validate_args=False).cuda(), logits, target)
show("Scatter precision validate", scatter_stat_scores(MulticlassPrecision)(num_classes=C).cuda(), logits, target)
m = MeanMetric().cuda(); m.update(loss)
r = count_syncs(m.compute); print("compute", r.count)
# the weight bug check
a = MeanMetric().cuda(); b = MeanMetric(nan_strategy="disable").cuda(); c = suppress_nan_check(MeanMetric)().cuda()
x = torch.tensor([1.0, 3.0], device="cuda"); w = torch.tensor([1.0, 3.0], device="cuda")
for mm in (a, b, c): mm.update(x, weight=w)
print("weighted mean default / disable / suppress:", float(a.compute()), float(b.compute()), float(c.compute()))
