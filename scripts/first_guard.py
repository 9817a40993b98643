"""Diagnose: what the first sync_guard of a process sees besides the code under test."""
import torch, warnings
from torchmetrics import MeanMetric
from mentor.profiling import count_syncs, sync_guard
loss = torch.rand((), device="cuda")
m = MeanMetric().cuda(); m.update(loss); torch.cuda.synchronize()
print("mode before:", torch.cuda.get_sync_debug_mode())
with sync_guard() as r0:
    pass
print("empty guard:", r0.count, [(s.where, s.stack[-4:]) for s in r0.sites])
r = count_syncs(m.update, loss)
for s in r.sites:
    print(s.where, s.function)
    for fr in s.stack[-6:]:
        print("    ", fr)
r = count_syncs(m.update, loss)
print("second:", r.count)
